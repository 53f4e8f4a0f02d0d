//! Element types and devices.

use crate::error::{ErrorKind, IrError, Result};
use std::fmt;

/// The element type of a tensor, in torch's set. The discriminant is the code shared with Python.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
#[repr(u8)]
pub enum DType {
    Bool = 0,
    U8,
    I8,
    I16,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
    C64,
    C128,
}

impl DType {
    pub const ALL: [DType; 12] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C64,
        DType::C128,
    ];

    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.get(code as usize).copied()
    }

    pub fn code(self) -> u8 {
        self as u8
    }

    /// The short name used in trace comments: `f32`, `b8`.
    pub fn short_name(self) -> &'static str {
        use DType::*;
        match self {
            Bool => "b8",
            U8 => "u8",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F16 => "f16",
            BF16 => "bf16",
            F32 => "f32",
            F64 => "f64",
            C64 => "c64",
            C128 => "c128",
        }
    }

    /// The attribute name in the `torch` module: `float32` for `torch.float32`.
    pub fn torch_name(self) -> &'static str {
        use DType::*;
        match self {
            Bool => "bool",
            U8 => "uint8",
            I8 => "int8",
            I16 => "int16",
            I32 => "int32",
            I64 => "int64",
            F16 => "float16",
            BF16 => "bfloat16",
            F32 => "float32",
            F64 => "float64",
            C64 => "complex64",
            C128 => "complex128",
        }
    }

    pub fn from_torch_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.torch_name() == name || d.short_name() == name)
    }

    pub fn is_bool(self) -> bool {
        self == DType::Bool
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    pub fn is_complex(self) -> bool {
        matches!(self, DType::C64 | DType::C128)
    }

    /// Integer types, not including bool.
    pub fn is_int(self) -> bool {
        matches!(self, DType::U8 | DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// Floating or complex: the types that carry gradients and that inexact math accepts.
    pub fn is_inexact(self) -> bool {
        self.is_float() || self.is_complex()
    }

    /// The real type of a complex type; other types map to themselves.
    pub fn to_real(self) -> DType {
        match self {
            DType::C64 => DType::F32,
            DType::C128 => DType::F64,
            d => d,
        }
    }

    pub fn itemsize(self) -> usize {
        use DType::*;
        match self {
            Bool | U8 | I8 => 1,
            I16 | F16 | BF16 => 2,
            I32 | F32 => 4,
            I64 | F64 | C64 => 8,
            C128 => 16,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// The kind of device a tensor lives on.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum DeviceKind {
    Cpu,
    Cuda,
    Meta,
}

/// A device as torch names it: `cpu`, `cuda:0`, `meta`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Device {
    pub kind: DeviceKind,
    pub index: Option<u16>,
}

impl Device {
    pub const CPU: Device = Device { kind: DeviceKind::Cpu, index: None };

    /// Parses torch's spelling of a device (`"cuda:1"`).
    pub fn parse(text: &str) -> Result<Device> {
        let (kind, index) = match text.split_once(':') {
            Some((k, i)) => (k, Some(i)),
            None => (text, None),
        };
        let kind = match kind {
            "cpu" => DeviceKind::Cpu,
            "cuda" => DeviceKind::Cuda,
            "meta" => DeviceKind::Meta,
            _ => return Err(IrError::new(ErrorKind::Value, "device", format!("unsupported device '{text}'"))),
        };
        let index = match index {
            Some(i) => Some(
                i.parse::<u16>()
                    .map_err(|_| IrError::new(ErrorKind::Value, "device", format!("bad device index in '{text}'")))?,
            ),
            None => None,
        };
        Ok(Device { kind, index })
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Meta => "meta",
        };
        match self.index {
            Some(i) => write!(f, "{kind}:{i}"),
            None => f.write_str(kind),
        }
    }
}

//! Element types and devices.

use crate::error::{ErrorKind, IrError, Result};
use std::fmt;

/// The element type of a tensor, in torch's set. The discriminant is the code shared with Python.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
#[repr(u8)]
pub enum DType {
    /// `torch.bool`, printed `b8`.
    Bool = 0,
    /// `torch.uint8`.
    U8,
    /// `torch.int8`.
    I8,
    /// `torch.int16`.
    I16,
    /// `torch.int32`.
    I32,
    /// `torch.int64`, the type of integer indices and of `torch.arange` with integer bounds.
    I64,
    /// `torch.float16`.
    F16,
    /// `torch.bfloat16`.
    BF16,
    /// `torch.float32`, torch's default floating type.
    F32,
    /// `torch.float64`.
    F64,
    /// `torch.complex64` (two `f32`).
    C64,
    /// `torch.complex128` (two `f64`).
    C128,
}

impl DType {
    /// Every dtype in code order: `ALL[d.code() as usize] == d`.
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

    /// The dtype whose [`code`](Self::code) is `code`; `None` for a code past the last.
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.get(code as usize).copied()
    }

    /// The number Python and the binary trace form use for this dtype (`thunder_rs.core`'s `CODES`).
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

    /// Reads either spelling, torch's (`float32`) or the trace comments' (`f32`); `None` for others.
    pub fn from_torch_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.torch_name() == name || d.short_name() == name)
    }

    /// `torch.bool`, which type promotion ranks below every integer type.
    pub fn is_bool(self) -> bool {
        self == DType::Bool
    }

    /// Real floating types (`f16`, `bf16`, `f32`, `f64`), not complex ones.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// `c64` and `c128`.
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

    /// Bytes per element, as `torch.dtype.itemsize` (the split pass weighs residuals by it).
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
    /// The host (`cpu`); torch gives it no index.
    Cpu,
    /// An NVIDIA GPU (`cuda`, `cuda:1`).
    Cuda,
    /// torch's `meta` device: metadata without storage, where fallbacks compute output shapes.
    Meta,
}

/// A device as torch names it: `cpu`, `cuda:0`, `meta`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Device {
    /// What kind of device it is.
    pub kind: DeviceKind,
    /// The ordinal after the colon (`cuda:1` is `Some(1)`); `None` when torch's spelling has none.
    pub index: Option<u16>,
}

impl Device {
    /// `cpu`, the device of every tensor not placed elsewhere.
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

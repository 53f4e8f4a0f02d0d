//! Identity checks of the per-call path, each one C call where Python compares object by object.
//!
//! A jitted module's call checks that its parameter and buffer slots still hold the tensors of
//! the last call (`SlotIdentity.holds`: ~14 ns a slot as generated Python, a few here) and, where the
//! program writes an argument in place, that the module tensors it was given are those whose
//! memory facts it holds (`same_objects`: ~11 ns a tensor through `all(map(is_, ...))`). Nothing
//! here calls back into Python, so the objects compared cannot change under a check.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

/// The `(store, name, tensor)` slots of a module binding and the tensors they held at a call:
/// `holds()` tells whether each store still holds its tensor under its name.
#[pyclass(frozen, module = "thunder_rs._core", name = "SlotIdentity")]
pub struct SlotIdentity {
    slots: Vec<(Py<PyDict>, Py<PyAny>, Py<PyAny>)>,
}

#[pymethods]
impl SlotIdentity {
    #[new]
    fn new(slots: Vec<(Bound<'_, PyDict>, Bound<'_, PyAny>, Bound<'_, PyAny>)>) -> Self {
        let slots = slots.into_iter().map(|(d, n, t)| (d.unbind(), n.unbind(), t.unbind())).collect();
        SlotIdentity { slots }
    }

    /// Whether every store holds its tensor under its name (false for an emptied slot). A name's
    /// hash is the only Python code a lookup runs: the names are strings.
    fn holds(&self, py: Python<'_>) -> PyResult<bool> {
        for (store, name, tensor) in &self.slots {
            // SAFETY: the GIL is held (`py`) and the store and name are alive (held here); the
            // borrowed reference found is only compared by address.
            let found = unsafe { ffi::PyDict_GetItemWithError(store.as_ptr(), name.as_ptr()) };
            if found != tensor.as_ptr() {
                return match PyErr::take(py) {
                    Some(error) => Err(error),
                    None => Ok(false),
                };
            }
        }
        Ok(true)
    }

    fn __len__(&self) -> usize {
        self.slots.len()
    }
}

/// Whether `items[start:start + len(objects)]` are the objects of `objects`, each the same one.
#[pyfunction]
pub fn same_objects(items: &Bound<'_, PyTuple>, start: usize, objects: &Bound<'_, PyList>) -> bool {
    let n = objects.len();
    if start + n > items.len() {
        return false;
    }
    let (items, objects) = (items.as_ptr(), objects.as_ptr());
    // SAFETY: the GIL is held (the arguments are bound) and both indices are in bounds (checked
    // above); the borrowed references are only compared by address, and nothing here runs Python
    // code that could change the list meanwhile.
    (0..n).all(|i| unsafe {
        ffi::PyTuple_GetItem(items, (start + i) as ffi::Py_ssize_t)
            == ffi::PyList_GetItem(objects, i as ffi::Py_ssize_t)
    })
}

/// Offset of `ma_version_tag` in CPython's `PyDictObject` (after `PyObject_HEAD` and `ma_used`):
/// the same on 3.10 to 3.13, which stamp it from one interpreter-wide counter at every change of
/// the dict. 3.14 dropped the stamp (`dict_versions_stamped` tells).
const DICT_VERSION_OFFSET: usize = std::mem::size_of::<ffi::PyObject>() + std::mem::size_of::<ffi::Py_ssize_t>();

/// Whether this interpreter stamps each dict change into the dict (`newest_dict_version` reads
/// the stamp): CPython 3.10 to 3.12, those checked.
#[pyfunction]
pub fn dict_versions_stamped(py: Python<'_>) -> bool {
    let version = py.version_info();
    (version.major, version.minor) >= (3, 10) && (version.major, version.minor) < (3, 13)
}

/// Dicts (instance dicts and stores of modules) whose changes a cache entry watches: `newest()`
/// is the newest change stamp among them, which grows when any of them changes, however written
/// (`module.__dict__[k] = v`, `vars(m)[k] = v`, `object.__setattr__`, none of which
/// `nn.Module.__setattr__` sees), since each change stamps its dict with the interpreter's next
/// version. Only where `dict_versions_stamped()`; a few ns a dict.
#[pyclass(frozen, module = "thunder_rs._core", name = "DictStamps")]
pub struct DictStamps {
    dicts: Vec<Py<PyDict>>,
}

#[pymethods]
impl DictStamps {
    #[new]
    fn new(dicts: Vec<Bound<'_, PyDict>>) -> Self {
        DictStamps { dicts: dicts.into_iter().map(Bound::unbind).collect() }
    }

    fn newest(&self) -> u64 {
        self.dicts
            .iter()
            // SAFETY: the GIL is held (a method of a Python object runs under it) and each dict is
            // alive (held here), so its `PyDictObject` header, `ma_version_tag` included, is
            // readable at this offset; nothing is written.
            .map(|d| unsafe { std::ptr::read((d.as_ptr() as *const u8).add(DICT_VERSION_OFFSET) as *const u64) })
            .max()
            .unwrap_or(0)
    }

    fn __len__(&self) -> usize {
        self.dicts.len()
    }
}

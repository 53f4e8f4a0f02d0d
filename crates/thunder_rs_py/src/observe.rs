//! Which Python functions run while a program is traced.
//!
//! Guards on Python state need to know which code objects the traced program ran, and with which
//! arguments. A Python-level `sys.setprofile` hook doubles acquisition time (every call, including
//! thunder_rs's and torch's own, pays a Python call); this C-level hook answers most calls with a
//! hash lookup on the code object's address and calls back into Python only for the first call of
//! each code object (`classify(code) -> flags`) and for calls of code objects marked interesting
//! (`on_call(frame, importing)`) and returns of those marked for them (`on_return(frame,
//! importing, value)`, `value` what the frame returns, None when it raises: by `classify`, or by
//! `on_call` returning true for that code).
//!
//! Module bodies (marked by `classify`) started while the hook is set are kept on a stack:
//! `importing` is whether one runs now, so that the callbacks look for an import between the frame
//! and the program's entry (a walk up the stack) only when one may be there.
//!
//! Some state is read by C functions no Python frame wraps (`datetime.datetime.now()`): calls any
//! frame makes to a builtin bound to one of the `watch_c_calls` owners (a type or a module, a
//! subclass of the type, or an instance of it: `f.write` on a file object) go to
//! `on_c_call(frame, function, importing, interesting)`, whose error is raised at that call;
//! `interesting`: the frame's code is (the standard library's `json.dump` writes for the program).
//! Whether a type is an owner or derives from one is decided once per type while the hook is
//! started (`kinds`), so that a builtin call costs two hash lookups, not a walk of every owner's
//! subclass check.

use pyo3::ffi;
use pyo3::prelude::*;
use rustc_hash::{FxHashMap, FxHashSet};
use std::os::raw::c_int;

type TraceFunc = unsafe extern "C" fn(*mut ffi::PyObject, *mut ffi::PyFrameObject, c_int, *mut ffi::PyObject) -> c_int;

extern "C" {
    // Part of CPython's C API on every supported version (not of the limited API, whose wheels
    // still find it in the running interpreter).
    fn PyEval_SetProfile(func: Option<TraceFunc>, obj: *mut ffi::PyObject);
}

/// `PyTrace_CALL`: a Python function's frame starts.
const PY_TRACE_CALL: c_int = 0;
/// `PyTrace_RETURN`: a Python function's frame ends (returning or raising).
const PY_TRACE_RETURN: c_int = 3;
/// `PyTrace_C_CALL`: a builtin (C) function is about to be called; `arg` is the function.
const PY_TRACE_C_CALL: c_int = 4;

/// `classify`'s flags: calls of the code go to `on_call`.
const CALL: u8 = 1;
/// Returns of the code go to `on_return`.
const RETURN: u8 = 2;
/// The code is a module body (a frame of it runs an import).
const MODULE: u8 = 4;

/// The profile hook's state: which code objects are interesting, and whom to tell.
#[pyclass(unsendable, module = "thunder_rs._core", name = "CallObserver")]
pub struct CallObserver {
    /// Code object address -> its flags (`CALL`, `RETURN`, `MODULE`). Codes are kept alive in
    /// `codes` so an address is never reused for another code object while it is in this table.
    decisions: FxHashMap<usize, u8>,
    codes: Vec<Py<PyAny>>,
    classify: Py<PyAny>,
    on_call: Py<PyAny>,
    on_return: Py<PyAny>,
    /// Addresses of the objects (kept in `owner_refs`) whose builtins' calls go to `on_c_call`.
    owners: FxHashSet<usize>,
    owner_refs: Vec<Py<PyAny>>,
    /// Type address -> whether it is one of the owners that are types or a subclass of one,
    /// decided at a builtin's first call bound to it (or to an instance of it); the types are
    /// kept in `kind_refs` until `stop` so an address is not reused while it is in this table.
    kinds: FxHashMap<usize, bool>,
    kind_refs: Vec<Py<PyAny>>,
    on_c_call: Option<Py<PyAny>>,
    /// The first Python error a callback raised; reported by `stop`.
    error: Option<PyErr>,
    /// Whether the hook is installed (between `start` and `stop`), and whether it is paused.
    started: bool,
    paused: bool,
    /// The frames of module bodies running, started since `start` (innermost last).
    modules: Vec<usize>,
}

#[pymethods]
impl CallObserver {
    #[new]
    fn new(classify: Py<PyAny>, on_call: Py<PyAny>, on_return: Py<PyAny>) -> Self {
        CallObserver {
            decisions: FxHashMap::default(),
            codes: Vec::new(),
            classify,
            on_call,
            on_return,
            owners: FxHashSet::default(),
            owner_refs: Vec::new(),
            kinds: FxHashMap::default(),
            kind_refs: Vec::new(),
            on_c_call: None,
            error: None,
            started: false,
            paused: false,
            modules: Vec::new(),
        }
    }

    /// Calls of builtins bound to one of `owners` (their `__self__`; a subclass or an instance of
    /// an owner that is a type) go to `on_c_call(frame, function, importing, interesting)`
    /// (`interesting`: the calling frame's code is); an error it raises is raised at that call.
    fn watch_c_calls(&mut self, owners: Vec<Py<PyAny>>, on_c_call: Py<PyAny>) {
        self.owners = owners.iter().map(|o| o.as_ptr() as usize).collect();
        self.owner_refs = owners;
        self.forget_kinds();
        self.on_c_call = Some(on_c_call);
    }

    /// Installs the hook on the calling thread (profile hooks are per thread).
    fn start(slf: &Bound<'_, Self>) {
        {
            let mut this = slf.borrow_mut();
            this.started = true;
            this.paused = false;
            this.modules.clear();
        }
        install(slf);
    }

    /// Removes the hook from the calling thread; raises the first error a callback raised. The
    /// types whose builtins it saw are let go (a class the program made is not kept alive).
    fn stop(&mut self) -> PyResult<()> {
        self.started = false;
        uninstall();
        self.forget_kinds();
        self.error.take().map_or(Ok(()), Err)
    }

    /// Removes the hook while thunder_rs handles a torch call of the program: nothing that runs
    /// there is the program's, and CPython runs every instruction slower while a hook is set.
    fn pause(&mut self) {
        if self.started && !self.paused {
            self.paused = true;
            uninstall();
        }
    }

    /// Installs the hook again after `pause`.
    fn resume(slf: &Bound<'_, Self>) {
        let resumed = {
            let mut this = slf.borrow_mut();
            let resumed = this.started && this.paused;
            this.paused = false;
            resumed
        };
        if resumed {
            install(slf);
        }
    }
}

fn install(observer: &Bound<'_, CallObserver>) {
    // SAFETY: the GIL is held; CPython takes a new reference to the observer for as long as the
    // hook is installed.
    unsafe { PyEval_SetProfile(Some(profile), observer.as_ptr()) }
}

fn uninstall() {
    // SAFETY: the GIL is held.
    unsafe { PyEval_SetProfile(None, std::ptr::null_mut()) }
}

impl CallObserver {
    /// Whether `owner`, a builtin's `__self__`, is watched: one of `owners`, a subclass of one
    /// (`class Stamp(datetime.datetime)`), or an instance of one (a file object's `write`).
    fn watches(&mut self, py: Python<'_>, owner: *mut ffi::PyObject) -> bool {
        if owner.is_null() {
            return false;
        }
        if self.owners.contains(&(owner as usize)) {
            return true;
        }
        // SAFETY: the GIL is held; `owner` is a live object.
        let is_type = unsafe { ffi::PyType_Check(owner) != 0 };
        let kind: *mut ffi::PyObject = if is_type { owner } else { unsafe { ffi::Py_TYPE(owner) }.cast() };
        if let Some(&known) = self.kinds.get(&(kind as usize)) {
            return known;
        }
        let watched = self.owner_refs.iter().any(|o| unsafe {
            ffi::PyType_Check(o.as_ptr()) != 0 && ffi::PyType_IsSubtype(kind.cast(), o.as_ptr().cast()) != 0
        });
        self.kinds.insert(kind as usize, watched);
        // SAFETY: the GIL is held; `kind` is a live type (the owner's, or the owner itself).
        self.kind_refs.push(unsafe { Bound::from_borrowed_ptr(py, kind) }.unbind());
        watched
    }

    /// Lets go of the decisions of `watches` by type: a type's bases may be assigned between
    /// traces, and the types are not kept alive past one.
    fn forget_kinds(&mut self) {
        self.kinds.clear();
        self.kind_refs.clear();
    }

    /// The flags of `code`, asking `classify` on its first call.
    fn flags(&mut self, py: Python<'_>, code: Bound<'_, PyAny>) -> u8 {
        let address = code.as_ptr() as usize;
        if let Some(&known) = self.decisions.get(&address) {
            return known;
        }
        let decision = match self.classify.call1(py, (&code,)).and_then(|d| d.extract::<u8>(py)) {
            Ok(d) => d,
            Err(e) => {
                self.error.get_or_insert(e);
                0
            }
        };
        self.decisions.insert(address, decision);
        self.codes.push(code.unbind());
        decision
    }
}

unsafe extern "C" fn profile(
    obj: *mut ffi::PyObject,
    frame: *mut ffi::PyFrameObject,
    what: c_int,
    arg: *mut ffi::PyObject,
) -> c_int {
    if what == PY_TRACE_C_CALL && !frame.is_null() && !arg.is_null() {
        // SAFETY: as below; `arg` is the function about to be called.
        return unsafe { c_call(obj, frame, arg) };
    }
    if (what != PY_TRACE_CALL && what != PY_TRACE_RETURN) || frame.is_null() {
        return 0;
    }
    // SAFETY: CPython calls profile hooks with the GIL held, `obj` is the observer passed to
    // `PyEval_SetProfile` and `frame` a live frame.
    let py = unsafe { Python::assume_attached() };
    let Ok(observer) = unsafe { Bound::from_borrowed_ptr(py, obj) }.cast_into::<CallObserver>() else {
        return 0;
    };
    let Ok(mut observer) = observer.try_borrow_mut() else {
        return 0; // a callback of this observer is running: calls it makes are not the program's
    };
    let code = unsafe { Bound::from_owned_ptr(py, ffi::PyFrame_GetCode(frame).cast()) };
    let address = code.as_ptr() as usize;
    let flags = if what == PY_TRACE_CALL {
        observer.flags(py, code)
    } else {
        // A return without a call seen (the hook started inside the frame) is not reported.
        observer.decisions.get(&address).copied().unwrap_or(0)
    };
    if flags & MODULE != 0 {
        if what == PY_TRACE_CALL {
            observer.modules.push(frame as usize);
        } else if observer.modules.last() == Some(&(frame as usize)) {
            observer.modules.pop();
        }
    }
    let wanted = if what == PY_TRACE_CALL { CALL } else { RETURN };
    if flags & wanted == 0 {
        return 0;
    }
    let importing = !observer.modules.is_empty();
    let frame = unsafe { Bound::from_borrowed_ptr(py, frame.cast()) };
    let called = if what == PY_TRACE_CALL {
        observer.on_call.call1(py, (frame, importing))
    } else {
        // SAFETY: for `PyTrace_RETURN`, `arg` is the value returned (borrowed), null when raising.
        let value = if arg.is_null() { py.None() } else { unsafe { Bound::from_borrowed_ptr(py, arg) }.unbind() };
        observer.on_return.call1(py, (frame, importing, value))
    };
    match called {
        Ok(returns) => {
            // `on_call` true: this code's returns are wanted too, from now on.
            if what == PY_TRACE_CALL && flags & RETURN == 0 && returns.bind(py).is_truthy().unwrap_or(false) {
                observer.decisions.insert(address, flags | RETURN);
            }
        }
        Err(e) => {
            observer.error.get_or_insert(e);
        }
    }
    0
}

/// A builtin called by a frame: `on_c_call(frame, function, importing, interesting)` when the
/// builtin is bound to a watched owner; -1 with its error set when it raised.
unsafe fn c_call(obj: *mut ffi::PyObject, frame: *mut ffi::PyFrameObject, function: *mut ffi::PyObject) -> c_int {
    // SAFETY: the GIL is held (a profile hook), `obj` is the observer, `frame` and `function` live.
    let py = unsafe { Python::assume_attached() };
    if unsafe { ffi::PyCFunction_Check(function) } == 0 {
        return 0;
    }
    let Ok(observer) = unsafe { Bound::from_borrowed_ptr(py, obj) }.cast_into::<CallObserver>() else {
        return 0;
    };
    let callback = {
        let Ok(mut observer) = observer.try_borrow_mut() else {
            return 0;
        };
        let owner = unsafe { ffi::PyCFunction_GetSelf(function) };
        if observer.on_c_call.is_none() || !observer.watches(py, owner) {
            return 0;
        }
        let Some(callback) = observer.on_c_call.as_ref() else {
            return 0;
        };
        let code = unsafe { Bound::<PyAny>::from_owned_ptr(py, ffi::PyFrame_GetCode(frame).cast()) };
        let interesting = observer.decisions.get(&(code.as_ptr() as usize)).copied().unwrap_or(0) & CALL != 0;
        (callback.clone_ref(py), !observer.modules.is_empty(), interesting)
    };
    let (callback, importing, interesting) = callback;
    let frame = unsafe { Bound::<PyAny>::from_borrowed_ptr(py, frame.cast()) };
    let function = unsafe { Bound::<PyAny>::from_borrowed_ptr(py, function) };
    match callback.call1(py, (frame, function, importing, interesting)) {
        Ok(_) => 0,
        Err(e) => {
            e.restore(py);
            -1
        }
    }
}

/// A `gc.callbacks` entry that a `KeyboardInterrupt` does not lose. CPython reports what a
/// collection's callback raises as unraisable and goes on, so Ctrl-C landing in thunder_rs's
/// callbacks (`core.state.collector`) would be swallowed and its bookkeeping left half done.
/// `func` is called again until it returns without one (it runs its step once: a call the
/// interrupt stopped on entry did nothing), and the callback made with `rearm` (the collection's
/// last) makes the interrupt pending again when it returns, for the code the collection
/// interrupted; other errors are raised as before.
#[pyclass(module = "thunder_rs._core", name = "GcCallback", frozen)]
pub struct GcCallback {
    func: Py<PyAny>,
    rearm: bool,
}

/// Whether a `KeyboardInterrupt` was caught in a collection's callback since the last re-arming.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `SIGINT`'s number (the same on every platform CPython runs on).
const SIGINT: c_int = 2;

#[pymethods]
impl GcCallback {
    #[new]
    fn new(func: Py<PyAny>, rearm: bool) -> Self {
        GcCallback { func, rearm }
    }

    #[getter]
    fn func(&self, py: Python<'_>) -> Py<PyAny> {
        self.func.clone_ref(py)
    }

    fn __call__(&self, py: Python<'_>, phase: Py<PyAny>, info: Py<PyAny>) -> PyResult<()> {
        use std::sync::atomic::Ordering;
        let mut result = Ok(());
        for _ in 0..64 {
            match self.func.call1(py, (phase.clone_ref(py), info.clone_ref(py))) {
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) => {
                    INTERRUPTED.store(true, Ordering::Relaxed);
                }
                other => {
                    result = other.map(drop);
                    break;
                }
            }
        }
        if self.rearm && INTERRUPTED.swap(false, Ordering::Relaxed) {
            // SAFETY: the GIL is held; this only marks the signal pending (its handler runs at the
            // interpreter's next check, in the code the collection interrupted).
            unsafe { ffi::PyErr_SetInterruptEx(SIGINT) };
        }
        result
    }
}

//! The process-wide table of composite and fallback symbols.
//!
//! Python registers each `ltorch` symbol once at import (and each fallback the first time it is
//! seen); traces then refer to symbols by [`SymbolId`]. The table only grows, so ids stay valid
//! for the life of the process.

use crate::ids::SymbolId;
use rustc_hash::FxHashMap;
use std::sync::{Arc, OnceLock, RwLock};

/// What kind of non-prim symbol an id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SymbolKind {
    /// A Python decomposition (`ltorch.softmax`): its bound symbols carry their decomposition.
    Composite,
    /// A torch call with no decomposition, run eagerly by torch (`torch.cumsum`).
    Fallback,
    /// A fallback run for its effect on state outside the trace, such as the random number
    /// generator (`torch.manual_seed`, `torch.randint`): kept, unmerged and in program order.
    Effect,
}

#[derive(Default)]
struct Table {
    names: Vec<Arc<str>>,
    kinds: Vec<SymbolKind>,
    by_name: FxHashMap<Arc<str>, SymbolId>,
}

/// Handle to the global symbol table.
pub struct SymbolTable;

fn table() -> &'static RwLock<Table> {
    static TABLE: OnceLock<RwLock<Table>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

impl SymbolTable {
    /// Registers `name` (or returns its id if already registered with the same kind).
    pub fn register(name: &str, kind: SymbolKind) -> SymbolId {
        if let Some(id) = table().read().expect("symbol table poisoned").by_name.get(name) {
            return *id;
        }
        let mut t = table().write().expect("symbol table poisoned");
        if let Some(id) = t.by_name.get(name) {
            return *id;
        }
        let id = SymbolId(t.names.len() as u32);
        let name: Arc<str> = name.into();
        t.names.push(name.clone());
        t.kinds.push(kind);
        t.by_name.insert(name, id);
        id
    }

    /// The name `id` was registered under, as printed in traces (`ltorch.softmax`).
    ///
    /// # Panics
    /// If `id` was not returned by [`register`](Self::register) in this process.
    pub fn name(id: SymbolId) -> Arc<str> {
        table().read().expect("symbol table poisoned").names[id.index()].clone()
    }

    /// The kind `id` was first registered with.
    ///
    /// # Panics
    /// If `id` was not returned by [`register`](Self::register) in this process.
    pub fn kind(id: SymbolId) -> SymbolKind {
        table().read().expect("symbol table poisoned").kinds[id.index()]
    }

    /// The id of `name` if it was registered, without registering it (the parser and the binary
    /// decoder use it to tell a known symbol from an unknown one).
    pub fn lookup(name: &str) -> Option<SymbolId> {
        table().read().expect("symbol table poisoned").by_name.get(name).copied()
    }
}

//! Entity ids: `u32` newtypes indexing the arenas of a trace.
//!
//! Values are never named by strings inside the IR; a value's printed name (`t12`) is derived
//! from its id and kind when a trace is printed. Keeping ids small and `Copy` lets passes use
//! side tables (`Vec<T>` indexed by id) instead of hash maps keyed by names, as cranelift does.

use std::fmt;

macro_rules! entity {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
        pub struct $name(pub u32);

        impl $name {
            /// The position of this entity in its arena.
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

entity!(
    /// A value (tensor or number) of a trace.
    ValueId,
    "t"
);
entity!(
    /// A composite or fallback symbol registered in the process-wide [`crate::SymbolTable`].
    SymbolId,
    "sym"
);

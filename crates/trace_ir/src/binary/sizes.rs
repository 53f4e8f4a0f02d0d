//! Sizes, expressions and guards in the binary form (layout in the module doc).

use super::decode::Reader;
use super::encode::Writer;
use crate::error::Result;
use crate::sym::{Atom, Dim, Facts, Guard, Poly, Rel};
use crate::ValueId;
use std::sync::Arc;

const ATOM_VALUE: u8 = 0;
const ATOM_FLOORDIV: u8 = 1;
const ATOM_MOD: u8 = 2;

impl Writer {
    /// A constant as its zigzag code shifted left (as compact as the plain int it was before
    /// sizes could be symbolic), a symbolic size as 1 then its expression and hint.
    pub(super) fn dim(&mut self, d: &Dim) {
        match d {
            Dim::Const(c) => self.uint((((*c << 1) ^ (*c >> 63)) as u64) << 1),
            Dim::Sym(s) => {
                self.uint(1);
                self.poly(&s.expr);
                self.int(s.hint);
            }
        }
    }

    pub(super) fn poly(&mut self, p: &Poly) {
        self.uint(p.terms().len() as u64);
        for (atoms, c) in p.terms() {
            self.int(*c);
            self.uint(atoms.len() as u64);
            atoms.iter().for_each(|a| self.atom(a));
        }
    }

    fn atom(&mut self, a: &Atom) {
        match a {
            Atom::Value(v) => {
                self.out.push(ATOM_VALUE);
                self.uint(v.0 as u64);
            }
            Atom::FloorDiv(p, k) | Atom::Mod(p, k) => {
                self.out.push(if matches!(a, Atom::FloorDiv(..)) { ATOM_FLOORDIV } else { ATOM_MOD });
                self.poly(p);
                self.int(*k);
            }
        }
    }

    pub(super) fn facts(&mut self, facts: &Facts) {
        let counts: Vec<ValueId> = facts.counts().collect();
        self.uint(counts.len() as u64);
        counts.iter().for_each(|v| self.uint(v.0 as u64));
        self.uint(facts.guards().len() as u64);
        for g in facts.guards() {
            self.out.push(match g.rel {
                Rel::Eq => 0,
                Rel::Ne => 1,
                Rel::Ge => 2,
            });
            self.poly(&g.expr);
        }
    }
}

impl Reader<'_> {
    /// A size whose atoms are still wire ids (a value table entry, renumbered when first
    /// mentioned).
    pub(super) fn wire_dim(&mut self, depth: usize) -> Result<Dim> {
        match self.uint()? {
            1 => {
                let expr = self.poly(depth, &mut |_, wire| Ok(ValueId(wire)))?;
                Ok(Dim::from_poly(expr, self.int()?))
            }
            code if code & 1 == 0 => {
                let zigzag = code >> 1;
                Ok(Dim::Const((zigzag >> 1) as i64 ^ -((zigzag & 1) as i64)))
            }
            other => Err(self.error(format!("unknown size code {other}"))),
        }
    }

    /// An expression, each atom's wire id mapped by `id`.
    pub(super) fn poly(
        &mut self,
        depth: usize,
        id: &mut impl FnMut(&mut Self, u32) -> Result<ValueId>,
    ) -> Result<Poly> {
        if depth > super::MAX_DEPTH {
            return Err(self.error(format!("expressions nested deeper than {}", super::MAX_DEPTH)));
        }
        let n = self.count()?;
        let mut terms = Vec::with_capacity(n);
        for _ in 0..n {
            let c = self.int()?;
            let k = self.count()?;
            let mut atoms = Vec::with_capacity(k);
            for _ in 0..k {
                atoms.push(self.atom(depth, id)?);
            }
            terms.push((atoms, c));
        }
        Ok(Poly::from_terms(terms))
    }

    fn atom(&mut self, depth: usize, id: &mut impl FnMut(&mut Self, u32) -> Result<ValueId>) -> Result<Atom> {
        match self.byte()? {
            ATOM_VALUE => {
                let wire = self.u32("value id")?;
                Ok(Atom::Value(id(self, wire)?))
            }
            tag @ (ATOM_FLOORDIV | ATOM_MOD) => {
                let p = Arc::new(self.poly(depth + 1, id)?);
                let k = self.int()?;
                if k <= 0 {
                    return Err(self.error(format!("a size divided by {k}")));
                }
                Ok(if tag == ATOM_FLOORDIV { Atom::FloorDiv(p, k) } else { Atom::Mod(p, k) })
            }
            other => Err(self.error(format!("unknown expression atom tag {other}"))),
        }
    }

    /// An expression in the body, its values renumbered as mentioned.
    pub(super) fn body_poly(&mut self) -> Result<Poly> {
        self.poly(0, &mut |r, wire| r.mention(wire))
    }

    pub(super) fn facts(&mut self) -> Result<Facts> {
        let mut facts = Facts::default();
        for _ in 0..self.count()? {
            let wire = self.u32("count value id")?;
            facts.count(self.mention(wire)?);
        }
        let n = self.count()?;
        for _ in 0..n {
            let rel = match self.byte()? {
                0 => Rel::Eq,
                1 => Rel::Ne,
                2 => Rel::Ge,
                other => return Err(self.error(format!("unknown guard relation {other}"))),
            };
            facts.assume(Guard { expr: self.body_poly()?, rel });
        }
        Ok(facts)
    }
}

//! Sizes that may change between calls: [`Dim`], a constant or a symbolic expression over size
//! values of the trace, and [`Facts`], the relations between sizes a trace relied on.
//!
//! A symbolic size is an integer polynomial ([`Poly`]) over *atoms*: number values of the trace
//! that stand for sizes read from the inputs ([`crate::ValueKind::Size`]), and the floor division
//! or remainder of a polynomial by a positive constant (`t3 // 2`). Polynomials are kept in one
//! canonical form (sorted monomials, no zero coefficient), so two expressions of the same size are
//! equal as data: `2*t3` built as `t3 + t3` or `t3 * 2` is one `Poly`. Each symbolic size carries
//! its *hint*, the value it had when the trace was recorded.
//!
//! Meta rules decide on hints. A decision that holds for the expressions themselves (`t3 == t3`,
//! `2*t3 >= t3`... as data, not as proofs: only structural equality is used) needs nothing; a
//! decision that held only for the hints (`t3 == t5` because both were 7, `t3 != 4`) is recorded
//! in [`Facts`] as a [`Guard`] that the compiled program checks on every call, so a call where it
//! does not hold misses the cache instead of running a program that would compute something else.
//! Sizes are at least 2 (0 and 1 stay constant), so `t3 != 1` needs no guard either; except
//! *counts*, sizes a call computes from values (the count of `nonzero`'s indices), which may be 0
//! or 1 where the trace relied on nothing else ([`Facts::count`]): `t3 != 1` of a count is a guard.
//!
//! ```
//! use trace_ir::sym::{Dim, Facts, Rel};
//! use trace_ir::ValueId;
//!
//! let t = Dim::size(ValueId(3), 7); // the size `t3`, 7 when recorded
//! let doubled = t.mul(&Dim::Const(2));
//! assert_eq!(doubled, t.add(&t));
//! assert_eq!((doubled.to_string(), doubled.hint()), ("2*t3".to_string(), 14));
//! assert_eq!(doubled.floordiv(2), t);
//!
//! let mut facts = Facts::default();
//! assert!(facts.equal(&t, &t)); // holds as data: nothing to check
//! assert!(facts.is_empty());
//! assert!(!facts.equal(&t, &Dim::Const(1))); // sizes are at least 2: nothing to check
//! assert!(facts.is_empty());
//! assert!(!facts.equal(&t, &Dim::Const(4))); // held for the hint only
//! assert_eq!(facts.guards()[0].rel, Rel::Ne);
//! assert_eq!(facts.guards()[0].to_string(), "t3 - 4 != 0");
//! ```

use crate::ValueId;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

/// A factor of a monomial.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Atom {
    /// A size value of the trace (`t3`).
    Value(ValueId),
    /// `p // k` (Python's floor division), `k > 0`, where `p` is not a multiple of `k` as data.
    FloorDiv(Arc<Poly>, i64),
    /// `p % k` (Python's remainder, never negative), `k > 0`.
    Mod(Arc<Poly>, i64),
}

/// A product of atoms, sorted; the empty product is the constant term's.
type Monomial = Vec<Atom>;

/// An integer polynomial in canonical form: its terms sorted by monomial, no zero coefficient.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Poly {
    terms: Vec<(Monomial, i64)>,
}

impl Poly {
    /// The constant `c`.
    pub fn constant(c: i64) -> Poly {
        Poly::from_terms(vec![(Vec::new(), c)])
    }

    /// The atom `a` alone.
    pub fn atom(a: Atom) -> Poly {
        Poly::from_terms(vec![(vec![a], 1)])
    }

    /// The terms: each a sorted product of atoms (empty for the constant) and its coefficient.
    pub fn terms(&self) -> &[(Vec<Atom>, i64)] {
        &self.terms
    }

    /// The polynomial with these terms, brought to canonical form.
    pub fn from_terms(mut terms: Vec<(Vec<Atom>, i64)>) -> Poly {
        terms.iter_mut().for_each(|(m, _)| m.sort());
        terms.sort_by(|a, b| a.0.cmp(&b.0));
        let mut merged: Vec<(Monomial, i64)> = Vec::with_capacity(terms.len());
        for (m, c) in terms {
            match merged.last_mut() {
                Some((last, sum)) if *last == m => *sum += c,
                _ => merged.push((m, c)),
            }
        }
        merged.retain(|(_, c)| *c != 0);
        Poly { terms: merged }.with_whole_multiples()
    }

    /// `self` with a remainder term `c * (e % k)` written `c*e - c*k*(e // k)` where that makes the
    /// terms on `e`'s monomials multiples of `k`: a size padded up to a multiple of `k`
    /// (`x + (3*x) % 4`, from `x + (4 - x % 4) % 4`) is `4*x - 4*((3*x) // 4)`, so its `// 4` and
    /// `% 4` are exact and a view into windows of `k` divides its element count.
    fn with_whole_multiples(self) -> Poly {
        let found = self.terms.iter().enumerate().find_map(|(i, (m, c))| match m.as_slice() {
            [Atom::Mod(e, k)] if self.completes(e, *c, *k) => Some((i, e.clone(), *c, *k)),
            _ => None,
        });
        let Some((i, e, c, k)) = found else { return self };
        let Some(ck) = c.checked_mul(k).and_then(i64::checked_neg) else { return self }; // (kept as it is)
        let mut rest = self.terms;
        rest.remove(i);
        Poly { terms: rest }.add(&e.scale(c)).add(&e.floordiv(k).scale(ck))
    }

    /// Whether `c*e` makes the terms of `self` on `e`'s monomials multiples of `k`, one of them
    /// there before.
    fn completes(&self, e: &Poly, c: i64, k: i64) -> bool {
        let on = |m: &Monomial| self.terms.iter().find(|(n, _)| n == m).map_or(0, |(_, c)| *c);
        // (in i128: `on(m) + c * ce` may leave i64, where `c` is a large multiple)
        let whole = |m: &Monomial, ce: i64| (i128::from(on(m)) + i128::from(c) * i128::from(ce)) % i128::from(k) == 0;
        e.terms.iter().any(|(m, _)| on(m) != 0) && e.terms.iter().all(|(m, ce)| whole(m, *ce))
    }

    /// `self` with every remainder by a multiple of `k` among its factors replaced by what it
    /// divides (`(3*(x % 4)) % 4` is `(3*x) % 4`), for a remainder by `k`; None where there is none.
    fn without_remainders_by_multiples_of(&self, k: i64) -> Option<Poly> {
        let inner = |a: &Atom| matches!(a, Atom::Mod(_, j) if j % k == 0);
        if !self.terms.iter().any(|(m, _)| m.iter().any(inner)) {
            return None;
        }
        let mut out = Poly::default();
        for (m, c) in &self.terms {
            let mut term = Poly::constant(*c);
            for a in m {
                term = term.mul(&match a {
                    Atom::Mod(p, j) if j % k == 0 => (**p).clone(),
                    _ => Poly::atom(a.clone()),
                });
            }
            out = out.add(&term);
        }
        Some(out)
    }

    /// The constant term.
    pub fn as_constant_term(&self) -> i64 {
        self.terms.iter().find(|(m, _)| m.is_empty()).map_or(0, |(_, c)| *c)
    }

    /// The value when the polynomial has no atom.
    pub fn as_constant(&self) -> Option<i64> {
        match self.terms.as_slice() {
            [] => Some(0),
            [(m, c)] if m.is_empty() => Some(*c),
            _ => None,
        }
    }

    /// Whether the polynomial is never negative, whatever the sizes: no negative coefficient,
    /// over atoms that are never negative (sizes are not; a remainder is not; a floor division
    /// is not when what it divides is not).
    pub fn is_nonnegative(&self) -> bool {
        self.terms.iter().all(|(m, c)| *c >= 0 && m.iter().all(Atom::is_nonnegative))
    }

    /// A lower bound of the polynomial where size value `v` is at least `least(v)` (a size of the
    /// inputs: 2, the entry checks it; a count: 0, see [`Facts::lower_bound`]), where every
    /// non-constant term's coefficient is positive; `None` otherwise. A remainder counts as at
    /// least 0, a floor division as its dividend's bound divided (`(t0 + 1) // 2` is at least 1).
    pub fn lower_bound_over(&self, least: &impl Fn(ValueId) -> i64) -> Option<i64> {
        let mut bound = 0i64;
        for (m, c) in &self.terms {
            if m.is_empty() {
                bound = bound.checked_add(*c)?;
                continue;
            }
            if *c < 0 {
                return None;
            }
            let atoms = m.iter().map(|a| a.lower_bound(least)).collect::<Option<Vec<i64>>>()?;
            // A product's bound is the product of its factors' only where none can be negative.
            if atoms.len() > 1 && atoms.iter().any(|&b| b < 0) {
                return None;
            }
            let least = atoms.iter().try_fold(1i64, |p, &b| p.checked_mul(b))?;
            bound = bound.checked_add(c.checked_mul(least)?)?;
        }
        Some(bound)
    }

    /// `self / other` when `other` is one term (`c * atoms`) dividing every term of `self`
    /// exactly (`B*T*C / (B*T)` is `C`), or when `self` is `other` times one term
    /// (`(64*T - 64) / (32*T - 32)` is `2`: a view's `-1` over a length less one); `None`
    /// otherwise.
    pub fn exact_div(&self, other: &Poly) -> Option<Poly> {
        if other.terms.len() > 1 {
            return self.divide_by_a_multiple(other);
        }
        let [divisor] = other.terms.as_slice() else { return None };
        let terms = self.terms.iter().map(|term| divide_term(term, divisor)).collect::<Option<Vec<_>>>()?;
        Some(Poly::from_terms(terms))
    }

    /// The one term `q` with `other * q == self`, if there is one: `other`'s first term times
    /// `q` is one of `self`'s terms.
    fn divide_by_a_multiple(&self, other: &Poly) -> Option<Poly> {
        let first = other.terms.first()?;
        self.terms.iter().find_map(|term| {
            let q = Poly::from_terms(vec![divide_term(term, first)?]);
            (other.mul(&q) == *self).then_some(q)
        })
    }

    /// `self + other`.
    pub fn add(&self, other: &Poly) -> Poly {
        Poly::from_terms(self.terms.iter().chain(&other.terms).cloned().collect())
    }

    /// `self * k`.
    pub fn scale(&self, k: i64) -> Poly {
        Poly::from_terms(self.terms.iter().map(|(m, c)| (m.clone(), c * k)).collect())
    }

    /// `self * other`.
    pub fn mul(&self, other: &Poly) -> Poly {
        let mut terms = Vec::with_capacity(self.terms.len() * other.terms.len());
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                terms.push((ma.iter().chain(mb).cloned().collect(), ca * cb));
            }
        }
        Poly::from_terms(terms)
    }

    /// `self` as `k*q + r` with every coefficient of `r` in `0..k` (atoms are ints, so
    /// `self // k == q + r // k` and `self % k == r % k`).
    fn divide(&self, k: i64) -> (Poly, Poly) {
        let q = self.terms.iter().map(|(m, c)| (m.clone(), c.div_euclid(k))).collect();
        let r = self.terms.iter().map(|(m, c)| (m.clone(), c.rem_euclid(k))).collect();
        (Poly::from_terms(q), Poly::from_terms(r))
    }

    /// `self // k` for `k > 0` (Python's floor division): the multiples of `k` come out
    /// (`(2*t0 + 1) // 2` is `t0`), what is left is an atom.
    pub fn floordiv(&self, k: i64) -> Poly {
        assert!(k > 0, "floordiv by {k}");
        let (q, r) = self.divide(k);
        match r.as_constant() {
            Some(c) => q.add(&Poly::constant(c.div_euclid(k))),
            None => q.add(&Poly::atom(Atom::FloorDiv(Arc::new(r), k))),
        }
    }

    /// `self % k` for `k > 0` (Python's remainder, never negative).
    pub fn rem(&self, k: i64) -> Poly {
        assert!(k > 0, "rem by {k}");
        let (_, r) = self.divide(k);
        if let Some(c) = r.as_constant() {
            return Poly::constant(c.rem_euclid(k));
        }
        match r.without_remainders_by_multiples_of(k) {
            Some(simpler) => simpler.rem(k),
            None => Poly::atom(Atom::Mod(Arc::new(r), k)),
        }
    }

    /// The value with every size value `v` set to `value(v)`, or `None` where a product or a sum
    /// leaves `i64` (Python's int does not: the caller says so rather than use a wrapped value).
    pub fn eval(&self, value: &impl Fn(ValueId) -> i64) -> Option<i64> {
        self.terms.iter().try_fold(0i64, |sum, (m, c)| {
            let term = m.iter().try_fold(*c, |p, a| p.checked_mul(a.eval(value)?))?;
            sum.checked_add(term)
        })
    }

    /// The sum of the coefficients' magnitudes: no coefficient of a sum of polynomials exceeds the
    /// sum of theirs, nor of a product the product of theirs (saturating at `i128::MAX`).
    fn magnitude(&self) -> i128 {
        self.terms.iter().fold(0i128, |sum, (_, c)| sum.saturating_add(i128::from(*c).abs()))
    }

    /// Calls `f` on every size value the polynomial reads, in order, repeats included.
    pub fn for_each_value(&self, f: &mut impl FnMut(ValueId)) {
        for (m, _) in &self.terms {
            for a in m {
                match a {
                    Atom::Value(v) => f(*v),
                    Atom::FloorDiv(p, _) | Atom::Mod(p, _) => p.for_each_value(f),
                }
            }
        }
    }

    /// The same polynomial over other size values: each `v` replaced by the polynomial `f(v)`.
    pub fn substitute(&self, f: &mut impl FnMut(ValueId) -> Poly) -> Poly {
        let result: Result<Poly, std::convert::Infallible> = self.substitute_fallible(&mut |v| Ok(f(v)));
        match result {
            Ok(p) => p,
        }
    }

    /// [`Poly::substitute`] with a replacement that may fail.
    pub fn substitute_fallible<E>(&self, f: &mut impl FnMut(ValueId) -> Result<Poly, E>) -> Result<Poly, E> {
        let mut out = Poly::default();
        for (m, c) in &self.terms {
            let mut term = Poly::constant(*c);
            for a in m {
                let factor = match a {
                    Atom::Value(v) => f(*v)?,
                    Atom::FloorDiv(p, k) => p.substitute_fallible(f)?.floordiv(*k),
                    Atom::Mod(p, k) => p.substitute_fallible(f)?.rem(*k),
                };
                term = term.mul(&factor);
            }
            out = out.add(&term);
        }
        Ok(out)
    }
}

/// `term / divisor` when it divides exactly: the coefficient and every atom of the divisor's.
fn divide_term((m, k): &(Monomial, i64), (atoms, c): &(Monomial, i64)) -> Option<(Monomial, i64)> {
    if k % c != 0 {
        return None;
    }
    let mut rest = m.clone();
    for a in atoms {
        let at = rest.iter().position(|x| x == a)?;
        rest.remove(at);
    }
    Some((rest, k / c))
}

impl Atom {
    /// A lower bound where size value `v` is at least `least(v)` (see `Poly::lower_bound_over`).
    fn lower_bound(&self, least: &impl Fn(ValueId) -> i64) -> Option<i64> {
        match self {
            Atom::Value(v) => Some(least(*v)),
            Atom::Mod(..) => Some(0),
            Atom::FloorDiv(p, k) => p.lower_bound_over(least).map(|b| b.div_euclid(*k)),
        }
    }

    fn is_nonnegative(&self) -> bool {
        match self {
            Atom::Value(_) | Atom::Mod(..) => true,
            Atom::FloorDiv(p, _) => p.is_nonnegative(),
        }
    }

    fn eval(&self, value: &impl Fn(ValueId) -> i64) -> Option<i64> {
        match self {
            Atom::Value(v) => Some(value(*v)),
            Atom::FloorDiv(p, k) => Some(p.eval(value)?.div_euclid(*k)),
            Atom::Mod(p, k) => Some(p.eval(value)?.rem_euclid(*k)),
        }
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Value(v) => write!(f, "{v}"),
            Atom::FloorDiv(p, k) => write!(f, "({} // {k})", Operand(p)),
            Atom::Mod(p, k) => write!(f, "({} % {k})", Operand(p)),
        }
    }
}

/// A polynomial as the left operand of `//` or `%`: parenthesized unless it is one atom.
struct Operand<'a>(&'a Poly);

impl fmt::Display for Operand<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.terms.as_slice() {
            [(m, 1)] if m.len() == 1 => write!(f, "{}", self.0),
            _ => write!(f, "({})", self.0),
        }
    }
}

impl fmt::Display for Poly {
    /// Valid Python over the size values' names: `2*t3 + t5 - 1`, `(t3 + 1) // 2` as `((t3 + 1) // 2)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        // The constant term (the empty monomial, sorted first) prints last, as people write it.
        let ordered = self
            .terms
            .iter()
            .skip_while(|(m, _)| m.is_empty())
            .chain(self.terms.iter().take_while(|(m, _)| m.is_empty()));
        for (i, (m, c)) in ordered.enumerate() {
            let magnitude = c.unsigned_abs();
            match (i, *c < 0) {
                (0, true) => f.write_str("-")?,
                (0, false) => {}
                (_, true) => f.write_str(" - ")?,
                (_, false) => f.write_str(" + ")?,
            }
            if m.is_empty() {
                write!(f, "{magnitude}")?;
                continue;
            }
            if magnitude != 1 {
                write!(f, "{magnitude}*")?;
            }
            for (j, a) in m.iter().enumerate() {
                if j > 0 {
                    f.write_str("*")?;
                }
                write!(f, "{a}")?;
            }
        }
        Ok(())
    }
}

/// A symbolic size: its canonical expression and the value it had when recorded.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SymDim {
    /// The expression over size values.
    pub expr: Poly,
    /// Its value when the trace was recorded.
    pub hint: i64,
}

/// The size of a dimension, or a size parameter of a prim: a constant or a symbolic expression.
///
/// Equality is equality as data: `Dim::Const(7)` is not a symbolic size whose hint is 7. Rules
/// that compare sizes go through [`Facts`], which records what held only for hints. `{:?}` prints
/// as `{}` does, so a shape in an error message reads `[2, t3]`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A size known when compiling.
    Const(i64),
    /// A size computed from size values when the program runs.
    Sym(Arc<SymDim>),
}

impl From<i64> for Dim {
    fn from(c: i64) -> Dim {
        Dim::Const(c)
    }
}

impl Dim {
    /// The size value `v` (a [`crate::ValueKind::Size`]) whose hint is `hint`.
    pub fn size(v: ValueId, hint: i64) -> Dim {
        Dim::Sym(Arc::new(SymDim { expr: Poly::atom(Atom::Value(v)), hint }))
    }

    /// A size from its expression and hint; a constant when the expression has no atom.
    pub fn from_poly(expr: Poly, hint: i64) -> Dim {
        match expr.as_constant() {
            Some(c) => Dim::Const(c),
            None => Dim::Sym(Arc::new(SymDim { expr, hint })),
        }
    }

    /// The value when compiling: the constant, or the symbolic size's hint.
    pub fn hint(&self) -> i64 {
        match self {
            Dim::Const(c) => *c,
            Dim::Sym(s) => s.hint,
        }
    }

    /// The constant, or `None` for a symbolic size.
    pub fn as_const(&self) -> Option<i64> {
        match self {
            Dim::Const(c) => Some(*c),
            Dim::Sym(_) => None,
        }
    }

    /// Whether the size is computed when the program runs.
    pub fn is_sym(&self) -> bool {
        matches!(self, Dim::Sym(_))
    }

    /// The expression (a constant's is constant).
    pub fn poly(&self) -> Poly {
        match self {
            Dim::Const(c) => Poly::constant(*c),
            Dim::Sym(s) => s.expr.clone(),
        }
    }

    fn combine(&self, other: &Dim, poly: impl Fn(&Poly, &Poly) -> Poly, hint: impl Fn(i64, i64) -> i64) -> Dim {
        match (self, other) {
            (Dim::Const(a), Dim::Const(b)) => Dim::Const(hint(*a, *b)),
            _ => Dim::from_poly(poly(&self.poly(), &other.poly()), hint(self.hint(), other.hint())),
        }
    }

    /// `self + other`.
    pub fn add(&self, other: &Dim) -> Dim {
        self.combine(other, Poly::add, |a, b| a + b)
    }

    /// `self - other`.
    pub fn sub(&self, other: &Dim) -> Dim {
        self.combine(other, |a, b| a.add(&b.scale(-1)), |a, b| a - b)
    }

    /// `self * other`.
    pub fn mul(&self, other: &Dim) -> Dim {
        self.combine(other, Poly::mul, |a, b| a * b)
    }

    /// `self // k` for `k > 0` (Python's floor division).
    pub fn floordiv(&self, k: i64) -> Dim {
        match self {
            Dim::Const(c) => Dim::Const(c.div_euclid(k)),
            Dim::Sym(s) => Dim::from_poly(s.expr.floordiv(k), s.hint.div_euclid(k)),
        }
    }

    /// `self % k` for `k > 0` (Python's remainder).
    pub fn rem(&self, k: i64) -> Dim {
        match self {
            Dim::Const(c) => Dim::Const(c.rem_euclid(k)),
            Dim::Sym(s) => Dim::from_poly(s.expr.rem(k), s.hint.rem_euclid(k)),
        }
    }

    /// `self + other`, or `None` where its hint or a coefficient would leave `i64`.
    pub fn checked_add(&self, other: &Dim) -> Option<Dim> {
        let fits = self.hint().checked_add(other.hint()).is_some() && fits(self.magnitude() + other.magnitude());
        fits.then(|| self.add(other))
    }

    /// `self - other`, or `None` where its hint or a coefficient would leave `i64`.
    pub fn checked_sub(&self, other: &Dim) -> Option<Dim> {
        let fits = self.hint().checked_sub(other.hint()).is_some() && fits(self.magnitude() + other.magnitude());
        fits.then(|| self.sub(other))
    }

    /// `self * other`, or `None` where its hint or a coefficient would leave `i64`: sizes whose
    /// product Python's int holds and a wrapped hint would decide on wrongly (`n*n*n > 2**62`).
    pub fn checked_mul(&self, other: &Dim) -> Option<Dim> {
        let fits =
            self.hint().checked_mul(other.hint()).is_some() && fits(self.magnitude().saturating_mul(other.magnitude()));
        fits.then(|| self.mul(other))
    }

    fn magnitude(&self) -> i128 {
        match self {
            Dim::Const(c) => i128::from(*c).abs(),
            Dim::Sym(s) => s.expr.magnitude(),
        }
    }

    /// The product of `dims` (a tensor's number of elements): 1 for none.
    pub fn product<'a>(dims: impl IntoIterator<Item = &'a Dim>) -> Dim {
        dims.into_iter().fold(Dim::Const(1), |acc, d| acc.mul(d))
    }

    /// The same size over renamed size values.
    pub fn renamed(&self, f: &impl Fn(ValueId) -> ValueId) -> Dim {
        match self {
            Dim::Const(_) => self.clone(),
            Dim::Sym(s) => Dim::from_poly(s.expr.substitute(&mut |v| Poly::atom(Atom::Value(f(v)))), s.hint),
        }
    }

    /// Calls `f` on every size value the size reads.
    pub fn for_each_value(&self, f: &mut impl FnMut(ValueId)) {
        if let Dim::Sym(s) = self {
            s.expr.for_each_value(f)
        }
    }
}

impl fmt::Debug for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Dim {
    /// The constant, or the expression as Python (`t3`, `2*t3 + 1`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Const(c) => write!(f, "{c}"),
            Dim::Sym(s) => write!(f, "{}", s.expr),
        }
    }
}

/// Whether a coefficient bound (`Poly::magnitude`) fits `i64`.
fn fits(bound: i128) -> bool {
    bound <= i128::from(i64::MAX)
}

/// The hints of `dims`: sizes as they were when the trace was recorded.
pub fn hints(dims: &[Dim]) -> Vec<i64> {
    dims.iter().map(Dim::hint).collect()
}

/// Sizes as error messages show them: `[2, t3]`, as a list of ints prints.
pub fn show(dims: &[Dim]) -> String {
    let items: Vec<String> = dims.iter().map(Dim::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// Constant sizes.
pub fn consts(sizes: &[i64]) -> Vec<Dim> {
    sizes.iter().map(|&s| Dim::Const(s)).collect()
}

/// The polynomial an argument that replaced the size value `v` stands for: another size value or
/// an int (a pass substituting values in an expression).
///
/// # Panics
/// If the replacement is neither: a size value can only be replaced by a size.
pub fn arg_poly(arg: &crate::Arg, v: ValueId) -> Poly {
    match arg {
        crate::Arg::Value(w) => Poly::atom(Atom::Value(*w)),
        crate::Arg::Scalar(crate::Scalar::Int(c)) => Poly::constant(*c),
        crate::Arg::Sym(s) => s.expr.clone(),
        other => panic!("size value {v} replaced by {other:?}, which is no int"),
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// How a guard's expression relates to zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rel {
    /// `expr == 0`.
    Eq,
    /// `expr != 0`.
    Ne,
    /// `expr >= 0`.
    Ge,
}

/// A relation between sizes that held for the hints and that the compiled program relies on:
/// `expr REL 0`, checked on every call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Guard {
    /// The expression compared with zero.
    pub expr: Poly,
    /// How it compares.
    pub rel: Rel,
}

impl Guard {
    /// Whether the guard holds with every size value `v` set to `value(v)`: not where the
    /// expression leaves `i64` there (no size the trace serves).
    pub fn holds(&self, value: &impl Fn(ValueId) -> i64) -> bool {
        let Some(x) = self.expr.eval(value) else { return false };
        match self.rel {
            Rel::Eq => x == 0,
            Rel::Ne => x != 0,
            Rel::Ge => x >= 0,
        }
    }
}

impl fmt::Display for Guard {
    /// Valid Python: `t3 - t5 == 0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rel = match self.rel {
            Rel::Eq => "==",
            Rel::Ne => "!=",
            Rel::Ge => ">=",
        };
        write!(f, "{} {rel} 0", self.expr)
    }
}

/// The guards a recording relied on, each once, in the order first relied on; and which of its
/// size values are counts (at least 0, where other sizes are at least 2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    guards: Vec<Guard>,
    counts: BTreeSet<ValueId>,
}

impl Facts {
    /// Marks size value `v` as a count: a size a call computes from values (the count of
    /// `nonzero`'s indices), which the compiled program may see at 0 or 1 as well, where what
    /// the trace relied on holds there. Decisions about it that sizes of at least 2 settle as
    /// data (`v != 1`, `v - 1 >= 0`) are guards; call before the first decision about `v`.
    pub fn count(&mut self, v: ValueId) {
        self.counts.insert(v);
    }

    /// Whether size value `v` is a count ([`Facts::count`]).
    pub fn is_count(&self, v: ValueId) -> bool {
        self.counts.contains(&v)
    }

    /// The counts, in value order.
    pub fn counts(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.counts.iter().copied()
    }

    /// A lower bound of `p` over this recording's sizes (counts from 0, others from 2).
    pub fn lower_bound(&self, p: &Poly) -> Option<i64> {
        p.lower_bound_over(&|v| if self.counts.contains(&v) { 0 } else { 2 })
    }

    /// The guards, in order.
    pub fn guards(&self) -> &[Guard] {
        &self.guards
    }

    /// Whether nothing was relied on beyond the expressions themselves.
    pub fn is_empty(&self) -> bool {
        self.guards.is_empty()
    }

    /// Drops the guards recorded after the first `n` (a call that failed relied on nothing).
    pub fn truncate(&mut self, n: usize) {
        self.guards.truncate(n);
    }

    /// Records `guard` unless it is already recorded or holds as data. An equality or
    /// inequality is kept with its first term positive, so `a == b` and `b == a` are one guard.
    pub fn assume(&mut self, mut guard: Guard) {
        if guard.rel != Rel::Ge && guard.expr.terms.iter().find(|(m, _)| !m.is_empty()).is_some_and(|(_, c)| *c < 0) {
            guard.expr = guard.expr.scale(-1);
        }
        // Dividing by the coefficients' common factor keeps the relation (`4*t0 - 8 == 0` is
        // `t0 - 2 == 0`), so one relation has one form.
        let common = guard.expr.terms.iter().fold(0, |g, (_, c)| gcd(g, c.unsigned_abs()));
        if common > 1 {
            let k = common as i64;
            guard.expr = Poly::from_terms(guard.expr.terms.iter().map(|(m, c)| (m.clone(), c / k)).collect());
        }
        // A constant relation needs no check on calls (rules only assume what held for hints),
        // nor does `p >= 0` or `p != 0` of a `p` that sizes of at least 2 keep non-negative or
        // positive (`16*t0 - 1 != 0`: ResNet's shapes recorded five such guards).
        let least = self.lower_bound(&guard.expr);
        let positive = least.is_some_and(|b| b > 0);
        if guard.expr.as_constant().is_some()
            || (guard.rel == Rel::Ge && (guard.expr.is_nonnegative() || least.is_some_and(|b| b >= 0)))
            || (guard.rel == Rel::Ne && positive)
        {
            return;
        }
        if !self.guards.contains(&guard) {
            self.guards.push(guard);
        }
    }

    /// Decides `a == b` on the hints; records what the answer relied on.
    pub fn equal(&mut self, a: &Dim, b: &Dim) -> bool {
        if a == b {
            return true;
        }
        let equal = a.hint() == b.hint();
        if a.is_sym() || b.is_sym() {
            let expr = a.sub(b).poly();
            self.assume(Guard { expr, rel: if equal { Rel::Eq } else { Rel::Ne } });
        }
        equal
    }

    /// Decides `a <= b` on the hints; records what the answer relied on.
    pub fn le(&mut self, a: &Dim, b: &Dim) -> bool {
        let diff = b.sub(a);
        if let Dim::Const(c) = diff {
            return c >= 0;
        }
        let holds = diff.hint() >= 0;
        // not (a <= b) is a - b - 1 >= 0.
        let expr = if holds { diff.poly() } else { a.sub(b).sub(&Dim::Const(1)).poly() };
        self.assume(Guard { expr, rel: Rel::Ge });
        holds
    }

    /// Decides `a < b` on the hints; records what the answer relied on.
    pub fn lt(&mut self, a: &Dim, b: &Dim) -> bool {
        self.le(&a.add(&Dim::Const(1)), b)
    }

    /// The value of `d` as a constant: its hint, assumed from now on (a guard when symbolic).
    /// For rules that need a number where a symbolic one is not supported yet.
    pub fn specialise(&mut self, d: &Dim) -> i64 {
        let hint = d.hint();
        self.equal(d, &Dim::Const(hint));
        hint
    }

    /// Decides whether two shapes are equal (same rank, each size equal) on the hints; records
    /// what the answer relied on.
    pub fn same_shape(&mut self, a: &[Dim], b: &[Dim]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| self.equal(x, y))
    }

    /// Decides `a == c` for a constant `c` on the hint; records what the answer relied on.
    pub fn is(&mut self, a: &Dim, c: i64) -> bool {
        self.equal(a, &Dim::Const(c))
    }

    /// The same guards and counts over renamed size values.
    pub fn renamed(&self, f: &impl Fn(ValueId) -> ValueId) -> Facts {
        let mut out = Facts { guards: Vec::new(), counts: self.counts.iter().map(|&v| f(v)).collect() };
        for g in &self.guards {
            out.assume(Guard { expr: g.expr.substitute(&mut |v| Poly::atom(Atom::Value(f(v)))), rel: g.rel });
        }
        out
    }

    /// Adds every guard and count of `other`.
    pub fn extend(&mut self, other: &Facts) {
        self.counts.extend(other.counts.iter().copied());
        other.guards.iter().for_each(|g| self.assume(g.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(i: u32, hint: i64) -> Dim {
        Dim::size(ValueId(i), hint)
    }

    #[test]
    fn sizes_past_int64_are_none_not_wrapped() {
        let (n, small) = (t(1, 1 << 22), t(1, 2));
        let cube = small.mul(&small).mul(&small).poly();
        assert_eq!(cube.eval(&|_| 1 << 21), None); // (2**63)
        assert_eq!(cube.eval(&|_| 1 << 20), Some(1 << 60));
        assert_eq!(n.mul(&n).checked_mul(&n), None); // (its hint, 2**66)
        assert_eq!(t(1, 3).checked_mul(&Dim::Const(i64::MAX)), None); // (a coefficient)
        assert_eq!(t(1, 3).checked_add(&Dim::Const(2)), Some(t(1, 3).add(&Dim::Const(2))));
        assert!(!Guard { expr: cube, rel: Rel::Ge }.holds(&|_| 1 << 22));
    }

    #[test]
    fn canonical_form_makes_equal_sizes_equal() {
        let (a, b) = (t(1, 5), t(2, 7));
        assert_eq!(a.add(&b), b.add(&a));
        assert_eq!(a.mul(&b).mul(&Dim::Const(3)), b.mul(&Dim::Const(3)).mul(&a));
        assert_eq!(a.add(&b).sub(&b), a);
        assert_eq!(a.sub(&a), Dim::Const(0));
        assert_eq!(a.mul(&b).hint(), 35);
        assert_eq!(a.add(&Dim::Const(1)).mul(&a).to_string(), "t1 + t1*t1");
    }

    #[test]
    fn floor_division_is_exact_or_an_atom() {
        let a = t(1, 9);
        assert_eq!(a.mul(&Dim::Const(6)).floordiv(3), a.mul(&Dim::Const(2)));
        let half = a.floordiv(2);
        assert_eq!((half.to_string(), half.hint()), ("(t1 // 2)".to_string(), 4));
        assert_eq!(a.rem(2).hint(), 1);
        assert_eq!(a.mul(&Dim::Const(4)).rem(2), Dim::Const(0));
        assert_eq!(a.mul(&Dim::Const(2)).add(&Dim::Const(1)).floordiv(2), a);
        assert_eq!(a.mul(&Dim::Const(2)).add(&Dim::Const(1)).rem(2), Dim::Const(1));
        let b = t(2, 5);
        assert_eq!(a.mul(&Dim::Const(4)).add(&b).floordiv(4).to_string(), "t1 + (t2 // 4)");
        assert_eq!(a.sub(&Dim::Const(1)).floordiv(2).to_string(), "((t1 + 1) // 2) - 1");
        assert_eq!(Dim::Const(-7).floordiv(2), Dim::Const(-4)); // Python's floor
        let p = a.add(&Dim::Const(1)).floordiv(2).poly();
        assert_eq!(p.eval(&|_| 10), Some(5));
        assert_eq!(p.eval(&|_| -2), Some(-1));
    }

    #[test]
    fn facts_record_only_what_held_for_hints() {
        let (a, b) = (t(1, 5), t(2, 5));
        let mut facts = Facts::default();
        assert!(facts.equal(&a, &a) && facts.le(&a, &a.add(&Dim::Const(1))) && facts.is_empty());
        assert!(facts.equal(&a, &b));
        assert!(facts.equal(&b, &a)); // b - a == 0 is a - b == 0, recorded once
        assert_eq!(facts.guards().len(), 1);
        assert!(!facts.lt(&a, &Dim::Const(5)));
        assert!(facts.le(&Dim::Const(0), &a));
        let holds_at = |x: i64, y: i64| facts.guards().iter().all(|g| g.holds(&|v| if v.0 == 1 { x } else { y }));
        assert!(holds_at(5, 5) && holds_at(9, 9));
        assert!(!holds_at(5, 6) && !holds_at(4, 4));
        assert_eq!(facts.guards()[0].to_string(), "t1 - t2 == 0");
    }

    #[test]
    fn exact_division_and_relations_that_always_hold() {
        let (b, t) = (t(1, 2), t(2, 7));
        let n = b.mul(&t).mul(&Dim::Const(32)).poly();
        assert_eq!(n.exact_div(&b.mul(&t).poly()), Some(Poly::constant(32)));
        assert_eq!(n.exact_div(&Dim::Const(32).poly()).map(|p| p.to_string()), Some("t1*t2".to_string()));
        assert_eq!(n.exact_div(&t.add(&Dim::Const(1)).poly()), None);
        // A multiple of a sum: (64*t - 64) / (32*t - 32) and / (t - 1), as a view's -1 divides.
        let less_one = t.sub(&Dim::Const(1));
        let numel = less_one.mul(&Dim::Const(64)).poly();
        assert_eq!(numel.exact_div(&less_one.mul(&Dim::Const(32)).poly()), Some(Poly::constant(2)));
        assert_eq!(numel.exact_div(&less_one.mul(&b).poly()), None);
        let rows = b.mul(&less_one).mul(&Dim::Const(4)).poly();
        assert_eq!(rows.exact_div(&less_one.poly()).map(|p| p.to_string()), Some("4*t1".to_string()));
        let mut facts = Facts::default();
        assert!(!facts.is(&t, -1)); // t + 1 != 0 holds for every size
        assert!(facts.le(&Dim::Const(0), &t.mul(&Dim::Const(3)))); // 3*t >= 0 likewise
        assert!(facts.le(&Dim::Const(1), &t.add(&Dim::Const(1)).floordiv(2))); // (t + 1) // 2 >= 1 likewise
        assert!(facts.is_empty(), "{:?}", facts.guards());
        // (t - 5) // 2 >= 0 held at t = 7, not at t = 3: a guard (a floor division is no size).
        assert!(facts.le(&Dim::Const(0), &t.sub(&Dim::Const(5)).floordiv(2)));
        assert_eq!(facts.guards().len(), 1);
    }

    #[test]
    fn a_size_padded_up_to_a_multiple_divides_exactly() {
        // Swin's `x + (4 - x % 4) % 4`: the padded size is a multiple of 4 as data, so windows
        // of 4 divide it and the views into windows need no guard.
        let x = t(1, 10);
        let pad = Dim::Const(4).sub(&x.rem(4)).rem(4);
        assert_eq!(pad.to_string(), "((3*t1) % 4)");
        assert_eq!(pad.hint(), 2);
        let padded = x.add(&pad);
        assert_eq!((padded.to_string(), padded.hint()), ("4*t1 - 4*((3*t1) // 4)".to_string(), 12));
        assert_eq!(padded.rem(4), Dim::Const(0));
        let windows = padded.floordiv(4);
        assert_eq!(windows.mul(&Dim::Const(4)), padded);
        assert_eq!(padded.mul(&t(2, 3)).poly().exact_div(&padded.poly()), Some(t(2, 3).poly()));
        // Rounded down: `x - x % 4` is `4*(x // 4)`; a remainder alone stays one.
        assert_eq!(x.sub(&x.rem(4)), x.floordiv(4).mul(&Dim::Const(4)));
        assert_eq!(x.rem(4).add(&Dim::Const(1)).to_string(), "(t1 % 4) + 1");
    }

    #[test]
    fn substitution_renames_and_specialises() {
        let e = t(1, 4).mul(&t(2, 3)).add(&t(1, 4).floordiv(3)).poly();
        let renamed = e.substitute(&mut |v| Poly::atom(Atom::Value(ValueId(v.0 + 10))));
        assert_eq!(renamed.to_string(), "t11*t12 + (t11 // 3)");
        assert_eq!(e.substitute(&mut |v| Poly::constant(v.0 as i64 + 5)).as_constant(), Some(6 * 7 + 2));
        let mut seen = Vec::new();
        e.for_each_value(&mut |v| seen.push(v.0));
        assert_eq!(seen, vec![1, 2, 1]);
    }
}

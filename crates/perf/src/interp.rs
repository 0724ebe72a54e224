//! Interpolation over measured tables, following the reference estimator's resolution chain:
//!
//! 1. an exact hit returns the measured value;
//! 2. inside the data, a *grid* table brackets each axis (outer to inner) and blends the two
//!    neighbours linearly, in √latency space along one chosen axis (sequence length for context
//!    attention); a bracket side missing below (ragged table) is dropped and the survivor is
//!    rescaled by `SOL(query) / SOL(survivor)`;
//! 3. past the collected range, the utilisation `SOL / latency` of nearby measured points is held
//!    and `latency = SOL(query) / util`: multi-axis grids take the 4 nearest points in joint log₂
//!    space with tapered Shepard weights `((R − d) / (R·d))²` (R = distance of the 5th); 1-D curves
//!    take the median utilisation of the `k_tail` boundary points;
//! 4. GEMM tables are *sites* `(n, k)` each owning an `m` curve: a collected site answers from its
//!    curve (linear inside, utilisation hold beyond with `k_tail = 3`); an unknown site borrows the
//!    utilisation of ≤ 4 covering sites within 2 octaves (log₂ inverse-distance weights), the gate
//!    being waived only for a scale-up overflow along exactly one axis. A table may also have a
//!    collected site whose curve misses the query borrow from the others instead of holding its
//!    own tail, and admit sites within a raw distance along one axis (the FPM tables, whose KV
//!    axis starts at zero, where octaves exaggerate a few tokens);
//! 5. nothing to anchor on → an error (the reference's `fallback_policy: deny`).

use std::sync::OnceLock;

use crate::error::{PerfError, Result};

/// A speed-of-light function over the table's axes (same order as the query).
pub type Sol<'a> = &'a dyn Fn(&[f64]) -> f64;

/// A nested table: each level a sorted list of `(key, child)`.
#[derive(Clone, Debug)]
pub enum Node {
    Branch(Vec<(u32, Node)>),
    Leaf(f64),
}

impl Node {
    pub fn new() -> Node {
        Node::Branch(Vec::new())
    }

    /// Inserts a value at `path`; an existing value is kept (first source wins).
    pub fn insert_first_wins(&mut self, path: &[u32], value: f64) {
        let Node::Branch(children) = self else { return };
        let i = match children.binary_search_by_key(&path[0], |(k, _)| *k) {
            Ok(i) => i,
            Err(i) => {
                let child = if path.len() == 1 { Node::Leaf(value) } else { Node::new() };
                children.insert(i, (path[0], child));
                i
            }
        };
        if path.len() > 1 {
            children[i].1.insert_first_wins(&path[1..], value);
        }
    }

    fn children(&self) -> Option<&[(u32, Node)]> {
        match self {
            Node::Branch(c) => Some(c),
            Node::Leaf(_) => None,
        }
    }

    fn child(&self, key: u32) -> Option<&Node> {
        let c = self.children()?;
        c.binary_search_by_key(&key, |(k, _)| *k).ok().map(|i| &c[i].1)
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Node::Branch(c) if c.is_empty())
    }

    /// Every leaf as `(coordinates, value)`, in key order.
    pub fn leaves(&self) -> Vec<(Vec<u32>, f64)> {
        fn walk(n: &Node, path: &mut Vec<u32>, out: &mut Vec<(Vec<u32>, f64)>) {
            match n {
                Node::Leaf(v) => out.push((path.clone(), *v)),
                Node::Branch(c) => {
                    for (k, child) in c {
                        path.push(*k);
                        walk(child, path, out);
                        path.pop();
                    }
                }
            }
        }
        let mut out = Vec::new();
        walk(self, &mut Vec::new(), &mut out);
        out
    }
}

impl Default for Node {
    fn default() -> Self {
        Node::new()
    }
}

fn exact_key(c: f64) -> Option<u32> {
    (c >= 0.0 && c <= u32::MAX as f64 && c.fract() == 0.0).then_some(c as u32)
}

fn describe(axes: &[&str], q: &[f64]) -> String {
    axes.iter().zip(q).map(|(a, v)| format!("{a}={v}")).collect::<Vec<_>>().join(", ")
}

fn no_anchor(axes: &[&str], q: &[f64], why: &str) -> PerfError {
    PerfError::no_anchor(format!("perf_interp: no data to anchor query {{{}}} ({why})", describe(axes, q)))
}

/// The median of `v` (sorted in place; the mean of the middle two for an even count).
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// How a grid blends along its axes.
#[derive(Clone, Copy, Debug)]
pub struct GridSpec {
    pub axes: &'static [&'static str],
    /// Blend √latency along this axis (all others raw).
    pub sqrt_axis: Option<usize>,
    /// Boundary points a 1-D hold takes the median utilisation of.
    pub k_tail: usize,
    /// Points a multi-axis hold blends.
    pub nn_leaves: usize,
}

impl GridSpec {
    pub const fn raw(axes: &'static [&'static str]) -> Self {
        GridSpec { axes, sqrt_axis: None, k_tail: 1, nn_leaves: 4 }
    }
    pub const fn sqrt_along(axes: &'static [&'static str], axis: usize) -> Self {
        GridSpec { axes, sqrt_axis: Some(axis), k_tail: 1, nn_leaves: 4 }
    }
}

/// Flattened leaves of a grid for utilisation holds.
#[derive(Debug)]
struct HoldIndex {
    coords: Vec<Vec<u32>>,
    logs: Vec<Vec<f64>>,
    values: Vec<f64>,
}

/// A grid table with its lazily built hold index.
#[derive(Debug, Default)]
pub struct Grid {
    pub node: Node,
    hold: OnceLock<HoldIndex>,
}

enum Interior {
    OutOfRange,
    Miss(String),
}

impl Grid {
    pub fn new(node: Node) -> Grid {
        Grid { node, hold: OnceLock::new() }
    }

    pub fn query(&self, spec: &GridSpec, sol: Sol, q: &[f64]) -> Result<f64> {
        if self.node.is_empty() {
            return Err(no_anchor(spec.axes, q, "empty table"));
        }
        match self.interior(spec, sol, &self.node, q, 0) {
            Ok(v) => Ok(v),
            Err(Interior::Miss(why)) => Err(no_anchor(spec.axes, q, &why)),
            Err(Interior::OutOfRange) => {
                if spec.axes.len() == 1 {
                    self.hold_1d(spec, sol, q)
                } else {
                    self.hold(spec, sol, q)
                }
            }
        }
    }

    fn interior(
        &self,
        spec: &GridSpec,
        sol: Sol,
        node: &Node,
        q: &[f64],
        depth: usize,
    ) -> std::result::Result<f64, Interior> {
        if depth == spec.axes.len() {
            return match node {
                Node::Leaf(v) => Ok(*v),
                Node::Branch(_) => Err(Interior::Miss("malformed leaf".into())),
            };
        }
        let children = node.children().ok_or_else(|| Interior::Miss("table shallower than its axes".into()))?;
        if children.is_empty() {
            return Err(Interior::Miss(format!("empty branch at axis {}", spec.axes[depth])));
        }
        let c = q[depth];
        if let Some(k) = exact_key(c) {
            if let Some(child) = node.child(k) {
                return self.interior(spec, sol, child, q, depth + 1);
            }
        }
        let (lo, hi) = (children[0].0 as f64, children[children.len() - 1].0 as f64);
        if c < lo || c > hi {
            return Err(Interior::OutOfRange);
        }
        let idx = children.partition_point(|(k, _)| (*k as f64) < c);
        let (k_lo, k_hi) = (children[idx - 1].0, children[idx].0);
        let mut got: Vec<(u32, f64)> = Vec::with_capacity(2);
        let mut out_of_range = false;
        for (k, child) in [&children[idx - 1], &children[idx]].map(|(k, n)| (*k, n)) {
            match self.interior(spec, sol, child, q, depth + 1) {
                Ok(v) => got.push((k, v)),
                Err(Interior::OutOfRange) => out_of_range = true,
                Err(Interior::Miss(_)) => {}
            }
        }
        match got.len() {
            0 if out_of_range => Err(Interior::OutOfRange),
            0 => Err(Interior::Miss(format!("no usable branch at axis {}", spec.axes[depth]))),
            1 => {
                // Ragged table: hold the survivor's utilisation across this axis.
                let (k, v) = got[0];
                let mut snapped = q.to_vec();
                snapped[depth] = k as f64;
                let (sq, ss) = (sol(q), sol(&snapped));
                if sq.is_finite() && ss.is_finite() && sq > 0.0 && ss > 0.0 {
                    Ok(v * (sq / ss))
                } else {
                    Ok(v)
                }
            }
            _ => {
                let (a, b) = (got[0].1, got[1].1);
                let w = (c - k_lo as f64) / (k_hi as f64 - k_lo as f64);
                if spec.sqrt_axis == Some(depth) {
                    let (sa, sb) = (if a > 0.0 { a.sqrt() } else { 0.0 }, if b > 0.0 { b.sqrt() } else { 0.0 });
                    let s = sa + (sb - sa) * w;
                    Ok(s * s)
                } else {
                    Ok(a + (b - a) * w)
                }
            }
        }
    }

    fn hold_index(&self) -> &HoldIndex {
        self.hold.get_or_init(|| {
            let leaves = self.node.leaves();
            let mut idx = HoldIndex { coords: Vec::new(), logs: Vec::new(), values: Vec::new() };
            for (c, v) in leaves {
                idx.logs.push(c.iter().map(|&k| (k as f64).max(1e-12).log2()).collect());
                idx.coords.push(c);
                idx.values.push(v);
            }
            idx
        })
    }

    /// Multi-axis hold: tapered Shepard blend of the utilisation of the nearest valid points.
    fn hold(&self, spec: &GridSpec, sol: Sol, q: &[f64]) -> Result<f64> {
        let idx = self.hold_index();
        let ql: Vec<f64> = q.iter().map(|v| v.max(1e-12).log2()).collect();
        let mut ranked: Vec<(f64, usize)> = idx
            .logs
            .iter()
            .enumerate()
            .map(|(i, l)| (l.iter().zip(&ql).map(|(a, b)| (a - b) * (a - b)).sum::<f64>(), i))
            .collect();
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut picked: Vec<(f64, f64)> = Vec::with_capacity(spec.nn_leaves); // (distance, util)
        let mut radius = f64::INFINITY;
        for (d2, i) in ranked {
            let lat = idx.values[i];
            let coords: Vec<f64> = idx.coords[i].iter().map(|&k| k as f64).collect();
            let s = sol(&coords);
            if !(lat.is_finite() && lat > 0.0 && s.is_finite() && s > 0.0) {
                continue;
            }
            if picked.len() < spec.nn_leaves {
                picked.push((d2.sqrt(), s / lat));
            } else {
                radius = d2.sqrt();
                break;
            }
        }
        if picked.is_empty() {
            return Err(no_anchor(spec.axes, q, "no positive-utilisation point to hold"));
        }
        let weight = |d: f64| {
            if radius.is_infinite() {
                1.0 / (d * d + 1e-12)
            } else {
                let t = (radius - d).max(0.0) / (radius * d + 1e-12);
                t * t
            }
        };
        let mut ws: Vec<f64> = picked.iter().map(|(d, _)| weight(*d)).collect();
        if ws.iter().sum::<f64>() <= 0.0 {
            ws.iter_mut().for_each(|w| *w = 1.0);
        }
        let wsum: f64 = ws.iter().sum();
        let util: f64 = ws.iter().zip(&picked).map(|(w, (_, u))| w * u).sum::<f64>() / wsum;
        let sq = sol(q);
        if !(sq.is_finite() && sq > 0.0) {
            return Err(no_anchor(spec.axes, q, "non-positive speed of light at the query"));
        }
        Ok(sq / util)
    }

    fn hold_1d(&self, spec: &GridSpec, sol: Sol, q: &[f64]) -> Result<f64> {
        let children = self.node.children().unwrap_or(&[]);
        let tail: &[(u32, Node)] = if q[0] > children[children.len() - 1].0 as f64 {
            &children[children.len().saturating_sub(spec.k_tail)..]
        } else {
            &children[..spec.k_tail.min(children.len())]
        };
        let mut utils = Vec::new();
        for (k, n) in tail {
            if let Node::Leaf(lat) = n {
                let s = sol(&[*k as f64]);
                if *lat > 0.0 && s > 0.0 {
                    utils.push(s / lat);
                }
            }
        }
        if utils.is_empty() {
            return Err(no_anchor(spec.axes, q, "no positive-utilisation boundary point"));
        }
        let sq = sol(q);
        if !(sq.is_finite() && sq > 0.0) {
            return Err(no_anchor(spec.axes, q, "non-positive speed of light at the query"));
        }
        Ok(sq / median(&mut utils))
    }
}

/// A 1-D curve (message size → latency) resolved like a raw grid with `k_tail = 1` and a
/// SOL proportional to the coordinate.
#[derive(Clone, Debug, Default)]
pub struct Curve {
    pub points: Vec<(u64, f64)>,
}

impl Curve {
    pub fn query(&self, x: f64, what: &str) -> Result<f64> {
        let p = &self.points;
        if p.is_empty() {
            return Err(PerfError::no_anchor(format!("{what}: empty curve")));
        }
        let i = p.partition_point(|(k, _)| (*k as f64) < x);
        if i < p.len() && p[i].0 as f64 == x {
            return Ok(p[i].1);
        }
        if x < p[0].0 as f64 || x > p[p.len() - 1].0 as f64 {
            let (k, lat) = if x < p[0].0 as f64 { p[0] } else { p[p.len() - 1] };
            let anchored = lat > 0.0 && k > 0 && x > 0.0; // false for NaN too
            if !anchored {
                return Err(PerfError::no_anchor(format!("{what}: no positive point to hold at size {x}")));
            }
            return Ok(x / (k as f64 / lat));
        }
        let ((k0, a), (k1, b)) = (p[i - 1], p[i]);
        let w = (x - k0 as f64) / (k1 as f64 - k0 as f64);
        Ok(a + (b - a) * w)
    }
}

/// GEMM-style table: sites over some axes, each owning a curve along one axis.
#[derive(Debug)]
pub struct Sites {
    /// Site keys in enumeration order (the order ties break in).
    keys: Vec<Vec<u32>>,
    logs: Vec<Vec<f64>>,
    /// Each site's curve, sorted by the curve coordinate.
    curves: Vec<Vec<(u32, f64)>>,
    lookup: std::collections::HashMap<Vec<u32>, usize>,
}

#[derive(Clone, Copy, Debug)]
pub struct SitesSpec {
    pub axes: &'static [&'static str],
    /// Positions of the site axes in the query.
    pub site_axes: &'static [usize],
    pub curve_axis: usize,
    pub nn_sites: usize,
    pub max_site_distance: f64,
    pub k_tail: usize,
    /// A collected site whose own curve does not cover the query is left out and the query
    /// transferred from the other sites (false: the site holds its own tail).
    pub own_curve_fallback: bool,
    /// `(site axis, raw limit)`: a site beyond the log₂ gate is still admitted when it lies
    /// within the raw limit along that axis and within the gate along the others.
    pub raw_admission: Option<(usize, f64)>,
}

impl Sites {
    /// `order`: site keys in enumeration order; `curves[i]` belongs to `order[i]`.
    pub fn new(order: Vec<Vec<u32>>, mut curves: Vec<Vec<(u32, f64)>>) -> Sites {
        for c in &mut curves {
            c.sort_by_key(|(k, _)| *k);
        }
        let logs = order.iter().map(|k| k.iter().map(|&v| (v as f64).max(1e-12).log2()).collect()).collect();
        let lookup = order.iter().enumerate().map(|(i, k)| (k.clone(), i)).collect();
        Sites { keys: order, logs, curves, lookup }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether site `i`'s curve spans the curve coordinate `x`.
    fn covers(&self, i: usize, x: f64) -> bool {
        let c = &self.curves[i];
        (c[0].0 as f64) <= x && x <= (c[c.len() - 1].0 as f64)
    }

    fn full(spec: &SitesSpec, q: &[f64], site: &[u32], cv: f64) -> Vec<f64> {
        let mut out = q.to_vec();
        for (&p, &v) in spec.site_axes.iter().zip(site) {
            out[p] = v as f64;
        }
        out[spec.curve_axis] = cv;
        out
    }

    fn eval_curve(&self, spec: &SitesSpec, sol: Sol, site: usize, q: &[f64]) -> Result<f64> {
        let curve = &self.curves[site];
        let key = &self.keys[site];
        let x = q[spec.curve_axis];
        let i = curve.partition_point(|(c, _)| (*c as f64) < x);
        if i < curve.len() && curve[i].0 as f64 == x {
            return Ok(curve[i].1);
        }
        if x < curve[0].0 as f64 || x > curve[curve.len() - 1].0 as f64 || curve.len() < 2 {
            let tail = if x < curve[0].0 as f64 {
                &curve[..spec.k_tail.min(curve.len())]
            } else {
                &curve[curve.len().saturating_sub(spec.k_tail)..]
            };
            let mut utils = Vec::new();
            for &(cv, lat) in tail {
                let s = sol(&Self::full(spec, q, key, cv as f64));
                if lat > 0.0 && s > 0.0 {
                    utils.push(s / lat);
                }
            }
            if utils.is_empty() {
                return Err(no_anchor(spec.axes, q, "no positive-util boundary anchor"));
            }
            let sq = sol(&Self::full(spec, q, key, x));
            if !(sq.is_finite() && sq > 0.0) {
                return Err(no_anchor(spec.axes, q, "non-positive SOL at query"));
            }
            return Ok(sq / median(&mut utils));
        }
        let ((c0, a), (c1, b)) = (curve[i - 1], curve[i]);
        let w = (x - c0 as f64) / (c1 as f64 - c0 as f64);
        Ok(a + (b - a) * w)
    }

    pub fn query(&self, spec: &SitesSpec, sol: Sol, q: &[f64]) -> Result<f64> {
        let x = q[spec.curve_axis];
        let site_key: Option<Vec<u32>> = spec.site_axes.iter().map(|&p| exact_key(q[p])).collect();
        let mut excluded = None;
        if let Some(key) = &site_key {
            if let Some(&i) = self.lookup.get(key) {
                if !spec.own_curve_fallback || self.covers(i, x) {
                    return self.eval_curve(spec, sol, i, q);
                }
                excluded = Some(i);
            }
        }
        if self.keys.is_empty() {
            return Err(no_anchor(spec.axes, q, "no sites collected"));
        }
        let ql: Vec<f64> = spec.site_axes.iter().map(|&p| q[p].max(1e-12).log2()).collect();
        let dist = |l: &[f64]| l.iter().zip(&ql).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
        let others = || (0..self.keys.len()).filter(|&i| Some(i) != excluded);
        let mut ranked: Vec<(f64, usize)> =
            others().filter(|&i| self.covers(i, x)).map(|i| (dist(&self.logs[i]), i)).collect();
        if ranked.is_empty() {
            ranked = others().map(|i| (dist(&self.logs[i]), i)).collect();
        }
        let gate = spec.max_site_distance;
        let admitted = |d: f64, i: usize| {
            d <= gate
                || spec.raw_admission.is_some_and(|(axis, limit)| {
                    let near = (self.keys[i][axis] as f64 - q[spec.site_axes[axis]]).abs() <= limit;
                    let rest = (0..ql.len())
                        .filter(|&a| a != axis)
                        .map(|a| (self.logs[i][a] - ql[a]).powi(2))
                        .sum::<f64>()
                        .sqrt();
                    near && rest <= gate
                })
        };
        if ranked.iter().any(|&(d, i)| admitted(d, i)) {
            ranked.retain(|&(d, i)| admitted(d, i));
        } else {
            // Waive the gate only for a scale-up overflow along exactly one site axis.
            let n_axes = spec.site_axes.len();
            let q_site: Vec<f64> = spec.site_axes.iter().map(|&p| q[p]).collect();
            let mut overflow = Vec::new();
            for (a, &qa) in q_site.iter().enumerate() {
                let lo = ranked.iter().map(|&(_, i)| self.keys[i][a]).min().unwrap_or(0);
                let hi = ranked.iter().map(|&(_, i)| self.keys[i][a]).max().unwrap_or(0);
                if qa < lo as f64 {
                    return Err(no_anchor(spec.axes, q, "no site within max_site_distance"));
                }
                if qa > hi as f64 {
                    overflow.push(a);
                }
            }
            if overflow.len() != 1 {
                return Err(no_anchor(spec.axes, q, "no site within max_site_distance"));
            }
            let resid = |i: usize| {
                (0..n_axes)
                    .filter(|a| !overflow.contains(a))
                    .map(|a| (self.logs[i][a] - ql[a]).powi(2))
                    .sum::<f64>()
                    .sqrt()
            };
            ranked.retain(|&(_, i)| resid(i) <= gate);
            if ranked.is_empty() {
                return Err(no_anchor(spec.axes, q, "no site within max_site_distance"));
            }
        }
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        ranked.truncate(spec.nn_sites);
        let (mut wsum, mut uacc) = (0.0, 0.0);
        for &(d, i) in &ranked {
            let Ok(lat) = self.eval_curve(spec, sol, i, q) else { continue };
            let s = sol(&Self::full(spec, q, &self.keys[i], x));
            if !(lat.is_finite() && lat > 0.0 && s.is_finite() && s > 0.0) {
                continue;
            }
            let w = 1.0 / (d * d + 1e-12);
            uacc += w * (s / lat);
            wsum += w;
        }
        if wsum <= 0.0 {
            return Err(no_anchor(spec.axes, q, "no usable neighbour site"));
        }
        let sq = sol(q);
        if !(sq.is_finite() && sq > 0.0) {
            return Err(no_anchor(spec.axes, q, "non-positive SOL at query"));
        }
        Ok(sq / (uacc / wsum))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(points: &[([u32; 2], f64)]) -> Grid {
        let mut n = Node::new();
        for (c, v) in points {
            n.insert_first_wins(c, *v);
        }
        Grid::new(n)
    }

    const AX: &[&str] = &["a", "b"];

    #[test]
    fn exact_and_linear_blend() {
        let g = grid(&[([1, 10], 1.0), ([1, 20], 3.0), ([3, 10], 5.0), ([3, 20], 7.0)]);
        let sol = |c: &[f64]| c[0] * c[1];
        let spec = GridSpec::raw(AX);
        assert_eq!(g.query(&spec, &sol, &[1.0, 20.0]).unwrap(), 3.0);
        // (2, 15): a-bracket blends 2.0 (at a=1) and 6.0 (at a=3) half-way.
        assert!((g.query(&spec, &sol, &[2.0, 15.0]).unwrap() - 4.0).abs() < 1e-12);
    }

    #[test]
    fn sqrt_blend_is_exact_for_squares() {
        let g = grid(&[([1, 10], 100.0), ([1, 30], 900.0)]);
        let sol = |c: &[f64]| c[1] * c[1];
        let spec = GridSpec::sqrt_along(AX, 1);
        assert!((g.query(&spec, &sol, &[1.0, 20.0]).unwrap() - 400.0).abs() < 1e-9);
    }

    #[test]
    fn ragged_survivor_is_sol_rescaled() {
        // a=1 has b up to 20, a=3 only up to 10: query (2, 20) keeps a=1's value × SOL ratio.
        let g = grid(&[([1, 10], 1.0), ([1, 20], 2.0), ([3, 10], 3.0)]);
        let sol = |c: &[f64]| c[0] * c[1];
        let v = g.query(&GridSpec::raw(AX), &sol, &[2.0, 20.0]).unwrap();
        assert!((v - 2.0 * (40.0 / 20.0)).abs() < 1e-12);
    }

    #[test]
    fn hold_past_the_range_keeps_utilisation() {
        // Every point has util SOL/lat = 2; any hold must give SOL(q)/2.
        let pts: Vec<([u32; 2], f64)> =
            [1u32, 2, 4, 8].iter().flat_map(|&a| [16u32, 32].map(|b| ([a, b], (a * b) as f64 / 2.0))).collect();
        let g = grid(&pts);
        let sol = |c: &[f64]| c[0] * c[1];
        let v = g.query(&GridSpec::raw(AX), &sol, &[64.0, 100.0]).unwrap();
        assert!((v - 3200.0).abs() < 1e-9, "{v}");
    }

    #[test]
    fn empty_grid_is_an_error() {
        let g = Grid::new(Node::new());
        let e = g.query(&GridSpec::raw(AX), &|_| 1.0, &[1.0, 1.0]).unwrap_err();
        assert!(e.message.contains("empty table"), "{e}");
    }

    #[test]
    fn curve_interpolates_and_holds() {
        let c = Curve { points: vec![(100, 1.0), (200, 3.0)] };
        assert_eq!(c.query(150.0, "t").unwrap(), 2.0);
        assert_eq!(c.query(400.0, "t").unwrap(), 6.0);
        assert_eq!(c.query(50.0, "t").unwrap(), 0.5);
    }

    const GEMM: SitesSpec = SitesSpec {
        axes: &["m", "n", "k"],
        site_axes: &[1, 2],
        curve_axis: 0,
        nn_sites: 4,
        max_site_distance: 2.0,
        k_tail: 3,
        own_curve_fallback: false,
        raw_admission: None,
    };

    #[test]
    fn sites_answer_from_own_curve_and_transfer_otherwise() {
        let sol = |c: &[f64]| c[0] * c[1] * c[2];
        // Two sites with utilisation 0.5 everywhere.
        let curve = |n: u32, k: u32| [1u32, 2, 4, 8].map(|m| (m, (m * n * k) as f64 / 0.5)).to_vec();
        let s = Sites::new(vec![vec![64, 64], vec![128, 64]], vec![curve(64, 64), curve(128, 64)]);
        assert_eq!(s.query(&GEMM, &sol, &[4.0, 64.0, 64.0]).unwrap(), 4.0 * 64.0 * 64.0 * 2.0);
        // Unknown site (96, 64) inside 2 octaves: same utilisation.
        let v = s.query(&GEMM, &sol, &[3.0, 96.0, 64.0]).unwrap();
        assert!((v - 3.0 * 96.0 * 64.0 * 2.0).abs() < 1e-6);
        // Past the curve: utilisation hold.
        let v = s.query(&GEMM, &sol, &[32.0, 64.0, 64.0]).unwrap();
        assert!((v - 32.0 * 64.0 * 64.0 * 2.0).abs() < 1e-6);
        // Far below every site on one axis: no anchor.
        assert!(s.query(&GEMM, &sol, &[4.0, 4.0, 64.0]).is_err());
        // Scale-up overflow along one axis only: the gate is waived.
        assert!(s.query(&GEMM, &sol, &[4.0, 4096.0, 64.0]).is_ok());
    }
}

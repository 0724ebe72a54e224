//! Random search in the reference's draw order (issue 32): aisimulate 0.13 samples with Python's
//! `random.Random(seed)` (MT19937 seeded from the seed's 32-bit words), one sampler per
//! deployment mode seeded `seed + {aggregated: 0, disaggregated: 1}`. Each sampler shuffles its
//! arms — the (backend, parallel shape set) pairs, shape-set-major — then walks them
//! round-robin, each arm drawing a not-yet-drawn index of its knob grid (the knobs' values
//! mixed-radix, the last one fastest) with a sparse Fisher–Yates pool. Trials are split over
//! the modes by divmod and asked in rounds of `min(parallelism, max_trials)` per mode, a mode
//! that runs dry handing its unused trials to the others.
//!
//! Only finite grids map one-to-one onto servesim's space. [`draw`] returns `None` (the caller
//! keeps its own ChaCha12 draw and says so in the provenance) when a knob is a continuous or
//! log-scale range (the reference samples those by value, not by index), and when a router,
//! planner or encoder pool is searched (the reference's adapter knobs, ordered differently).
//! AFD (`afd.rs`) builds its own arms, the topologies, and draws with [`draw_arms`]. The round
//! schedule assumes every trial completes: the
//! reference re-asks within a round after an infeasible trial and retries a timed-out one,
//! which can change how trials interleave across modes (never a mode's own sequence, bar
//! retries).

use std::collections::{HashMap, VecDeque};

use rand_mt::Mt;
use serde_json::Value;

use super::space::{get, Optimization, Optimizer, Space};

/// The provenance's `random_draw` when [`draw`] reproduced the reference's sampler.
pub const REFERENCE_DRAW: &str = "aisimulate_random_branch_sampler (python random.Random)";

/// Python's `random.Random(seed)` for a non-negative integer seed: getrandbits, randbelow,
/// random, uniform and shuffle give CPython's values.
pub struct PyRandom {
    mt: Mt,
}

impl PyRandom {
    /// CPython seeds by `init_by_array` over the seed's 32-bit words, least significant first
    /// (one zero word for seed 0).
    pub fn new(seed: u128) -> PyRandom {
        let mut key = Vec::new();
        let mut rest = seed;
        loop {
            key.push(rest as u32);
            rest >>= 32;
            if rest == 0 {
                break;
            }
        }
        PyRandom { mt: Mt::new_with_key(key) }
    }

    /// `getrandbits(k)` for `k` up to 64: whole 32-bit words, least significant first, the
    /// last one keeping its top bits.
    pub fn getrandbits(&mut self, k: u32) -> u64 {
        assert!(k <= 64, "getrandbits takes at most 64 bits here");
        let mut out = 0u64;
        let mut left = k;
        let mut shift = 0;
        while left > 0 {
            let mut w = self.mt.next_u32();
            if left < 32 {
                w >>= 32 - left;
            }
            out |= u64::from(w) << shift;
            shift += 32;
            left = left.saturating_sub(32);
        }
        out
    }

    /// `_randbelow_with_getrandbits(n)` (`randrange(n)`): `n.bit_length()` bits, redrawn
    /// until below `n`. `n` must be positive.
    pub fn randbelow(&mut self, n: u64) -> u64 {
        assert!(n > 0, "randbelow needs a positive bound");
        let k = 64 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// `random()`: 53 bits from two words (27 + 26), in [0, 1).
    // `random` and `uniform` are the reference's continuous draws: tested against CPython, not
    // yet used (continuous domains keep the ChaCha12 draw).
    #[allow(dead_code)]
    pub fn random(&mut self) -> f64 {
        let a = u64::from(self.mt.next_u32() >> 5);
        let b = u64::from(self.mt.next_u32() >> 6);
        (a as f64 * 67_108_864.0 + b as f64) * (1.0 / 9_007_199_254_740_992.0)
    }

    /// `uniform(a, b)`: `a + (b - a) * random()`.
    #[allow(dead_code)]
    pub fn uniform(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.random()
    }

    /// `shuffle(x)`: Fisher–Yates from the last element down.
    pub fn shuffle<T>(&mut self, x: &mut [T]) {
        for i in (1..x.len()).rev() {
            let j = self.randbelow(i as u64 + 1) as usize;
            x.swap(i, j);
        }
    }
}

/// The indexes of a grid not yet drawn, as a sparse Fisher–Yates pool (memory grows with the
/// draws, not the grid).
struct Unseen {
    remaining: u64,
    moved: HashMap<u64, u64>,
}

impl Unseen {
    fn take(&mut self, rng: &mut PyRandom) -> Option<u64> {
        if self.remaining == 0 {
            return None;
        }
        let position = rng.randbelow(self.remaining);
        let value = self.moved.get(&position).copied().unwrap_or(position);
        self.remaining -= 1;
        let last = self.moved.remove(&self.remaining).unwrap_or(self.remaining);
        if position != self.remaining {
            self.moved.insert(position, last);
        }
        Some(value)
    }
}

/// One mode's sampler: its arms in the shuffled order, each with its pool of grid indexes.
pub struct BranchDraw<A> {
    rng: PyRandom,
    arms: VecDeque<(A, Unseen)>,
}

impl<A: Clone> BranchDraw<A> {
    /// Shuffles `arms` with `random.Random(seed)`; `smallest_first` (target min_gpus) then
    /// orders them by GPUs, stably, as the reference does.
    pub fn new(seed: u128, mut arms: Vec<A>, grid: u64, smallest_first: Option<&dyn Fn(&A) -> u64>) -> Self {
        let mut rng = PyRandom::new(seed);
        rng.shuffle(&mut arms);
        if let Some(gpus) = smallest_first {
            arms.sort_by_key(|a| gpus(a));
        }
        let arms = arms.into_iter().map(|a| (a, Unseen { remaining: grid, moved: HashMap::new() })).collect();
        BranchDraw { rng, arms }
    }

    pub fn exhausted(&self) -> bool {
        self.arms.is_empty()
    }

    /// Up to `count` (arm, grid index) draws, round-robin over the arms with draws left.
    pub fn suggest(&mut self, count: usize) -> Vec<(A, u64)> {
        let mut out = Vec::new();
        while out.len() < count {
            let Some((arm, mut pool)) = self.arms.pop_front() else { break };
            let Some(index) = pool.take(&mut self.rng) else { continue };
            out.push((arm.clone(), index));
            if pool.remaining > 0 {
                self.arms.push_back((arm, pool));
            }
        }
        out
    }
}

/// The reference's rounds over the modes' samplers, every trial taken as completed: per cycle
/// (at most `max_rounds`) each mode with budget left asks `min(per_round, budget left)`; a mode
/// whose sampler runs dry stops and splits its unused budget over the modes still drawing.
/// Returns (mode, arm, grid index) in evaluation order.
pub fn schedule<A: Clone>(
    mut draws: Vec<BranchDraw<A>>,
    mut budgets: Vec<u64>,
    per_round: u64,
    max_rounds: u64,
) -> Vec<(usize, A, u64)> {
    let n = draws.len();
    let mut attempts = vec![0u64; n];
    let mut stalled = vec![false; n];
    let mut out = Vec::new();
    for _ in 0..max_rounds {
        let mut progressed = false;
        for m in 0..n {
            if stalled[m] || attempts[m] >= budgets[m] {
                continue;
            }
            progressed = true;
            let target = per_round.min(budgets[m] - attempts[m]);
            let mut unique = 0;
            let max_attempts = per_round * 11;
            let mut tried = 0;
            while unique < target && tried < max_attempts {
                let ask = (target - unique).min(max_attempts - tried).min(budgets[m] - attempts[m]);
                if ask == 0 {
                    break;
                }
                let got = draws[m].suggest(ask as usize);
                if got.is_empty() {
                    break;
                }
                tried += got.len() as u64;
                attempts[m] += got.len() as u64;
                unique += got.len() as u64;
                out.extend(got.into_iter().map(|(a, i)| (m, a, i)));
            }
            let exhausted = draws[m].exhausted();
            if unique < target || exhausted {
                stalled[m] = true;
                if exhausted {
                    let unused = budgets[m] - attempts[m];
                    budgets[m] = attempts[m];
                    let available: Vec<usize> =
                        (0..n).filter(|&o| o != m && !stalled[o] && !draws[o].exhausted()).collect();
                    if !available.is_empty() {
                        let (share, extra) = (unused / available.len() as u64, unused % available.len() as u64);
                        for (k, &o) in available.iter().enumerate() {
                            budgets[o] += share + u64::from((k as u64) < extra);
                        }
                    }
                }
            }
        }
        if !progressed {
            break;
        }
    }
    out
}

/// An arm's GPUs (shape set of a branch), for target min_gpus.
type GpusOf<'a> = dyn Fn(&(usize, usize)) -> u64 + 'a;

/// Why servesim's space does not map one-to-one onto the reference's random sampler, if it
/// does not.
fn unmappable(space: &Space) -> Option<String> {
    if space.routers.len() > 1 {
        return Some("a searched router (the reference's adapter knobs)".into());
    }
    for br in &space.branches {
        if br.planners.len() > 1 {
            return Some("a searched planner (the reference's adapter knobs)".into());
        }
        for k in &br.knobs {
            let path: Vec<&str> = k.path.iter().map(String::as_str).collect();
            if path == ["engine", "workers", "encoder"] {
                return Some("a searched encoder pool".into());
            }
            // A range without a step, or a log one, is sampled by value in the reference (an
            // integer log range weighted by log value, a continuous one uniformly).
            let Some(range) = get(&space.base, &path).and_then(|v| v.get("range")) else { continue };
            let log = range.get("scale").and_then(Value::as_str) == Some("log");
            let same = range.get("min").is_some() && range.get("min") == range.get("max");
            if !same && (log || range.get("step").is_none()) {
                return Some(format!("{} is a {} range", path.join("."), if log { "log" } else { "continuous" }));
            }
        }
    }
    None
}

/// The reference's random draw over `pools` (per mode with candidates left, the KV-feasible
/// candidates within the budget, as indexes into `space`), or why it cannot be reproduced.
pub(super) fn draw(
    space: &Space,
    pools: &[Vec<usize>],
    optimizer: &Optimizer,
    optimization: &Optimization,
) -> Result<Vec<usize>, String> {
    if let Some(why) = unmappable(space) {
        return Err(why);
    }
    let active = pools.len() as u64;
    let trials = u64::from(optimizer.max_trials);
    let per_round = u64::from(optimizer.parallelism.max(1)).min(trials).max(1);
    let max_rounds = trials.div_ceil(per_round).max(1);
    let mut draws = Vec::new();
    let mut grids = Vec::new();
    for pool in pools {
        // The mode's shape sets in the reference's order (the first backend's, then any only
        // later backends keep), then its arms: per shape set, the backends that keep it.
        let (b0, _) = space.locate(pool[0]);
        let mode = space.branches[b0].mode;
        let per_shape = space.per_shape(b0);
        let mut kept: Vec<(usize, usize)> = Vec::new();
        for &i in pool {
            let (b, local) = space.locate(i);
            let s = local / space.per_shape(b);
            if kept.last() != Some(&(b, s)) {
                kept.push((b, s));
            }
        }
        let mut sets: Vec<usize> = Vec::new();
        for &(_, s) in &kept {
            if !sets.contains(&s) {
                sets.push(s);
            }
        }
        let mut arms: Vec<(usize, usize)> = Vec::new();
        for &s in &sets {
            for (b, br) in space.branches.iter().enumerate() {
                if br.mode == mode && kept.contains(&(b, s)) {
                    arms.push((b, s));
                }
            }
        }
        if space.branches.iter().enumerate().any(|(b, br)| br.mode == mode && space.per_shape(b) != per_shape) {
            return Err("the backends of one mode search different knob grids".into());
        }
        let offset: u128 = if mode == "disaggregated" { 1 } else { 0 };
        let gpus = |&(b, s): &(usize, usize)| space.branches[b].shape_sets[s].iter().map(|x| x.gpus()).sum::<u64>();
        let smallest: Option<&GpusOf> = if optimization.target == "min_gpus" { Some(&gpus) } else { None };
        draws.push(BranchDraw::new(u128::from(optimizer.seed) + offset, arms, per_shape as u64, smallest));
        grids.push(per_shape);
    }
    let budgets: Vec<u64> = (0..active).map(|m| trials / active + u64::from(m < trials % active)).collect();
    Ok(schedule(draws, budgets, per_round, max_rounds)
        .into_iter()
        .map(|(m, (b, s), g)| space.branches[b].start + s * grids[m] + g as usize)
        .collect())
}

/// The reference's random draw of one mode whose arms the caller builds (AFD: its topologies
/// by backend, in the reference's pair order), each arm a knob grid of `grid` indexes, seeded
/// `seed` (the mode's offset included); `smallest_first` is target min_gpus' arm order.
/// `builds` says whether a draw's candidate builds: one that does not takes a trial but not a
/// place in its round, which asks again (as the reference's round does after a failed
/// materialisation), and is recorded before the ask's candidates that build (the reference
/// records it while it materialises the ask, before their replays). Returns (arm, grid index)
/// in the reference's record order, `optimizer.max_trials` at most.
pub(super) fn draw_arms<A: Clone>(
    seed: u128,
    arms: Vec<A>,
    grid: u64,
    optimizer: &Optimizer,
    smallest_first: Option<&dyn Fn(&A) -> u64>,
    builds: &mut dyn FnMut(&A, u64) -> bool,
) -> Vec<(A, u64)> {
    let trials = u64::from(optimizer.max_trials);
    let per_round = u64::from(optimizer.parallelism.max(1)).min(trials).max(1);
    let max_rounds = trials.div_ceil(per_round).max(1);
    let mut draw = BranchDraw::new(seed, arms, grid, smallest_first);
    let mut attempts = 0;
    let mut out = Vec::new();
    for _ in 0..max_rounds {
        if attempts >= trials {
            break;
        }
        let target = per_round.min(trials - attempts);
        let (mut unique, mut tried) = (0, 0);
        let max_attempts = per_round * 11;
        while unique < target && tried < max_attempts {
            let ask = (target - unique).min(max_attempts - tried).min(trials - attempts);
            if ask == 0 {
                break;
            }
            let got = draw.suggest(ask as usize);
            if got.is_empty() {
                break;
            }
            tried += got.len() as u64;
            attempts += got.len() as u64;
            let (good, failed): (Vec<_>, Vec<_>) = got.into_iter().partition(|(a, g)| builds(a, *g));
            unique += good.len() as u64;
            out.extend(failed);
            out.extend(good);
        }
        // A round short of its target, or a sampler run dry, stops the mode.
        if unique < target || draw.exhausted() {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Values printed by CPython 3.11.7 for each seed:
    // python3 -c "import random; r=random.Random(S); print([r.getrandbits(32) for _ in range(3)],
    //   r.getrandbits(64), r.randrange(10), r.randrange(1000003), repr(r.random()),
    //   repr(r.uniform(2.5, 7.0))); x=list(range(10)); r.shuffle(x); print(x)"
    #[allow(clippy::type_complexity)]
    const CPYTHON: [(u128, [u64; 3], u64, u64, u64, f64, f64, [usize; 10]); 7] = [
        (
            0,
            [3626764237, 1654615998, 3255389356],
            7758176404715800194,
            0,
            271493,
            0.9654648863619172,
            4.6866746345326575,
            [2, 0, 3, 8, 6, 1, 9, 5, 7, 4],
        ),
        (
            1,
            [577090037, 2444712010, 3639700191],
            14089154938208861744,
            1,
            267459,
            0.11791870367106105,
            5.92433100210659,
            [2, 4, 1, 5, 8, 9, 0, 3, 6, 7],
        ),
        (
            42,
            [2746317213, 478163327, 107420369],
            5073395517033431291,
            3,
            234053,
            0.1395379285251439,
            2.961228292771784,
            [3, 2, 4, 9, 5, 7, 0, 6, 1, 8],
        ),
        (
            43,
            [165578901, 1228722198, 2990260696],
            2655099191675536772,
            7,
            387844,
            0.671646764117767,
            6.068280722448824,
            [8, 1, 5, 2, 6, 3, 4, 0, 9, 7],
        ),
        (
            123456789,
            [2754794679, 1899526012, 2328685183],
            18320846151382705099,
            9,
            416466,
            0.9879999230585628,
            3.8674113012921953,
            [4, 0, 2, 1, 9, 3, 8, 5, 6, 7],
        ),
        (
            4294967296,
            [485306839, 1508871100, 1794561286],
            307624781732766930,
            0,
            641436,
            0.8760931253853963,
            5.930499039529266,
            [5, 4, 6, 2, 3, 9, 1, 0, 7, 8],
        ),
        (
            18446744073709551615,
            [93740670, 1068495656, 1452108352],
            3910109989525945107,
            7,
            645006,
            0.09501752197422808,
            6.553653543216727,
            [6, 4, 1, 8, 2, 9, 5, 7, 3, 0],
        ),
    ];

    #[test]
    fn matches_cpython_random() {
        for (seed, words, wide, r10, rbig, unit, uni, shuffled) in CPYTHON {
            let mut r = PyRandom::new(seed);
            let got = [r.getrandbits(32), r.getrandbits(32), r.getrandbits(32)];
            assert_eq!(got, words, "seed {seed}");
            assert_eq!(r.getrandbits(64), wide, "seed {seed}");
            assert_eq!(r.randbelow(10), r10, "seed {seed}");
            assert_eq!(r.randbelow(1_000_003), rbig, "seed {seed}");
            assert_eq!(r.random(), unit, "seed {seed}");
            assert_eq!(r.uniform(2.5, 7.0), uni, "seed {seed}");
            let mut x: Vec<usize> = (0..10).collect();
            r.shuffle(&mut x);
            assert_eq!(x, shuffled, "seed {seed}");
        }
    }

    // The reference's own pool (`aisimulate.sweeper.sampler._UnseenIndices`) under its arm loop:
    // $AISIM_REF_VENV/bin/python -c "import random; from collections import deque;
    //   from aisimulate.sweeper.sampler import _UnseenIndices as U; r=random.Random(7);
    //   a=list(range(5)); r.shuffle(a); q=deque((x,U(3)) for x in a); o=[]
    //   while q: x,p=q.popleft(); o.append((x,p.take(r))); p.remaining and q.append((x,p))
    //   print(o)"  (and seed 42, one arm, a grid of 1000, six draws)
    #[test]
    fn draws_in_the_reference_order() {
        let mut d = BranchDraw::new(7, (0..5).collect::<Vec<u32>>(), 3, None);
        let expect = [
            (4, 0),
            (0, 2),
            (3, 0),
            (1, 1),
            (2, 2),
            (4, 2),
            (0, 0),
            (3, 2),
            (1, 0),
            (2, 1),
            (4, 1),
            (0, 1),
            (3, 1),
            (1, 2),
            (2, 0),
        ];
        assert_eq!(d.suggest(20), expect);
        assert!(d.exhausted());
        let mut d = BranchDraw::new(42, vec![0u32], 1000, None);
        assert_eq!(d.suggest(6), [(0, 654), (0, 114), (0, 25), (0, 759), (0, 281), (0, 250)]);
    }

    #[test]
    fn a_draw_that_does_not_build_is_recorded_first_and_replaced_in_its_round() {
        // The draw of `draws_in_the_reference_order` (seed 7, five arms, grids of 3), 6 trials in
        // rounds of 3, arm 4 failing its build: round one asks 3, one fails (recorded first) and
        // one more is asked; round two asks the 2 trials left, one fails, and no trial is left
        // to replace it.
        let optimizer = Optimizer { algorithm: "random", max_trials: 6, parallelism: 3, seed: 7 };
        let got = draw_arms(7, (0..5).collect::<Vec<u32>>(), 3, &optimizer, None, &mut |a, _| *a != 4);
        assert_eq!(got, [(4, 0), (0, 2), (3, 0), (1, 1), (4, 2), (2, 2)]);
        // Every draw building: the sampler's own order.
        let got = draw_arms(7, (0..5).collect::<Vec<u32>>(), 3, &optimizer, None, &mut |_, _| true);
        assert_eq!(got, [(4, 0), (0, 2), (3, 0), (1, 1), (2, 2), (4, 2)]);
    }

    #[test]
    fn schedule_interleaves_modes_and_hands_on_unused_trials() {
        // Mode 0 has 2 draws in all, mode 1 plenty: 7 trials, rounds of 2 (4 rounds at most).
        let draws = vec![BranchDraw::new(1, vec![0u32], 2, None), BranchDraw::new(2, vec![1u32], 100, None)];
        let got: Vec<usize> = schedule(draws, vec![4, 3], 2, 4).into_iter().map(|(m, ..)| m).collect();
        // Mode 0 runs dry in its first round; its 2 unused trials go to mode 1 (3 + 2 = 5).
        assert_eq!(got, [0, 0, 1, 1, 1, 1, 1]);
    }
}

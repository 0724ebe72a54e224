//! Random search in the reference's draw order (issue 32): aisimulate 0.13 samples with Python's
//! `random.Random(seed)` (MT19937 seeded from the seed's 32-bit words), one sampler per
//! deployment mode seeded `seed + {aggregated: 0, disaggregated: 1}`. Each sampler shuffles its
//! arms — the (backend, parallel shape set) pairs, shape-set-major — then walks them
//! round-robin, each arm drawing a knob index (the choice knobs' values, then every integer of
//! each integer log range, mixed-radix, the last one fastest):
//! - finite grids without log ranges: a not-yet-drawn index from a sparse Fisher–Yates pool;
//! - with an integer log range (scheduler budgets, sequences, block size: every integer between
//!   the bounds, where a grid searches the powers of two): up to 32 log-weighted indexes (a
//!   log-uniform value rounded half to even per log digit, a uniform one per other digit), the
//!   first undrawn one taken, else a uniform pool draw;
//! - with a continuous range (a KV memory fraction without step, linear or log, which a grid
//!   refuses): a weighted index and a value per range, redrawn up to 64 times until the arm has
//!   not drawn that selection (an arm that finds none stops, and the sampler never runs dry).
//!
//! Values drawn by value travel with the candidate ([`Pick`]), an index into the space whose
//! stand-in values they replace. Trials are split over the modes by divmod and asked in rounds
//! of `min(parallelism, max_trials)` per mode ([`schedule`]); a trial that does not complete (it
//! ranks infeasible, unsupported or failed) is re-asked within its mode's round, up to 11 asks a
//! round, so the search runs round by round from the results ([`Plan::run`]) and cannot be
//! sharded; a mode that runs dry hands its unused trials to the others. The reference's retry of
//! a timed-out trial (`RandomBranchSampler.retry`) never applies: a servesim trial has no timeout.
//!
//! A router section's settings are the adapter's knobs, after the traffic load: the policy (one
//! value), then under kv_router the prefill load model, overlap credit, prefill load scale and
//! temperature. A router that searches both policies is the reference's
//! `ConditionalBranchSampler`: a sampler per policy, seeded `(seed + int(sha256(arm)[:8], 16)) %
//! (2^31 - 1)` from its selector assignment, taking turns from a cursor ([`Conditional`]). A
//! scalar KV-relative load is a knob of one value (it takes a log-weighted draw of its own); a
//! traffic range the reference samples by value (log, or linear without step) is drawn by value,
//! a concurrency rounded ties to even.
//!
//! A `planner:` section's settings are the Planner adapter's knobs (policy, scaling policy, FPM
//! sampling, load sensitivity, worker minimums, a group's independent knobs), drawn over their
//! full product with its duplicates (every disabled-policy point is the one disabled setting):
//! each knob is a digit, single-valued ones too, and the product point names the setting
//! servesim's deduplicated list holds for it (`planner_search::Grid`). The router's and the
//! planner's knobs follow the configuration's section order.
//!
//! A planner knob given as a log range (an independent group knob) is drawn as the reference's
//! `log_discrete_choices`: its values sorted as numbers, weighted by a log-uniform value's
//! nearest. A searched encoder pool (EPD) is the branch's last choice knob, its catalog in the
//! reference's order.
//!
//! [`plan`] returns why not (the caller keeps its own ChaCha12 draw, says so in the provenance,
//! and refuses a continuous range, which only this draw samples) for an encoder pool searched
//! beside more than one backend (the reference's knob is every backend's pools, a mismatched
//! pair failing its build, which servesim's per-backend catalogs do not hold) and backends of
//! one mode searching different grids otherwise. AFD (`afd.rs`) builds its own arms, the
//! topologies, and draws with [`afd_plan`].

use std::collections::{HashMap, HashSet, VecDeque};

use rand_mt::Mt;
use serde_json::Value;

use super::space::{get, Optimization, Optimizer, Pick, Sampled, Space};

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
    pub fn random(&mut self) -> f64 {
        let a = u64::from(self.mt.next_u32() >> 5);
        let b = u64::from(self.mt.next_u32() >> 6);
        (a as f64 * 67_108_864.0 + b as f64) * (1.0 / 9_007_199_254_740_992.0)
    }

    /// `uniform(a, b)`: `a + (b - a) * random()`.
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

/// The indexes of a knob grid not yet drawn, as a sparse Fisher–Yates pool (memory grows with
/// the draws, not the grid); an index may also be asked for by value (a log-weighted draw).
struct Unseen {
    remaining: u64,
    /// Position → the index now held there (positions below `remaining` hold undrawn ones).
    values: HashMap<u64, u64>,
    /// Index → its position, where it moved.
    positions: HashMap<u64, u64>,
    drawn: HashSet<u64>,
}

impl Unseen {
    fn new(size: u64) -> Unseen {
        Unseen { remaining: size, values: HashMap::new(), positions: HashMap::new(), drawn: HashSet::new() }
    }

    /// A uniform undrawn index (`preferred` `None`), or `preferred` when it is undrawn.
    fn take(&mut self, rng: &mut PyRandom, preferred: Option<u64>) -> Option<u64> {
        if self.remaining == 0 {
            return None;
        }
        let value = match preferred {
            Some(v) => v,
            None => {
                let position = rng.randbelow(self.remaining);
                self.values.get(&position).copied().unwrap_or(position)
            }
        };
        if self.drawn.contains(&value) {
            return None;
        }
        let position = self.positions.remove(&value).unwrap_or(value);
        self.remaining -= 1;
        let last = self.values.remove(&self.remaining).unwrap_or(self.remaining);
        if position != self.remaining {
            self.values.insert(position, last);
            self.positions.insert(last, position);
        }
        self.drawn.insert(value);
        Some(value)
    }
}

/// How a log-weighted draw picks a digit (`_weighted_index`): uniformly, or from a log-uniform
/// value between the domain's ends.
#[derive(Clone, Debug, PartialEq)]
pub enum Scale {
    Uniform,
    /// Every integer from `min` (an integer log range): the value rounded half to even.
    LogIntegers {
        min: u64,
    },
    /// Listed values, ascending (an adapter knob given as a log range, its values sorted as
    /// numbers): the nearest value, the first on a tie.
    LogValues(Vec<f64>),
}

/// One digit of a branch's knob index, in the reference's order (its choice knobs, then its
/// integer ranges): `size` values, weighted as `scale` says.
#[derive(Clone, Debug, PartialEq)]
pub struct Digit {
    pub size: u64,
    pub scale: Scale,
}

impl Digit {
    fn uniform(size: u64) -> Digit {
        Digit { size, scale: Scale::Uniform }
    }
}

/// The knobs one sampler draws: index digits (mixed radix, the last one fastest) and continuous
/// ranges (min, max, log) drawn by value per suggestion.
#[derive(Clone, Debug, PartialEq)]
pub struct Dims {
    pub digits: Vec<Digit>,
    pub floats: Vec<(f64, f64, bool)>,
}

impl Dims {
    /// A plain grid of `size` indexes.
    #[cfg(test)]
    pub fn grid(size: u64) -> Dims {
        Dims { digits: vec![Digit::uniform(size)], floats: Vec::new() }
    }

    fn size(&self) -> u64 {
        self.digits.iter().map(|d| d.size).product()
    }

    fn weighted(&self) -> bool {
        self.digits.iter().any(|d| d.scale != Scale::Uniform && d.size > 1)
    }
}

/// The selections an arm drew (continuous domains): knob index and the values' bits.
type Seen = HashSet<(u64, Vec<u64>)>;

/// One drawn suggestion: the arm, its knob index and its continuous values.
pub type Drawn<A> = (A, u64, Vec<f64>);

/// One mode's sampler (`RandomBranchSampler`): its arms in the shuffled order, each with its pool
/// of knob indexes (finite domains) or the selections it drew (continuous ones).
pub struct BranchDraw<A> {
    rng: PyRandom,
    dims: Dims,
    arms: VecDeque<(A, Unseen, Seen)>,
    /// An arm found no new selection in 64 tries (continuous domains): never exhausted.
    stalled: bool,
}

impl<A: Clone> BranchDraw<A> {
    /// Shuffles `arms` with `random.Random(seed)`; `smallest_first` (target min_gpus) then
    /// orders them by GPUs, stably, as the reference does.
    pub fn new(seed: u128, mut arms: Vec<A>, dims: Dims, smallest_first: Option<&dyn Fn(&A) -> u64>) -> Self {
        let mut rng = PyRandom::new(seed);
        rng.shuffle(&mut arms);
        if let Some(gpus) = smallest_first {
            arms.sort_by_key(|a| gpus(a));
        }
        let size = dims.size();
        let arms = arms.into_iter().map(|a| (a, Unseen::new(size), HashSet::new())).collect();
        BranchDraw { rng, dims, arms, stalled: false }
    }

    pub fn exhausted(&self) -> bool {
        self.arms.is_empty() && !self.stalled
    }

    /// `_weighted_index`: per digit a log-uniform value rounded (half to even) to the nearest
    /// integer of a log range, or the nearest of a log knob's listed values, else a uniform digit.
    fn weighted_index(&mut self) -> u64 {
        let mut index = 0;
        for d in &self.dims.digits {
            let digit = match &d.scale {
                Scale::LogIntegers { min } if d.size > 1 => {
                    let (lo, hi) = (*min as f64, (min + d.size - 1) as f64);
                    let x = self.rng.uniform(lo.ln(), hi.ln()).exp().round_ties_even();
                    (x - lo).clamp(0.0, (d.size - 1) as f64) as u64
                }
                Scale::LogValues(values) if d.size > 1 => {
                    let (lo, hi) = (values[0], values[values.len() - 1]);
                    let x = self.rng.uniform(lo.ln(), hi.ln()).exp();
                    let mut best = 0;
                    for (i, v) in values.iter().enumerate() {
                        if (v - x).abs() < (values[best] - x).abs() {
                            best = i;
                        }
                    }
                    best as u64
                }
                _ => self.rng.randbelow(d.size),
            };
            index = index * d.size + digit;
        }
        index
    }

    fn floats(&mut self) -> Vec<f64> {
        let floats = self.dims.floats.clone();
        floats
            .into_iter()
            .map(|(a, b, log)| if log { self.rng.uniform(a.ln(), b.ln()).exp() } else { self.rng.uniform(a, b) })
            .collect()
    }

    /// Up to `count` draws, round-robin over the arms with draws left.
    pub fn suggest(&mut self, count: usize) -> Vec<Drawn<A>> {
        let continuous = !self.dims.floats.is_empty();
        let weighted = self.dims.weighted();
        let mut out = Vec::new();
        while out.len() < count {
            let Some((arm, mut pool, mut seen)) = self.arms.pop_front() else { break };
            let (index, floats) = if continuous {
                let mut fresh = None;
                for _ in 0..64 {
                    let index = self.weighted_index();
                    let floats = self.floats();
                    if seen.insert((index, floats.iter().map(|f| f.to_bits()).collect())) {
                        fresh = Some((index, floats));
                        break;
                    }
                }
                match fresh {
                    Some(f) => f,
                    None => {
                        self.stalled = true;
                        continue;
                    }
                }
            } else {
                let mut index = None;
                if weighted {
                    for _ in 0..32 {
                        let preferred = self.weighted_index();
                        index = pool.take(&mut self.rng, Some(preferred));
                        if index.is_some() {
                            break;
                        }
                    }
                }
                match index.or_else(|| pool.take(&mut self.rng, None)) {
                    Some(i) => (i, Vec::new()),
                    None => continue,
                }
            };
            out.push((arm.clone(), index, floats));
            if continuous || pool.remaining > 0 {
                self.arms.push_back((arm, pool, seen));
            }
        }
        out
    }
}

/// One mode's samplers as the reference's `ConditionalBranchSampler` takes turns over them (a
/// searched router policy: one sampler per policy, each over that policy's knobs); a mode
/// without a conditional knob has one. An ask is split over the samplers with draws left,
/// round-robin from a cursor that moves on by the ask's size, and their draws are interleaved
/// in that order.
pub struct Conditional<A> {
    samplers: Vec<BranchDraw<A>>,
    cursor: usize,
}

impl<A: Clone> Conditional<A> {
    pub fn new(samplers: Vec<BranchDraw<A>>) -> Self {
        Conditional { samplers, cursor: 0 }
    }

    pub fn exhausted(&self) -> bool {
        self.samplers.iter().all(BranchDraw::exhausted)
    }

    pub fn suggest(&mut self, count: usize) -> Vec<Drawn<A>> {
        let active: Vec<usize> = (0..self.samplers.len()).filter(|&i| !self.samplers[i].exhausted()).collect();
        if count == 0 || active.is_empty() {
            return Vec::new();
        }
        let order: Vec<usize> = (0..count).map(|i| active[(self.cursor + i) % active.len()]).collect();
        self.cursor = (self.cursor + count) % active.len();
        let mut batches: Vec<VecDeque<Drawn<A>>> = (0..self.samplers.len())
            .map(|i| {
                let n = order.iter().filter(|&&o| o == i).count();
                if n > 0 {
                    self.samplers[i].suggest(n).into()
                } else {
                    VecDeque::new()
                }
            })
            .collect();
        order.into_iter().filter_map(|i| batches[i].pop_front()).collect()
    }
}

/// The reference's rounds over the modes' samplers: per cycle (at most `max_rounds`) each mode
/// with budget left asks `min(per_round, budget left)` and re-asks, within the round, for each
/// trial that did not complete (`run` evaluates a batch and says how many did), up to 11 asks
/// per round; a mode short of its round's target stops, and one whose sampler ran dry splits
/// its unused budget over the modes still drawing. `run` gets (mode, draws) in evaluation order.
pub fn schedule<A: Clone>(
    draws: &mut [Conditional<A>],
    mut budgets: Vec<u64>,
    per_round: u64,
    max_rounds: u64,
    run: &mut dyn FnMut(usize, Vec<Drawn<A>>) -> u64,
) {
    let n = draws.len();
    let mut attempts = vec![0u64; n];
    let mut stalled = vec![false; n];
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
                unique += run(m, got);
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
}

/// An arm's GPUs (its position in the mode's arms), for target min_gpus.
type GpusOf<'a> = dyn Fn(&(usize, usize)) -> u64 + 'a;

/// Where a sampler's index digit lands in servesim's candidate: a knob's value index, an integer
/// range's value (min + digit), a step of the router index or of the planner's knob product,
/// or nowhere (a single-valued domain
/// of the reference's that servesim's space does not list, such as a fixed KV-relative load or
/// planner; it still takes a log-weighted draw of its own).
#[derive(Clone, Debug, PartialEq)]
enum Slot {
    Knob(usize),
    Integer(usize, u64),
    Router(usize),
    /// A stride of the planner's knob product; a log knob's sorted digits mapped to positions.
    Planner(usize, Vec<usize>),
    Unit,
}

/// One sampler of a mode: its seed, the knobs' digits and where each lands, the continuous knobs
/// (knob position; whether the value is rounded to an integer, as a concurrency is), and the
/// router index its router digits start from.
#[derive(Clone, Debug)]
struct Sampler {
    seed: u128,
    dims: Dims,
    slots: Vec<Slot>,
    floats: Vec<(usize, bool)>,
    router_base: usize,
}

/// One mode's samplers as the search replays them: the arms (branch, shape set) before the
/// shuffle and their GPUs, a sampler per conditional arm (one without), min_gpus ordering. With
/// `arm_knob` (AFD: the topology), an arm's second number is that knob's value, not a shape set.
#[derive(Clone, Debug)]
pub struct ModePlan {
    arms: Vec<(usize, usize)>,
    gpus: Vec<u64>,
    arm_knob: Option<usize>,
    samplers: Vec<Sampler>,
    smallest_first: bool,
}

/// The reference's random search over servesim's space (issue 32): one sampler per mode,
/// the modes' trial budgets and the round sizes. [`Plan::run`] replays it.
#[derive(Clone, Debug)]
pub struct Plan {
    modes: Vec<ModePlan>,
    budgets: Vec<u64>,
    per_round: u64,
    max_rounds: u64,
}

impl Plan {
    /// Runs the search: `run` evaluates each batch of picks (in evaluation order) and says how
    /// many completed (the reference re-asks for the others within the round).
    pub fn run(&self, space: &Space, run: &mut dyn FnMut(Vec<Pick>) -> u64) {
        let mut draws: Vec<Conditional<(usize, usize)>> = self
            .modes
            .iter()
            .map(|m| {
                let gpus = |&(a, _): &(usize, usize)| m.gpus[a];
                let smallest: Option<&GpusOf> = if m.smallest_first { Some(&gpus) } else { None };
                Conditional::new(
                    m.samplers
                        .iter()
                        .enumerate()
                        .map(|(k, sm)| {
                            let arms = (0..m.arms.len()).map(|a| (a, k)).collect();
                            BranchDraw::new(sm.seed, arms, sm.dims.clone(), smallest)
                        })
                        .collect(),
                )
            })
            .collect();
        schedule(&mut draws, self.budgets.clone(), self.per_round, self.max_rounds, &mut |m, got| {
            let plan = &self.modes[m];
            run(got
                .into_iter()
                .map(|((a, k), index, floats)| {
                    let (b, s) = plan.arms[a];
                    plan.samplers[k].pick(space, b, s, plan.arm_knob, index, &floats)
                })
                .collect())
        });
    }

    /// The picks when every trial completes (the order a run takes unless one does not).
    pub fn picks(&self, space: &Space) -> Vec<Pick> {
        let mut out = Vec::new();
        self.run(space, &mut |batch| {
            let n = batch.len() as u64;
            out.extend(batch);
            n
        });
        out
    }
}

impl Sampler {
    /// The candidate of branch `b`, shape set `s` (or value `s` of `arm_knob`, shape set 0)
    /// that the sampler's knob `index` and continuous values name.
    fn pick(&self, space: &Space, b: usize, s: usize, arm_knob: Option<usize>, index: u64, floats: &[f64]) -> Pick {
        let br = &space.branches[b];
        let mut digits = vec![0u64; self.dims.digits.len()];
        let mut rest = index;
        for (j, d) in self.dims.digits.iter().enumerate().rev() {
            digits[j] = rest % d.size;
            rest /= d.size;
        }
        let mut knob_digit = vec![0usize; br.knobs.len()];
        let s = match arm_knob {
            Some(k) => {
                knob_digit[k] = s;
                0
            }
            None => s,
        };
        let mut router = self.router_base;
        let mut planner_point = 0;
        let mut drawn = Vec::new();
        for (slot, &d) in self.slots.iter().zip(&digits) {
            match *slot {
                Slot::Knob(k) => knob_digit[k] = d as usize,
                Slot::Integer(k, min) => drawn.push((k, Value::from(min + d))),
                Slot::Router(stride) => router += d as usize * stride,
                Slot::Planner(stride, ref order) => {
                    planner_point += order.get(d as usize).copied().unwrap_or(d as usize) * stride
                }
                Slot::Unit => {}
            }
        }
        for (&(k, integer), &f) in self.floats.iter().zip(floats) {
            // The reference's integer load: `max(1, round(value))`, ties to even.
            let v = if integer { Value::from(f.round_ties_even().max(1.0) as u64) } else { Value::from(f) };
            drawn.push((k, v));
        }
        let mut local = 0usize;
        for (k, knob) in br.knobs.iter().enumerate() {
            local = local * knob.values.len() + knob_digit[k];
        }
        // The planner's knob product point names its (deduplicated) setting.
        let planner = br.planner_grid.cells.get(planner_point).copied().unwrap_or(0);
        local = (local * space.routers.len().max(1) + router) * br.planners.len().max(1) + planner;
        Pick { index: br.start + s * space.per_shape(b) + local, drawn }
    }
}

/// The reference's order of a branch's integer ranges: per role (aggregated, prefill, decode)
/// the token budget, the sequences, the block size.
fn integer_rank(path: &[String]) -> (usize, usize) {
    let role = ["aggregated", "prefill", "decode"].iter().position(|r| path.get(2).is_some_and(|p| p == r));
    let key =
        ["max_batched_tokens", "max_sequences", "block_size"].iter().position(|k| path.last().is_some_and(|p| p == k));
    (role.unwrap_or(3), key.unwrap_or(3))
}

/// The router adapter's selector name, as the reference namespaces it.
const ROUTER_SELECTOR: &str = "adapter::dynamo.router::mode";

/// The seed of a conditional arm: `(seed + int(sha256(json)[:8], 16)) % (2^31 - 1)`, the JSON
/// being the arm's selector assignment (`{"<selector>":"<value>"}`, as Python's `json.dumps`
/// with sorted keys and compact separators writes it).
fn arm_seed(seed: u128, selector: &str, value: &str) -> u128 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{{\"{selector}\":\"{value}\"}}").as_bytes());
    let head = u128::from(u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]));
    (seed + head) % ((1u128 << 31) - 1)
}

/// The router settings' domains as the adapter lists them: per policy (in the configuration's
/// order) its first index in `space.routers`, and the kv_router knobs' value counts
/// (prefill load model, overlap credit, prefill load scale, temperature; the last fastest).
fn router_domains(space: &Space) -> (Vec<(String, usize)>, [usize; 4]) {
    let mut policies: Vec<(String, usize)> = Vec::new();
    let mut seen: [Vec<&Value>; 4] = Default::default();
    for (i, r) in space.routers.iter().enumerate() {
        let policy = r.get("policy").and_then(Value::as_str).unwrap_or("round_robin").to_string();
        if !policies.iter().any(|(p, _)| *p == policy) {
            policies.push((policy.clone(), i));
        }
        if policy == "kv_router" {
            let values = [
                r.pointer("/prefill_load_model/type"),
                r.get("overlap_score_credit"),
                r.get("prefill_load_scale"),
                r.get("temperature"),
            ];
            for (j, v) in values.into_iter().enumerate() {
                if let Some(v) = v {
                    if !seen[j].contains(&v) {
                        seen[j].push(v);
                    }
                }
            }
        }
    }
    (policies, seen.map(|v| v.len().max(1)))
}

/// Branch `b`'s samplers in the reference's order of its knobs (the engine's, a fixed
/// KV-relative load, the traffic load, the router's and planner's adapter knobs, then the
/// integer ranges; continuous ranges by value), one per router policy when the router policy
/// is searched (its `ConditionalBranchSampler`), each seeded from `seed`; or why the
/// reference's differ.
fn branch_samplers(space: &Space, b: usize, seed: u128, arm_knob: Option<usize>) -> Result<Vec<Sampler>, String> {
    let br = &space.branches[b];
    let mut dims = Dims { digits: Vec::new(), floats: Vec::new() };
    let mut slots = Vec::new();
    let mut floats = Vec::new();
    let mut integers = Vec::new();
    let kv_load = space.base.pointer("/traffic/load/type").and_then(Value::as_str) == Some("kv_capacity_fraction");
    let mut fixed_kv_load = kv_load && space.base.pointer("/traffic/load/fraction").is_some_and(|f| !f.is_object());
    for (k, knob) in br.knobs.iter().enumerate().filter(|&(k, _)| Some(k) != arm_knob) {
        let path: Vec<&str> = knob.path.iter().map(String::as_str).collect();
        // The reference's scalar KV load ratio is a knob of one value before the traffic load.
        if path[0] == "traffic" && std::mem::take(&mut fixed_kv_load) {
            dims.digits.push(Digit::uniform(1));
            slots.push(Slot::Unit);
        }
        match knob.sampled {
            Some(Sampled::Integers { min, max }) => integers.push((integer_rank(&knob.path), k, min, max)),
            Some(Sampled::Continuous { min, max, log, integer }) => {
                dims.floats.push((min, max, log));
                floats.push((k, integer));
            }
            None => {
                // A traffic range without a step, or a log one, is sampled by value when the
                // search is random (its knob says so); one listed as a grid here is not.
                if let Some(range) = get(&space.base, &path).and_then(|v| v.get("range")) {
                    let log = range.get("scale").and_then(Value::as_str) == Some("log");
                    let same = range.get("min").is_some() && range.get("min") == range.get("max");
                    if !same && (log || range.get("step").is_none()) {
                        let kind = if log { "log" } else { "continuous" };
                        return Err(format!("{} is a {kind} range", path.join(".")));
                    }
                }
                dims.digits.push(Digit::uniform(knob.values.len() as u64));
                slots.push(Slot::Knob(k));
            }
        }
    }
    if fixed_kv_load {
        dims.digits.push(Digit::uniform(1));
        slots.push(Slot::Unit);
    }
    // The adapter knobs in the order of the configuration's sections: the router's (a selector
    // per policy when it searches both, its kv_router knobs after every other adapter knob) and
    // the planner's, each of its knobs a digit (single-valued ones too: drawn by value, each
    // takes a draw of its own), whose product point names the setting it materialises to.
    // A knob given as a log range draws over its values sorted as numbers, weighted by value;
    // its digit names the sorted value, which `order` maps back to the knob's own position.
    let planner_digit = |dims: &mut Dims, slots: &mut Vec<Slot>| {
        let grid = &br.planner_grid;
        for (j, &size) in grid.sizes.iter().enumerate() {
            let stride = grid.sizes[j + 1..].iter().product();
            match grid.log.iter().find(|(at, _)| *at == j) {
                Some((_, values)) => {
                    let mut order: Vec<usize> = (0..values.len()).collect();
                    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
                    let sorted = order.iter().map(|&i| values[i]).collect();
                    dims.digits.push(Digit { size: size as u64, scale: Scale::LogValues(sorted) });
                    slots.push(Slot::Planner(stride, order));
                }
                None => {
                    dims.digits.push(Digit::uniform(size as u64));
                    slots.push(Slot::Planner(stride, Vec::new()));
                }
            }
        }
    };
    let planner_first = br.planner_grid.before_router;
    integers.sort_by_key(|&(rank, ..)| rank);
    let finish = |mut dims: Dims, mut slots: Vec<Slot>, seed: u128, router_base: usize| {
        for &(_, k, min, max) in &integers {
            dims.digits.push(Digit { size: max - min + 1, scale: Scale::LogIntegers { min } });
            slots.push(Slot::Integer(k, min));
        }
        Sampler { seed, dims, slots, floats: floats.clone(), router_base }
    };
    if space.routers.is_empty() {
        planner_digit(&mut dims, &mut slots);
        return Ok(vec![finish(dims, slots, seed, 0)]);
    }
    let (policies, [models, credits, scales, temperatures]) = router_domains(space);
    let kv_digits = |dims: &mut Dims, slots: &mut Vec<Slot>| {
        let strides = [credits * scales * temperatures, scales * temperatures, temperatures, 1];
        for (size, stride) in [models, credits, scales, temperatures].into_iter().zip(strides) {
            dims.digits.push(Digit::uniform(size as u64));
            slots.push(Slot::Router(stride));
        }
    };
    let mut out = Vec::new();
    for (policy, base) in &policies {
        let (mut dims, mut slots) = (dims.clone(), slots.clone());
        if planner_first {
            planner_digit(&mut dims, &mut slots);
        }
        // The policy selector: one value per sampler when both policies are searched.
        dims.digits.push(Digit::uniform(1));
        slots.push(Slot::Router(0));
        if policies.len() == 1 && policy == "kv_router" {
            kv_digits(&mut dims, &mut slots);
        }
        if !planner_first {
            planner_digit(&mut dims, &mut slots);
        }
        // A conditional arm's knobs come after every other adapter knob.
        if policies.len() > 1 && policy == "kv_router" {
            kv_digits(&mut dims, &mut slots);
        }
        let seed = if policies.len() > 1 { arm_seed(seed, ROUTER_SELECTOR, policy) } else { seed };
        out.push(finish(dims, slots, seed, *base));
    }
    Ok(out)
}

/// The reference's random search over `pools` (per mode with candidates left, the KV-feasible
/// candidates within the budget, as indexes into `space`), or why it cannot be reproduced.
pub(super) fn plan(
    space: &Space,
    pools: &[Vec<usize>],
    optimizer: &Optimizer,
    optimization: &Optimization,
) -> Result<Plan, String> {
    let active = pools.len() as u64;
    let trials = u64::from(optimizer.max_trials);
    let per_round = u64::from(optimizer.parallelism.max(1)).min(trials).max(1);
    let max_rounds = trials.div_ceil(per_round).max(1);
    let mut modes = Vec::new();
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
        let offset: u128 = if mode == "disaggregated" { 1 } else { 0 };
        let seed = u128::from(optimizer.seed) + offset;
        let samplers = branch_samplers(space, b0, seed, None)?;
        let shape = |s: &[Sampler]| s.iter().map(|x| (x.dims.clone(), x.slots.clone())).collect::<Vec<_>>();
        let values = |b: usize| space.branches[b].knobs.iter().map(|k| &k.values).collect::<Vec<_>>();
        for (b, br) in space.branches.iter().enumerate() {
            if br.mode != mode {
                continue;
            }
            // Each backend's encoder catalog is its own knob here; the reference's one knob is
            // their union, a pool of another backend failing its candidate build.
            if br.knobs.iter().any(|k| k.path == ["engine", "workers", "encoder"]) && values(b) != values(b0) {
                return Err("an encoder pool searched beside more than one backend (the reference draws over \
                            every backend's pools and fails a pool of another backend)"
                    .into());
            }
            if space.per_shape(b) != per_shape || shape(&branch_samplers(space, b, seed, None)?) != shape(&samplers) {
                return Err("the backends of one mode search different knob grids".into());
            }
        }
        let gpus = arms.iter().map(|&(b, s)| space.branches[b].shape_sets[s].iter().map(|x| x.gpus()).sum()).collect();
        modes.push(ModePlan {
            arms,
            gpus,
            arm_knob: None,
            samplers,
            smallest_first: optimization.target == "min_gpus",
        });
    }
    let budgets: Vec<u64> = (0..active).map(|m| trials / active + u64::from(m < trials % active)).collect();
    Ok(Plan { modes, budgets, per_round, max_rounds })
}

/// The reference's random draw of the AFD branch (`afd.rs`): one mode seeded `seed + 2`, its arms
/// the (backend branch, topology) pairs `arms` (the topology a value of knob `topology`, in the
/// reference's pair order) with their GPUs, each drawing from the grid of the branch's other
/// knobs (the load's values), in the reference's rounds: a trial that does not complete (a
/// topology the op model cannot measure, a strict-SLA miss) is re-asked within its round.
pub(super) fn afd_plan(
    space: &Space,
    topology: usize,
    arms: Vec<(usize, usize)>,
    gpus: Vec<u64>,
    optimizer: &Optimizer,
    optimization: &Optimization,
) -> Result<Plan, String> {
    let trials = u64::from(optimizer.max_trials);
    let per_round = u64::from(optimizer.parallelism.max(1)).min(trials).max(1);
    let samplers = branch_samplers(space, 0, u128::from(optimizer.seed) + 2, Some(topology))?;
    let mode =
        ModePlan { arms, gpus, arm_knob: Some(topology), samplers, smallest_first: optimization.target == "min_gpus" };
    Ok(Plan { modes: vec![mode], budgets: vec![trials], per_round, max_rounds: trials.div_ceil(per_round).max(1) })
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
        let mut d = BranchDraw::new(7, (0..5).collect::<Vec<u32>>(), Dims::grid(3), None);
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
        let got: Vec<(u32, u64)> = d.suggest(20).into_iter().map(|(a, i, _)| (a, i)).collect();
        assert_eq!(got, expect);
        assert!(d.exhausted());
        let mut d = BranchDraw::new(42, vec![0u32], Dims::grid(1000), None);
        let got: Vec<u64> = d.suggest(6).into_iter().map(|(_, i, _)| i).collect();
        assert_eq!(got, [654, 114, 25, 759, 281, 250]);
    }

    #[test]
    fn a_conditional_sampler_takes_turns_from_its_cursor() {
        // Two samplers (seeds 7 and 42, the draws of `draws_in_the_reference_order`): asks of 3
        // then 2 split [0, 1, 0] and, from the cursor's position 1, [1, 0], each sampler
        // drawing in its own order; one that runs dry leaves the turns to the others.
        let mut c = Conditional::new(vec![
            BranchDraw::new(7, (0..5).collect::<Vec<u32>>(), Dims::grid(3), None),
            BranchDraw::new(42, vec![9u32], Dims::grid(1000), None),
        ]);
        let got: Vec<(u32, u64)> = c.suggest(3).into_iter().chain(c.suggest(2)).map(|(a, i, _)| (a, i)).collect();
        assert_eq!(got, [(4, 0), (9, 654), (0, 2), (9, 114), (3, 0)]);
        let mut c = Conditional::new(vec![
            BranchDraw::new(1, vec![0u32], Dims::grid(1), None),
            BranchDraw::new(2, vec![1u32], Dims::grid(3), None),
        ]);
        let got: Vec<u32> = (0..4).flat_map(|_| c.suggest(1)).map(|(a, ..)| a).collect();
        assert_eq!(got, [0, 1, 1, 1]);
        assert!(c.exhausted());
    }

    #[test]
    fn schedule_interleaves_modes_and_hands_on_unused_trials() {
        // Mode 0 has 2 draws in all, mode 1 plenty: 7 trials, rounds of 2 (4 rounds at most).
        let mut draws = vec![
            Conditional::new(vec![BranchDraw::new(1, vec![0u32], Dims::grid(2), None)]),
            Conditional::new(vec![BranchDraw::new(2, vec![1u32], Dims::grid(100), None)]),
        ];
        let mut got = Vec::new();
        schedule(&mut draws, vec![4, 3], 2, 4, &mut |m, batch| {
            got.extend(std::iter::repeat_n(m, batch.len()));
            batch.len() as u64
        });
        // Mode 0 runs dry in its first round; its 2 unused trials go to mode 1 (3 + 2 = 5).
        assert_eq!(got, [0, 0, 1, 1, 1, 1, 1]);
        // A trial that does not complete is re-asked within its mode's round: mode 1's first
        // fails, so it asks a third before mode 0's second round; each mode spends its budget.
        let mut draws = vec![
            Conditional::new(vec![BranchDraw::new(1, vec![0u32], Dims::grid(50), None)]),
            Conditional::new(vec![BranchDraw::new(2, vec![1u32], Dims::grid(100), None)]),
        ];
        let (mut got, mut calls) = (Vec::new(), 0);
        schedule(&mut draws, vec![4, 4], 2, 4, &mut |m, batch| {
            calls += 1;
            got.extend(std::iter::repeat_n(m, batch.len()));
            batch.len() as u64 - u64::from(calls == 2)
        });
        assert_eq!(got, [0, 0, 1, 1, 1, 0, 0, 1]);
    }
}

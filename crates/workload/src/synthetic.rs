//! Synthetic workloads: constant prompt and output lengths, sessions of several turns, shared
//! prefixes, and arrival processes (Poisson, fixed interval, or all at once for closed loop).
//!
//! The random streams are the reference's: ChaCha12 seeded with the arrival seed, Poisson gaps
//! drawn by inversion (`−ln(1 − u) · mean`), and prefix groups drawn uniformly from a second
//! ChaCha12 stream with a fixed seed (`group_seed`: the reference's session stream does not
//! depend on the arrival seed). A run with the same seed therefore releases the same requests
//! at exactly the reference's times.
//!
//! Two references generate sessions, and differ in what a later turn's prompt is:
//! - Dynamo's synthetic replay (the flag form): every turn is a fresh prompt of `input_tokens`,
//!   its groups drawn with seed [`GROUP_SEED`];
//! - aisimulate's `synthetic-session` source (the deployment YAML): `input_tokens` are the turn's
//!   *new* tokens, appended to everything the session said and generated before
//!   ([`SyntheticSpec::accumulate`]), its groups drawn with seed [`AISIMULATE_GROUP_SEED`].

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rustc_hash::FxHashMap;

use crate::error::{short_number as short, InputError};
use crate::ids::MAX_TIME_MS;
use crate::session::{SessionSpec, TurnSpec};

/// Seed of the prefix-group stream of Dynamo's synthetic replay, whatever the arrival seed.
pub const GROUP_SEED: u64 = 42;
/// Seed of the prefix-group stream of aisimulate's synthetic sources.
pub const AISIMULATE_GROUP_SEED: u64 = 0;
/// High bits of the ids of the cached prefix every prompt starts with.
const CACHED_PREFIX_TAG: u64 = 0xCAC0_0000_0000_0000;
/// High bits of the ids of a prefix group's shared blocks (the group in bits 32..48).
const GROUP_TAG: u64 = 0xD00D_0000_0000_0000;
/// High bits of the ids of an image's tokens (the image in bits 16..48, the position below).
const IMAGE_TAG: u64 = 0x1A6E_0000_0000_0000;

/// Images at the start of every synthetic prompt (aisimulate's `traffic.source.images` replayed
/// natively): `count` images of `tokens` tokens each, ahead of the text. Image `i` of the run
/// (request by request, `count` each) is image `i mod pool` of an identity pool, else its own;
/// identical images are identical tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticImages {
    pub tokens: u32,
    pub count: u32,
    pub pool: Option<u32>,
}

impl SyntheticImages {
    /// Token `pos` of image `image`: the first names the image (distinct for distinct images).
    pub fn token(image: u64, pos: u32) -> u32 {
        block_token(IMAGE_TAG | (image << 16) | u64::from(pos))
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrivals {
    /// Poisson process with this many sessions per second.
    Poisson { rate_per_s: f64 },
    /// One session every `interval_ms`.
    Interval { interval_ms: f64 },
    /// Every session ready at 0 (closed-loop concurrency decides when they start).
    AllAtOnce,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticSpec {
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Number of sessions (requests when `turns_per_session` is 1).
    pub sessions: u32,
    pub turns_per_session: u32,
    pub arrivals: Arrivals,
    pub seed: u64,
    /// Fraction of each prompt shared with the other sessions of its prefix group.
    pub shared_prefix_ratio: f64,
    pub num_prefix_groups: u32,
    pub inter_turn_delay_ms: f64,
    /// Tokens per generated block id (the engine's block size, as in the reference).
    pub block_tokens: u32,
    /// Seed of the prefix-group stream ([`GROUP_SEED`] or [`AISIMULATE_GROUP_SEED`]).
    pub group_seed: u64,
    /// Every prompt starts with these same tokens, shared by all sessions (aisimulate's
    /// `cached_prefix_tokens`). Prompts are then generated token by token, so that a prefix that
    /// ends inside an engine block shares only its own tokens.
    pub cached_prefix_tokens: u32,
    /// A turn's prompt is the session's history (earlier prompts and outputs) followed by
    /// `input_tokens` new ones, as in a `mooncake-delta` trace.
    pub accumulate: bool,
    /// Images ahead of every prompt's text (one-turn requests only); prompts are then generated
    /// token by token.
    pub images: Option<SyntheticImages>,
}

impl SyntheticSpec {
    pub fn validate(&self) -> Result<(), InputError> {
        let bad = |field: &str, msg: &str| Err(InputError::new(msg.to_string()).with_field(field));
        if self.input_tokens == 0 {
            return bad("input-tokens", "must be at least 1");
        }
        if self.sessions == 0 {
            return bad("request-count", "must be at least 1");
        }
        if self.turns_per_session == 0 {
            return bad("turns-per-session", "must be at least 1");
        }
        if self.cached_prefix_tokens > self.input_tokens {
            return bad("cached-prefix-tokens", "cannot exceed input_tokens");
        }
        if let Some(i) = self.images {
            if self.turns_per_session > 1 || self.accumulate || self.cached_prefix_tokens > 0 {
                return bad("images", "images ride on one-turn synthetic requests without a cached prefix");
            }
            if i.tokens == 0 || i.count == 0 || i.pool == Some(0) || i.tokens >= 1 << 16 {
                return bad("images", "an image has 1 to 65535 tokens and a request at least one image");
            }
            if u64::from(i.tokens) * u64::from(i.count) + u64::from(self.input_tokens) > u64::from(u32::MAX) {
                return bad("images", "the images and text of a prompt exceed 2^32 tokens");
            }
        }
        if !(0.0..=1.0).contains(&self.shared_prefix_ratio) {
            return bad("shared-prefix-ratio", "must be between 0 and 1");
        }
        if !self.inter_turn_delay_ms.is_finite() || self.inter_turn_delay_ms < 0.0 {
            return bad(
                "inter-turn-delay-ms",
                &format!("must be a finite number ≥ 0, got {}", self.inter_turn_delay_ms),
            );
        }
        match self.arrivals {
            Arrivals::Poisson { rate_per_s } if !(rate_per_s.is_finite() && rate_per_s > 0.0) => {
                bad("request-rate", &format!("must be a positive number, got {rate_per_s}"))
            }
            Arrivals::Interval { interval_ms } if !(interval_ms.is_finite() && interval_ms >= 0.0) => {
                bad("arrival-interval-ms", &format!("must be a finite number ≥ 0, got {interval_ms}"))
            }
            _ => Ok(()),
        }
    }

    /// Refuses arrivals and think times that would put the run's clock past
    /// [`MAX_TIME_MS`], where times lose sub-microsecond precision (or overflow), once divided
    /// by `speedup` (1 in a closed loop, whose think times are not scaled). The field is the
    /// flag to change. Poisson arrivals are bounded by their mean plus ten standard deviations.
    pub fn check_times(&self, speedup: f64) -> Result<(), InputError> {
        let gaps = f64::from(self.sessions.saturating_sub(1));
        let (field, span, what) = match self.arrivals {
            Arrivals::Poisson { rate_per_s } => (
                "request-rate",
                1000.0 / rate_per_s * (gaps + 10.0 * gaps.sqrt()),
                format!(
                    "is too small: {} per second spreads {} sessions' arrivals over",
                    short(rate_per_s),
                    self.sessions
                ),
            ),
            Arrivals::Interval { interval_ms } => (
                "arrival-interval-ms",
                interval_ms * gaps,
                format!("is too large: {} ms apart, {} sessions' arrivals span", short(interval_ms), self.sessions),
            ),
            Arrivals::AllAtOnce => ("request-count", 0.0, String::new()),
        };
        // A gap of NaN (0 × ∞: one session at a rate whose gap overflows) draws nothing.
        let span = if gaps == 0.0 { 0.0 } else { span };
        let think = self.inter_turn_delay_ms * f64::from(self.turns_per_session.saturating_sub(1));
        let beyond = |t: f64| t.is_nan() || t > MAX_TIME_MS;
        let limit = format!(
            "past {MAX_TIME_MS} ms (about 278 years), beyond which simulated times lose sub-microsecond precision"
        );
        let fail = |field: &str, msg: String| Err(InputError::new(msg).with_field(field));
        if beyond(span) {
            return fail(field, format!("{what} about {span:e} ms, {limit}"));
        }
        let delay = self.inter_turn_delay_ms;
        if beyond(think) || beyond(span + think) {
            return fail(
                "inter-turn-delay-ms",
                format!(
                    "is too large: {} think times of {} ms after arrivals spanning {span:e} ms reach about {:e} \
                     ms, {limit}",
                    self.turns_per_session - 1,
                    short(delay),
                    span + think
                ),
            );
        }
        if beyond((span + think) / speedup) {
            return fail(
                "arrival-speedup-ratio",
                format!(
                    "is too small: {} stretches the arrivals and think times to about {:e} ms, {limit}",
                    short(speedup),
                    (span + think) / speedup
                ),
            );
        }
        Ok(())
    }

    /// Tokens each generated id stands for: the engine's block size, or a single token when a
    /// cached prefix is asked for (it need not end on a block boundary).
    pub fn unit_tokens(&self) -> u32 {
        if self.cached_prefix_tokens == 0 && self.images.is_none() {
            self.block_tokens.max(1)
        } else {
            1
        }
    }

    /// The sessions, generated one at a time in start order.
    pub fn sessions_iter(&self) -> SyntheticSessions {
        let unit = self.unit_tokens();
        let units_per_prompt = self.input_tokens.div_ceil(unit);
        let sharing = self.shared_prefix_ratio > 0.0 && self.num_prefix_groups > 0;
        // The group's share ends at this unit; the cached prefix, when there is one, comes first.
        let group_end = if sharing {
            ((units_per_prompt as f64 * self.shared_prefix_ratio).round() as u32).min(units_per_prompt)
        } else {
            0
        };
        SyntheticSessions {
            spec: self.clone(),
            arrivals: ChaCha12Rng::seed_from_u64(self.seed),
            groups: ChaCha12Rng::seed_from_u64(self.group_seed),
            units_per_prompt,
            cached_units: self.cached_prefix_tokens / unit,
            group_end,
            next_session: 0,
            next_unique: 1,
            first_seen: (self.group_seed == GROUP_SEED).then(FirstSeen::default),
            t: 0.0,
        }
    }
}

/// Dynamo's synthetic replay numbers its block ids in first-seen order (0, 1, ...) before they
/// become the prompt's tokens, so block hashes, and the host cache's LRU ties broken by hash,
/// depend on that numbering. A unique id is always new; only the shared ids (cached prefix and
/// prefix groups) need a map, which stays as small as the groups.
#[derive(Default)]
struct FirstSeen {
    shared: FxHashMap<u64, u32>,
    next: u32,
}

impl FirstSeen {
    fn number(&mut self, id: u64, shared: bool) -> u32 {
        let fresh = |next: &mut u32| {
            *next = next.checked_add(1).expect("a synthetic workload has fewer than 2^32 block ids");
            *next - 1
        };
        if shared {
            *self.shared.entry(id).or_insert_with(|| fresh(&mut self.next))
        } else {
            fresh(&mut self.next)
        }
    }
}

/// The generator behind [`SyntheticSpec::sessions_iter`]: two random streams, a clock and a
/// counter of unique block ids.
pub struct SyntheticSessions {
    spec: SyntheticSpec,
    arrivals: ChaCha12Rng,
    groups: ChaCha12Rng,
    units_per_prompt: u32,
    cached_units: u32,
    group_end: u32,
    next_session: u32,
    next_unique: u64,
    /// Dynamo's flavour ([`GROUP_SEED`]): ids numbered in first-seen order; otherwise folded
    /// into tokens with [`block_token`].
    first_seen: Option<FirstSeen>,
    t: f64,
}

impl Iterator for SyntheticSessions {
    type Item = SessionSpec;

    fn next(&mut self) -> Option<SessionSpec> {
        let spec = &self.spec;
        let s = self.next_session;
        if s >= spec.sessions {
            return None;
        }
        self.next_session += 1;
        if s > 0 {
            self.t += match spec.arrivals {
                Arrivals::Poisson { rate_per_s } => {
                    let u: f64 = self.arrivals.random();
                    -(1.0 - u).ln() * (1000.0 / rate_per_s)
                }
                Arrivals::Interval { interval_ms } => interval_ms,
                Arrivals::AllAtOnce => 0.0,
            };
        }
        let group = (self.group_end > 0).then(|| self.groups.random_range(0..spec.num_prefix_groups as usize) as u64);
        let turns = (0..spec.turns_per_session)
            .map(|k| {
                let blocks: Vec<u32> = (0..self.units_per_prompt)
                    .map(|b| {
                        let (id, shared) = match group {
                            _ if b < self.cached_units => (CACHED_PREFIX_TAG | b as u64, true),
                            Some(g) if b < self.group_end => (GROUP_TAG | (g << 32) | b as u64, true),
                            _ => {
                                self.next_unique += 1;
                                (self.next_unique - 1, false)
                            }
                        };
                        match self.first_seen.as_mut() {
                            Some(first_seen) => first_seen.number(id, shared),
                            None => block_token(id),
                        }
                    })
                    .collect();
                let (blocks, input_length) = match spec.images {
                    None => (blocks, spec.input_tokens),
                    Some(i) => {
                        let mut all: Vec<u32> = Vec::with_capacity((i.tokens * i.count) as usize + blocks.len());
                        for j in 0..i.count {
                            let n = u64::from(s) * u64::from(i.count) + u64::from(j);
                            let image = i.pool.map_or(n, |p| n % u64::from(p));
                            all.extend((0..i.tokens).map(|pos| SyntheticImages::token(image, pos)));
                        }
                        all.extend(blocks);
                        (all, i.tokens * i.count + spec.input_tokens)
                    }
                };
                TurnSpec {
                    input_length,
                    output_length: spec.output_tokens,
                    blocks: blocks.into(),
                    delay_ms: if k == 0 { 0.0 } else { spec.inter_turn_delay_ms },
                    priority: 0,
                    strict_priority: 0,
                    output_tokens: None,
                    meta: None,
                }
            })
            .collect();
        // Dynamo names multi-turn sessions; a one-turn request has no session (`null`).
        let name = (self.spec.turns_per_session > 1).then(|| format!("session_{s}").into());
        Some(SessionSpec { name, start_ms: self.t, turns })
    }
}

/// Folds a 64-bit block id into the 32-bit token that fills the block, keeping group-tagged
/// prefix ids apart from the small sequential ids.
fn block_token(id: u64) -> u32 {
    (id ^ (id >> 32)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    fn spec() -> SyntheticSpec {
        SyntheticSpec {
            input_tokens: 1500,
            output_tokens: 4,
            sessions: 8,
            turns_per_session: 1,
            arrivals: Arrivals::Poisson { rate_per_s: 20.0 },
            seed: 42,
            shared_prefix_ratio: 0.0,
            num_prefix_groups: 0,
            inter_turn_delay_ms: 0.0,
            block_tokens: 16,
            group_seed: GROUP_SEED,
            cached_prefix_tokens: 0,
            accumulate: false,
            images: None,
        }
    }

    #[test]
    fn arrivals_past_the_clock_precision_are_refused_by_flag() {
        let check = |arrivals, sessions, turns, delay, speedup| {
            let s =
                SyntheticSpec { arrivals, sessions, turns_per_session: turns, inter_turn_delay_ms: delay, ..spec() };
            s.check_times(speedup).map_err(|e| e.to_string())
        };
        let past =
            "past 8796093022208 ms (about 278 years), beyond which simulated times lose sub-microsecond precision";
        let interval = |ms| Arrivals::Interval { interval_ms: ms };
        assert_eq!(
            check(interval(1e308), 2, 1, 0.0, 1.0),
            Err(format!(
                "`arrival-interval-ms`: is too large: 1e308 ms apart, 2 sessions' arrivals span about 1e308 ms, {past}"
            ))
        );
        assert_eq!(
            check(interval(1e13), 2, 1, 0.0, 1.0),
            Err(format!(
                "`arrival-interval-ms`: is too large: 1e13 ms apart, 2 sessions' arrivals span about 1e13 ms, {past}"
            ))
        );
        // Up to the limit, and one session at any interval (no gap is drawn).
        assert_eq!(check(interval(8e12), 2, 1, 0.0, 1.0), Ok(()));
        assert_eq!(check(interval(1e308), 1, 1, 0.0, 1.0), Ok(()));
        assert_eq!(
            check(Arrivals::Poisson { rate_per_s: 1e-308 }, 2, 1, 0.0, 1.0),
            Err(format!("`request-rate`: is too small: 1e-308 per second spreads 2 sessions' arrivals over about inf ms, {past}"))
        );
        assert_eq!(check(Arrivals::Poisson { rate_per_s: 1e-308 }, 1, 1, 0.0, 1.0), Ok(()));
        assert_eq!(
            check(interval(1.0), 2, 3, 1e308, 1.0),
            Err(format!(
                "`inter-turn-delay-ms`: is too large: 2 think times of 1e308 ms after arrivals spanning 1e0 ms reach \
                 about inf ms, {past}"
            ))
        );
        assert_eq!(
            check(interval(1.0), 2, 1, 0.0, 1e-310),
            Err(format!(
                "`arrival-speedup-ratio`: is too small: 1e-310 stretches the arrivals and think times to about inf ms, \
                 {past}"
            ))
        );
        assert_eq!(check(Arrivals::AllAtOnce, 1000, 2, 1e12, 1.0), Ok(()));
    }

    #[test]
    fn poisson_arrivals_match_the_reference_stream() {
        // First arrivals of the reference's synthetic replay at 20 req/s, seed 42.
        let sessions: Vec<SessionSpec> = spec().sessions_iter().collect();
        let starts: Vec<f64> = sessions.iter().map(|s| s.start_ms).collect();
        let want =
            [0.0, 37.38623088203482, 76.50976975956941, 127.103768422482, 153.13929757803515, 154.88661716639484];
        for (a, b) in starts.iter().zip(want) {
            assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        }
    }

    #[test]
    fn prefix_groups_match_the_reference_stream() {
        // The reference (30 sessions, 5 groups) sees a new group at sessions 0, 1, 2, 4, 5.
        let sessions: Vec<SessionSpec> =
            SyntheticSpec { sessions: 30, shared_prefix_ratio: 0.5, num_prefix_groups: 5, ..spec() }
                .sessions_iter()
                .collect();
        let mut seen = std::collections::HashSet::new();
        let pattern: String =
            sessions.iter().map(|s| if seen.insert(s.turns[0].blocks[0]) { 'n' } else { 'H' }).collect();
        assert_eq!(pattern, "nnnHnnHHHHHHHHHHHHHHHHHHHHHHHH");
        // ceil(1500 / 16) = 94 blocks, half of them (47) shared.
        let a = &sessions[0].turns[0].blocks;
        let shared = sessions.iter().find(|s| s.turns[0].blocks[0] == a[0] && !std::ptr::eq(*s, &sessions[0])).unwrap();
        let common = a.iter().zip(shared.turns[0].blocks.iter()).take_while(|(x, y)| x == y).count();
        assert_eq!(common, 47);
    }

    /// The group stream has its own seed (Dynamo's 42, aisimulate's 0), whatever the arrival seed.
    #[test]
    fn prefix_groups_follow_their_own_seed_not_the_arrival_seed() {
        let groups = |seed, group_seed| -> Vec<u32> {
            SyntheticSpec { sessions: 30, shared_prefix_ratio: 0.5, num_prefix_groups: 5, seed, group_seed, ..spec() }
                .sessions_iter()
                .map(|s| s.turns[0].blocks[0])
                .collect()
        };
        assert_eq!(groups(7, GROUP_SEED), groups(42, GROUP_SEED));
        assert_eq!(groups(960, GROUP_SEED), groups(42, GROUP_SEED));
        assert_ne!(groups(42, AISIMULATE_GROUP_SEED), groups(42, GROUP_SEED));
    }

    #[test]
    fn turns_get_fresh_prompts_and_delays() {
        let spec = SyntheticSpec {
            sessions: 2,
            turns_per_session: 3,
            inter_turn_delay_ms: 100.0,
            arrivals: Arrivals::Interval { interval_ms: 1000.0 },
            ..spec()
        };
        assert_eq!(Workload::Synthetic(spec.clone()).num_requests(), 6);
        let sessions: Vec<SessionSpec> = spec.sessions_iter().collect();
        assert_eq!(sessions[1].start_ms, 1000.0);
        let t = &sessions[0].turns;
        assert_eq!((t[0].delay_ms, t[1].delay_ms), (0.0, 100.0));
        assert_ne!(t[0].blocks[0], t[1].blocks[0]);
    }

    /// aisimulate's cached prefix: the first `cached_prefix_tokens` tokens of every prompt are
    /// the same, token by token (700 is not a whole number of 16-token blocks), the rest unique.
    #[test]
    fn a_cached_prefix_is_shared_token_by_token() {
        let spec = SyntheticSpec { cached_prefix_tokens: 700, input_tokens: 1000, sessions: 3, ..spec() };
        assert_eq!(spec.unit_tokens(), 1);
        assert_eq!(Workload::Synthetic(spec.clone()).block_tokens(), 1);
        let s: Vec<SessionSpec> = spec.sessions_iter().collect();
        let (a, b) = (&s[0].turns[0].blocks, &s[2].turns[0].blocks);
        assert_eq!((a.len(), b.len()), (1000, 1000));
        assert_eq!(a[..700], b[..700]);
        assert!(a[700..].iter().all(|t| !b.contains(t)));
        assert!(SyntheticSpec { cached_prefix_tokens: 1001, ..spec }.validate().is_err());
    }
}

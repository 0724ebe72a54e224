//! `traffic`: the source (synthetic, synthetic sessions, traces), the load (concurrency,
//! Poisson, constant rate, trace timestamps) and the stop conditions.

use serde_json::Value;

use crate::error::DeployError;
use crate::reader::ErrAt;
use servesim_config::Reader;
use servesim_workload::agentic::profile::{self, ProfileOptions};
use servesim_workload::agentic::snapshot::{Selection, SnapshotOptions};

#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    Synthetic {
        input_tokens: u32,
        output_tokens: u32,
        /// Every prompt starts with these same tokens.
        cached_prefix_tokens: u32,
    },
    Session {
        new_input_tokens: u32,
        output_tokens: u32,
        turns: u32,
        shared_prefix_ratio: f64,
        prefix_groups: u32,
        inter_turn_delay_ms: f64,
    },
    Trace {
        paths: Vec<String>,
        format: &'static str,
        block_size: Option<u32>,
        nested_timestamp_basis: Option<&'static str>,
    },
}

impl Source {
    /// The `session_id` aisimulate writes in its per-request records for the request released
    /// `ordinal`-th (from 0) that belongs to no session: each synthetic request is a one-turn
    /// session `session_{ordinal}`, a trace row without one is `request_{ordinal + 1}`.
    pub fn unnamed_request_id(&self, ordinal: u64) -> String {
        match self {
            Source::Trace { .. } => format!("request_{}", ordinal + 1),
            Source::Synthetic { .. } | Source::Session { .. } => format!("session_{ordinal}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Load {
    Concurrency(u32),
    /// Rate per second (requests or sessions, per the source), seed.
    Poisson {
        rate: f64,
        seed: u64,
    },
    ConstantRate {
        rate: f64,
    },
    TraceTimestamps {
        speedup: f64,
        agentic_lanes: Option<u32>,
        agentic_snapshot: Option<SnapshotOptions>,
    },
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stop {
    /// Requests (synthetic) or sessions (synthetic-session).
    pub count: Option<u32>,
    pub count_per_load_unit: Option<f64>,
    pub max_virtual_time_seconds: Option<f64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Traffic {
    pub source: Source,
    pub load: Load,
    pub stop: Stop,
    /// `source.images` of a synthetic source (run through an encoder pool, `crate::epd`).
    pub images: Option<super::encoder::Images>,
}

const FORMATS: [&str; 6] =
    ["mooncake", "mooncake-delta", "agentic_mooncake", "applied_compute_agentic", "dynamo", "weka"];

pub(super) fn read_traffic(t: Option<Reader>) -> Result<Traffic, DeployError> {
    let Some(mut t) = t else {
        // Predict's default traffic: synthetic 1024/128, concurrency 10, 100 requests.
        return Ok(Traffic {
            source: Source::Synthetic { input_tokens: 1024, output_tokens: 128, cached_prefix_tokens: 0 },
            load: Load::Concurrency(10),
            stop: Stop { count: Some(100), ..Stop::default() },
            images: None,
        });
    };
    let here = t.here().to_string();
    let (source, images) = match t.obj("source")? {
        Some(s) => read_source(s)?,
        None => (Source::Synthetic { input_tokens: 1024, output_tokens: 128, cached_prefix_tokens: 0 }, None),
    };
    // The load's checks read one stop condition (the reference's `TrafficPredictionConfig`
    // checks it among the load's own).
    let virtual_time_stop = t.raw("stop").and_then(|s| s.get("max_virtual_time_seconds")).is_some_and(|v| !v.is_null());
    let (load, load_path, lanes) = match t.obj("load")? {
        Some(l) => {
            let p = l.here().to_string();
            let (load, lanes) = read_load(l, &source, virtual_time_stop)?;
            (load, p, lanes)
        }
        None => (Load::Concurrency(10), format!("{here}.load"), None),
    };
    let mut stop = Stop::default();
    let mut stop_keys = Vec::new();
    let stop_path = format!("{here}.stop");
    if let Some(mut s) = t.obj("stop")? {
        let requests = s.positive("requests")?;
        let rpl = s.nonneg("requests_per_load_unit", true)?;
        let sessions = s.positive("sessions")?;
        let spl = s.nonneg("sessions_per_load_unit", true)?;
        let mvt = s.nonneg("max_virtual_time_seconds", true)?;
        s.finish()?;
        for (k, set) in [
            ("requests", requests.is_some()),
            ("requests_per_load_unit", rpl.is_some()),
            ("sessions", sessions.is_some()),
            ("sessions_per_load_unit", spl.is_some()),
            ("max_virtual_time_seconds", mvt.is_some()),
        ] {
            if set {
                stop_keys.push(k);
            }
        }
        stop.max_virtual_time_seconds = mvt;
        let session_source = matches!(source, Source::Session { .. });
        let counts = stop_keys.iter().filter(|k| **k != "max_virtual_time_seconds").count();
        if counts > 1 {
            return Err(DeployError::new(&stop_path, "traffic.stop requires exactly one count condition"));
        }
        match &source {
            Source::Trace { .. } => {}
            _ if session_source => {
                if requests.is_some() || rpl.is_some() {
                    return Err(DeployError::new(&stop_path, "synthetic session traffic requires a session stop"));
                }
                stop.count = sessions;
                stop.count_per_load_unit = spl;
            }
            _ => {
                if sessions.is_some() || spl.is_some() {
                    return Err(DeployError::new(&stop_path, "synthetic request traffic requires a request stop"));
                }
                stop.count = requests;
                stop.count_per_load_unit = rpl;
            }
        }
    }
    t.finish()?;
    match &source {
        Source::Trace { format, .. } => {
            if !matches!(load, Load::TraceTimestamps { .. } | Load::Concurrency(_)) {
                return Err(DeployError::new(
                    &load_path,
                    "trace traffic requires trace_timestamps or concurrency load",
                ));
            }
            if stop_keys.iter().any(|k| *k != "max_virtual_time_seconds") {
                return Err(DeployError::new(&stop_path, "trace traffic only accepts max_virtual_time_seconds"));
            }
            if matches!(*format, "agentic_mooncake" | "weka") {
                if !matches!(load, Load::TraceTimestamps { .. }) {
                    return Err(DeployError::new(&load_path, format!("{format} requires trace_timestamps load")));
                }
                if stop.max_virtual_time_seconds.is_some() {
                    return Err(DeployError::new(
                        &stop_path,
                        format!("{format} does not support max_virtual_time_seconds"),
                    ));
                }
            }
            if *format == "applied_compute_agentic" && !matches!(load, Load::Concurrency(_)) {
                return Err(DeployError::new(&load_path, "applied_compute_agentic requires concurrency load"));
            }
            if lanes.is_some() && !matches!(*format, "weka" | "agentic_mooncake" | "dynamo") {
                return Err(DeployError::new(
                    &load_path,
                    "agentic_lanes requires weka, agentic_mooncake, or agentic dynamo input",
                ));
            }
        }
        _ => {
            if matches!(load, Load::TraceTimestamps { .. }) {
                return Err(DeployError::new(&load_path, "synthetic traffic does not accept trace_timestamps load"));
            }
            if stop.max_virtual_time_seconds.is_some() {
                return Err(DeployError::new(&stop_path, "max_virtual_time_seconds is trace-only"));
            }
            if stop_keys.is_empty() {
                return Err(DeployError::new(&stop_path, "synthetic traffic requires a stop condition"));
            }
            if let Some(ratio) = stop.count_per_load_unit {
                let unit = match load {
                    Load::Concurrency(c) => c as f64,
                    Load::Poisson { rate, .. } | Load::ConstantRate { rate } => rate,
                    Load::TraceTimestamps { .. } => 0.0,
                };
                stop.count = Some(((ratio * unit).round() as u32).max(1));
            }
        }
    }
    Ok(Traffic { source, load, stop, images })
}

fn read_source(mut s: Reader) -> Result<(Source, Option<super::encoder::Images>), DeployError> {
    let mut images = None;
    let ty = s.one_of("type", &["synthetic", "synthetic-session", "trace"])?.unwrap_or("synthetic");
    let here = s.here().to_string();
    let source = match ty {
        "synthetic" => {
            let input_tokens = s.positive("input_tokens")?.unwrap_or(1024);
            let output_tokens = s.positive("output_tokens")?.unwrap_or(128);
            let cached_prefix_tokens = s.u32_min("cached_prefix_tokens", 0)?.unwrap_or(0);
            if cached_prefix_tokens > input_tokens {
                return Err(s.err(
                    "cached_prefix_tokens",
                    format!(
                        "cached_prefix_tokens cannot exceed input_tokens ({cached_prefix_tokens} > {input_tokens})"
                    ),
                ));
            }
            if let Some(i) = s.obj("images")? {
                images = Some(super::encoder::read_images(i)?);
            }
            Source::Synthetic { input_tokens, output_tokens, cached_prefix_tokens }
        }
        "synthetic-session" => {
            let new_input_tokens = s.positive("new_input_tokens_per_turn")?.unwrap_or(1024);
            let output_tokens = s.positive("output_tokens_per_turn")?.unwrap_or(128);
            let (mut turns, mut ratio, mut groups, mut delay) = (4, 0.0, 0, 0.0);
            if let Some(mut ss) = s.obj("session")? {
                turns = ss.u32_min("turns", 2)?.unwrap_or(4);
                ratio = ss.nonneg("shared_prefix_ratio", false)?.unwrap_or(0.0);
                if ratio > 1.0 {
                    return Err(ss.err("shared_prefix_ratio", format!("must be in [0, 1], got {ratio}")));
                }
                groups = ss.u32_min("prefix_groups", 0)?.unwrap_or(0);
                if ratio > 0.0 && groups == 0 {
                    return Err(
                        ss.err("prefix_groups", "prefix_groups must be positive when shared_prefix_ratio is positive")
                    );
                }
                delay = ss.nonneg("inter_turn_delay_ms", false)?.unwrap_or(0.0);
                ss.finish()?;
            }
            Source::Session {
                new_input_tokens,
                output_tokens,
                turns,
                shared_prefix_ratio: ratio,
                prefix_groups: groups,
                inter_turn_delay_ms: delay,
            }
        }
        _ => {
            let paths = match s.value("paths") {
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|p| {
                        p.as_str().map(str::to_string).ok_or_else(|| s.err("paths", "every path must be a string"))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                Some(_) => return Err(s.err("paths", "must be a list of paths")),
                None => Vec::new(),
            };
            if paths.iter().all(|p| p.is_empty()) || paths.iter().any(|p| p.is_empty()) {
                return Err(s.err("paths", "trace paths must contain at least one nonempty path"));
            }
            let format = s.one_of("format", &FORMATS)?.unwrap_or("mooncake");
            if format != "dynamo" && paths.len() != 1 {
                return Err(s.err("paths", format!("trace format '{format}' requires exactly one path")));
            }
            let block_size = s.positive("block_size")?;
            let basis = s.one_of("nested_timestamp_basis", &["auto", "absolute", "relative"])?;
            if basis.is_some() && format != "weka" {
                return Err(
                    s.err("nested_timestamp_basis", "nested_timestamp_basis is only valid for trace format 'weka'")
                );
            }
            Source::Trace { paths, format, block_size, nested_timestamp_basis: basis }
        }
    };
    let _ = here;
    s.finish()?;
    Ok((source, images))
}

/// `agentic_snapshot`: `seed`, and the reference's exact initial cuts with the corpus cursor.
fn read_snapshot(mut r: Reader) -> Result<SnapshotOptions, DeployError> {
    let seed = r.integer("seed")?.ok_or_else(|| DeployError::new(r.here(), "seed is required"))?;
    let selections = match r.value("initial_selections") {
        None => None,
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(r.err("initial_selections", "must contain at least one selection"));
        }
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let mut s = Reader::mapping(&format!("{}[{i}]", r.path("initial_selections")), item)?;
                let source_play_id = s
                    .nonempty("source_play_id")?
                    .ok_or_else(|| DeployError::new(s.here(), "source_play_id is required"))?;
                let t_star_ms =
                    s.nonneg("t_star_ms", false)?.ok_or_else(|| DeployError::new(s.here(), "t_star_ms is required"))?;
                s.finish()?;
                out.push(Selection { source_play_id, t_star_ms });
            }
            Some(out)
        }
        Some(_) => return Err(r.err("initial_selections", "must be a list of {source_play_id, t_star_ms}")),
    };
    let corpus_cursor = r.integer("corpus_cursor")?;
    if selections.is_some() != corpus_cursor.is_some() {
        return Err(DeployError::new(r.here(), "initial_selections and corpus_cursor must be specified together"));
    }
    if let (Some(sel), Some(c)) = (&selections, corpus_cursor) {
        if c < sel.len() as u64 {
            return Err(r.err("corpus_cursor", "corpus_cursor cannot precede the initial lane draws"));
        }
    }
    r.finish()?;
    Ok(SnapshotOptions { seed, initial_selections: selections, corpus_cursor, warmup: false, profile: None })
}

/// `agentic_profile`: its five durations (the reference's defaults for those not given), each
/// finite, and every deadline finite in milliseconds.
fn read_profile(mut r: Reader, path: &str) -> Result<ProfileOptions, DeployError> {
    let mut o = ProfileOptions::default();
    for (key, positive) in profile::KEYS {
        if let Some(v) = r.nonneg(key, positive)? {
            *o.get_mut(key).expect("a profile key") = v;
        }
    }
    r.finish()?;
    o.validate().map_err(|m| DeployError::new(path, m))?;
    Ok(o)
}

fn read_load(mut l: Reader, source: &Source, virtual_time_stop: bool) -> Result<(Load, Option<u32>), DeployError> {
    let ty = l
        .one_of("type", &["concurrency", "poisson", "constant_rate", "trace_timestamps", "kv_capacity_fraction"])?
        .unwrap_or("concurrency");
    let allowed: &[&str] = match ty {
        "concurrency" => &["type", "concurrency"],
        "poisson" => &["type", "requests_per_second", "sessions_per_second", "seed"],
        "constant_rate" => &["type", "requests_per_second", "sessions_per_second"],
        "trace_timestamps" => &[
            "type",
            "speedup",
            "agentic_lanes",
            "agentic_snapshot",
            "agentic_warmup",
            "agentic_warmup_policy",
            "agentic_profile",
        ],
        _ => &["type", "fraction"],
    };
    let all = [
        "concurrency",
        "requests_per_second",
        "sessions_per_second",
        "seed",
        "speedup",
        "agentic_lanes",
        "agentic_snapshot",
        "agentic_warmup",
        "agentic_warmup_policy",
        "agentic_profile",
        "fraction",
    ];
    // As the reference counts them: a key is used when it is set (not null), except that
    // `agentic_warmup: false` and the default warmup policy are no use at all; its own
    // canonical dumps (`prediction_config`, `recommendations/*.yaml`) write them on every load.
    let warmup = l.flag("agentic_warmup")?.unwrap_or(false);
    let policy = l.one_of("agentic_warmup_policy", &["repeated_prefixes", "live_trajectory_v1"])?;
    let used = |k: &str| match k {
        "agentic_warmup" => warmup,
        "agentic_warmup_policy" => policy.is_some_and(|p| p != "repeated_prefixes"),
        _ => l.given(k),
    };
    let extra: Vec<&str> = all.iter().copied().filter(|k| used(k) && !allowed.contains(k)).collect();
    if !extra.is_empty() {
        return Err(DeployError::new(l.here(), format!("traffic.load.type='{ty}' does not accept {extra:?}")));
    }
    // Null fields of the load model are no use either, whatever the type.
    for k in all {
        if !l.given(k) {
            l.value(k);
        }
    }
    let mut lanes = None;
    let load = match ty {
        "concurrency" => Load::Concurrency(l.positive("concurrency")?.unwrap_or(10)),
        "poisson" | "constant_rate" => {
            // The rate's unit is the source's: requests per second for requests, sessions per
            // second for sessions. A trace source refuses these loads later, whatever the rate.
            let (unit, other) = match source {
                Source::Session { .. } => ("sessions_per_second", "requests_per_second"),
                _ => ("requests_per_second", "sessions_per_second"),
            };
            let rate = l.nonneg(unit, true)?;
            let wrong = l.nonneg(other, true)?;
            let trace = matches!(source, Source::Trace { .. });
            let rate = match rate {
                Some(rate) => rate,
                None if trace => 0.0,
                None => {
                    let what = if wrong.is_some() {
                        format!(" ({other} counts the other source type)")
                    } else {
                        String::new()
                    };
                    return Err(DeployError::new(l.here(), format!("{ty} synthetic traffic requires {unit}{what}")));
                }
            };
            if wrong.is_some() && !trace {
                return Err(l.err(
                    other,
                    format!("traffic load rate unit does not match source type: this source's rate is {unit}"),
                ));
            }
            if ty == "poisson" {
                Load::Poisson { rate, seed: l.integer("seed")?.unwrap_or(42) }
            } else {
                Load::ConstantRate { rate }
            }
        }
        "trace_timestamps" => {
            let speedup = l.nonneg("speedup", true)?.unwrap_or(1.0);
            lanes = l.positive("agentic_lanes")?;
            let mut snapshot = match l.obj("agentic_snapshot")? {
                Some(r) => Some(read_snapshot(r)?),
                None => None,
            };
            let profile_path = l.path("agentic_profile");
            let profile = match l.obj("agentic_profile")? {
                Some(r) => Some(read_profile(r, &profile_path)?),
                None => None,
            };
            // The reference's order of checks (`TrafficPredictionConfig`).
            if profile.is_some() && snapshot.is_none() {
                return Err(l.err("agentic_profile", "agentic_profile requires agentic_snapshot"));
            }
            if profile.is_some() && virtual_time_stop {
                return Err(
                    l.err("agentic_profile", "agentic_profile cannot be combined with max_virtual_time_seconds")
                );
            }
            if warmup && snapshot.is_none() {
                return Err(l.err("agentic_warmup", "agentic_warmup requires agentic_snapshot"));
            }
            if policy == Some("live_trajectory_v1") && (!warmup || profile.is_none()) {
                return Err(
                    l.err("agentic_warmup_policy", "live_trajectory_v1 requires agentic_warmup and agentic_profile")
                );
            }
            if policy == Some("live_trajectory_v1") {
                return Err(l.err(
                    "agentic_warmup_policy",
                    "live_trajectory_v1 is not supported by servesim yet: the warmed profile replays \
                     repeated_prefixes warmups only (what is missing is warming the lanes with live \
                     trajectory requests before the profile opens)",
                ));
            }
            if snapshot.is_some() && lanes.is_none() {
                return Err(l.err("agentic_snapshot", "agentic_snapshot requires positive agentic_lanes"));
            }
            if let (Some(sel), Some(n)) = (snapshot.as_ref().and_then(|s| s.initial_selections.as_ref()), lanes) {
                if sel.len() != n as usize {
                    return Err(
                        l.err("agentic_snapshot", "initial_selections must contain exactly one selection per lane")
                    );
                }
            }
            if let Some(s) = snapshot.as_mut() {
                s.warmup = warmup;
                s.profile = profile;
            }
            Load::TraceTimestamps { speedup, agentic_lanes: lanes, agentic_snapshot: snapshot }
        }
        _ => return Err(l.err("type", "kv_capacity_fraction load is recommend-only")),
    };
    l.finish()?;
    Ok((load, lanes))
}

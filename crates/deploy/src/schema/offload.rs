//! `kv_cache.host_offload`, `kv_cache.g3_offload` and `kv_cache.kvcr`: the KV tiers below a
//! worker's device cache. Read with the reference's defaults and rules
//! (`aisimulate/config/engine.py`: `HostOffloadConfig`, `G3OffloadConfig`, `KvcrConfig` and the
//! checks on `KvCachePredictionConfig`), and kept as the JSON objects the engine reads as its
//! `native_host_offload` and `g3_offload` arguments (every field written out, defaults included).
//!
//! `kvcr` (a rank pulling a prefix from a peer rank's host cache) acts only on requests that
//! carry KV hints naming the peer, and no traffic source of the unified YAML gives a request
//! one: aisimulate 0.13 gives the same numbers with and without `kvcr` on synthetic, session,
//! Mooncake and Dynamo traffic, aggregated and disaggregated (probed; the goldens
//! `predict_kvcr_*` pin it). servesim reads it, checks it as the reference does, and keeps it
//! for what it is: a tier that never receives a pull here.

use serde_json::{json, Map, Value};

use crate::error::DeployError;
use crate::reader::ErrAt;
use servesim_config::Reader;

/// The offload tiers of one worker: a host (G2) cache, and possibly a G3 tier below it.
#[derive(Clone, Debug, PartialEq)]
pub struct Offload {
    /// The engine's `native_host_offload`.
    pub host: Value,
    /// The engine's `g3_offload`.
    pub g3: Option<Value>,
    /// `kvcr`: peer-rank host fetches, inert without KV hints (see the module's note).
    pub kvcr: Option<Kvcr>,
}

/// `kv_cache.kvcr`, with the reference's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Kvcr {
    pub latency_to_first_byte_ms: f64,
    pub bandwidth_gbps: f64,
}

/// Reads the three offload blocks of a worker's `kv_cache` section.
pub(super) fn read_offload(k: &mut Reader) -> Result<Option<Offload>, DeployError> {
    let here = k.here().to_string();
    let host = match k.obj("host_offload")? {
        Some(h) => Some(read_host(h)?),
        None => None,
    };
    let g3 = match k.obj("g3_offload")? {
        Some(g) => Some(read_g3(g)?),
        None => None,
    };
    let kvcr = match k.obj("kvcr")? {
        Some(mut c) => {
            let latency_to_first_byte_ms = c.nonneg("latency_to_first_byte_ms", false)?.unwrap_or(1.0);
            let bandwidth_gbps = c.nonneg("bandwidth_gbps", false)?.unwrap_or(50.0);
            c.finish()?;
            Some(Kvcr { latency_to_first_byte_ms, bandwidth_gbps })
        }
        None => None,
    };
    if g3.is_some() && host.is_none() {
        return Err(DeployError::new(&here, "g3_offload requires host_offload"));
    }
    if kvcr.is_some() {
        let local = host.as_ref().is_some_and(|h| h["scope"] == "dp_rank_local");
        if !local {
            return Err(DeployError::new(&here, "kvcr requires host_offload with scope dp_rank_local"));
        }
        if g3.is_some() {
            return Err(DeployError::new(&here, "kvcr cannot be combined with g3_offload"));
        }
    }
    Ok(host.map(|host| Offload { host, g3, kvcr }))
}

/// A field that must be a positive integer and is required.
fn required_blocks(r: &mut Reader, key: &'static str) -> Result<u64, DeployError> {
    match r.integer(key)? {
        Some(0) => Err(r.err(key, "must be a positive integer, got 0")),
        Some(n) => Ok(n),
        None => Err(r.err(key, "is required")),
    }
}

/// One tier's fields as the engine reads them: its scope, its size in blocks (`blocks_key`,
/// required) and its bandwidths and latencies (finite and ≥ 0, with the reference's defaults).
fn tier(
    mut r: Reader,
    scope: &str,
    blocks_key: &'static str,
    rates: &[(&'static str, f64)],
) -> Result<Value, DeployError> {
    let mut out = Map::new();
    out.insert("scope".into(), json!(scope));
    out.insert(blocks_key.into(), json!(required_blocks(&mut r, blocks_key)?));
    for &(key, default) in rates {
        out.insert(key.into(), json!(r.nonneg(key, false)?.unwrap_or(default)));
    }
    r.finish()?;
    Ok(Value::Object(out))
}

fn read_host(mut h: Reader) -> Result<Value, DeployError> {
    if h.value("scope").and_then(Value::as_str) == Some("worker_local") {
        return Err(h.err(
            "scope",
            "host_offload.scope `worker_local` is a G3 scope; use `dp_rank_local` for per-DP-rank G2 caches",
        ));
    }
    let scope = h.one_of("scope", &["dp_rank_local", "cluster_shared"])?.unwrap_or("dp_rank_local");
    let rates = [
        ("d2h_bandwidth_gbps", 32.0),
        ("h2d_bandwidth_gbps", 32.0),
        ("shared_d2h_bandwidth_gbps", 80.0),
        ("shared_h2d_bandwidth_gbps", 80.0),
        ("latency_to_first_byte_ms", 0.0),
    ];
    tier(h, scope, "num_host_blocks", &rates)
}

fn read_g3(mut g: Reader) -> Result<Value, DeployError> {
    let scope = g.one_of("scope", &["worker_local", "cluster_shared"])?.ok_or_else(|| g.err("scope", "is required"))?;
    let rates = [
        ("latency_to_first_byte_ms", 0.1),
        ("read_bandwidth_gbps", 10.0),
        ("write_bandwidth_gbps", 10.0),
        ("shared_read_bandwidth_gbps", 80.0),
        ("shared_write_bandwidth_gbps", 80.0),
    ];
    tier(g, scope, "num_g3_blocks", &rates)
}

//! `servesim perf`: predicted step times of the data-driven (AIS) timing model for one model,
//! GPU and batch shape, optionally per operation; or answers to a file of queries.

use std::io::{BufRead, Write};

use clap::Args;
use serde_json::{json, Value};
use servesim_perf::{AisConfig, RankMetrics};

use crate::failure::Failure;

#[derive(Args, Debug)]
pub struct PerfArgs {
    /// Model: a Hugging Face id (looked up in the data package's model_configs), a directory
    /// with config.json, or a config.json file.
    #[arg(long)]
    pub model: Option<String>,
    // The doc comment is the --help text, printed as written: `<system>` is a placeholder,
    // not HTML.
    #[allow(rustdoc::invalid_html_tags)]
    /// GPU system, as in the data package's systems/<system>.yaml.
    #[arg(long, default_value = "h200_sxm")]
    pub system: String,
    /// Serving backend whose kernel tables are used: vllm, sglang or trtllm.
    #[arg(long, default_value = "vllm")]
    pub backend: String,
    /// Backend version: current (default), previous, next or a listed version.
    #[arg(long)]
    pub backend_version: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub tp: u32,
    #[arg(long, default_value_t = 1)]
    pub pp: u32,
    #[arg(long, default_value_t = 1)]
    pub attention_dp: u32,
    #[arg(long)]
    pub moe_tp: Option<u32>,
    #[arg(long)]
    pub moe_ep: Option<u32>,
    /// MTP draft depth.
    #[arg(long, default_value_t = 0)]
    pub nextn: u32,
    /// A `systems/` directory to read (repeatable); default: discovered (see the crate README).
    #[arg(long = "systems-path")]
    pub systems_paths: Vec<String>,
    /// A complete timing config (ForwardPassPerfModelConfig keys) as JSON; replaces the flags above.
    #[arg(long)]
    pub config: Option<String>,
    /// Requests in the batch.
    #[arg(long, default_value_t = 1)]
    pub batch: u32,
    /// Prompt length (tokens) of each request.
    #[arg(long, default_value_t = 1024)]
    pub isl: u32,
    /// Cached prefix of each prompt.
    #[arg(long, default_value_t = 0)]
    pub prefix: u32,
    /// KV length of each decoding request (default: isl + 1).
    #[arg(long)]
    pub context: Option<u32>,
    /// Print every operation's time.
    #[arg(long)]
    pub per_op: bool,
    /// Answer JSON-lines queries from FILE ('-': stdin), one JSON answer per line:
    /// {"prefill": [batch, isl, prefix]} | {"decode": [batch, context]} |
    /// {"ranks": [{"num_prefill_requests": .., "sum_prefill_tokens": .., ...}, ...]}.
    #[arg(long)]
    pub queries: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn config_of(a: &PerfArgs) -> Result<AisConfig, Failure> {
    let v = match &a.config {
        Some(text) => {
            serde_json::from_str::<Value>(text).map_err(|e| Failure::input(format!("--config: invalid JSON: {e}")))?
        }
        None => {
            let model = a.model.as_ref().ok_or_else(|| Failure::input("--model is required (or --config)"))?;
            let mut m = json!({
                "model": model, "system": a.system, "backend": a.backend, "worker_type": "aggregated",
                "tp": a.tp, "pp": a.pp, "attention_dp": a.attention_dp, "nextn": a.nextn,
            });
            if let Some(v) = &a.backend_version {
                m["backend_version"] = json!(v);
            }
            if let Some(v) = a.moe_tp {
                m["moe_tp_size"] = json!(v);
            }
            if let Some(v) = a.moe_ep {
                m["moe_ep_size"] = json!(v);
            }
            if !a.systems_paths.is_empty() {
                m["systems_paths"] = json!(a.systems_paths);
            }
            m
        }
    };
    AisConfig::from_json("config", &v).map_err(|e| Failure::input(e.message))
}

fn rank(v: &Value) -> Result<RankMetrics, String> {
    let f = |k: &str| -> Result<u32, String> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(0),
            Some(x) => x
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("{k} must be a non-negative integer")),
        }
    };
    Ok(RankMetrics {
        num_prefill_requests: f("num_prefill_requests")?,
        sum_prefill_tokens: f("sum_prefill_tokens")?,
        sum_prefill_kv_tokens: f("sum_prefill_kv_tokens")?,
        num_decode_requests: f("num_decode_requests")?,
        sum_decode_kv_tokens: f("sum_decode_kv_tokens")?,
    })
}

fn answer(est: &servesim_perf::Estimator, q: &Value) -> Result<f64, String> {
    let ints = |v: &Value, n: usize| -> Result<Vec<u32>, String> {
        let a = v.as_array().filter(|a| a.len() == n).ok_or_else(|| format!("expected a list of {n} integers"))?;
        a.iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| "expected integers".to_string()))
            .collect()
    };
    if let Some(p) = q.get("prefill") {
        let v = ints(p, 3)?;
        return est.prefill_ms(v[0], v[1], v[2]).map_err(|e| e.message);
    }
    if let Some(d) = q.get("decode") {
        let v = ints(d, 2)?;
        return est.decode_ms(v[0], v[1]).map_err(|e| e.message);
    }
    if let Some(r) = q.get("ranks").and_then(Value::as_array) {
        let ranks = r.iter().map(rank).collect::<Result<Vec<_>, _>>()?;
        return est.forward_pass_time_ms(&ranks).map_err(|e| e.message);
    }
    Err("a query needs \"prefill\", \"decode\" or \"ranks\"".into())
}

pub fn run(a: PerfArgs) -> Result<(), Failure> {
    let cfg = config_of(&a)?;
    let est = servesim_perf::estimator(&cfg).map_err(|e| Failure::input(e.message))?;
    if let Some(file) = &a.queries {
        let reader: Box<dyn BufRead> = if file == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(file).map_err(|e| Failure::input(format!("{file}: {e}")))?,
            ))
        };
        let out = std::io::stdout();
        let mut out = out.lock();
        for (i, line) in reader.lines().enumerate() {
            let line = line.map_err(|e| Failure::input(format!("{file}: {e}")))?;
            if line.trim().is_empty() {
                continue;
            }
            let q: Value =
                serde_json::from_str(&line).map_err(|e| Failure::input(format!("{file} line {}: {e}", i + 1)))?;
            let a = match answer(&est, &q) {
                Ok(ms) => json!({"ms": ms}),
                Err(e) => json!({"error": e}),
            };
            writeln!(out, "{a}").map_err(|e| Failure::run(e.to_string()))?;
        }
        return Ok(());
    }
    let context = a.context.unwrap_or(a.isl + 1);
    let pre = est.prefill_ops(a.batch, a.isl, a.prefix).map_err(|e| Failure::run(e.message))?;
    let dec = est.decode_ops(a.batch, context).map_err(|e| Failure::run(e.message))?;
    let (pt, dt): (f64, f64) = (pre.iter().map(|x| x.1).sum(), dec.iter().map(|x| x.1).sum());
    let db = &est.db;
    if a.json {
        let ops = |v: &[(String, f64)]| v.iter().map(|(n, ms)| json!({"op": n, "ms": ms})).collect::<Vec<_>>();
        let mut out = json!({
            "model": est.model.name, "architecture": est.model.architecture, "system": db.spec.name,
            "backend": db.backend, "backend_version": db.version, "tp": est.layout.tp,
            "batch": a.batch, "isl": a.isl, "prefix": a.prefix, "context": context,
            "prefill_ms": pt, "decode_ms": dt,
        });
        if a.per_op {
            out["prefill_ops"] = json!(ops(&pre));
            out["decode_ops"] = json!(ops(&dec));
        }
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return Ok(());
    }
    println!(
        "{} ({}) on {} · {} {} · tp {} · data {}",
        est.model.name,
        est.model.architecture,
        db.spec.name,
        db.backend,
        db.version,
        est.layout.tp,
        db.spec.root.display()
    );
    println!("prefill: batch {} × {} tokens ({} cached) → {:.4} ms", a.batch, a.isl, a.prefix, pt);
    println!(
        "decode:  batch {} at context {}{} → {:.4} ms",
        a.batch,
        context,
        if est.layout.nextn > 0 { format!(" (×{} verify width)", est.layout.nextn + 1) } else { String::new() },
        dt
    );
    if a.per_op {
        for (title, ops, total) in [("prefill", &pre, pt), ("decode", &dec, dt)] {
            println!("\n{title} ops:");
            for (n, ms) in ops {
                println!("  {n:<28} {ms:>12.4} ms {:>6.1} %", if total > 0.0 { ms / total * 100.0 } else { 0.0 });
            }
        }
    }
    Ok(())
}

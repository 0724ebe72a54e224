//! DeepSeek-V4.1-Flash past the measured module curves of its `full` execution profile
//! (systems/profiles/dsv41/full, SGLang, TP4 on B300 and GB300) against the reference estimator
//! (aisimulate 0.13.0.dev202610270000000085): every module, attention and mHC included, holds its
//! curve end's utilisation of its roofline. The goldens run only when the profile is installed;
//! otherwise they print a notice and pass.
//!
//! Every number comes from
//!
//! ```text
//! $AISIM_REF_VENV/bin/python scripts/ais_goldens.py --dsv41
//! ```
//!
//! (`static_phase_diagnostics` summed over ops). Per op, `scripts/ais_ops.py` on these shapes shows
//! every op within 1e-9 of the reference.

use std::path::PathBuf;

use serde_json::json;

mod common;
use common::est_with;

/// The `full` profile's systems root, where the AIS data is installed.
fn profile() -> Option<PathBuf> {
    let roots = servesim_perf::systems::systems_roots(&[]).ok()?;
    roots.into_iter().map(|(r, _)| r.join("profiles/dsv41/full")).find(|p| p.is_dir())
}

fn cfg(profile: &std::path::Path, system: &str, version: &str) -> serde_json::Value {
    json!({"model": "deepseek-ai/DeepSeek-V4.1-Flash", "system": system, "backend": "sglang",
           "backend_version": version, "tp": 4, "moe_tp_size": 4, "moe_ep_size": 1,
           "systems_paths": [profile]})
}

fn close(got: f64, want: f64) {
    common::close_to(got, want, 1e-9);
}

/// Prompts past the attention curves' 2049 (batch 1, 2) and 1025 (batch 3) new tokens, with
/// and without a measured cached prefix, mHC / Engram / projections past 1536 tokens, and decode
/// KV lengths past 2049.
#[test]
fn dsv41_past_the_measured_curves() {
    let Some(p) = profile() else {
        eprintln!("NOTICE: the DeepSeek-V4.1 profile is not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    };
    let e = est_with(cfg(&p, "b300_sxm", "dev-c4ca651192e5"));
    close(e.prefill_ms(1, 4096, 0).unwrap(), 572.2764970346908);
    close(e.prefill_ms(2, 3000, 0).unwrap(), 477.96640054305504);
    close(e.prefill_ms(1, 8192, 1536).unwrap(), 1024.2533914913959);
    close(e.decode_ms(1, 8192).unwrap(), 90.34096535319445);
    close(e.decode_ms(2, 20000).unwrap(), 94.34178054986015);
    close(e.decode_ms(3, 4000).unwrap(), 94.19996047903429);
    let e = est_with(cfg(&p, "gb300", "dev-800cc9adea5b"));
    close(e.prefill_ms(1, 65536, 0).unwrap(), 37551.17477855873);
    close(e.prefill_ms(2, 700, 512).unwrap(), 187.75542989978604);
    close(e.decode_ms(2, 30000).unwrap(), 140.722499087562);
}

//! DeepSeek-V4's config facts and KV cache against the reference (aisimulate 0.13,
//! `aisimulate_core`). Runs only when the packaged model configs are installed; otherwise each
//! test prints a notice and passes.
//!
//! The numbers were recorded with the reference venv's python from
//! `DeepSeekV4Model.get_kvcache_bytes_per_sequence` and `BaseModel._binary_search_kvcache_max_tokens`
//! on the configs `_parse_hf_config_json(_load_pre_downloaded_hf_config(hf_id))` reads:
//!
//! ```text
//! $AISIM_REF_VENV/bin/python scripts/ais_goldens.py --dsv4-kv
//! ```

use servesim_perf::db::Dtype;
use servesim_perf::dsv4::Dsv4Spec;
use servesim_perf::model::find_config;

fn spec(model: &str) -> Option<Dsv4Spec> {
    let roots: Vec<_> = servesim_perf::systems::systems_roots(&[]).ok()?.into_iter().map(|(r, _)| r).collect();
    let path = find_config(model, &roots).ok()?;
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()?;
    let layers = cfg["num_hidden_layers"].as_u64()? as u32;
    Some(Dsv4Spec::from_config(&cfg, layers, &path.display().to_string()).unwrap())
}

type Case = (&'static str, Dtype, &'static [(u64, f64)], &'static [(f64, u64)]);

/// (model, kv dtype, [(sequence length, KV bytes)], [(budget bytes, tokens)]).
const CASES: &[Case] = &[
    (
        "deepseek-ai/DeepSeek-V4-Flash",
        Dtype::Fp8,
        &[
            (0, 11345920.0),
            (1, 11367936.0),
            (3, 11411968.0),
            (4, 11446080.0),
            (127, 14516928.0),
            (128, 14561280.0),
            (129, 14561280.0),
            (1000, 17259648.0),
            (4096, 26877952.0),
            (100000, 324561408.0),
        ],
        &[(1e6, 0), (5e9, 1606267), (60.5e9, 19486419)],
    ),
    (
        "deepseek-ai/DeepSeek-V4-Flash",
        Dtype::Bfloat16,
        &[
            (0, 11345920.0),
            (1, 11389952.0),
            (3, 11478016.0),
            (4, 11544896.0),
            (127, 17646272.0),
            (128, 17733632.0),
            (129, 17733632.0),
            (1000, 22837376.0),
            (4096, 41033728.0),
            (100000, 604176896.0),
        ],
        &[(1e6, 0), (5e9, 848611), (60.5e9, 10300243)],
    ),
    (
        "deepseek-ai/DeepSeek-V4-Pro",
        Dtype::Fp8,
        &[
            (0, 17481728.0),
            (1, 17512960.0),
            (3, 17575424.0),
            (4, 17623936.0),
            (127, 21983872.0),
            (128, 22048256.0),
            (129, 22048256.0),
            (1000, 25910528.0),
            (4096, 39682048.0),
            (100000, 465875456.0),
        ],
        &[(1e6, 0), (5e9, 1120279), (60.5e9, 13609031)],
    ),
    (
        "deepseek-ai/DeepSeek-V4-Pro",
        Dtype::Bfloat16,
        &[
            (0, 17481728.0),
            (1, 17544192.0),
            (3, 17669120.0),
            (4, 17764224.0),
            (127, 26426496.0),
            (128, 26553344.0),
            (129, 26553344.0),
            (1000, 33859328.0),
            (4096, 59916288.0),
            (100000, 866269184.0),
        ],
        &[(1e6, 0), (5e9, 591643), (60.5e9, 7192499)],
    ),
];

#[test]
fn kv_bytes_and_capacity_match_the_reference() {
    let mut checked = 0;
    for &(model, kv, bytes, tokens) in CASES {
        let Some(s) = spec(model) else {
            eprintln!("NOTICE: {model} config not installed (set SERVESIM_AIS_SYSTEMS); skipping");
            continue;
        };
        for &(len, want) in bytes {
            assert_eq!(s.kv_bytes_per_sequence(kv, len), want, "{model} {} len {len}", kv.name());
        }
        for &(budget, want) in tokens {
            assert_eq!(s.kv_tokens(kv, budget, 1048576), want, "{model} {} budget {budget}", kv.name());
        }
        checked += 1;
    }
    if checked > 0 {
        assert_eq!(checked, CASES.len());
    }
}

#[test]
fn config_facts() {
    let (Some(flash), Some(pro)) = (spec("deepseek-ai/DeepSeek-V4-Flash"), spec("deepseek-ai/DeepSeek-V4-Pro")) else {
        eprintln!("NOTICE: DeepSeek-V4 configs not installed; skipping");
        return;
    };
    // Flash lists 44 ratios for 43 layers (the last is the MTP layer's) and keeps 43.
    assert_eq!(flash.compress_ratios.len(), 43);
    assert_eq!((flash.layers_with(0), flash.layers_with(4), flash.layers_with(128)), (2, 21, 20));
    assert_eq!((flash.head_dim, flash.sliding_window, flash.index_topk, flash.o_groups), (512, 128, 512, 8));
    assert_eq!((flash.hc_mult, flash.hc_sinkhorn_iters), (4, 20));
    assert_eq!((pro.q_lora_rank, pro.index_topk, pro.o_groups), (1536, 1024, 16));
}

#[test]
fn malformed_configs_are_named() {
    let base = serde_json::json!({
        "compress_ratios": [0, 4, 128], "sliding_window": 128, "head_dim": 512, "qk_rope_head_dim": 64,
        "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8, "index_n_heads": 64,
        "index_head_dim": 128, "index_topk": 512, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    });
    assert_eq!(Dsv4Spec::from_config(&base, 3, "c.json").unwrap().compress_ratios, vec![0, 4, 128]);
    let e = Dsv4Spec::from_config(&base, 4, "c.json").unwrap_err().message;
    assert!(e.contains("compress_ratios has 3 entries, fewer than num_hidden_layers 4"), "{e}");
    let mut odd = base.clone();
    odd["compress_ratios"] = serde_json::json!([0, 8, 128]);
    let e = Dsv4Spec::from_config(&odd, 3, "c.json").unwrap_err().message;
    assert!(e.contains("compress ratio 8 is not one DeepSeek-V4's attention has"), "{e}");
    let mut missing = base.clone();
    missing.as_object_mut().unwrap().remove("hc_mult");
    let e = Dsv4Spec::from_config(&missing, 3, "c.json").unwrap_err().message;
    assert!(e.contains("c.json: DeepseekV4ForCausalLM needs an integer hc_mult"), "{e}");
}

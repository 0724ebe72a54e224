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

mod common;
use common::{data_available, est_with};

fn close(got: f64, want: f64) {
    common::close_to(got, want, 1e-9);
}

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

/// DeepSeek-V4 step times and KV capacity against the reference's op-level estimator: the
/// CSA / HCA module tables (SWA layers timed as HCA), the mHC pre / post ops, the shared expert
/// beside the MXFP4 × MXFP8 routed experts, fp8 KV with bf16 attention tables. Numbers from
///
/// ```text
/// $AISIM_REF_VENV/bin/python scripts/ais_goldens.py --dsv4
/// ```
///
/// (`static_phase_diagnostics` summed for prefill and decode at `context − 1`,
/// `estimate_forward_pass_time_ms` for the mixed pass, `estimate_num_gpu_blocks` at 8192 tokens
/// per pass and block 64).
#[test]
fn timing_goldens() {
    if !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the DeepSeek-V4 goldens");
        return;
    }
    use serde_json::json;
    let mixed = servesim_perf::RankMetrics {
        num_prefill_requests: 3,
        sum_prefill_tokens: 2000,
        sum_prefill_kv_tokens: 3000,
        num_decode_requests: 100,
        sum_decode_kv_tokens: 70000,
    };
    let layout = |model: &str, tp: u32, moe_tp: u32, moe_ep: u32| {
        est_with(json!({"model": model, "system": "b200_sxm", "backend": "vllm", "backend_version": "0.24.0",
                        "tp": tp, "moe_tp_size": moe_tp, "moe_ep_size": moe_ep}))
    };
    let flash = layout("deepseek-ai/DeepSeek-V4-Flash", 1, 1, 1);
    let q = &flash.layout;
    assert_eq!((q.gemm, q.moe, q.kv, q.fmha), (Dtype::Fp8Block, Dtype::W4a8Mxfp4Mxfp8, Dtype::Fp8, Dtype::Bfloat16));
    close(flash.prefill_ms(2, 1000, 0).unwrap(), 79.8730509008812);
    close(flash.prefill_ms(1, 20000, 0).unwrap(), 498.34455436968227);
    close(flash.prefill_ms(2, 3000, 500).unwrap(), 135.5514158366166);
    close(flash.decode_ms(16, 1100).unwrap(), 13.083621483291422);
    close(flash.decode_ms(7, 131072).unwrap(), 9.828872148301608);
    close(flash.forward_pass_time_ms(&[mixed]).unwrap(), 95.3066545380031);
    let got = servesim_perf::memory::kv_capacity(&flash, None, 8192, 64, 0.0).unwrap();
    assert_eq!(got.blocks, 41609, "{got:?}");

    let flash_tp4 = layout("deepseek-ai/DeepSeek-V4-Flash", 4, 4, 1);
    close(flash_tp4.prefill_ms(4, 777, 0).unwrap(), 54.8603583508467);
    close(flash_tp4.decode_ms(64, 4097).unwrap(), 11.893267000050383);

    let pro = layout("deepseek-ai/DeepSeek-V4-Pro", 8, 1, 8);
    close(pro.prefill_ms(2, 1000, 0).unwrap(), 77.37266365475664);
    close(pro.prefill_ms(1, 8192, 0).unwrap(), 316.13631550579163);
    close(pro.decode_ms(16, 1100).unwrap(), 16.875279131632592);
    close(pro.decode_ms(33, 5000).unwrap(), 20.60524992618321);
    close(pro.forward_pass_time_ms(&[mixed]).unwrap(), 93.53526206070447);
    let got = servesim_perf::memory::kv_capacity(&pro, None, 8192, 64, 0.0).unwrap();
    assert_eq!(got.blocks, 188960, "{got:?}");
}

/// DeepSeek-V4 on SGLang 0.5.14 against the reference: the CSA top-k correction
/// (`dsv4_csa_topk_calib_perf`) off the CSA modules in prefill and decode, Flash (64 heads) and
/// Pro (128) each with its own pairs; the fp4 experts on the trtllm-gen MXFP4 × MXFP8 lane on
/// Blackwell (B200, B300), the FP8 re-quantised Flash's fp8_block experts on H200; attention DP
/// with `moe_backend: deepep_moe`, which the reference builds as the default graph. Numbers from
///
/// ```text
/// $AISIM_REF_VENV/bin/python scripts/ais_goldens.py --dsv4-sglang
/// ```
///
/// (as [`timing_goldens`]; KV capacity at block 1, SGLang's page).
#[test]
fn sglang_timing_goldens() {
    if !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the DeepSeek-V4 SGLang goldens");
        return;
    }
    use serde_json::json;
    let mixed = common::MIXED;
    let layout = |model: &str, system: &str, extra: serde_json::Value| {
        let mut cfg = json!({"model": model, "system": system, "backend": "sglang", "backend_version": "0.5.14"});
        cfg.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        est_with(cfg)
    };
    let flash =
        layout("deepseek-ai/DeepSeek-V4-Flash", "b200_sxm", json!({"tp": 1, "moe_tp_size": 1, "moe_ep_size": 1}));
    let q = &flash.layout;
    // The context tables hold bf16 attention only: the fp8 checkpoint's format falls back to it.
    assert_eq!(
        (q.gemm, q.moe, q.kv, q.fmha),
        (Dtype::Fp8Block, Dtype::W4a8Mxfp4Mxfp8Trtllm, Dtype::Fp8, Dtype::Bfloat16)
    );
    close(flash.prefill_ms(2, 1000, 0).unwrap(), 78.79888581186262);
    close(flash.prefill_ms(1, 20000, 0).unwrap(), 427.5455304679508);
    close(flash.prefill_ms(2, 3000, 500).unwrap(), 125.55275475645746);
    close(flash.decode_ms(16, 1100).unwrap(), 13.498424852792647);
    close(flash.decode_ms(7, 131072).unwrap(), 9.601593009848562);
    close(flash.forward_pass_time_ms(&[mixed]).unwrap(), 92.4437681068071);
    let got = servesim_perf::memory::kv_capacity(&flash, None, 8192, 1, 0.0).unwrap();
    assert_eq!(got.blocks, 5673919, "{got:?}");

    let tp4 = layout("deepseek-ai/DeepSeek-V4-Flash", "b200_sxm", json!({"tp": 4, "moe_tp_size": 4, "moe_ep_size": 1}));
    close(tp4.prefill_ms(4, 777, 0).unwrap(), 55.89337181245517);
    close(tp4.decode_ms(64, 4097).unwrap(), 11.104907362721013);

    let deepep = layout(
        "deepseek-ai/DeepSeek-V4-Flash",
        "b200_sxm",
        json!({"tp": 1, "attention_dp": 4, "moe_tp_size": 1, "moe_ep_size": 4, "moe_backend": "deepep_moe"}),
    );
    close(deepep.prefill_ms(3, 3000, 777).unwrap(), 181.14501670147604);
    close(deepep.decode_ms(17, 1234).unwrap(), 12.02873947354063);
    close(deepep.forward_pass_time_ms(&[mixed]).unwrap(), 76.33387233772837);

    let pro = layout("deepseek-ai/DeepSeek-V4-Pro", "b300_sxm", json!({"tp": 8, "moe_tp_size": 1, "moe_ep_size": 8}));
    assert_eq!(pro.layout.moe, Dtype::W4a8Mxfp4Mxfp8Trtllm);
    close(pro.prefill_ms(2, 1000, 0).unwrap(), 81.31210739018312);
    close(pro.prefill_ms(5, 9000, 1000).unwrap(), 1117.3884481548841);
    close(pro.decode_ms(33, 5000).unwrap(), 18.160359815871605);
    close(pro.forward_pass_time_ms(&[mixed]).unwrap(), 99.50902695249863);
    let got = servesim_perf::memory::kv_capacity(&pro, None, 8192, 1, 0.0).unwrap();
    assert_eq!(got.blocks, 32559455, "{got:?}");

    let fp8 =
        layout("sgl-project/DeepSeek-V4-Flash-FP8", "h200_sxm", json!({"tp": 4, "moe_tp_size": 1, "moe_ep_size": 4}));
    assert_eq!(fp8.layout.moe, Dtype::Fp8Block);
    close(fp8.prefill_ms(2, 1000, 0).unwrap(), 71.83604246808207);
    close(fp8.decode_ms(16, 1100).unwrap(), 13.715269546723647);

    // Prefill context parallelism: the compressed-attention layers on the busiest rank's share
    // plus the indexer-logits / selector deltas and the KV gathers; the dispatch gathers the
    // split prompt, and (as the reference builds it) the decode dispatch too.
    let cp2 = layout(
        "deepseek-ai/DeepSeek-V4-Flash",
        "b200_sxm",
        json!({"tp": 1, "cp_size": 2, "moe_tp_size": 1, "moe_ep_size": 2}),
    );
    close(cp2.prefill_ms(2, 4096, 0).unwrap(), 106.23689363406537);
    close(cp2.prefill_ms(3, 3000, 777).unwrap(), 90.28563470085838);
    close(cp2.prefill_ms(1, 16000, 0).unwrap(), 195.50381168673945);
    close(cp2.decode_ms(16, 1100).unwrap(), 11.229886274606612);
    close(cp2.forward_pass_time_ms(&[mixed]).unwrap(), 49.95111735500179);
    let cp4 = layout(
        "sgl-project/DeepSeek-V4-Flash-FP8",
        "h200_sxm",
        json!({"tp": 1, "cp_size": 4, "moe_tp_size": 4, "moe_ep_size": 1}),
    );
    close(cp4.prefill_ms(2, 3000, 0).unwrap(), 109.0070318408813);
    close(cp4.prefill_ms(1, 8000, 192).unwrap(), 136.56925304018242);
    close(cp4.decode_ms(16, 1100).unwrap(), 14.48195537778658);
    // Past the selector table's largest prompt (16384 on B200) the split is refused, as the
    // reference refuses it (the selector's time is not held).
    let err = cp2.prefill_ms(1, 20000, 0).unwrap_err().to_string();
    assert!(err.contains("isl 20000 is past the largest collected v1_top_last isl 16384"), "{err}");
}

/// What servesim does not model of DeepSeek-V4 is refused by name: SGLang's MegaMoE graph (after
/// the reference's own checks; the reference fails too, for want of its table at every served
/// version), the fp4 experts' Hopper lane where no data has it (as the reference), and the SOL
/// rooflines.
#[test]
fn unmodelled_parts_are_refused_by_name() {
    if !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    }
    use serde_json::json;
    let refusal = |cfg: serde_json::Value| match servesim_perf::AisConfig::from_json("config", &cfg) {
        Err(e) => e.message,
        Ok(c) => servesim_perf::estimator(&c).err().map(|e| e.message).unwrap_or_default(),
    };
    let mega = |system: &str, tp: u32, adp: u32, moe_tp: u32, moe_ep: u32| {
        refusal(json!({"model": "deepseek-ai/DeepSeek-V4-Flash", "system": system, "backend": "sglang",
                       "tp": tp, "attention_dp": adp, "moe_tp_size": moe_tp, "moe_ep_size": moe_ep,
                       "moe_backend": "megamoe"}))
    };
    let e = mega("b200_sxm", 4, 1, 4, 1);
    assert!(e.contains("moe_backend: megamoe: DeepSeek-V4's MegaMoE requires moe_tp_size=1, got 4"), "{e}");
    let e = mega("b200_sxm", 1, 1, 1, 1);
    assert!(e.contains("DeepSeek-V4's MegaMoE requires moe_ep_size > 1, got 1"), "{e}");
    for system in ["b200_sxm", "gb200", "gb300"] {
        let e = mega(system, 1, 4, 1, 4);
        assert!(
            e.contains(&format!("no dsv4_megamoe_module_perf.parquet for {system} / sglang 0.5.14")),
            "{system}: {e}"
        );
    }
    // The fp4 experts on Hopper take SGLang's CUTLASS lane, which no H200 table holds.
    let hopper = est_with(json!({"model": "deepseek-ai/DeepSeek-V4-Flash", "system": "h200_sxm", "backend": "sglang",
                                 "tp": 4, "moe_tp_size": 1, "moe_ep_size": 4}));
    assert_eq!(hopper.layout.moe, Dtype::W4a16Mxfp4Cutlass);
    let e = hopper.prefill_ms(2, 1000, 0).unwrap_err().message;
    assert!(e.contains("no w4a16_mxfp4_cutlass MoE data on h200_sxm / sglang 0.5.14"), "{e}");
    let sol = est_with(json!({"model": "deepseek-ai/DeepSeek-V4-Flash", "system": "b200_sxm", "backend": "vllm",
                              "backend_version": "0.24.0", "database_mode": "SOL"}));
    let e = sol.decode_ms(4, 1000).unwrap_err().message;
    assert!(e.contains("database_mode SOL is not modelled for DeepSeek-V4"), "{e}");
    for mode in ["EMPIRICAL", "HYBRID"] {
        let est = est_with(json!({"model": "deepseek-ai/DeepSeek-V4-Flash", "system": "b200_sxm", "backend": "vllm",
                                  "backend_version": "0.24.0", "database_mode": mode}));
        let e = est.decode_ms(4, 1000).unwrap_err().message;
        assert!(e.contains(&format!("database_mode {mode} is not modelled for")), "{e}");
    }
}

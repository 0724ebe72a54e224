//! Qwen3-VL's vision tower against the reference (aisimulate 0.13): the image tokens, each
//! encoder op of one encoder-only worker's batch, and its memory, as the analytical encoder pool
//! reads them (`BackendBase._run_encoder_phase` / `run_encoder_static` over
//! `build_encoder_ops(enc_cfg, tp, enable_encoder_dp=False)` on h200_sxm, vLLM 0.24.0; the 8B at
//! TP 1, one 1024×1024 image; the 30B-A3B at TP 2, a batch of 4 of 720×1280, the all-reduces live). Runs only
//! when the AIS data is installed; otherwise it prints a notice and passes.
//!
//! Recorded with the reference venv's python:
//!
//! ```text
//! $AISIM_REF_VENV/bin/python scripts/ais_goldens.py --vision
//! ```

use servesim_perf::db::Database;
use servesim_perf::model::find_config;
use servesim_perf::systems::{find_system, systems_roots};
use servesim_perf::vision::{ImageShape, VisionTower};

mod common;

fn tower(model: &str) -> Option<VisionTower> {
    let roots: Vec<_> = systems_roots(&[]).ok()?.into_iter().map(|(r, _)| r).collect();
    let path = find_config(model, &roots).ok()?;
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()?;
    VisionTower::from_config(&cfg, model).unwrap()
}

fn db() -> Database {
    let roots = systems_roots(&[]).unwrap();
    let spec = find_system(&roots, "h200_sxm").unwrap();
    Database::open(spec, "vllm", "0.24.0", true).unwrap()
}

/// (model, tp, batch, height, width, image tokens, patches, [(op, ms)], memory GiB).
type Case = (&'static str, u32, u32, u32, u32, u32, u32, &'static [(&'static str, f64)], f64);

const CASES: &[Case] = &[
    (
        "Qwen/Qwen3-VL-8B-Instruct",
        1,
        1,
        1024,
        1024,
        1024,
        4096,
        &[
            ("encoder_patch_embed_gemm", 0.021330496310727188),
            ("encoder_position_embed", 0.0103728),
            ("encoder_add_norm_1", 0.34642080000000003),
            ("encoder_qkv_gemm", 1.353982550163821),
            ("encoder_attention", 5.696207821369171),
            ("encoder_proj_gemm", 0.45952427456566447),
            ("encoder_ar_1", 0.0),
            ("encoder_add_norm_2", 0.34642080000000003),
            ("encoder_ffn1_gemm", 1.635839741462697),
            ("encoder_act", 0.5768208),
            ("encoder_ffn2_gemm", 1.409033055049814),
            ("encoder_ar_2", 0.0),
            ("encoder_rope_apply", 0.8772624),
            ("encoder_merger_norm", 0.0316608),
            ("encoder_projector_fc0_gemm", 0.21734862464858296),
            ("encoder_projector_fc0_act", 0.0316608),
            ("encoder_projector_fc1_gemm", 0.19651727066769828),
            ("encoder_projector_ar", 0.0),
        ],
        1.1254196166992188,
    ),
    (
        "Qwen/Qwen3-VL-30B-A3B-Instruct",
        2,
        4,
        720,
        1280,
        880,
        3520,
        &[
            ("encoder_patch_embed_gemm", 0.06842708255248921),
            ("encoder_position_embed", 0.028343999999999998),
            ("encoder_add_norm_1", 0.9933839999999999),
            ("encoder_qkv_gemm", 2.1254909104989026),
            ("encoder_attention", 7.75831203160565),
            ("encoder_proj_gemm", 0.8729513351902364),
            ("encoder_ar_1", 3.7884628564305602),
            ("encoder_add_norm_2", 0.9933839999999999),
            ("encoder_ffn1_gemm", 2.6217872243802436),
            ("encoder_act", 0.9331919999999999),
            ("encoder_ffn2_gemm", 2.4927327079076314),
            ("encoder_ar_2", 3.7884628564305602),
            ("encoder_rope_apply", 1.449576),
            ("encoder_merger_norm", 0.079584),
            ("encoder_projector_fc0_gemm", 0.39240354501422753),
            ("encoder_projector_fc0_act", 0.045792),
            ("encoder_projector_fc1_gemm", 0.1865475372863686),
            ("encoder_projector_ar", 0.2684975171089172),
        ],
        0.6447410583496094,
    ),
];

#[test]
fn the_encoder_ops_match_the_reference() {
    if !common::data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed; skipping");
        return;
    }
    let db = db();
    for &(model, tp, batch, h, w, tokens, patches, ops, memory) in CASES {
        let t = tower(model).expect("a Qwen3-VL vision_config");
        let shape = t.image(h, w).unwrap();
        assert_eq!(shape, ImageShape::single(patches, tokens), "{model} {h}x{w}");
        let got = t.batch_ops(&db, tp, batch, 1, shape).unwrap();
        assert_eq!(got.len(), ops.len(), "{model}: op count");
        for ((name, ms), (want_name, want)) in got.iter().zip(ops.iter()) {
            assert_eq!(name, want_name);
            common::close_to(*ms, *want, 1e-12);
        }
        let (total, _, _) = t.memory_gib(tp, batch, 1, shape).unwrap();
        common::close_to(total, memory, 1e-12);
    }
}

/// Llama 4's fixed tiles against the reference's `image_geometry` (printed by
/// `$AISIM_REF_VENV/bin/python scripts/ais_goldens.py --llama4-tiles`): the best-fit canvas of at
/// most 16 tiles of 336 pixels plus the global tile when it takes several, 576 patches + CLS a
/// tile, 144 merged tokens a tile, 3 framing tokens an image and 1 per local tile past the first;
/// the embeddings 144 × 5120 bf16 a tile.
#[test]
fn llama4_tiles_match_the_reference() {
    let Some(t) = tower("meta-llama/Llama-4-Scout-17B-16E-Instruct") else {
        eprintln!("NOTICE: model configs not installed; skipping");
        return;
    };
    // (height, width, sequences, visual tokens, embedding bytes)
    let cases = [
        (480, 640, 5, 727, 7_372_800),
        (300, 300, 1, 147, 1_474_560),
        (336, 336, 1, 147, 1_474_560),
        (337, 336, 3, 437, 4_423_680),
        (1080, 1920, 16, 2322, 23_592_960),
        (4000, 300, 13, 1887, 19_169_280),
        (100, 5000, 16, 2322, 23_592_960),
        (2000, 2000, 17, 2467, 25_067_520),
        (1, 1, 1, 147, 1_474_560),
        (720, 1280, 13, 1887, 19_169_280),
    ];
    for (h, w, sequences, visual, bytes) in cases {
        let shape = t.image(h, w).unwrap();
        assert_eq!(shape, ImageShape { sequences, patches: 576, vit: 577, merged: 144, tokens: visual }, "{h}x{w}");
        assert_eq!(t.embedding_bytes(shape), bytes, "{h}x{w}");
    }
    // The tower shards over 4 and 8 (its widths 1408, 4096, 5120 and 16 heads), not 3; replicated
    // (encoder DP) it is refused, as SGLang does not read --mm-enable-dp-encoder for it.
    assert!(t.ops(4).is_ok() && t.ops(8).is_ok());
    assert!(t.ops(3).is_err());
    assert!(t.check_layout(servesim_perf::vision::EncoderLayout::Data).is_err());
    assert!(t.check_layout(servesim_perf::vision::EncoderLayout::Tensor).is_ok());
}

/// (tp, batch, [(op, ms)]).
type OpsCase = (u32, u32, &'static [(&'static str, f64)]);

/// Kimi K3's tower (MoonViT3D and PatchMergerV2) against the reference, printed by
/// `$AISIM_REF_VENV/bin/python scripts/ais_goldens.py --kimi-k3-tower`: the processor's patch
/// budget (16384 patches, scaled down by truncation, padded to the 28-pixel merge stride), and
/// each op of one encoder-only worker's batch of 720×1280 images on b300_sxm / SGLang 0.5.14 at
/// TP 1 (one image) and TP 2 (three: the all-reduces live, the replicated merger not sharded),
/// and the worker's memory (`run_encoder_static`: at TP 1 the 1536-wide QKV outgrows the
/// residual's three copies), within 1e-12. The installed data has no bf16 encoder attention of head size 128 (its 1536-wide
/// QKV over 12 heads) on any system, so the attention op is the one the reference cannot price
/// and servesim refuses it naming the missing table row.
#[test]
fn kimi_k3_tower_matches_the_reference() {
    if !common::data_available("b300_sxm") {
        eprintln!("NOTICE: AIS data not installed; skipping");
        return;
    }
    let t = tower("moonshotai/Kimi-K3").expect("Kimi K3's vision_config");
    // (height, width, patches, merged tokens)
    let images = [
        (720, 1280, 4784, 1196),
        (448, 448, 1024, 256),
        (4000, 3000, 16800, 4200),
        (1, 1, 4, 1),
        (100, 7000, 4000, 1000),
        (7000, 7000, 16384, 4096),
    ];
    for (h, w, patches, tokens) in images {
        assert_eq!(t.image(h, w).unwrap(), ImageShape::single(patches, tokens), "{h}x{w}");
    }
    assert_eq!(t.embedding_bytes(t.image(720, 1280).unwrap()), 1196 * 7168 * 2);
    let roots = systems_roots(&[]).unwrap();
    let db = Database::open(find_system(&roots, "b300_sxm").unwrap(), "sglang", "0.5.14", true).unwrap();
    let shape = t.image(720, 1280).unwrap();
    let cases: &[OpsCase] = &[
        (
            1,
            1,
            &[
                ("encoder_patch_embed_gemm", 0.00683357569626552),
                ("encoder_position_embed", 0.0077407896774193555),
                ("encoder_add_norm_1", 0.2516684283870968),
                ("encoder_qkv_gemm", 0.7895826650869816),
                ("encoder_proj_gemm", 0.32122805429315404),
                ("encoder_ar_1", 0.0),
                ("encoder_add_norm_2", 0.2516684283870968),
                ("encoder_ffn1_gemm", 0.6988446822729109),
                ("encoder_act", 0.4223368567741936),
                ("encoder_ffn2_gemm", 0.7210030087303079),
                ("encoder_ar_2", 0.0),
                ("encoder_rope_apply", 0.8490079277419355),
                ("encoder_final_norm", 0.006160526451612903),
                ("encoder_patch_merge_pool", 0.006160526451612903),
                ("encoder_projector_fc0_gemm", 0.028253616343915853),
                ("encoder_projector_fc0_act", 0.006160526451612903),
                ("encoder_projector_fc1_gemm", 0.04391996809859681),
                ("encoder_projector_post_norm", 0.008530921290322579),
            ],
        ),
        (
            2,
            3,
            &[
                ("encoder_patch_embed_gemm", 0.013953665465010813),
                ("encoder_position_embed", 0.017222369032258066),
                ("encoder_add_norm_1", 0.5930052851612903),
                ("encoder_qkv_gemm", 1.1914274432272367),
                ("encoder_proj_gemm", 0.4493459644436371),
                ("encoder_ar_1", 1.9603535359958189),
                ("encoder_add_norm_2", 0.5930052851612903),
                ("encoder_ffn1_gemm", 1.054767703288235),
                ("encoder_act", 0.5930052851612903),
                ("encoder_ffn2_gemm", 1.0667048239556607),
                ("encoder_ar_2", 1.9603535359958189),
                ("encoder_rope_apply", 1.2330118916129031),
                ("encoder_final_norm", 0.01248157935483871),
                ("encoder_patch_merge_pool", 0.01248157935483871),
                ("encoder_projector_fc0_gemm", 0.07404890161713742),
                ("encoder_projector_fc0_act", 0.01248157935483871),
                ("encoder_projector_fc1_gemm", 0.1310950177946901),
                ("encoder_projector_post_norm", 0.019592763870967738),
            ],
        ),
    ];
    for &(tp, batch, want) in cases {
        let ops: Vec<_> = t.ops(tp).unwrap().into_iter().filter(|op| op.name != "encoder_attention").collect();
        assert_eq!(ops.len(), want.len(), "tp {tp}: op count");
        for (op, (name, ms)) in ops.iter().zip(want) {
            assert_eq!(op.name, *name);
            common::close_to(t.batch_op_ms(&db, tp, batch, 1, shape, op).unwrap(), *ms, 1e-12);
        }
        let (memory, _, _) = t.memory_gib(tp, batch, 1, shape).unwrap();
        common::close_to(memory, if tp == 1 { 0.8823699951171875 } else { 0.5862274169921875 }, 1e-12);
        let e = t.batch_ops(&db, tp, batch, 1, shape).unwrap_err();
        assert!(e.message.contains("no bfloat16 encoder attention data for head size 128"), "{}", e.message);
    }
    // 12 heads and a 4096-wide FFN shard over 2 and 4, not 3 or 8.
    assert!(t.ops(2).is_ok() && t.ops(4).is_ok());
    assert!(t.ops(3).is_err() && t.ops(8).is_err());
}

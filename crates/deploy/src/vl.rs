//! Native VL replay: images without an encoder pool, encoded by the vision tower on the
//! aggregated or prefill SGLang worker, as aisimulate 0.13 replays them.
//!
//! What the worker gets from here (the rules are the engine's `sglang::vision` and the
//! `servesim-perf` tower; see the engine README's "Native VL replay"):
//! - the prompt layout: every synthetic prompt starts with `count` images of the processor's
//!   merged tokens each (identity pool: image `i` of the run is image `i mod pool`);
//! - the embedding cache: `cache_mib` MiB, one image's embeddings being `merged tokens ×
//!   hidden × merger instances × 2` bytes;
//! - the timing: the AIS config names the tower's layout (`encoder_parallel`) and the image
//!   shape (servesim's `vision_image`);
//! - the memory: the tower's weights (sharded over the worker's tensor group under `tp`, whole
//!   under `dp`) and the embedding cache are reserved outside the KV cache.

use serde_json::{json, Value};
use servesim_engine::config::VisionSettings;
use servesim_perf::vision::{hosted_tower, EncoderLayout, ImageShape, VisionTower};
use servesim_workload::SyntheticImages;

use crate::error::DeployError;
use crate::schema::worker::Worker;
use crate::schema::{Config, Engine};

/// The tower a worker hosts and what its engine, timing and memory take from it.
#[derive(Clone, Debug)]
pub struct HostedVl {
    pub tower: VisionTower,
    pub shape: ImageShape,
    pub layout: EncoderLayout,
    pub settings: VisionSettings,
    pub images: SyntheticImages,
    /// `encoder_parallel` and `vision_image` of the worker's AIS config.
    pub ais: [(&'static str, Value); 2],
    /// Bytes reserved outside the KV cache on each rank: the tower's weights and the cache.
    pub weights_bytes: f64,
    pub cache_bytes: u64,
}

/// The tower `w` hosts (None: it hosts none).
pub fn hosted(engine: &Engine, w: &Worker) -> Result<Option<HostedVl>, DeployError> {
    let Some(vision) = &w.vision else { return Ok(None) };
    let Some(images) = &vision.images else { return Ok(None) };
    let here = format!("engine.workers.{}", w.role);
    let paths = w.systems_paths.as_ref().or(engine.systems_paths.as_ref()).cloned().unwrap_or_default();
    let tower = hosted_tower(&engine.model, &paths, images.min_pixels.map(u64::from), images.max_pixels.map(u64::from))
        .map_err(|e| DeployError::new("engine.model", e.message))?;
    let shape =
        tower.image(images.height, images.width).map_err(|e| DeployError::new("traffic.source.images", e.message))?;
    if shape.tokens >= 1 << 16 {
        return Err(DeployError::new(
            "traffic.source.images",
            format!("an image of {} tokens is more than servesim's native VL replay lays out (65535)", shape.tokens),
        ));
    }
    let layout = EncoderLayout::parse(vision.encoder_parallel).expect("read as tp or dp");
    tower.check_layout(layout).map_err(|e| DeployError::new(format!("{here}.vision.encoder_parallel"), e.message))?;
    let tp = w.parallelism.tensor;
    let weights_bytes = tower
        .weights_bytes(tp, layout)
        .map_err(|e| DeployError::new(format!("{here}.vision.encoder_parallel"), e.message))?;
    let cache_bytes = vision.cache_mib << 20;
    let image_bytes = tower.embedding_bytes(shape);
    let mut image = json!({"height": images.height, "width": images.width});
    if let Some(lo) = images.min_pixels {
        image["min_pixels"] = json!(lo);
    }
    if let Some(hi) = images.max_pixels {
        image["max_pixels"] = json!(hi);
    }
    Ok(Some(HostedVl {
        settings: VisionSettings {
            image_tokens: shape.tokens,
            images_per_request: images.count,
            image_bytes,
            cache_bytes,
        },
        images: SyntheticImages { tokens: shape.tokens, count: images.count, pool: images.pool },
        ais: [("encoder_parallel", json!(layout.name())), ("vision_image", image)],
        tower,
        shape,
        layout,
        weights_bytes,
        cache_bytes,
    }))
}

/// The hosted tower of a configuration's aggregated or prefill worker, if any.
pub fn of_config(cfg: &Config) -> Result<Option<HostedVl>, DeployError> {
    let engine = &cfg.engine;
    match engine.aggregated.as_ref().or(engine.prefill.as_ref()) {
        Some(w) => hosted(engine, w),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// A hosted tower's weights and embedding cache come off the KV budget: the blocks the
    /// reference materialises for the goldens' workers (`aisimulate.capacity.
    /// materialize_aic_num_gpu_blocks` over `prediction_to_replay_spec`'s engine args, printed by
    /// `$AISIM_REF_VENV/bin/python scripts/vl_kv_blocks.py CONFIG[@key=value]`), to the block.
    #[test]
    fn kv_blocks_reserve_the_tower_and_its_cache() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/deploy");
        let cases: [(&str, &[&str], u64); 8] = [
            ("predict_native_vl", &[], 757_033),
            ("predict_native_vl", &["engine.workers.aggregated.vision={cache_mib: 0}"], 757_744),
            ("predict_native_vl_dp", &[], 1_620_875),
            ("predict_native_vl_tp", &[], 1_628_627),
            (
                "predict_native_vl_dp",
                &["engine.workers.aggregated.vision={cache_mib: 777, encoder_parallel: dp}"],
                1_611_247,
            ),
            // Llama 4's tower (sharded four and eight ways).
            ("predict_native_vl_llama4", &[], 1_544_944),
            ("predict_native_vl_llama4_tp8", &[], 4_127_165),
            ("predict_native_vl_llama4_tp8", &["engine.workers.aggregated.vision={cache_mib: 0}"], 4_127_293),
        ];
        for (name, sets, want) in cases {
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            let tree = crate::load_tree(&dir.join(format!("{name}.yaml")), &sets).unwrap();
            let cfg = crate::schema::read_predict(&tree).unwrap();
            let lowered = match crate::lower::lower_engine(&cfg.engine) {
                Ok(l) => l,
                Err(e) if e.to_string().contains("SERVESIM_AIS_SYSTEMS") => {
                    eprintln!("NOTICE: AIS data not installed; skipping {name}");
                    return;
                }
                Err(e) => panic!("{name}: {e}"),
            };
            assert_eq!(lowered.workers[0].args_json["num_gpu_blocks"], want, "{name} {sets:?}");
        }
    }
}

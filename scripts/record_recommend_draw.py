#!/usr/bin/env python3
"""Record tests/deploy/NAME.draw.golden.json: the reference's random-search draw of
tests/deploy/NAME.yaml, run once per variant (a list of --set overrides), every candidate in the
reference's record order (candidate id, AFD topology or per-role workers, router, traffic load,
status, failure category (and reason, AFD), GPUs, score), its counts and its ranking (views.top_n).

    $AISIM_REF_VENV/bin/python scripts/record_recommend_draw.py recommend_afd_random [VARIANT ...]

runs, for each variant below (or only the VARIANTs named, keeping the file's others),
    $AISIM_REF_VENV/bin/python /work/shared/parity/aisimulate_predict.py tests/deploy/NAME.yaml \\
        --command recommend [--set K=V ...]

A router section (recommend_random_router) needs the Dynamo adapters and `--stack dynamo`; the
installed ai-dynamo 1.6.1 runtime cannot replay this aisimulate build's engines (it rejects
fields such as engine.sglang.vlm_cache_bytes), so those variants run with
    PYTHONPATH=scripts/record_shim:$DYNAMO_REF_VENV/lib/python3.11/site-packages \\
        RECORD_SHIM_ENGINE_ROUTER=1 ... --stack dynamo
where scripts/record_shim/sitecustomize.py replays `--stack dynamo` on the engine stack: the
router adapter compiles its search space and the sampler draws as under Dynamo, but a kv_router
candidate's placement hook is dropped (it replays round-robin), so only the draw and the
round_robin candidates' scores are the reference's (the golden marks the others
"score_compared": false).

A planner section (recommend_random_planner) runs the same way; the Planner adapter imports
scikit-learn and kubernetes, which the reference venv lacks, so RECORD_SHIM_EXTRA_SITE names the
site directory of a venv that has them ($PLANNER_PY_SITE, default
/tmp/servesim-planner-py/lib/python3.11/site-packages: searched after the reference's own, so
the reference's aisimulate is the one imported). The shim drops the Planner's scaling hook as
it drops the router's, so a planner-enabled candidate replays at its fixed shape: its draw and
resolved planner section are the reference's, its score is not compared.
"""
import json
import os
import subprocess
import sys

PREDICT = os.environ.get("AISIM_PREDICT", "/work/shared/parity/aisimulate_predict.py")
AFD_TOPOLOGY = ("n_a_nodes", "n_f_nodes", "tp_a", "a_batch_size", "f_moe_ep_size", "num_microbatches",
                "pipeline_model")
VARIANTS = {
    "recommend_afd_random": {
        "as_written": [],
        "min_gpus_seed3_one_per_round": [
            "optimization.target=min_gpus", "optimizer.seed=3", "optimizer.parallelism=1",
            "evaluation.sla={ttft_ms: 1000}", "traffic.load.concurrency=16",
        ],
        "strict_sla_ttft_40": ["optimization.strict_sla=true", "evaluation.sla={ttft_ms: 40}"],
    },
    "recommend_random_router": {
        "as_written": [],
        "kv_router_only_log_range": [
            "router={policy: kv_router, prefill_load_model: {type: none}, overlap_score_credit: {choices: [0.5, 1]}}",
            "engine.workers.aggregated.scheduler.max_sequences={range: {min: 8, max: 512, scale: log}}",
        ],
        "round_robin_only_log_range_seed7": [
            "router={policy: round_robin}", "optimizer.seed=7",
            "engine.workers.aggregated.scheduler.max_sequences={range: {min: 8, max: 512, scale: log}}",
        ],
        "kv_router_first_seed5_rounds_of_3": [
            "router.policy={choices: [kv_router, round_robin]}", "optimizer.seed=5", "optimizer.parallelism=3",
        ],
        "both_modes": [
            "engine.mode={choices: [aggregated, disaggregated]}",
            "engine.workers={aggregated: {timing: {type: default}}, prefill: {timing: {type: default}}, "
            "decode: {timing: {type: default}}}",
            "engine.kv_transfer={bandwidth_gb_per_second: 50}",
        ],
    },
    "recommend_random_planner": {
        "as_written": [],
        "log_range_seed7": [
            "optimizer.seed=7",
            "engine.workers.aggregated.scheduler.max_sequences={range: {min: 8, max: 512, scale: log}}",
        ],
        "disabled_only_log_range": [
            "planner={policy: disabled}",
            "engine.workers.aggregated.scheduler.max_sequences={range: {min: 8, max: 512, scale: log}}",
        ],
        "independent_knobs_seed3": [
            "planner={policy: enabled, scaling_policy: {preset: false}, enable_throughput_scaling: false, "
            "load_adjustment_interval_seconds: {choices: [5, 10]}, load_sensitivity: {preset: false}, "
            "load_min_observations: {choices: [3, 5]}, max_num_gpus: 8}",
            "optimizer.seed=3", "optimizer.parallelism=3",
        ],
        "router_after_planner": [
            "router={policy: {choices: [round_robin, kv_router]}, prefill_load_model: {type: none}, "
            "temperature: {choices: [0, 0.5]}}",
        ],
        # Independent knobs given as log ranges: the adapter lists every integer between the
        # bounds and the sampler weights them by value (log_discrete_choices).
        "log_range_knobs_seed3": [
            "planner={policy: enabled, scaling_policy: {preset: false}, enable_throughput_scaling: false, "
            "load_adjustment_interval_seconds: {range: {min: 2, max: 60, scale: log}}, "
            "load_sensitivity: {preset: false}, load_min_observations: {choices: [3, 5]}, "
            "load_scaling_down_sensitivity: {range: {min: 10, max: 90, scale: log}}, max_num_gpus: 32}",
            "optimizer.seed=3", "optimizer.max_trials=12",
        ],
        "disaggregated_min_workers_seed5": [
            "engine.mode=disaggregated",
            "engine.workers={prefill: {timing: {type: default}}, decode: {timing: {type: default}}}",
            "engine.kv_transfer={bandwidth_gb_per_second: 50}",
            "planner.prefill_min_workers={choices: [1, 2]}", "planner.decode_min_workers={choices: [1, 2]}",
            "optimizer.seed=5",
        ],
    },
    # A searched encoder pool (EPD): the catalog is the branch's last choice knob.
    "recommend_epd_agg": {
        "eight_trials_seed3": ["optimizer.max_trials=8", "optimizer.seed=3"],
        "six_trials_seed11_rounds_of_3": ["optimizer.max_trials=6", "optimizer.seed=11", "optimizer.parallelism=3"],
    },
    # Native VL replay (images without an encoder pool): the tower's settings are pinned on every
    # candidate, written with each one (`vision`).
    "recommend_native_vl": {
        "as_written": [],
        "tp_tower_seed5_rounds_of_3": [
            "engine.workers.aggregated.vision={encoder_parallel: tp}", "optimizer.seed=5",
            "optimizer.parallelism=3", "optimizer.max_trials=8",
        ],
        "disaggregated_prefill_hosts_seed5": [
            "engine.mode=disaggregated",
            "engine.workers={prefill: {parallelism: {preset: false, replicas: 1, tensor: {choices: [1, 2]}}, "
            "scheduler: {max_batched_tokens: {choices: [4096, 8192]}}, vision: {cache_mib: 50}}, "
            "decode: {parallelism: {preset: false, replicas: 1, tensor: {choices: [1, 2]}}}}",
            "engine.kv_transfer={bandwidth_gb_per_second: 50}", "optimizer.seed=5", "optimizer.max_trials=8",
        ],
    },
    # A native encoder pool: its catalog (tensor x servers, one batch cap) is the branch's last
    # choice knob; each candidate replays the pool event by event.
    "recommend_encoder_native": {
        "as_written": [],
        "seed5_rounds_of_3_load_searched": [
            "optimizer.seed=5", "optimizer.parallelism=3", "optimizer.max_trials=8",
            "traffic.load={type: poisson, requests_per_second: {choices: [20, 80]}, seed: 3}",
        ],
    },
    "recommend_random_loads": {
        "as_written": [],
        "request_rate_range": ["traffic.load={type: poisson, requests_per_second: {range: {min: 0.5, max: 4}}}"],
        "kv_fraction_fixed": ["traffic.load={type: kv_capacity_fraction, fraction: 0.5}"],
        "kv_fraction_choices": ["traffic.load={type: kv_capacity_fraction, fraction: {choices: [0.25, 0.5]}}"],
        "concurrency_choices_seed3": ["traffic.load.concurrency={choices: [8, 32]}", "optimizer.seed=3"],
    },
    "recommend_afd_oom": {
        "as_written": [],
        "two_per_round_batch32_seed5": [
            "optimizer.parallelism=2", "optimizer.max_trials=6", "optimizer.seed=5", "engine.afd.a_batch_size=32",
        ],
    },
}
ROUTER = ("recommend_random_router", "recommend_random_planner")
PLANNER_PY_SITE = os.environ.get("PLANNER_PY_SITE", "/tmp/servesim-planner-py/lib/python3.11/site-packages")
ROLES = (("agg", "aggregated", ""), ("prefill", "prefill", "prefill_"), ("decode", "decode", "decode_"))


def engine_candidate(c):
    config = c["config"]
    workers = {}
    for prefix, role, parallel in ROLES:
        if config.get(f"{prefix}_max_num_seqs") is None:
            continue
        workers[role] = [config.get(f"{parallel}replicas"), config.get(f"{parallel}tp"),
                         config.get(f"{prefix}_max_num_batched_tokens"), config.get(f"{prefix}_max_num_seqs"),
                         config.get(f"{prefix}_gpu_memory_utilization")]
    router = (config.get("adapters") or {}).get("dynamo.router")
    planner = (config.get("adapters") or {}).get("dynamo.planner")
    out = {
        "id": c["candidate_id"],
        "workers": workers,
        "router": router,
        "load": {k: config.get(k) for k in ("concurrency", "request_rate", "kv_load_ratio")},
        "status": c["status"],
        "reason_category": c.get("reason_category"),
        "used_gpus": c["used_gpus"],
        "score": c["score"],
        "score_compared": (router is None or router.get("policy") == "round_robin")
        and (planner is None or planner.get("policy") == "disabled"),
    }
    if planner is not None:
        out["planner"] = planner
    for prefix, role, _ in ROLES[:2]:
        if config.get(f"{prefix}_vision") is not None:
            out["vision"] = {role: config[f"{prefix}_vision"]}
    encoder = config.get("encoder")
    if encoder is not None:
        out["encoder"] = {"tensor": encoder["tp"], "replicas": encoder["workers"], "batch_size": encoder["batch_size"]}
    return out


def run(name, sets):
    cmd = [sys.executable, PREDICT, f"tests/deploy/{name}.yaml", "--command", "recommend"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ)
    if name in ROUTER:
        cmd += ["--stack", "dynamo"]
        shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "record_shim")
        dynamo = os.path.join(os.environ["DYNAMO_REF_VENV"], "lib/python3.11/site-packages")
        env["PYTHONPATH"] = f"{shim}:{dynamo}"
        env["RECORD_SHIM_ENGINE_ROUTER"] = "1"
        env["RECORD_SHIM_EXTRA_SITE"] = PLANNER_PY_SITE
    doc = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    candidates = []
    for c in doc["candidates"]:
        if "afd" not in c["config"]:
            candidates.append(engine_candidate(c))
            continue
        config = c["config"]
        candidates.append({
            "id": c["candidate_id"],
            "afd": {k: config["afd"][k] for k in AFD_TOPOLOGY},
            "traffic_load": config.get("traffic_load"),
            "status": c["status"],
            "reason_category": c.get("reason_category"),
            "reason": c.get("reason"),
            "used_gpus": c["used_gpus"],
            "score": c["score"],
        })
    return {"sets": sets, "command": " ".join(cmd), "candidates": candidates,
            "counts": {k: doc["counts"][k] for k in ("evaluated", "feasible", "failed", "infeasible")},
            "top_n": doc["views"]["top_n"]}


def main():
    name, only = sys.argv[1], sys.argv[2:]
    path = f"tests/deploy/{name}.draw.golden.json"
    kept = {}
    if only and os.path.exists(path):
        with open(path) as f:
            kept = json.load(f)["variants"]
    variants = {tag: run(name, sets) if not only or tag in only else kept[tag]
                for tag, sets in VARIANTS[name].items()}
    golden = {"_source": f"scripts/record_recommend_draw.py {name} (aisimulate 0.13, "
                         f"$AISIM_REF_VENV/bin/python {PREDICT})",
              "variants": variants}
    with open(path, "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")
    print(path)


if __name__ == "__main__":
    main()

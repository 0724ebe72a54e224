#!/usr/bin/env python3
"""Record tests/deploy/NAME.draw.golden.json: the reference's random-search draw of
tests/deploy/NAME.yaml, run once per variant (a list of --set overrides), every candidate in the
reference's record order (candidate id, AFD topology, traffic load when the candidate was built,
status, failure category and reason, GPUs, score), its counts and its ranking (views.top_n).

    $AISIM_REF_VENV/bin/python scripts/record_recommend_draw.py recommend_afd_random

runs, for each variant below,
    $AISIM_REF_VENV/bin/python /work/shared/parity/aisimulate_predict.py tests/deploy/NAME.yaml \\
        --command recommend [--set K=V ...]
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
    },
    "recommend_afd_oom": {
        "as_written": [],
        "two_per_round_batch32_seed5": [
            "optimizer.parallelism=2", "optimizer.max_trials=6", "optimizer.seed=5", "engine.afd.a_batch_size=32",
        ],
    },
}


def run(name, sets):
    cmd = [sys.executable, PREDICT, f"tests/deploy/{name}.yaml", "--command", "recommend"]
    for s in sets:
        cmd += ["--set", s]
    doc = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    candidates = []
    for c in doc["candidates"]:
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
    name = sys.argv[1]
    golden = {"_source": f"scripts/record_recommend_draw.py {name} (aisimulate 0.13, "
                         f"$AISIM_REF_VENV/bin/python {PREDICT})",
              "variants": {tag: run(name, sets) for tag, sets in VARIANTS[name].items()}}
    path = f"tests/deploy/{name}.draw.golden.json"
    with open(path, "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")
    print(path)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reduce the reference's recommend output for an `engine.mode: afd` configuration
tests/deploy/NAME.yaml into tests/deploy/NAME.golden.json: every candidate's AFD topology,
status (and why a failed one failed), GPUs, score and the summary metrics the test compares,
best score first (failed candidates last, in the reference's candidate order), plus the counts
and the reference's wall time for the whole call.

    NAME=recommend_afd_domains
    AISIM_REF_VENV=/tmp/servesim-aisim-ref $(../shared/parity/setup_aisimulate.sh) \\
        ../shared/parity/aisimulate_predict.py tests/deploy/$NAME.yaml --command recommend > /tmp/$NAME.json
    scripts/reduce_recommend_afd.py $NAME /tmp/$NAME.json
"""
import json
import sys

TOPOLOGY = ("n_a_nodes", "n_f_nodes", "tp_a", "a_batch_size", "f_moe_ep_size", "num_microbatches", "pipeline_model")
METRICS = ("completed_requests", "mean_ttft_ms", "mean_tpot_ms", "mean_e2e_latency_ms",
           "mean_output_token_throughput_per_user", "output_throughput_tok_s", "request_throughput_rps",
           "duration_ms", "gpu_hours")


def reduce(doc):
    out = []
    for c in doc["candidates"]:
        # A failed candidate has no prediction config; its searched config names the topology.
        config = c["config"]
        out.append({
            "backend": config["backend"],
            "mode": config["deployment_mode"],
            "afd": {k: config["afd"][k] for k in TOPOLOGY},
            "status": c["status"],
            "reason_category": c.get("reason_category"),
            "used_gpus": c["used_gpus"],
            "score": c["score"],
            "metrics": {k: c["metrics"][k] for k in METRICS if c.get("metrics") and k in c["metrics"]},
        })
    out.sort(key=lambda c: -(c["score"] if c["score"] is not None else float("-inf")))
    return out


def main():
    name, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        doc = json.load(f)
    golden = {
        "_source": "scripts/reduce_recommend_afd.py over the output of `AISIM_REF_VENV=/tmp/servesim-aisim-ref "
        "$(../shared/parity/setup_aisimulate.sh) ../shared/parity/aisimulate_predict.py "
        f"tests/deploy/{name}.yaml --command recommend` (engine stack, aisimulate 0.13.0.dev202610270000000085): "
        "every AFD candidate, best score first, with its topology, status, GPUs, score and summary metrics",
        "reference_call_wall_ms": round(doc["call_wall_ms"]),
        "counts": doc["counts"],
        "candidates": reduce(doc),
    }
    with open(f"tests/deploy/{name}.golden.json", "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()

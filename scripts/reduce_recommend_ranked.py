#!/usr/bin/env python3
"""Reduce the reference's recommend output for tests/deploy/NAME.yaml into
tests/deploy/NAME.golden.json: the candidate set (backend, mode, each role's parallel shape, or
for `engine.mode: afd` the AFD topology; status, why a failed candidate failed, GPUs), the
ranking by score, and per candidate the score and the summary metrics the test compares, plus
the counts and the reference's wall time for the whole call.

    NAME=recommend_deepseek
    AISIM_REF_VENV=/tmp/servesim-aisim-ref $(../shared/parity/setup_aisimulate.sh) \\
        ../shared/parity/aisimulate_predict.py tests/deploy/$NAME.yaml --command recommend > /tmp/$NAME.json
    scripts/reduce_recommend_ranked.py $NAME /tmp/$NAME.json
"""
import json
import sys

SHAPE = ("replicas", "tensor", "pipeline", "attention_data", "moe_tensor", "moe_expert")
AFD_TOPOLOGY = ("n_a_nodes", "n_f_nodes", "tp_a", "a_batch_size", "f_moe_ep_size", "num_microbatches",
                "pipeline_model")
# The summary metrics both tools write per candidate in recommendation.json (servesim keeps a
# subset of the summary there: no percentiles; `scripts/recommend_parity.py OUT.json` replays
# each candidate with `predict -c` to compare those).
METRICS = ("completed_requests", "mean_ttft_ms", "mean_tpot_ms", "mean_e2e_latency_ms",
           "mean_output_token_throughput_per_user", "output_throughput_tok_s", "request_throughput_rps",
           "duration_ms", "gpu_hours", "encoder_latency_ms", "encoder_gpus", "encoder_memory_gib")
# An EPD candidate's encoder pool as servesim's engine.workers.encoder spells it.
ENCODER = (("tensor", "tp"), ("replicas", "workers"), ("batch_size", "batch_size"))


def language_shape(config, prefix):
    """A language role's shape from the reference's candidate config (a candidate refused before
    it was built has no prediction config)."""
    keys = (("replicas", "replicas"), ("tensor", "tp"), ("pipeline", "pp"), ("attention_data", "attention_dp"),
            ("moe_tensor", "moe_tp"), ("moe_expert", "moe_ep"))
    return {k: config[prefix + v] for k, v in keys}


def reduce(doc):
    out = []
    # The reference's ranking (its ties broken by GPUs, then its candidate configs).
    top_n = doc.get("views", {}).get("top_n") or []
    for c in doc["candidates"]:
        if c.get("config", {}).get("deployment_mode") == "afd":
            # A failed AFD candidate has no prediction config; its searched config names it.
            config = c["config"]
            entry = {"backend": config["backend"], "mode": "afd",
                     "afd": {k: config["afd"][k] for k in AFD_TOPOLOGY},
                     "reason_category": c.get("reason_category")}
        elif "encoder_candidate" in c.get("config", {}):
            config = c["config"]
            if c["prediction_config"] is not None:
                engine = c["prediction_config"]["engine"]
                workers = {role: {k: w["parallelism"][k] for k in SHAPE}
                           for role, w in engine["workers"].items() if role != "encoder"}
            elif config["deployment_mode"] == "agg":
                workers = {"aggregated": language_shape(config, "")}
            else:
                workers = {role: language_shape(config, f"{role}_") for role in ("prefill", "decode")}
            entry = {"backend": config["backend"],
                     "mode": "aggregated" if config["deployment_mode"] == "agg" else "disaggregated",
                     "workers": workers,
                     "encoder": {k: config["encoder"][v] for k, v in ENCODER},
                     "reason_category": c.get("reason_category")}
        else:
            engine = c["prediction_config"]["engine"]
            entry = {"backend": engine["backend"], "mode": engine["mode"],
                     "workers": {role: {k: w["parallelism"][k] for k in SHAPE}
                                 for role, w in engine["workers"].items()}}
        entry.update({
            "rank": top_n.index(c["candidate_id"]) + 1 if c["candidate_id"] in top_n else None,
            "status": c["status"],
            "used_gpus": c["used_gpus"],
            "score": c["score"],
            "metrics": {k: c["metrics"][k] for k in METRICS if c.get("metrics") and k in c["metrics"]},
        })
        out.append(entry)
    # Best first; the reference's own tie order (candidate id) breaks ties.
    out.sort(key=lambda c: -(c["score"] if c["score"] is not None else float("-inf")))
    return out


def main():
    name, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        doc = json.load(f)
    golden = {
        "_source": "scripts/reduce_recommend_ranked.py over the output of `AISIM_REF_VENV=/tmp/servesim-aisim-ref "
        "$(../shared/parity/setup_aisimulate.sh) ../shared/parity/aisimulate_predict.py "
        f"tests/deploy/{name}.yaml --command recommend` (engine stack, aisimulate 0.13.0.dev202610270000000085): "
        "every candidate, best score first, with its shape, status, GPUs, score and summary metrics",
        "reference_call_wall_ms": round(doc["call_wall_ms"]),
        "counts": doc["counts"],
        "candidates": reduce(doc),
    }
    with open(f"tests/deploy/{name}.golden.json", "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()

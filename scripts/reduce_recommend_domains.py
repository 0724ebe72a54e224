#!/usr/bin/env python3
"""Reduce the reference's recommend outputs for the searched-domain examples (loads, KV-relative
loads, KV cache knobs) into tests/deploy/recommend_domains.golden.json: per example, each
candidate's status, score, GPUs, the concurrency it ran, and each worker role's parallel shape,
block size and memory fraction.

    for n in recommend_kv_fraction recommend_kv_fraction_disagg recommend_load_choices recommend_kv_domains; do
        $(../shared/parity/setup_aisimulate.sh) ../shared/parity/aisimulate_predict.py \\
            --command recommend tests/deploy/$n.yaml > /tmp/$n.json
    done
    scripts/reduce_recommend_domains.py recommend_kv_fraction=/tmp/recommend_kv_fraction.json ...
"""
import json
import sys


def reduce(doc):
    out = []
    for c in doc["candidates"]:
        pc = c["prediction_config"]
        shapes = {
            role: {
                **{k: w["parallelism"][k] for k in ("replicas", "tensor", "attention_data")},
                "block_size": w.get("kv_cache", {}).get("block_size"),
                "memory_fraction": w.get("kv_cache", {}).get("capacity", {}).get("memory_fraction"),
            }
            for role, w in pc["engine"]["workers"].items()
        }
        out.append({
            "candidate_id": c["candidate_id"],
            "status": c["status"],
            "score": c["score"],
            "used_gpus": c["used_gpus"],
            "concurrency": pc["traffic"]["load"]["concurrency"],
            "kv_load_ratio": c["config"].get("kv_load_ratio"),
            "shapes": shapes,
        })
    return out


def main():
    examples = {}
    for arg in sys.argv[1:]:
        name, path = arg.split("=", 1)
        with open(path) as f:
            examples[name] = reduce(json.load(f))
    golden = {
        "_source": "scripts/reduce_recommend_domains.py over the reference's recommend output for each "
        "tests/deploy/NAME.yaml (the command is in each YAML's header)",
        "examples": examples,
    }
    with open("tests/deploy/recommend_domains.golden.json", "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()

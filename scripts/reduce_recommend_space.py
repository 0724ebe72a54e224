#!/usr/bin/env python3
"""Add (or replace) one search in tests/deploy/recommend_space.golden.json from the reference's
recommend output for tests/deploy/NAME.yaml: every candidate as its mode, backend, per-role
parallelism (all six knobs, from prediction_config), status, used GPUs and score, sorted, and the
reference's counts.

    NAME=recommend_moe_domains
    AISIM_REF_VENV=/tmp/servesim-aisim-ref $(../shared/parity/setup_aisimulate.sh) \\
        ../shared/parity/aisimulate_predict.py tests/deploy/$NAME.yaml --command recommend > /tmp/$NAME.json
    scripts/reduce_recommend_space.py $NAME /tmp/$NAME.json
"""
import json
import sys

GOLDEN = "tests/deploy/recommend_space.golden.json"
SHAPE = ("attention_data", "moe_expert", "moe_tensor", "pipeline", "replicas", "tensor")


def reduce(doc):
    out = []
    for c in doc["candidates"]:
        engine = c["prediction_config"]["engine"]
        out.append({
            "backend": engine["backend"],
            "mode": engine["mode"],
            "score": c["score"],
            "status": c["status"],
            "used_gpus": c["used_gpus"],
            "workers": {
                role: {k: w["parallelism"].get(k, 1) for k in SHAPE}
                for role, w in sorted(engine["workers"].items())
            },
        })
    out.sort(key=lambda c: json.dumps(c, sort_keys=True))
    return {"candidates": out, "counts": doc["counts"]}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    name, path = sys.argv[1:]
    with open(GOLDEN) as f:
        golden = json.load(f)
    with open(path) as f:
        golden["searches"][name] = reduce(json.load(f))
    with open(GOLDEN, "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()

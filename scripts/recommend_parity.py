#!/usr/bin/env python3
"""Replays every candidate of the reference's recommend examples with `servesim predict -c`.

  SERVESIM_AIS_SYSTEMS=.../aisimulate_core/systems scripts/recommend_parity.py [--binary B] [EXPECTED.json ...]

For each ../shared/parity/aisimulate-examples/recommend_*.expected.json (or each file named, the
stdout of ../shared/parity/aisimulate_predict.py for a recommend config; relative trace paths are
read from that file's directory), each candidate's
`prediction_config` (the configuration the reference says it evaluated; systems_paths dropped,
trace paths made absolute) runs through servesim. Printed per example: each candidate's largest
deviation among TTFT/ITL/E2E means and p90s, output throughput and GPU-hours, and the order of
the candidates by the reference's score beside the order by servesim's value of the same
target. The router example's kv_router candidates sample workers at temperature 1 in the
reference: expect noise there.
"""
import argparse, atexit, glob, json, os, shutil, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "..", "shared", "parity", "aisimulate-examples")
COMPARED = ["mean_ttft_ms", "p90_ttft_ms", "mean_itl_ms", "p90_itl_ms", "mean_e2e_latency_ms",
            "p90_e2e_latency_ms", "output_throughput_tok_s", "gpu_hours"]
# The targets of the examples, as servesim's summary spells their numerators.
TARGETS = {"throughput_per_gpu": "output_throughput_tok_s", "goodput_per_gpu": "goodput_output_throughput_tok_s"}


def without_systems_paths(o):
    if isinstance(o, dict):
        return {k: without_systems_paths(v) for k, v in o.items() if k != "systems_paths"}
    if isinstance(o, list):
        return [without_systems_paths(v) for v in o]
    return o


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "servesim"))
    a.add_argument("expected", nargs="*", help="recommend outputs of the reference (default: the examples)")
    args = a.parse_args()
    tmp = tempfile.mkdtemp(prefix="servesim-recommend-parity-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    for path in args.expected or sorted(glob.glob(os.path.join(EXAMPLES, "recommend_*.expected.json"))):
        name = os.path.basename(path)[: -len(".expected.json")]
        doc = json.load(open(path))
        worst, ours, refs = [], [], []
        for c in doc["candidates"]:
            config = without_systems_paths(c["prediction_config"])
            source = config["traffic"]["source"]
            if source.get("paths"):
                source["paths"] = [os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), p)) for p in source["paths"]]
            cfg = os.path.join(tmp, "candidate.yaml")
            json.dump(config, open(cfg, "w"))  # JSON is YAML
            out = os.path.join(tmp, "out")
            run = subprocess.run([args.binary, "predict", "-c", cfg, "--output-dir", out, "--overwrite",
                                  "--format", "json"], capture_output=True, text=True)
            if run.returncode:
                sys.exit(f"{name} {c['candidate_id']}: {run.stderr.strip()}")
            got = json.load(open(os.path.join(out, "prediction.json")))
            got = got.get("summary", got)
            m = c["metrics"]
            dev = max(((abs(got[k] - m[k]) / abs(m[k]), k) for k in COMPARED if m.get(k)), default=(0.0, "-"))
            worst.append(f"{c['candidate_id'][-2:]}: {100 * dev[0]:.3f} % {dev[1]}")
            target = c["provenance"]["objective"]["target"]
            ours.append(got[TARGETS[target]] / c["used_gpus"])
            refs.append(c["score"])
        order = lambda v: [i + 1 for i in sorted(range(len(v)), key=lambda i: -v[i])]
        print(f"{name}: {len(doc['candidates'])} candidates; largest deviation each: " + ", ".join(worst))
        print(f"  order by score: reference {order(refs)}, servesim {order(ours)}")


if __name__ == "__main__":
    main()

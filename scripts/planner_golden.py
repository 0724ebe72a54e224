#!/usr/bin/env python3
"""Record a planner golden (tests/planner/NAME.golden.json) from the reference.

Usage, from the checkout root:
  python3 scripts/planner_golden.py tests/planner/NAME.yaml [--runs 3] [--check]

Runs `aisimulate predict --stack dynamo` (the reference: aisimulate 0.13.0.dev202610130000000070 +
ai-dynamo 1.6.1, through ../shared/parity/aisimulate_predict.py in the venv that
`../shared/parity/setup_aisimulate.sh --with-dynamo` prints) `--runs` times on the config, requires
every run to give the same scaling events and tick count (the reference is not always
reproducible: its fitted model keeps samples in hash-map order), and writes NAME.golden.json
beside the config: the summary keys below, the scaling events and the tick count of the first
run, plus the number of identical runs. With --check it only prints the runs' events and whether
they agree. Needs AIS data and ../shared/traces (the configs point there).
"""
import argparse
import json
import os
import subprocess
import sys

SUMMARY_KEYS = [
    "completed_requests",
    "num_requests",
    "duration_ms",
    "gpu_hours",
    "prefill_worker_seconds",
    "decode_worker_seconds",
    "mean_ttft_ms",
    "p90_ttft_ms",
    "mean_itl_ms",
    "mean_e2e_latency_ms",
    "p90_e2e_latency_ms",
    "output_throughput_tok_s",
]
EVENT_KEYS = ["at_s", "component", "from_count", "reason", "to_count"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="compare the runs, write nothing")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shared = os.path.join(os.path.dirname(root), "shared", "parity")
    python = subprocess.run(
        [os.path.join(shared, "setup_aisimulate.sh"), "--with-dynamo"], check=True, capture_output=True, text=True
    ).stdout.strip()
    config = os.path.abspath(args.config)
    runs = []
    for i in range(args.runs):
        out = subprocess.run(
            [python, os.path.join(shared, "aisimulate_predict.py"), config, "--stack", "dynamo"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(config),
        )
        if out.returncode != 0:
            sys.stderr.write(out.stderr)
            sys.exit(f"reference run {i + 1} failed")
        report = json.loads(out.stdout)
        events = [{k: e[k] for k in EVENT_KEYS} for e in report["planner"]["scaling_events"]]
        runs.append((report, events, report["planner"]["total_ticks"]))
        print(f"run {i + 1}: {len(events)} scaling events, {runs[-1][2]} ticks", file=sys.stderr)
    same = all(r[1] == runs[0][1] and r[2] == runs[0][2] for r in runs)
    if args.check or not same:
        for i, (_, events, _) in enumerate(runs):
            print(f"run {i + 1}: " + ", ".join(f"{e['at_s']:g} {e['component']} {e['from_count']}->{e['to_count']}" for e in events))
        if not same:
            sys.exit("the reference's runs disagree: no golden written")
        return
    report, events, ticks = runs[0]
    name = os.path.basename(config)
    golden = {
        "_source": (
            f"made by `python3 scripts/planner_golden.py tests/planner/{name} --runs {args.runs}` "
            "(aisimulate 0.13.0.dev202610130000000070 + ai-dynamo 1.6.1 through "
            "../shared/parity/aisimulate_predict.py --stack dynamo); "
            f"{args.runs} of {args.runs} runs gave these scaling events and tick count; "
            "reduced to the summary keys below, the scaling events and the tick count"
        ),
        "summary": {k: report["summary"][k] for k in SUMMARY_KEYS},
        "planner": {"total_ticks": ticks, "scaling_events": events},
    }
    path = config[: -len(".yaml")] + ".golden.json"
    with open(path, "w") as f:
        json.dump(golden, f, indent=1, sort_keys=False)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()

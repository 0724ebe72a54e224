#!/usr/bin/env python3
"""Trace-format parity: servesim vs the reference (Dynamo 1.6.1) on parity cases, every metric.

  scripts/trace_parity.py tests/parity/t_*.json          # the trace-format goldens' cases
  scripts/trace_parity.py CASE.json --tolerance 0.01

For each case both run with per-request records. A case passes when completed_requests are
equal, every numeric summary key both report (wall-clock keys aside) is within the tolerance
(default 1 %), the agentic graph identity (digest, counts, source models) and play statuses are
equal, and — for agentic formats — every request's arrival time equals the reference's (to 1e-6
ms). Prints one row per case: completed, the worst metric and its deviation.
"""
import argparse, atexit, json, os, shutil, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402

# Pass times are whole nanoseconds in both simulators; a few nanoseconds of difference in when a
# source request completed carry over into its dependents' arrivals.
ARRIVAL_TOLERANCE_MS = 1e-4
SKIP = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s", "call_wall_ms"}


def run_both(case, binary):
    tmp = tempfile.mkdtemp(prefix="servesim-trace-parity-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    ref_pr = os.path.join(tmp, "ref.json")
    py = subprocess.run([os.path.join(parity.SHARED, "parity", "setup.sh")], check=True, capture_output=True,
                        text=True).stdout.strip()
    case_file = os.path.join(tmp, "case.json")
    json.dump(case, open(case_file, "w"))
    out = subprocess.run([py, os.path.join(parity.ROOT, "scripts", "reference_replay.py"), case_file,
                          "--per-request", ref_pr], check=True, capture_output=True, text=True).stdout
    ref = json.loads(out)
    ref_records = json.load(open(ref_pr))
    ours_pr = os.path.join(tmp, "ours.jsonl")
    out = subprocess.run([binary] + parity.servesim_args(case) + ["--report-jsonl", ours_pr], check=True,
                         capture_output=True, text=True).stdout
    ours = json.loads(out)
    ours_records = [json.loads(l) for l in open(ours_pr) if l.strip()]
    return ours, ref, ours_records, ref_records


def compare(case, ours, ref, ours_records, ref_records, tolerance):
    problems = []
    if ours.get("completed_requests") != ref.get("completed_requests"):
        problems.append(f"completed {ours.get('completed_requests')} vs {ref.get('completed_requests')}")
    worst = ("-", 0.0)
    for key, b in ref.items():
        a = ours.get(key)
        if key in SKIP or isinstance(b, bool) or not isinstance(b, (int, float)) or not isinstance(a, (int, float)):
            continue
        dev = abs(a - b) / abs(b) if b else abs(a - b)
        if dev > worst[1]:
            worst = (key, dev)
        if dev > tolerance:
            problems.append(f"{key}: {a} vs {b} ({dev * 100:.3f}%)")
    if "agentic_graph" in ref:
        g, h = ours.get("agentic_graph", {}), ref["agentic_graph"]
        for k in ["graph_digest", "node_count", "play_count", "source_models", "block_size", "source"]:
            if g.get(k) != h.get(k):
                problems.append(f"agentic_graph.{k}: {g.get(k)} vs {h.get(k)}")
        a = [(p["play_id"], p["status"]) for p in ours.get("agentic_play_outcomes", [])]
        b = [(p["play_id"], p["status"]) for p in ref.get("agentic_play_outcomes", [])]
        if a != b:
            problems.append(f"play outcomes {a} vs {b}")
        if ours.get("agentic_model_projection") != ref.get("agentic_model_projection"):
            problems.append("agentic_model_projection differs")
        if ours.get("agentic_lifecycle_digest") != ref.get("agentic_lifecycle_digest"):
            # Informational: the transcript hashes every event's time, so a nanosecond apart
            # changes it.
            print(f"    (lifecycle digest differs: {ours.get('agentic_lifecycle_event_count')} vs "
                  f"{ref.get('agentic_lifecycle_event_count')} events)")
        arrivals = {r["request_id"]: r["arrival_time_ms"] for r in ours_records}
        missing = [r["request_id"] for r in ref_records if arrivals.get(r["request_id"]) is None]
        gaps = [abs(arrivals[r["request_id"]] - r["arrival_time_ms"]) for r in ref_records
                if arrivals.get(r["request_id"]) is not None]
        worst_gap = max(gaps, default=0.0)
        if missing or worst_gap > ARRIVAL_TOLERANCE_MS:
            problems.append(f"arrival times: {len(missing)} missing, largest difference {worst_gap} ms")
    return problems, worst


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="+")
    p.add_argument("--tolerance", type=float, default=0.01)
    p.add_argument("--binary", default=os.path.join(parity.ROOT, "target", "release", "servesim"))
    a = p.parse_args()
    failed = 0
    print(f"{'case':44} {'completed':>9}  {'worst metric':36} {'deviation':>9}  result")
    for path in a.cases:
        if path.endswith(".golden.json"):
            continue
        case = parity.resolve(path)
        try:
            ours, ref, orec, rrec = run_both(case, a.binary)
        except subprocess.CalledProcessError as e:
            failed += 1
            print(f"{os.path.basename(path):44} FAILED: {e.stderr.strip()[-300:]}")
            continue
        problems, worst = compare(case, ours, ref, orec, rrec, a.tolerance)
        failed += bool(problems)
        print(f"{os.path.basename(path):44} {ours.get('completed_requests'):>9}  {worst[0]:36} "
              f"{worst[1] * 100:>8.1e}%  {'ok' if not problems else 'DIFF'}")
        for pr in problems[:6]:
            print("    ", pr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Check that two servesim binaries produce the same reports: for a behaviour-preserving change.

  scripts/same_reports.py BEFORE AFTER                 # every parity case and benchmark
  scripts/same_reports.py BEFORE AFTER tests/parity/m_*.json

Every case (a parity case file, see scripts/parity.py; `"repeat": N` is expanded as
scripts/bench.py does) runs through both binaries with `servesim predict`, writing the summary
(`--report-json`) and the per-request records (`--report-jsonl`). The summaries must be equal
but for the wall-clock fields; the per-request records must be byte-identical. Prints one line
per case and exits 1 if any case differs.
"""
import argparse, glob, json, os, shutil, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import parity  # noqa: E402

ROOT = parity.ROOT
# Fields that measure the machine, not the simulation.
WALL_CLOCK = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}


def default_cases():
    cases = [c for c in sorted(glob.glob(os.path.join(ROOT, "tests", "parity", "*.json")))
             if not c.endswith(".golden.json")]
    return cases + sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.json")))


def strip_wall_clock(value):
    if isinstance(value, dict):
        return {k: strip_wall_clock(v) for k, v in value.items() if k not in WALL_CLOCK}
    if isinstance(value, list):
        return [strip_wall_clock(v) for v in value]
    return value


def run(binary, case, out_dir):
    summary, records = os.path.join(out_dir, "summary.json"), os.path.join(out_dir, "requests.jsonl")
    argv = [binary] + parity.servesim_args(case) + ["--report-json", summary, "--report-jsonl", records]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"status": proc.returncode, "stderr": proc.stderr.strip()}, None
    with open(summary) as f:
        report = strip_wall_clock(json.load(f))
    with open(records, "rb") as f:
        return report, f.read()


def first_difference(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'after' if k in b else 'before'}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if a != b:
        return f"{path or 'value'}: {a!r} != {b!r}"
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("cases", nargs="*")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="servesim-same-")
    failed = 0
    cases = a.cases or default_cases()
    for c in cases:
        case = parity.resolve(c)
        if case.get("repeat", 1) > 1:
            case["trace"] = bench.repeated_trace(case["trace"], case["repeat"], tmp)
        case.pop("repeat", None)
        results = []
        for side, binary in (("before", a.before), ("after", a.after)):
            out_dir = os.path.join(tmp, side)
            os.makedirs(out_dir, exist_ok=True)
            results.append(run(binary, case, out_dir))
        (rep_a, rec_a), (rep_b, rec_b) = results
        diff = first_difference(rep_a, rep_b)
        if diff is None and rec_a != rec_b:
            lines_a, lines_b = rec_a.splitlines(), rec_b.splitlines()
            at = next((i for i, (x, y) in enumerate(zip(lines_a, lines_b)) if x != y), min(len(lines_a), len(lines_b)))
            diff = f"per-request records differ from line {at + 1}"
        name = os.path.relpath(c, ROOT)
        if diff:
            failed += 1
            print(f"DIFFERENT {name}: {diff}")
        else:
            requests = rec_a.count(b"\n") if rec_a is not None else 0
            status = "same" if rec_a is not None else f"same failure (status {rep_a['status']})"
            print(f"{status:10} {name} ({requests} request records)")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(cases) - failed} of {len(cases)} cases identical")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

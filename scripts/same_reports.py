#!/usr/bin/env python3
"""Check that two servesim binaries produce the same reports: for a behaviour-preserving change.

  scripts/same_reports.py BEFORE AFTER                 # every parity case and benchmark
  scripts/same_reports.py BEFORE AFTER tests/parity/m_*.json

Every case (a parity case file, see scripts/parity.py; `"repeat": N` is expanded as
scripts/bench.py does) runs through both binaries with `servesim predict`, writing the summary
(`--report-json`) and the per-request records (`--report-jsonl`). The summaries must be equal
but for the wall-clock fields; the per-request records must be byte-identical. With
`--reports jsonl` (or `csv`) each run also writes `--telemetry` in that format and
`--report-html`, and both must be byte-identical too (the two binaries write to the same paths,
one after the other, since the page shows the command line). Prints one line per case and exits
1 if any case differs.

  scripts/same_reports.py --reports jsonl BEFORE AFTER benchmarks/*.json

A case may also be a deployment YAML (`predict -c` / `recommend -c`; a file with an
`optimization` or `optimizer` section is a recommend search). A predict configuration runs with
`--no-wall-clock --capture-per-request`: its `prediction.json` and `requests.jsonl` must be
byte-identical. A search runs with `--no-cache --format json`: every file it writes
(`recommendation.json`, `recommendation.csv`, `recommendations/*.yaml`) must be byte-identical.

  scripts/same_reports.py BEFORE AFTER tests/deploy/*.yaml benchmarks/*.yaml
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


def is_search(path):
    """Whether a deployment YAML is a recommend search (it has its own top-level sections)."""
    with open(path) as f:
        return any(line.startswith(("optimization:", "optimizer:")) for line in f)


def run_config(binary, path, out_dir, reports=None):
    """`predict -c` / `recommend -c` of a deployment YAML: (the summary, the bytes of every
    file written, by name)."""
    out = os.path.join(out_dir, "deploy")
    if is_search(path):
        argv = [binary, "recommend", "-c", path, "--no-cache", "--format", "json"]
    else:
        argv = [binary, "predict", "-c", path, "--no-wall-clock", "--capture-per-request", "--format", "json"]
    argv += ["--output-dir", out, "--overwrite"]
    extra = []
    if reports and not is_search(path):
        extra = [os.path.join(out_dir, f"telemetry.{reports}"), os.path.join(out_dir, "report.html")]
        argv += ["--telemetry", extra[0], "--report-html", extra[1]]
    for f in extra:
        if os.path.exists(f):
            os.remove(f)
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"status": proc.returncode, "stderr": proc.stderr.strip()}, None
    report = strip_wall_clock(json.loads(proc.stdout))
    files = {}
    for root, _, names in os.walk(out):
        for n in names:
            full = os.path.join(root, n)
            with open(full, "rb") as f:
                files[os.path.relpath(full, out)] = f.read()
    for f in extra:
        with open(f, "rb") as fh:
            files[os.path.basename(f)] = fh.read()
    return report, dict(sorted(files.items()))


def run(binary, case, out_dir, reports=None):
    """The summary without wall-clock fields, and the bytes of the other reports (the
    per-request records, then the telemetry file and the HTML page if `reports` names a
    telemetry format)."""
    summary, records = os.path.join(out_dir, "summary.json"), os.path.join(out_dir, "requests.jsonl")
    argv = [binary] + parity.servesim_args(case) + ["--report-json", summary, "--report-jsonl", records]
    files = [records]
    if reports:
        files += [os.path.join(out_dir, f"telemetry.{reports}"), os.path.join(out_dir, "report.html")]
        argv += ["--telemetry", files[1], "--report-html", files[2]]
    for f in [summary] + files:
        if os.path.exists(f):
            os.remove(f)
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"status": proc.returncode, "stderr": proc.stderr.strip()}, None
    with open(summary) as f:
        report = strip_wall_clock(json.load(f))
    out = []
    for path in files:
        with open(path, "rb") as f:
            out.append(f.read())
    return report, out


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


def compare_config(a, path, tmp):
    """Runs a deployment YAML through both binaries; prints its line and returns 1 if they differ."""
    out_dir = os.path.join(tmp, "out")
    os.makedirs(out_dir, exist_ok=True)
    (rep_a, files_a), (rep_b, files_b) = [run_config(b, os.path.abspath(path), out_dir, a.reports)
                                          for b in (a.before, a.after)]
    name = os.path.relpath(os.path.abspath(path), ROOT)
    diff = first_difference(rep_a, rep_b)
    if diff is None and files_a is not None:
        if list(files_a) != list(files_b):
            diff = f"written files differ: {sorted(set(files_a) ^ set(files_b))}"
        else:
            diff = next((f"{n} differs" for n in files_a if files_a[n] != files_b[n]), None)
    if diff:
        print(f"DIFFERENT {name}: {diff}")
        return 1
    if files_a is None:
        print(f"{'same failure (status ' + str(rep_a['status']) + ')':10} {name}")
    else:
        records = files_a.get("requests.jsonl", b"").count(b"\n")
        total = sum(len(v) for v in files_a.values())
        print(f"{'same':10} {name} ({len(files_a)} files, {total} bytes, {records} request records)")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("cases", nargs="*")
    p.add_argument("--reports", choices=["jsonl", "csv"],
                   help="also compare the telemetry file (in this format) and the HTML report")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="servesim-same-")
    failed = 0
    cases = a.cases or default_cases()
    for c in cases:
        if c.endswith((".yaml", ".yml")):
            failed += compare_config(a, c, tmp)
            continue
        case = parity.resolve(c)
        if case.get("repeat", 1) > 1:
            case["trace"] = bench.repeated_trace(case["trace"], case["repeat"], tmp)
        case.pop("repeat", None)
        results = []
        out_dir = os.path.join(tmp, "out")
        os.makedirs(out_dir, exist_ok=True)
        for binary in (a.before, a.after):
            results.append(run(binary, case, out_dir, a.reports))
        (rep_a, files_a), (rep_b, files_b) = results
        diff = first_difference(rep_a, rep_b)
        names = ["per-request records", "telemetry", "HTML report"]
        for name_, x, y in zip(names, files_a or [], files_b or []):
            if diff is None and x != y:
                lines_a, lines_b = x.splitlines(), y.splitlines()
                at = next((i for i, (u, v) in enumerate(zip(lines_a, lines_b)) if u != v),
                          min(len(lines_a), len(lines_b)))
                diff = f"{name_} differ from line {at + 1}"
        rec_a = files_a[0] if files_a else None
        name = os.path.relpath(c, ROOT)
        if diff:
            failed += 1
            print(f"DIFFERENT {name}: {diff}")
        else:
            requests = rec_a.count(b"\n") if rec_a is not None else 0
            status = "same" if rec_a is not None else f"same failure (status {rep_a['status']})"
            extra = f", {len(files_a[1])} telemetry bytes, {len(files_a[2])} HTML bytes" if a.reports and files_a else ""
            print(f"{status:10} {name} ({requests} request records{extra})")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(cases) - failed} of {len(cases)} cases identical")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Re-runs the reproduction commands of the 2026-12 reliability audit
(../shared/reference/defects-2026-12.md) against the release binary and prints, for each, the
exit code, the wall time, the peak RSS (from wait4's ru_maxrss) and the first line of stderr,
plus what was checked afterwards (files left, bytes kept).

    cargo build --release -p servesim
    python3 scripts/audit_repro.py              # every case
    python3 scripts/audit_repro.py N1 N8        # some of them

Every case runs in a fresh scratch directory under $TMPDIR, is bounded by a timeout and an
address-space limit (8 GiB), and leaves nothing behind. The `serve` cases (N4, D6, D21, N24,
N25) are measured by scripts/serve_memory.py.
"""

import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = os.environ.get("SERVESIM", str(ROOT / "target/release/servesim"))
CONV = ROOT / "examples/conversation.jsonl"
GRID = ROOT / "tests/deploy/recommend_grid_fixed.yaml"
LIMIT = 8 << 30

TRACE = "".join(
    json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": [h]}) + "\n"
    for t, n, o, h in [(0, 100, 5, 1), (0, 200, 3, 2), (15, 50, 4, 1)]
)
CONFIG = """traffic:
  source: {type: trace, format: mooncake, paths: [trace.jsonl]}
  load: {type: trace_timestamps}
engine:
  model: Qwen/Qwen3-32B
  hardware: h200_sxm
  context_length: 4096
  workers:
    aggregated:
      kv_cache: {capacity: {type: fixed, blocks: 1000}}
      timing: {type: fixed, prefill_ms: 10, decode_ms: 5}
"""
SEARCH = CONFIG.replace("engine:\n", "engine:\n  mode: aggregated\n  backend: vllm\n").replace(
    "      kv_cache:",
    "      parallelism: {preset: false, replicas: {choices: [1, 2]}, tensor: 1}\n"
    "      scheduler: {max_batched_tokens: 8192, max_sequences: {choices: [16, 32]}}\n      kv_cache:",
) + "optimization: {target: throughput_per_gpu}\noptimizer: {algorithm: grid}\n"


def limit():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def run(args, cwd, timeout=120, stdin=None):
    """Runs servesim; returns (rc, seconds, peak MB of that process, first stderr line)."""
    started = time.time()
    err_path = Path(cwd) / ".stderr"
    with open(err_path, "wb") as err:
        p = subprocess.Popen([BIN, *args], cwd=cwd, stdin=stdin, stdout=subprocess.DEVNULL, stderr=err,
                             preexec_fn=limit)
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.time() > deadline:
                p.kill()
                pid, status, usage = os.wait4(p.pid, 0)
                break
            time.sleep(0.02)
    p.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.time() - started
    lines = err_path.read_bytes().decode(errors="replace").strip().splitlines()
    err_path.unlink()
    return p.returncode, seconds, usage.ru_maxrss / 1024, (lines[0] if lines else "")[:160]


def project(d, text=CONFIG):
    (d / "trace.jsonl").write_text(TRACE)
    (d / "cfg.yaml").write_text(text)
    return d / "cfg.yaml"


def ls(d):
    return sorted(p.name for p in Path(d).iterdir())


CASES = {}


def case(name):
    def wrap(f):
        CASES[name] = f
        return f
    return wrap


@case("N1")
def n1(d):
    cfg = project(d)
    (d / "NOTES.txt").write_text("notes")
    r = run(["predict", "-c", str(cfg), "--output-dir", str(d), "--overwrite"], d)
    return r, f"left: {ls(d)}"


@case("N2")
def n2(d):
    cfg = project(d)
    r = run(["predict", "-c", str(cfg), "--output-dir", "o", "--report-html", "trace.jsonl"], d)
    return r, f"trace intact: {(d / 'trace.jsonl').read_text() == TRACE}"


@case("N3")
def n3(d):
    cfg = project(d)
    (d / "out").mkdir()
    r = run(["predict", "-c", str(cfg), "--output-dir", "out", "--overwrite", "--report-html", "out/report.html",
             "--telemetry", "out/tel.csv"], d)
    return r, f"out: {ls(d / 'out')}"


@case("N7")
def n7(d):
    r = run(["predict", "-c", str(GRID), "--set", "optimization=null", "--set", "optimizer=null",
             "--set", "engine.workers.aggregated.parallelism={replicas: 10000000}", "--output-dir", "o"], d)
    return r, ""


@case("N8")
def n8(d):
    r = run(["recommend", "-c", str(GRID), "--set",
             "engine.workers.aggregated.parallelism.replicas={range: {min: 1, max: 100000, step: 1}}",
             "--no-cache", "--output-dir", "o"], d, timeout=600)
    size = (d / "o/recommendation.json").stat().st_size if (d / "o/recommendation.json").exists() else 0
    return r, f"recommendation.json {size / 1e6:.1f} MB"


@case("N9")
def n9(d):
    cfg = project(d, SEARCH)
    run(["recommend", "-c", str(cfg), "--shard", "0/2", "--output-dir", "sh"], d)
    (d / "trace.jsonl").write_text(TRACE.replace('"output_length": 5', '"output_length": 25'))
    run(["recommend", "-c", str(cfg), "--shard", "1/2", "--output-dir", "sh"], d)
    return run(["recommend", "merge", "sh", "--output-dir", "m"], d), ""


@case("N10")
def n10(d):
    corpus = d / "corpus"
    corpus.mkdir()
    shutil.copy(ROOT / "tests/parity/gen/weka.jsonl", corpus / "a.jsonl")
    os.symlink(".", corpus / "a")
    os.symlink(".", corpus / "b")
    cfg = project(d, SEARCH.replace("{type: trace, format: mooncake, paths: [trace.jsonl]}",
                                    "{type: trace, format: weka, paths: [corpus]}"))
    return run(["recommend", "-c", str(cfg), "--output-dir", "o"], d, timeout=60), ""


@case("N11")
def n11(d):
    cfg = project(d, SEARCH)
    run(["recommend", "-c", str(cfg), "--output-dir", "o"], d)
    for p in (d / "o/cache").glob("*/*.json"):
        v = json.loads(p.read_text())
        v["summary"]["output_throughput_tok_s"] = {"f64": (5e6).hex()}
        p.write_text(json.dumps(v))
    r = run(["recommend", "-c", str(cfg), "--output-dir", "o", "--overwrite"], d)
    doc = json.loads((d / "o/recommendation.json").read_text())
    return r, f"cache_hits {doc['counts']['cache_hits']}"


@case("N13")
def n13(d):
    p = subprocess.Popen([BIN, "predict", "--input-tokens", "1000", "--output-tokens", "1000", "--request-count",
                          "2000000", "--request-rate", "1000", "--max-queued", "100000000", "--report-jsonl", "r.jsonl",
                          "--telemetry", "t.csv"], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)
    hidden = [n for n in ls(d) if n.startswith(".")]
    p.send_signal(2)
    rc = p.wait()
    return (rc, 3.0, 0, ""), f"temporary files before SIGINT {hidden}, after {ls(d)}"


@case("N19")
def n19(d):
    cfg = project(d)
    (d / "results").write_text("a file")
    r = run(["predict", "-c", str(cfg), "--output-dir", "results", "--overwrite"], d)
    return r, f"file intact: {(d / 'results').read_text() == 'a file'}"


@case("N22")
def n22(d):
    cfg = project(d)
    for o in "ab":
        run(["predict", "-c", str(cfg), "--output-dir", o, "--no-wall-clock"], d)
    same = (d / "a/prediction.json").read_bytes() == (d / "b/prediction.json").read_bytes()
    return (0 if same else 1, 0, 0, ""), f"byte-identical: {same}"


@case("N23")
def n23(d):
    return n10(d)


@case("N5")
def n5(d):
    # 64 MiB of spaces in 64 KB of gzip, then one row: the line cap stops it.
    with gzip.open(d / "bomb.jsonl.gz", "wb", compresslevel=9) as f:
        chunk = b" " * (1 << 20)
        for _ in range(1 << 10):
            f.write(chunk)
        f.write(TRACE.encode())
    return run(["predict", "bomb.jsonl.gz"], d, timeout=120), f"file {(d / 'bomb.jsonl.gz').stat().st_size} bytes"


@case("N6")
def n6(d):
    env_tmp = d / "tmp"
    env_tmp.mkdir()
    os.environ["TMPDIR"] = str(env_tmp)
    try:
        r = run(["predict", "/dev/zero"], d, timeout=120)
    finally:
        os.environ["TMPDIR"] = str(d.parent)
    return r, f"spool dir after: {ls(env_tmp)}"


@case("N12")
def n12(d):
    (d / "deep.yaml").write_text("a: " + "[" * 100000)
    return run(["predict", "-c", "deep.yaml"], d), ""


@case("N14")
def n14(d):
    return run(["predict", str(CONV), "--telemetry", "t.csv", "--telemetry-interval-ms", "1e-9"], d, timeout=60), ""


@case("N16")
def n16(d):
    (d / "e.jsonl").write_bytes(b"\x1b]0;PWNED\x07\x1b[2J\n")
    r = run(["predict", "e.jsonl"], d)
    return r, f"escape byte in stderr: {chr(27) in r[3]}"


@case("N18")
def n18(d):
    return run(["predict", "--input-tokens", "10", "--output-tokens", "2", "--request-count", "3",
                "--arrival-interval-ms", "1e308"], d), ""


@case("D9")
def d9(d):
    return run(["predict", "--input-tokens", "4294967295", "--output-tokens", "1", "--request-count", "1"], d), ""


@case("D14")
def d14(d):
    return run(["predict", "--input-tokens", "100", "--output-tokens", "100", "--request-count", "100000000",
                "--request-rate", "1e9"], d, timeout=120), ""


@case("D17")
def d17(d):
    r = run(["predict", "--input-tokens", "10", "--output-tokens", "2", "--request-count", "3",
             "--extra-engine-args", "[1,2]"], d)
    return r, ""


def main():
    names = sys.argv[1:] or list(CASES)
    base = Path(tempfile.mkdtemp(prefix="servesim-audit-"))
    try:
        for name in names:
            d = base / name
            d.mkdir()
            (rc, secs, peak, err), seen = CASES[name](d)
            print(f"{name:4} rc={rc!s:4} {secs:6.2f} s  peak {peak:7.1f} MB  {err}")
            if seen:
                print(f"{'':4} {seen}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Replay through Python vs through the CLI on the same trace and workers (median of N runs).

    .venv/bin/python scripts/python_overhead.py [TRACE] [--runs N] [--workers W]

Times whole processes for both (interpreter start and import included for Python), and the
`run_mocker_trace_replay` call alone.
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=str(ROOT.parent / "shared/traces/mooncake_conversation_trace.jsonl"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    cli = [str(ROOT / "target/release/servesim"), "predict", a.trace, "--num-workers", str(a.workers), "--format", "json"]
    py = [sys.executable, "-c",
          "import sys, time; from servesim.mocker import run_mocker_trace_replay as r; t = time.perf_counter(); "
          f"r({a.trace!r}, num_workers={a.workers}); print(time.perf_counter() - t, file=sys.stderr)"]
    cli_t, py_t, call_t = [], [], []
    for _ in range(a.runs):
        for cmd, out in ((cli, cli_t), (py, py_t)):
            t = time.perf_counter()
            p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
            out.append(time.perf_counter() - t)
            if cmd is py:
                call_t.append(float(p.stderr.strip().splitlines()[-1]))
    c, p, k = statistics.median(cli_t), statistics.median(py_t), statistics.median(call_t)
    print(f"CLI process {c:.3f} s; Python process {p:.3f} s ({(p / c - 1) * 100:+.1f} %); "
          f"Python call alone {k:.3f} s ({(k / c - 1) * 100:+.1f} %); median of {a.runs}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Load benchmark of `servesim serve` (a script, not a test).

Two runs against one server process each, with the lean Rust client in
crates/live/examples/loadgen.rs (one client thread, so the client takes one core at most):

  throughput  1,000 concurrent streams, --speedup-ratio 0: streamed tokens per second.
  lateness    256 concurrent streams, --speedup-ratio 1: how late each pass released its
              tokens after its modelled end (p50/p99, from the server's
              servesim:pass_lateness_seconds histogram), plus client-side TTFT and ITL.

usage: scripts/bench_live.py [--seconds 15] [--streams 1000] [--lateness-streams 256] [--binary PATH]
(--binary: another build of servesim to measure, e.g. a copy of main's, for a before/after table)
"""

import argparse
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lateness(text):
    """Totals of the servesim:pass_lateness_seconds buckets: [(le, cumulative count)]."""
    out = {}
    for m in re.finditer(r'^servesim:pass_lateness_seconds_bucket\{.*le="([^"]+)"\} (\S+)$', text, re.M):
        le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
        out[le] = out.get(le, 0.0) + float(m.group(2))
    return sorted(out.items())


def quantile(buckets, q):
    """Quantile from cumulative buckets, interpolating linearly inside a bucket."""
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    target = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= target:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (target - prev_c) / max(c - prev_c, 1e-12)
        prev_le, prev_c = le, c
    return prev_le


def run(label, server_args, streams, seconds, prompt_tokens, max_tokens, binary):
    port = free_port()
    server = subprocess.Popen(
        [binary, "serve", "--port", str(port), *server_args],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        out = subprocess.run(
            [str(ROOT / "target/release/examples/loadgen"), f"127.0.0.1:{port}", str(streams), str(seconds),
             str(prompt_tokens), str(max_tokens), "3"],
            capture_output=True, text=True, check=True,
        )
        result = json.loads(out.stdout)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        b = lateness(metrics)
        result["pass_lateness_ms_p50"] = quantile(b, 0.5) * 1000
        result["pass_lateness_ms_p99"] = quantile(b, 0.99) * 1000
        result["passes"] = b[-1][1] if b else 0
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    print(f"{label}: {json.dumps(result)}", flush=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--lateness-streams", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=1000)
    ap.add_argument("--binary", default=str(ROOT / "target/release/servesim"), help="the servesim to measure")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-p", "servesim", "-p", "servesim-live", "--example", "loadgen"],
                   cwd=ROOT, check=True)
    t = run("throughput (speedup 0)", ["--speedup-ratio", "0", "--max-num-seqs", str(a.streams)],
            a.streams, a.seconds, a.prompt_tokens, a.max_tokens, a.binary)
    l = run("lateness (speedup 1)", ["--speedup-ratio", "1"],
            a.lateness_streams, a.seconds, a.prompt_tokens, a.max_tokens, a.binary)
    print()
    print(f"streamed tokens/s at {a.streams} streams, speedup 0: {t['tokens_per_s']:,.0f}")
    print(f"pass lateness at {a.lateness_streams} streams, speedup 1: p50 {l['pass_lateness_ms_p50']:.3f} ms, "
          f"p99 {l['pass_lateness_ms_p99']:.3f} ms over {l['passes']:.0f} passes "
          f"(client ITL p50 {l['itl_ms_p50']:.2f} ms, p99 {l['itl_ms_p99']:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

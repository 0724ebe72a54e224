#!/usr/bin/env python3
"""Soak test of `servesim serve` (a script, not a test; CI does not run it).

Keeps --streams streaming requests in flight against one server on the loopback for --duration
seconds: most read their stream to [DONE], some disconnect abruptly part-way (a TCP reset), some
read slowly, some stop reading (with a small receive buffer, so that the server's
--write-timeout of 5 s can catch them) and then leave. Every --every seconds it prints the
server's RSS and gauges. At the end it stops the clients and checks that:
  - the server holds no KV and runs and queues nothing (within 30 s),
  - its RSS stayed flat after warm-up (median of the last third of the samples within 20 % of
    the median of the first third),
  - no client saw an error (a refused or failed request, a stream cut short by the server),
  - the server is still healthy, wrote no panic, and exits 0 on SIGTERM,
and prints the p50/p99 pass lateness from the servesim:pass_lateness_seconds histogram.
Exit code 1 if a check fails. The server is built with `cargo build --release -p servesim`.

usage: scripts/soak_live.py [--duration 60] [--streams 1000] [--speedup 1] [--every 5] [--seed 1]
       scripts/soak_live.py --duration 600          # the 10-minute soak of issue 12
"""

import argparse
import asyncio
import json
import os
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"  # loopback only


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def scrape(port):
    return urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10).read().decode()


def gauge(text, name):
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M))


def lateness_quantiles(text, qs):
    buckets = {}
    for m in re.finditer(r'^servesim:pass_lateness_seconds_bucket\{.*le="([^"]+)"\} (\S+)$', text, re.M):
        le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
        buckets[le] = buckets.get(le, 0.0) + float(m.group(2))
    b = sorted(buckets.items())
    total = b[-1][1] if b else 0
    out = []
    for q in qs:
        if total == 0:
            out.append(float("nan"))
            continue
        prev_le, prev_c = 0.0, 0.0
        for le, c in b:
            if c >= q * total:
                out.append(prev_le if le == float("inf") else prev_le + (le - prev_le) * (q * total - prev_c) / max(c - prev_c, 1e-12))
                break
            prev_le, prev_c = le, c
    return out, total


class Stats:
    def __init__(self):
        self.started = self.done = self.dropped = self.slow = self.stalled = self.errors = 0
        self.error_kinds = {}

    def error(self, what):
        self.errors += 1
        self.error_kinds[what] = self.error_kinds.get(what, 0) + 1


async def one_request(port, rng, stats, deadline):
    prefix = rng.randrange(8)
    prompt = [prefix * 100_000 + t for t in range(rng.randrange(16, 256))] + [rng.randrange(30_000) for _ in range(rng.randrange(1, 64))]
    behaviour = rng.choices(["normal", "drop", "slow", "stall"], weights=[60, 20, 15, 5])[0]
    max_tokens = rng.randrange(1000, 2000) if behaviour == "stall" else rng.randrange(16, 400)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()
    stats.started += 1
    sock = socket.socket()
    sock.setblocking(False)
    if behaviour == "stall":
        # A small window: the server's writes block soon after this client stops reading.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (HOST, port))
    except BaseException:
        sock.close()
        raise
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        got = 0
        head = b""
        drop_at = rng.randrange(200, 20_000) if behaviour == "drop" else None
        tail = b""
        while time.time() < deadline:
            if behaviour == "slow":
                await asyncio.sleep(rng.uniform(0.02, 0.3))
            elif behaviour == "stall" and got > 0:
                await asyncio.sleep(rng.uniform(1, 8))
                stats.stalled += 1
                return
            chunk = await reader.read(2048 if behaviour == "slow" else 65536)
            if not chunk:
                break
            if got < 64:
                head = (head + chunk)[:64]
            got += len(chunk)
            tail = (tail + chunk)[-64:]
            if drop_at is not None and got >= drop_at:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                stats.dropped += 1
                return
        if time.time() >= deadline:
            return
        if not head.startswith(b"HTTP/1.1 200"):
            stats.error("status " + head.split(b"\r\n", 1)[0].decode(errors="replace"))
        elif b"data: [DONE]" in tail:
            if behaviour == "slow":
                stats.slow += 1
            stats.done += 1
        else:
            stats.error("stream ended without [DONE]")
    finally:
        writer.close()


async def stream_loop(port, seed, stats, deadline):
    rng = random.Random(seed)
    await asyncio.sleep(rng.uniform(0, 2))
    while time.time() < deadline:
        try:
            await one_request(port, rng, stats, deadline)
        except Exception as e:  # noqa: BLE001 - every failure is counted, none stops the stream
            stats.error(type(e).__name__)
            await asyncio.sleep(0.1)


async def monitor(proc, port, stats, start, deadline, every, samples):
    while time.time() < deadline:
        await asyncio.sleep(min(every, max(0.0, deadline - time.time())))
        try:
            text = await asyncio.to_thread(scrape, port)
        except OSError as e:
            stats.error(f"metrics: {type(e).__name__}")
            continue
        s = {
            "t": round(time.time() - start),
            "rss_mb": round(rss_mb(proc.pid), 1),
            "running": gauge(text, "vllm:num_requests_running"),
            "waiting": gauge(text, "vllm:num_requests_waiting"),
            "kv": round(gauge(text, "vllm:kv_cache_usage_perc"), 3),
            "done": stats.done,
            "dropped": stats.dropped,
            "slow": stats.slow,
            "stalled": stats.stalled,
            "errors": stats.errors,
        }
        samples.append(s)
        print(json.dumps(s), flush=True)


async def soak(a, proc, port):
    stats, samples = Stats(), []
    start = time.time()
    deadline = start + a.duration
    tasks = [asyncio.create_task(stream_loop(port, a.seed * 100_003 + i, stats, deadline)) for i in range(a.streams)]
    tasks.append(asyncio.create_task(monitor(proc, port, stats, start, deadline, a.every, samples)))
    await asyncio.gather(*tasks, return_exceptions=True)
    return stats, samples


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=60, help="seconds of load (default 60; 600 for the full soak)")
    ap.add_argument("--streams", type=int, default=1000, help="streams kept in flight (default 1000)")
    ap.add_argument("--speedup", type=float, default=1.0, help="the server's --speedup-ratio (default 1)")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples (default 5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--binary", default=str(ROOT / "target/release/servesim"))
    a = ap.parse_args()
    if not os.access(a.binary, os.X_OK):
        sys.exit(f"{a.binary} not found: build it with cargo build --release -p servesim")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < a.streams + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, a.streams + 256), hard))
    port = free_port()
    engine = {"timing_model": {"type": "fixed", "prefill_ms": 20.0, "decode_ms": 10.0},
              "block_size": 16, "num_gpu_blocks": 40_000, "max_num_seqs": 1024}
    # The server's stderr goes to a file: a pipe nobody reads would block it once full.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([a.binary, "serve", "--host", HOST, "--port", str(port), "--speedup-ratio", str(a.speedup),
                             "--write-timeout", "5", "--extra-engine-args", json.dumps(engine)],
                            stdout=subprocess.DEVNULL, stderr=log)
    exit_code = None
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        else:
            log.seek(0)
            sys.exit(f"the server did not become healthy:\n{log.read().decode(errors='replace')}")
        stats, samples = asyncio.run(soak(a, proc, port))
        # The clients are gone: everything must drain.
        end = time.time() + 30
        while True:
            text = scrape(port)
            kv, running, waiting = (gauge(text, n) for n in
                                    ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"))
            if (kv == 0 and running == 0 and waiting == 0) or time.time() > end:
                break
            time.sleep(0.2)
        (p50, p99), passes = lateness_quantiles(text, [0.5, 0.99])
        rss_end = rss_mb(proc.pid)
        try:
            healthy = urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=5).status == 200
        except OSError:
            healthy = False
        proc.send_signal(signal.SIGTERM)
        try:
            exit_code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            exit_code = "did not stop within 60 s"
        log.seek(0)
        server_log = log.read().decode(errors="replace")
        panicked = "panicked" in server_log
        warm = [s["rss_mb"] for s in samples if s["t"] >= min(60, a.duration / 3)]
        third = max(1, len(warm) // 3)
        early, late = sorted(warm[:third])[third // 2] if warm else float("nan"), sorted(warm[-third:])[third // 2] if warm else float("nan")
        growth = (late - early) / early * 100 if warm else float("nan")
        report = {
            "duration_s": a.duration, "streams": a.streams, "requests_started": stats.started,
            "completed": stats.done, "of_which_slow_readers": stats.slow, "dropped": stats.dropped,
            "stalled_then_left": stats.stalled, "client_errors": stats.errors, "error_kinds": stats.error_kinds,
            "rss_mb_first": samples[0]["rss_mb"] if samples else None, "rss_mb_max": max((s["rss_mb"] for s in samples), default=None),
            "rss_mb_early_median": early, "rss_mb_late_median": late, "rss_growth_pct": round(growth, 1),
            "rss_mb_end": round(rss_end, 1), "kv_usage_end": kv, "running_end": running, "waiting_end": waiting,
            "pass_lateness_ms_p50": round(p50 * 1000, 3), "pass_lateness_ms_p99": round(p99 * 1000, 3), "passes": passes,
            "healthy_end": healthy, "server_panicked": panicked, "server_exit_code": exit_code,
        }
        print(json.dumps(report, indent=1))
        if panicked:
            print(server_log, file=sys.stderr)
        ok = (kv == 0 and running == 0 and waiting == 0 and growth < 20 and stats.errors == 0 and healthy
              and not panicked and exit_code == 0)
        print("soak:", "ok" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())

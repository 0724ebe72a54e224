#!/usr/bin/env python3
"""Peak memory of `servesim serve` under the request shapes of the 2026-12 audit (D6, N4, D21, N24).

Starts the release server on a free loopback port, sends the load, and reads the server's peak
RSS (VmHWM) and current RSS (VmRSS) from /proc/PID/status. Every scenario prints one JSON line.

    scripts/serve_memory.py messages      # D6: 8 concurrent 33 MB bodies of 65,536 × 470-byte messages
    scripts/serve_memory.py tokenizer     # N4: 8 concurrent 32 MiB chat bodies, --model-path (BPE, 8k vocabulary)
    scripts/serve_memory.py streams       # D21: 200 streams × 30,000 tokens whose clients read nothing, then once
    scripts/serve_memory.py metrics       # N24: /metrics size with --num-workers 4096
    scripts/serve_memory.py all

`--binary PATH` measures another build (default target/release/servesim); `--concurrency`,
`--streams`, `--tokens` vary the load. The tokenizer scenario trains its tokenizer with the
`tokenizers` package (tests/live/requirements.txt) into a temporary directory.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1024 * 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) / 1024
    return out


class Server:
    def __init__(self, binary, *args):
        self.port = free_port()
        cmd = [binary, "serve", "--port", str(self.port), "--speedup-ratio", "0", *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited: {self.proc.stderr.read()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                self.proc.kill()
                raise SystemExit("server did not become ready")
            time.sleep(0.05)

    def mem(self):
        return status(self.proc.pid)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def post_raw(port, path, body, timeout=300):
    """One request on its own connection: (status, first 200 bytes of the body)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                  b"Connection: close\r\n\r\n" % (path.encode(), len(body)))
        view = memoryview(body)
        for i in range(0, len(body), 1 << 20):
            s.sendall(view[i:i + (1 << 20)])
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), rest[:200].decode(errors="replace")
    finally:
        s.close()


def concurrent(port, path, bodies):
    results = [None] * len(bodies)

    def run(i):
        try:
            results[i] = post_raw(port, path, bodies[i])
        except OSError as e:
            results[i] = (None, repr(e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.time() - start


def report(name, srv, results, elapsed, extra=None):
    time.sleep(2)  # let the server finish freeing
    mem = srv.mem()
    statuses = sorted({r[0] for r in results}, key=str)
    out = {"scenario": name, "requests": len(results), "statuses": statuses, "seconds": round(elapsed, 2),
           "peak_rss_mb": round(mem["VmHWM"], 1), "rss_after_mb": round(mem["VmRSS"], 1),
           "first_response": results[0][1][:160] if results else None}
    out.update(extra or {})
    code = srv.stop()
    out["exit_code"] = code
    print(json.dumps(out), flush=True)
    return out


def messages_body(n=65_536, content_bytes=470):
    content = ("lorem ipsum dolor sit amet " * (content_bytes // 27 + 1))[:content_bytes]
    msg = json.dumps({"role": "user", "content": content}).encode()
    return b'{"messages":[' + b",".join([msg] * n) + b'],"max_tokens":1}'


def scenario_messages(a):
    srv = Server(a.binary)
    body = messages_body()
    results, elapsed = concurrent(srv.port, "/v1/chat/completions", [body] * a.concurrency)
    return report("messages", srv, results, elapsed, {"body_mb": round(len(body) / MB, 1)})


def train_tokenizer(d):
    """A byte-level BPE tokenizer.json with an 8k vocabulary (like the audit's), no chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import random

    rng = random.Random(7)
    syllables = ["ka", "lo", "mi", "ne", "tor", "sa", "ul", "bre", "ix", "on", "word", "the", "and"]
    corpus = [" ".join("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(60))
              for _ in range(4000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(Path(d) / "tokenizer.json"))


def scenario_tokenizer(a):
    with tempfile.TemporaryDirectory() as d:
        train_tokenizer(d)
        srv = Server(a.binary, "--model-path", d)
        words = (32 * MB - 200) // 5
        body = json.dumps({"messages": [{"role": "user", "content": "word " * words}], "max_tokens": 1}).encode()
        results, elapsed = concurrent(srv.port, "/v1/chat/completions", [body] * a.concurrency)
        return report("tokenizer", srv, results, elapsed, {"body_mb": round(len(body) / MB, 1)})


def drain_once(sock, limit=1 << 20):
    """Reads what the socket holds right now (up to `limit` bytes), without waiting."""
    sock.setblocking(False)
    got = 0
    try:
        while got < limit:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += len(chunk)
    except BlockingIOError:
        pass
    sock.setblocking(True)
    return got


def scenario_streams(a):
    """Streams whose clients read nothing for `--seconds` (the engine generates every token
    meanwhile), then read once what their sockets hold and stop again: the server then has room
    to write, and renders what has piled up."""
    srv = Server(a.binary, "--max-model-len", a.tokens + 100, "--num-gpu-blocks-override",
                 (a.tokens + 100) * a.streams // 16 + 1000)
    before = srv.mem()["VmRSS"]
    body = json.dumps({"prompt": [1, 2, 3, 4], "max_tokens": a.tokens, "stream": True}).encode()
    socks = []
    for _ in range(a.streams):
        s = socket.socket()
        if a.rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, a.rcvbuf)
        s.connect(("127.0.0.1", srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        socks.append(s)

    def sample(seconds):
        peak, start = 0.0, time.time()
        while time.time() - start < seconds:
            peak = max(peak, srv.mem()["VmRSS"])
            time.sleep(0.25)
        return peak

    not_reading = sample(a.seconds)
    read = sum(drain_once(s) for s in socks)
    after_one_read = sample(5)
    mem = srv.mem()
    for s in socks:
        s.close()
    out = {"scenario": "streams", "streams": a.streams, "tokens": a.tokens, "rss_before_mb": round(before, 1),
           "rss_max_not_reading_mb": round(not_reading, 1), "bytes_read_once": read,
           "rss_max_after_one_read_mb": round(after_one_read, 1), "peak_rss_mb": round(mem["VmHWM"], 1)}
    out["exit_code"] = srv.stop()
    print(json.dumps(out), flush=True)
    return out


def scenario_metrics(a):
    srv = Server(a.binary, "--num-workers", a.workers)
    start = time.time()
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=60) as r:
        size = len(r.read())
    out = {"scenario": "metrics", "workers": a.workers, "metrics_bytes": size,
           "scrape_seconds": round(time.time() - start, 3), "peak_rss_mb": round(srv.mem()["VmHWM"], 1)}
    out["exit_code"] = srv.stop()
    print(json.dumps(out), flush=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=["messages", "tokenizer", "streams", "metrics", "all"])
    p.add_argument("--binary", default=str(ROOT / "target" / "release" / "servesim"))
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--tokens", type=int, default=30_000)
    p.add_argument("--seconds", type=float, default=15.0, help="how long the streams scenario samples RSS")
    p.add_argument("--rcvbuf", type=int, default=0, help="SO_RCVBUF of the streams' sockets (default: the system's)")
    p.add_argument("--workers", type=int, default=4096)
    a = p.parse_args()
    names = ["messages", "tokenizer", "streams", "metrics"] if a.scenario == "all" else [a.scenario]
    for name in names:
        globals()[f"scenario_{name}"](a)


if __name__ == "__main__":
    sys.exit(main())

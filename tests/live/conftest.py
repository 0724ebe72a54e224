"""Starts `servesim serve` processes on free ports for the tests and stops them afterwards.

The binary is target/release/servesim (scripts/test.sh builds it; it is built here if it is
missing). Every server is stopped with SIGTERM and must exit 0.
"""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "release" / "servesim"

# Fixed pass times: what tests compare timing against.
FIXED = {"type": "fixed", "prefill_ms": 40.0, "decode_ms": 10.0}


def binary() -> Path:
    if not BINARY.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "servesim"], cwd=ROOT, check=True)
    return BINARY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list:
    """n distinct free ports (held open together so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def consecutive_ports(n: int) -> int:
    """A base port with n free ports after it."""
    for _ in range(200):
        base = free_port()
        if base + n >= 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no run of free ports")


def get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def post(url: str, body, timeout: float = 30.0, raw: bytes = None, headers=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), dict(e.headers)


class Server:
    """A running `servesim serve`; `url` is the frontend's base URL."""

    def __init__(self, *args, engine=None, wait_ready=True):
        self.port = free_port()
        cmd = [str(binary()), "serve", "--port", str(self.port)]
        if engine is not None:
            cmd += ["--extra-engine-args", json.dumps(engine)]
        cmd += [str(a) for a in args]
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = self.url + "/v1"
        deadline = time.time() + 20
        while True:
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise RuntimeError(f"server exited with {self.proc.returncode}: {err}{out}")
            try:
                status, _ = get(self.url + "/health", timeout=1)
                if status == 200 or not wait_ready:
                    break
            except urllib.error.HTTPError as e:
                if not wait_ready:
                    break
                if e.code != 503:
                    raise
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("server did not become ready")
            time.sleep(0.05)

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        return self.proc.returncode

    def metrics(self, url: str = None) -> str:
        return get((url or self.url) + "/metrics")[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        code = self.stop()
        if exc[0] is None:
            assert code == 0, f"server exited with {code}"


@pytest.fixture(scope="module")
def server():
    """A default single-worker server with fixed pass times, 10× faster than modelled."""
    with Server("--speedup-ratio", "10", engine={"timing_model": FIXED, "block_size": 16}) as s:
        yield s


def client(server):
    import openai

    return openai.OpenAI(base_url=server.api, api_key="none", max_retries=0, timeout=30)


def samples(text: str):
    """Prometheus samples by name: list of (labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    families = {}
    for fam in text_string_to_metric_families(text):
        families[fam.name] = fam
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return families, out

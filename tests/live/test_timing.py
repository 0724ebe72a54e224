"""Timing fidelity: at speedup 1 and light load, what a streaming client measures matches what
`servesim predict` computes for the same requests (fixed pass times, so a noisy machine cannot
change the model's answer)."""

import json
import socket
import subprocess
import time

import pytest

from conftest import FIXED, Server, binary


def predict(engine, input_tokens, output_tokens, count, interval_ms):
    out = subprocess.run(
        [
            str(binary()), "predict", "--input-tokens", str(input_tokens), "--output-tokens", str(output_tokens),
            "--request-count", str(count), "--arrival-interval-ms", str(interval_ms),
            "--extra-engine-args", json.dumps(engine), "--format", "json",
        ],
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout)


def measure(port, prompt, max_tokens):
    """Client-side TTFT and token gaps (seconds) of one streamed completion, read off a plain
    socket. The request goes out in one segment with TCP_NODELAY: clients that send headers and
    body separately (http.client, httpx) otherwise add a Nagle/delayed-ACK stall of ~15 ms
    that no server can remove."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = time.perf_counter()
    sock.sendall(request)
    times, buf = [], b""
    while True:
        data = sock.recv(65536)
        if not data:
            break
        now = time.perf_counter()
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            line = event.split(b"data: ", 1)[-1]
            if line.strip() == b"[DONE]":
                sock.close()
                assert len(times) == max_tokens
                return times[0] - start, [b - a for a, b in zip(times, times[1:])]
            if line.startswith(b"{"):
                choice = json.loads(line)["choices"][0]
                if choice["text"]:
                    times.append(now)
    raise AssertionError("stream ended without [DONE]")


@pytest.mark.parametrize(
    "case",
    [
        {"isl": 200, "osl": 20, "extra": {}},
        # Chunked prefill: a 3000-token prompt takes three passes of a 1024-token budget.
        {"isl": 3000, "osl": 30, "extra": {"max_num_batched_tokens": 1024}},
    ],
    ids=["short-prompt", "chunked-prefill"],
)
def test_client_ttft_and_itl_match_predict(case):
    engine = {"timing_model": FIXED, "block_size": 16, **case["extra"]}
    count, gap_ms = 6, 600
    expected = predict(engine, case["isl"], case["osl"], count, gap_ms)
    with Server("--speedup-ratio", "1", engine=engine) as srv:
        measure(srv.port, [1] * 50, 3)  # warm up code paths
        ttfts, gaps = [], []
        for i in range(count):
            began = time.perf_counter()
            # Distinct prompts: no prefix cache hits, as in the synthetic workload.
            ttft, g = measure(srv.port, [(i + 1) * 100_000 + t for t in range(case["isl"])], case["osl"])
            ttfts.append(ttft)
            gaps.extend(g)
            time.sleep(max(0.0, gap_ms / 1000 - (time.perf_counter() - began)))
    live_ttft = sum(ttfts) / len(ttfts) * 1000
    live_itl = sum(gaps) / len(gaps) * 1000
    print(f"TTFT live {live_ttft:.2f} ms vs predict {expected['mean_ttft_ms']:.2f}; "
          f"ITL live {live_itl:.2f} ms vs predict {expected['mean_itl_ms']:.2f}")
    assert abs(live_ttft - expected["mean_ttft_ms"]) <= 0.10 * expected["mean_ttft_ms"]
    assert abs(live_itl - expected["mean_itl_ms"]) <= 0.10 * expected["mean_itl_ms"]


def test_sglang_prefill_decode_interval_idle_rounds_do_not_stall_the_next_request():
    """A one-token request finishes in its prefill pass, leaving rounds of the interval to count
    down with nothing to do: they take no time and must not leave the next request waiting for
    some other news (each request here comes alone)."""
    from conftest import post

    engine = {"engine": {"backend": "sglang", "block_size": 16, "timing_model": FIXED, "speedup_ratio": 1.0,
                         "prefill_decode_interval": 3}}
    with Server(engine=engine) as srv:
        for i in range(4):
            began = time.perf_counter()
            prompt = [i * 1000 + t for t in range(50)]
            status, body, _ = post(srv.api + "/completions", {"prompt": prompt, "max_tokens": 1}, timeout=5)
            assert status == 200, body
            # One 40 ms prefill pass; the interval's idle rounds cost nothing.
            assert time.perf_counter() - began < 1.0


def test_prefill_intervals_with_attention_dp_are_refused_live():
    for engine in (
        {"engine": {"prefill_schedule_interval": 2}, "dp_size": 2},
        {"engine": {"backend": "sglang", "prefill_decode_interval": 1}, "dp_size": 2},
    ):
        out = subprocess.run([str(binary()), "serve", "--port", "0", "--extra-engine-args", json.dumps(engine)],
                             capture_output=True, text=True, timeout=20)
        assert out.returncode == 2, out.stderr
        key = next(k for k in engine["engine"] if "interval" in k)
        assert f"engine.{key} with data-parallel size 2 is not supported by the live server" in out.stderr

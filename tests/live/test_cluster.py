"""Several workers in one process: round robin, worker ports, KV routing, disaggregation,
startup time and graceful shutdown."""

import signal
import threading
import time
import urllib.error

import openai
import pytest

from conftest import FIXED, Server, consecutive_ports, get, post, samples


def completion(url, prompt, max_tokens=2, **extra):
    code, body, headers = post(url + "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, **extra})
    assert code == 200, body
    return body, int(headers["x-servesim-worker"])


def test_round_robin_and_worker_ports():
    base = consecutive_ports(3)
    with Server("--speedup-ratio", "0", "--num-workers", "3", "--worker-base-port", base) as srv:
        workers = [completion(srv.url, [i] * 20)[1] for i in range(6)]
        assert workers == [0, 1, 2, 0, 1, 2]
        for w in range(3):
            url = f"http://127.0.0.1:{base + w}"
            assert [completion(url, [7, w])[1] for _ in range(2)] == [w, w]
            assert get(url + "/health")[0] == 200
            # A worker's /metrics shows only that worker.
            assert f'worker_id="{w}"' in srv.metrics(url)
            assert f'worker_id="{(w + 1) % 3}"' not in srv.metrics(url)
        assert all(f'worker_id="{w}"' in srv.metrics() for w in range(3))
        body, w = completion(srv.url, [1, 2, 3], nvext={"backend_instance_id": 2, "extra_fields": ["worker_id"]})
        assert w == 2 and body["nvext"]["worker_id"]["decode_worker_id"] == 2


def test_kv_router_follows_the_cached_prefix():
    engine = {"timing_model": FIXED, "block_size": 16}
    with Server("--speedup-ratio", "10", "--num-workers", "4", "--router-mode", "kv_router", engine=engine) as srv:
        # A new prefix ties on every idle worker (a uniform draw, as Dynamo's router); the same
        # prefix with another ending then goes where the prefix is cached.
        for g in range(4):
            prefix = [g * 10_000 + t for t in range(256)]
            _, w = completion(srv.url, prefix + [1, 2, 3])
            assert w in range(4)
            for k in range(3):
                assert completion(srv.url, prefix + [50 + k] * 5)[1] == w


def test_disaggregated_prefill_then_decode_with_transfer_delay(tmp_path):
    # config.json: 1 layer × 2 (K, V) × 1 KV head × 64 dims × 2 bytes = 256 bytes per token.
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "hidden_size": 64,'
        ' "torch_dtype": "bfloat16", "max_position_embeddings": 4096}'
    )
    engine = {"timing_model": FIXED, "block_size": 16}
    # 100 prompt tokens × 256 B at 0.0001 GB/s = 256 ms of transfer.
    args = ["--speedup-ratio", "1", "--num-prefill-workers", "1", "--num-decode-workers", "2",
            "--kv-transfer-bandwidth", "0.0001", "--model-path", tmp_path]
    with Server(*args, engine=engine) as srv:
        for k in range(2):
            start = time.perf_counter()
            body, w = completion(srv.url, [k * 1000 + t for t in range(100)], 1, nvext={"extra_fields": ["worker_id"]})
            elapsed = (time.perf_counter() - start) * 1000
            ids = body["nvext"]["worker_id"]
            assert ids["prefill_worker_id"] == 0 and ids["decode_worker_id"] == w == k + 1
            # prefill 40 ms + transfer 256 ms + the decode worker's first pass 10 ms.
            assert 300 <= elapsed <= 360, elapsed
        assert 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="' in srv.metrics()


@pytest.mark.parametrize("engine_type", ["vllm", "sglang"])
def test_who_waits_for_a_full_decode_worker(engine_type):
    # One decode worker whose 10 blocks hold request A (100 prompt + 40 output tokens); B
    # needs 7 more blocks, so it waits until A finishes (~200 ms prefill + 400 ms decode).
    # vLLM computes B's prompt first and waits with the KV on the prefill worker: B's first
    # token follows A's end by a pass. SGLang reserves the decode pages first and only then
    # runs B's prefill: another 200 ms.
    engine = {"timing_model": {"type": "fixed", "prefill_ms": 200.0, "decode_ms": 10.0},
              "block_size": 16, "num_gpu_blocks": 10}
    args = ["--speedup-ratio", "1", "--num-prefill-workers", "1", "--num-decode-workers", "1",
            "--engine-type", engine_type]
    with Server(*args, engine=engine) as srv:
        done = {}

        def run(name, prompt, max_tokens):
            code, body, _ = post(srv.url + "/v1/completions",
                                 {"prompt": prompt, "max_tokens": max_tokens, "stream": False})
            assert code == 200, body
            done[name] = time.perf_counter() * 1000

        a = threading.Thread(target=run, args=("A", list(range(100)), 40))
        a.start()
        time.sleep(0.05)
        run("B", list(range(1000, 1100)), 1)
        a.join()
        # B's only token: one decode pass after A ends, plus B's prefill for SGLang.
        after = done["B"] - done["A"]
        expected = 10 if engine_type == "vllm" else 210
        assert expected - 10 <= after <= expected + 60, (engine_type, after)


def test_startup_time_gates_health_and_requests():
    srv = Server("--speedup-ratio", "0", "--startup-time", "1.0", wait_ready=False)
    try:
        try:
            get(srv.url + "/health")
            raise AssertionError("healthy during startup")
        except urllib.error.HTTPError as e:
            assert e.code == 503
        start = time.time()
        _, w = completion(srv.url, [1, 2, 3])
        assert time.time() - start > 0.5, "requests wait for the engine to start"
        assert get(srv.url + "/health")[0] == 200
    finally:
        assert srv.stop() == 0


def test_sigterm_finishes_in_flight_streams_and_exits_zero():
    srv = Server("--speedup-ratio", "1", engine={"timing_model": FIXED, "block_size": 16})
    result = {}
    started = threading.Event()
    c = openai.OpenAI(base_url=srv.api, api_key="x", max_retries=0)

    def stream():
        n = 0
        for ch in c.completions.create(model="servesim-model", prompt="hi", max_tokens=60, stream=True):
            if ch.choices and ch.choices[0].text:
                n += 1
                started.set()
        result["tokens"] = n

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(5)  # the stream is under way (60 tokens take ~630 ms)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    try:
        post(srv.url + "/v1/completions", {"prompt": "late", "max_tokens": 1}, timeout=2)
        refused = False
    except (urllib.error.URLError, ConnectionError, OSError):
        refused = True
    t.join()
    assert srv.proc.wait(timeout=10) == 0
    assert result["tokens"] == 60
    assert refused, "new connections are refused once shutdown starts"


def test_prefill_server_hands_kv_transfer_params_to_a_decode_server(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "hidden_size": 64}'
    )
    engine = {"timing_model": FIXED, "block_size": 16}
    common = ["--speedup-ratio", "1", "--kv-transfer-bandwidth", "0.0001", "--model-path", tmp_path]
    with Server(*common, "--disaggregation-mode", "prefill", engine=engine) as p, \
         Server(*common, "--disaggregation-mode", "decode", engine=engine) as d:
        prompt = list(range(100))
        # The router's prefill request (llm-d / vLLM style): one token and the handoff.
        start = time.perf_counter()
        code, body, _ = post(p.url + "/v1/completions",
                             {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        prefill_ms = (time.perf_counter() - start) * 1000
        assert code == 200 and body["usage"]["completion_tokens"] == 1
        kv = body["kv_transfer_params"]
        assert kv["do_remote_prefill"] is True and kv["remote_port"] == p.port
        assert kv["remote_block_ids"] == list(range(7))
        assert 35 <= prefill_ms <= 80, prefill_ms  # the 40 ms prefill pass
        # The prefill server holds the KV while it is being sent (256 ms here), then frees it.
        usage = lambda: samples(p.metrics())[1]["vllm:kv_cache_usage_perc"][0][1]
        assert usage() > 0
        time.sleep(0.35)
        assert usage() == 0
        # The decode request: transfer (100 × 256 B at 0.0001 GB/s = 256 ms), then decoding.
        start = time.perf_counter()
        code, body, _ = post(d.url + "/v1/completions", {"prompt": prompt, "max_tokens": 5, "kv_transfer_params": kv})
        decode_ms = (time.perf_counter() - start) * 1000
        assert code == 200 and body["usage"]["completion_tokens"] == 5
        assert 300 <= decode_ms <= 360, decode_ms  # 256 ms transfer + 5 passes of 10 ms
        # A decode-only server refuses requests without a handoff.
        code, body, _ = post(d.url + "/v1/completions", {"prompt": prompt, "max_tokens": 5})
        assert code == 400 and body["error"]["param"] == "kv_transfer_params"


def test_streams_name_their_worker():
    with Server("--speedup-ratio", "0", "--num-workers", "2") as srv:
        c = openai.OpenAI(base_url=srv.api, api_key="x", max_retries=0)
        seen = []
        for _ in range(4):
            with c.completions.with_streaming_response.create(
                model="servesim-model", prompt="hi", max_tokens=3, stream=True
            ) as r:
                seen.append(int(r.headers["x-servesim-worker"]))
                assert sum(1 for line in r.iter_lines() if line.startswith("data: {")) == 4
        assert seen == [0, 1, 0, 1]

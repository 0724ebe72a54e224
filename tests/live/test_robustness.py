"""Bad input never kills the server: malformed bodies, wrong types, huge values, disconnects."""

import json
import urllib.error
import urllib.request
import random
import socket
import struct
import threading
import time

from conftest import FIXED, Server, client, get, post, samples


def metric(srv, name):
    _, s = samples(srv.metrics())
    return sum(v for _, v in s[name])


def test_malformed_requests_get_openai_errors(server):
    url = server.api + "/completions"
    cases = [
        (b"{", 400, None),
        (b"", 400, None),
        (b"[]", 400, None),
        (b"\xff\xfe\x00garbage", 400, None),
        (json.dumps({"prompt": "x", "max_tokens": "many"}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "x", "max_tokens": -1}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "x", "max_tokens": 1.5}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "x", "max_tokens": 10**30}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "x", "max_tokens": 2**64 - 1}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": {"a": 1}}).encode(), 400, "prompt"),
        (json.dumps({"prompt": [1, "a"]}).encode(), 400, "prompt"),
        (json.dumps({"prompt": [2**40]}).encode(), 400, "prompt"),
        (json.dumps({"prompt": "x", "stream": 1}).encode(), 400, "stream"),
        (json.dumps({"prompt": "x", "stream_options": {"include_usage": True}}).encode(), 400, "stream_options"),
        (json.dumps({"prompt": "x", "model": 5}).encode(), 400, "model"),
        (json.dumps({"prompt": "x", "nvext": "yes"}).encode(), 400, "nvext"),
        (json.dumps({"prompt": "x", "nvext": {"backend_instance_id": 7}}).encode(), 400, "nvext"),
        (json.dumps({"prompt": "x", "logprobs": "yes"}).encode(), 400, "logprobs"),
    ]
    for body, status, param in cases:
        code, payload, headers = post(url, None, raw=body)
        assert code == status, (body, code, payload)
        assert payload["error"]["code"] == status and payload["error"]["message"], payload
        assert headers["content-type"] == "application/json"
        if param:
            assert payload["error"]["param"] == param, (body, payload)
    code, payload, _ = post(server.api + "/chat/completions", {"messages": [{"role": 3, "content": "x"}]})
    assert code == 400 and payload["error"]["param"] == "messages"
    code, payload, _ = post(server.api + "/chat/completions", {"messages": "hello"})
    assert code == 400
    code, payload, _ = post(server.url + "/v1/nothing", {})
    assert code == 404 and "no route" in payload["error"]["message"]
    try:
        urllib.request.urlopen(server.api + "/completions", timeout=5)
        raise AssertionError("GET on a POST route succeeded")
    except urllib.error.HTTPError as e:
        payload = json.loads(e.read())
        assert e.code == 405 and payload["error"]["code"] == 405 and "GET" in payload["error"]["message"]
    # Log probabilities are not simulated, but asking for them is not an error.
    code, payload, _ = post(url, {"prompt": "x", "max_tokens": 2, "logprobs": 2})
    assert code == 200 and payload["choices"][0]["logprobs"] is None
    code, payload, _ = post(server.api + "/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "logprobs": True, "top_logprobs": 3})
    assert code == 200 and payload["choices"][0]["logprobs"] is None
    assert get(server.url + "/health")[0] == 200


def test_oversized_body_is_refused(server):
    body = b'{"prompt": "' + b"a" * (33 * 1024 * 1024) + b'"}'
    try:
        code, payload, _ = post(server.api + "/completions", None, raw=body)
        assert code == 413 and payload["error"]["code"] == 413
    except (ConnectionError, OSError):
        pass  # the server may close the connection before the client finished sending
    assert get(server.url + "/health")[0] == 200


def test_random_bytes_and_types_fuzz(server):
    rng = random.Random(7)
    values = [None, True, -1, 0, 3, 2**63, 1e308, "", "x" * 1000, [], [1, 2], [[1]], {}, {"a": [None]}]
    keys = ["prompt", "messages", "max_tokens", "stream", "stream_options", "n", "model", "min_tokens", "nvext", "stop", "seed"]
    for i in range(300):
        if i % 3 == 0:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        else:
            body = {k: rng.choice(values) for k in rng.sample(keys, rng.randrange(1, len(keys)))}
            raw = json.dumps(body).encode()
        path = rng.choice(["/completions", "/chat/completions"])
        code, payload, _ = post(server.api + path, None, raw=raw)
        assert code in (200, 400, 404), (raw[:200], code, payload)
        if code != 200:
            assert payload["error"]["message"]
    assert get(server.url + "/health")[0] == 200


def raw_stream(port, body, read_bytes):
    """Starts a streaming request on a raw socket, reads a little, then drops the connection."""
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body).encode()
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    got = b""
    while len(got) < read_bytes:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    # Reset the connection (no graceful FIN), like a killed client.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    return got


def wait_for(cond, timeout=3.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.01)


def test_disconnects_free_the_kv_cache():
    engine = {"timing_model": FIXED, "block_size": 16, "num_gpu_blocks": 1000, "max_num_seqs": 1}
    with Server("--speedup-ratio", "1", engine=engine) as srv:
        # One long streaming request: drop it after its first tokens.
        got = raw_stream(srv.port, {"prompt": list(range(320)), "max_tokens": 15000, "stream": True}, 600)
        assert b"data: " in got
        # The waiting queue: a request that never started, then dropped.
        wait_for(lambda: metric(srv, "vllm:num_requests_running") == 0)
        blocker = threading.Thread(
            target=lambda: post(srv.api + "/completions", {"prompt": list(range(5000, 5100)), "max_tokens": 30})
        )
        blocker.start()
        wait_for(lambda: metric(srv, "vllm:num_requests_running") == 1)
        s = socket.create_connection(("127.0.0.1", srv.port))
        data = json.dumps({"prompt": list(range(9000, 9500)), "max_tokens": 50}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        wait_for(lambda: metric(srv, "vllm:num_requests_waiting") == 1)
        s.close()
        blocker.join()
        deadline = time.time() + 2
        while time.time() < deadline:
            if metric(srv, "vllm:kv_cache_usage_perc") == 0 and metric(srv, "vllm:num_requests_waiting") == 0:
                break
            time.sleep(0.02)
        assert metric(srv, "vllm:kv_cache_usage_perc") == 0
        assert metric(srv, "vllm:num_requests_running") == 0
        assert metric(srv, "vllm:num_requests_waiting") == 0
        assert metric(srv, "vllm:e2e_request_latency_seconds_count") == 1, "only the blocker finished"


def test_abort_frees_kv_within_a_pass():
    # 100 ms passes. The server learns of the reset at its next write (the next pass end, at
    # most one pass later); the engine frees the KV at the pass boundary after that.
    engine = {"timing_model": {"type": "fixed", "prefill_ms": 100.0, "decode_ms": 100.0}, "block_size": 16}
    with Server("--speedup-ratio", "1", engine=engine) as srv:
        raw_stream(srv.port, {"prompt": list(range(320)), "max_tokens": 1000, "stream": True}, 600)
        dropped = time.time()
        while metric(srv, "vllm:kv_cache_usage_perc") > 0:
            assert time.time() - dropped < 0.35, "KV still held more than a pass after the disconnect was seen"
            time.sleep(0.01)


def test_many_abrupt_disconnects_leave_a_healthy_server():
    with Server("--speedup-ratio", "0", engine={"block_size": 16}) as srv:
        threads = [
            threading.Thread(target=raw_stream, args=(srv.port, {"prompt": [i] * 50, "max_tokens": 5000, "stream": True}, 2000))
            for i in range(50)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.time() + 5
        while metric(srv, "vllm:num_requests_running") > 0 and time.time() < deadline:
            time.sleep(0.05)
        assert metric(srv, "vllm:num_requests_running") == 0
        r = client(srv).completions.create(model="servesim-model", prompt="still alive?", max_tokens=3)
        assert r.usage.completion_tokens == 3


def test_requests_longer_than_the_kv_cache_are_refused_up_front():
    # 10 blocks of 16 tokens: a 20-token prompt with 500 output tokens could start and stream,
    # then fail once it can no longer grow. The context length is capped to the cache instead.
    engine = {"timing_model": FIXED, "block_size": 16, "num_gpu_blocks": 10}
    with Server("--speedup-ratio", "0", engine=engine) as srv:
        code, payload, _ = post(srv.api + "/completions", {"prompt": list(range(20)), "max_tokens": 500, "stream": True})
        assert code == 400 and "160" in payload["error"]["message"], payload
        code, payload, _ = post(srv.api + "/completions", {"prompt": list(range(20)), "max_tokens": 140})
        assert code == 200 and payload["usage"]["completion_tokens"] == 140
        assert client(srv).models.list().data[0].model_extra["max_model_len"] == 160

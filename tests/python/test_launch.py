"""Workers started in-process: ``python -m servesim.mocker`` (the flags of ``python -m
dynamo.mocker``), ``servesim.mocker.main.launch_workers`` and ``servesim._core.LiveServer``.
Each server listens on a free port (``DYN_HTTP_PORT=0`` / ``port=0``) on loopback."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from servesim import _core
from servesim.mocker.args import parse_args
from servesim.mocker.config import core_config_text, load_mocker_engine_args
from servesim.mocker.main import graceful_shutdown, launch_workers

import cases


def _get(url, timeout=5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _post(url, body, timeout=30.0):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def _wait_healthy(url, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _get(url + "/health", timeout=1.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} not healthy within {timeout} s")


def _check_serving(url, model):
    status, body = _post(url + "/v1/completions", {"model": model, "prompt": "hello there world", "max_tokens": 5})
    assert status == 200
    reply = json.loads(body)
    assert reply["object"] == "text_completion"
    assert reply["model"] == model
    assert reply["usage"]["completion_tokens"] == 5
    assert reply["choices"][0]["finish_reason"] == "length"
    status, body = _post(
        url + "/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True},
    )
    assert status == 200
    events = [line[len("data: "):] for line in body.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[0])["object"] == "chat.completion.chunk"
    status, text = _get(url + "/metrics")
    assert status == 200
    assert "vllm:num_requests_running" in text
    # Both requests were counted (summed over the workers).
    finished = [line for line in text.splitlines() if line.startswith("vllm:time_to_first_token_seconds_count")]
    assert finished and sum(float(line.rsplit(" ", 1)[1]) for line in finished) == 2.0


def _mocker(*flags, env=None):
    full_env = dict(os.environ, DYN_HTTP_PORT="0", PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.Popen(
        [sys.executable, "-m", "servesim.mocker", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )


def _serving_url(proc, timeout=30.0):
    """Reads the process's stdout up to its `servesim: serving ...` line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.match(r"servesim: serving (\S+) on (http://\S+) \((\d+) worker", line)
        if m:
            return m.group(1), m.group(2), int(m.group(3))
    proc.kill()
    raise AssertionError(f"no serving line; stderr: {proc.stderr.read()}")


def test_python_m_mocker_serves_and_stops_cleanly_on_sigterm():
    proc = _mocker(
        "--num-workers", "2", "--speedup-ratio", "0", "--model-name", "tiny",
        # Flags of Dynamo's distributed runtime: accepted, ignored.
        "--discovery-backend", "file", "--event-plane", "zmq", "--request-plane", "tcp",
    )
    try:
        model, url, workers = _serving_url(proc)
        assert (model, workers) == ("tiny", 2)
        _wait_healthy(url)
        _check_serving(url, "tiny")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - started < 5.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigint_also_stops_cleanly_and_kv_router_flags_select_the_kv_router():
    proc = _mocker("--num-workers", "2", "--speedup-ratio", "0", "--router-mode", "kv", "--router-temperature", "0")
    try:
        model, url, _ = _serving_url(proc)
        assert model == "servesim-model"
        _wait_healthy(url)
        _check_serving(url, model)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-workers", "x"], "argument --num-workers: invalid int value: 'x'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--disaggregation-mode", "both"], "argument --disaggregation-mode: invalid choice: 'both'"),
        (["--ais-system", "a", "--aic-system", "b"], "--ais-system and its legacy --aic spelling cannot be combined"),
    ],
)
def test_bad_flags_are_argparse_errors_with_exit_code_2(flags, message):
    proc = subprocess.run(
        [sys.executable, "-m", "servesim.mocker", *flags], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stderr.startswith("usage: ")


def test_launch_workers_in_process_releases_the_gil_and_stops_on_graceful_shutdown(monkeypatch):
    monkeypatch.setenv("DYN_HTTP_PORT", "0")
    args = parse_args(["--num-workers", "2", "--speedup-ratio", "1", "--model-name", "inproc"])
    cfg = load_mocker_engine_args(args)
    ticks = 0
    stop_ticking = threading.Event()

    def tick():
        nonlocal ticks
        while not stop_ticking.is_set():
            ticks += 1
            time.sleep(0.001)

    checked = {}

    def client(servers):
        # A plain Python thread talks to the server while launch_workers waits on the loop.
        try:
            url = servers[0].url
            _wait_healthy(url)
            _check_serving(url, "inproc")
            checked["ok"] = True
        except BaseException as e:  # reported below
            checked["error"] = e

    async def run():
        loop = asyncio.get_running_loop()
        holder = {}

        def started(servers):
            holder["servers"] = servers
            holder["client"] = threading.Thread(target=client, args=(servers,))
            holder["client"].start()

        task = loop.create_task(launch_workers(args, cfg, on_started=started))
        while "client" not in holder:
            await asyncio.sleep(0.01)
        await loop.run_in_executor(None, holder["client"].join)
        assert not holder["servers"][0].stopped
        await graceful_shutdown(holder["servers"])
        await asyncio.wait_for(task, timeout=10)
        return holder["servers"][0]

    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.perf_counter()
    try:
        server = asyncio.run(run())
    finally:
        stop_ticking.set()
        ticker.join()
    elapsed = time.perf_counter() - started
    assert checked.get("ok"), checked.get("error")
    assert server.stopped
    assert server.shutdown_report() == {"drained": True, "forced": False, "aborted_connections": 0}
    # A thread starved of the GIL would have counted (almost) nothing.
    assert ticks > elapsed * 100


def test_wait_releases_the_gil_and_requests_are_served_meanwhile():
    cfg = core_config_text({"engine": {"speedup_ratio": 0}})
    with _core.LiveServer(cfg, port=0, num_workers=1, model_name="m") as server:
        _wait_healthy(server.url)
        waited = {}

        def block():
            started = time.perf_counter()
            waited["result"] = server.wait(0.5)
            waited["seconds"] = time.perf_counter() - started

        t = threading.Thread(target=block)
        t.start()
        counter = 0
        deadline = time.perf_counter() + 0.3
        while time.perf_counter() < deadline:
            counter += 1
        # This thread ran (and talked to the server) while the other one sat in wait().
        _check_serving(server.url, "m")
        t.join()
        assert counter > 10_000
        assert waited["result"] is False and waited["seconds"] >= 0.45
    assert server.stopped


def test_live_server_shutdown_is_idempotent_and_wait_reports_it():
    cfg = core_config_text({"engine": {"speedup_ratio": 0}})
    server = _core.LiveServer(cfg, port=0, num_workers=3, model_name="m")
    assert server.address[0] == "127.0.0.1" and server.address[1] > 0
    assert server.num_workers == 3 and server.model_name == "m"
    assert server.shutdown_report() is None
    _wait_healthy(server.url)
    server.shutdown()
    server.shutdown()
    assert server.wait(10.0)
    server.shutdown(force=True)
    assert server.stopped
    assert server.shutdown_report()["drained"]
    with pytest.raises(OSError):
        _get(server.url + "/health", timeout=1.0)


def test_a_busy_port_is_an_os_error_and_bad_options_value_errors():
    cfg = core_config_text({})
    with _core.LiveServer(cfg, port=0) as server:
        with pytest.raises(OSError, match="cannot listen"):
            _core.LiveServer(cfg, port=server.address[1])
    with pytest.raises(ValueError, match="router_mode"):
        _core.LiveServer(cfg, port=0, router_mode="random")
    with pytest.raises(ValueError, match="one port per worker"):
        _core.LiveServer(cfg, port=0, num_workers=2, zmq_kv_events_ports=[5555])


def test_the_live_router_reads_its_policy_file(tmp_path):
    # router_policy_config (as `--router-policy-config` passes it) is read when the server is
    # built: a missing or bad file is the reference's ValueError, a good one serves.
    cfg = core_config_text({})
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ValueError, match="^" + re.escape(f"failed to read router policy config {missing}: ")):
        _core.LiveServer(cfg, port=0, router_mode="kv_router", router_config=json.dumps({"router_policy_config": str(missing)}))
    bad = tmp_path / "bad.yaml"
    bad.write_text("- 1\n")
    with pytest.raises(ValueError, match="^" + re.escape(f"failed to parse router policy config {bad}: ")):
        _core.LiveServer(cfg, port=0, router_mode="kv_router", router_config=json.dumps({"router_policy_config": str(bad)}))
    good = tmp_path / "classes.yaml"
    good.write_text(cases.POLICY_CLASSES)
    rc = json.dumps({"router_policy_config": str(good)})
    with _core.LiveServer(cfg, port=0, router_mode="kv_router", router_config=rc) as server:
        assert not server.stopped


def test_stagger_delay_holds_the_later_workers(monkeypatch):
    monkeypatch.setenv("DYN_HTTP_PORT", "0")
    args = parse_args(["--num-workers", "2", "--stagger-delay", "1.0", "--speedup-ratio", "0"])
    cfg = load_mocker_engine_args(args)

    async def run():
        holder = {}
        task = asyncio.get_running_loop().create_task(
            launch_workers(args, cfg, on_started=lambda s: holder.setdefault("servers", s))
        )
        while "servers" not in holder:
            await asyncio.sleep(0.01)
        url = holder["servers"][0].url
        t0 = time.monotonic()
        # The frontend is ready when its last worker is: one stagger delay after the first.
        first = await asyncio.get_running_loop().run_in_executor(None, _get, url + "/health")
        while (await asyncio.get_running_loop().run_in_executor(None, _get, url + "/health"))[0] != 200:
            await asyncio.sleep(0.05)
        waited = time.monotonic() - t0
        await graceful_shutdown(holder["servers"])
        await asyncio.wait_for(task, timeout=10)
        return first, waited

    first, waited = asyncio.run(run())
    assert first[0] == 503 and json.loads(first[1])["status"] == "notready"
    assert 0.7 < waited < 3.0


def test_invalid_stagger_delay_is_the_reference_error(monkeypatch):
    monkeypatch.setenv("DYN_HTTP_PORT", "0")
    args = parse_args(["--stagger-delay", "-2"])
    with pytest.raises(ValueError, match=r"Invalid --stagger-delay value: -2.0\. Use -1 for auto mode"):
        asyncio.run(launch_workers(args, load_mocker_engine_args(args)))


def test_model_directory_sets_kv_bytes_and_the_served_name(tmp_path):
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 256,
             "torch_dtype": "bfloat16", "max_position_embeddings": 4096}
        )
    )
    from servesim.mocker.utils.kv_cache import compute_kv_bytes_per_token

    assert compute_kv_bytes_per_token(str(model)) == 4 * 2 * 2 * 32 * 2
    assert compute_kv_bytes_per_token(str(model), "fp8") == 4 * 2 * 2 * 32
    assert compute_kv_bytes_per_token(str(tmp_path / "absent")) is None
    proc = _mocker("--model-path", str(model), "--speedup-ratio", "0")
    try:
        name, url, _ = _serving_url(proc)
        # Dynamo names a model by the --model-path it was given when --model-name is unset (its
        # frontend's model group for this directory was the path string).
        assert name == str(model)
        _wait_healthy(url)
        models = json.loads(_get(url + "/v1/models")[1])
        assert [m["id"] for m in models["data"]] == [str(model)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert "kv_bytes_per_token" not in proc.stderr.read()  # computed without a warning
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

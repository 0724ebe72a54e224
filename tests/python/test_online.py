"""``replay_mode="online"``: the offline replay paced on the wall clock. The simulated numbers are
the offline run's; the call lasts about the simulated duration; Ctrl-C stops it; the reference's
online-only restrictions hold.

The reference's behaviour quoted here was probed with Dynamo 1.6.1 (the dynamo venv of
``/work/helpers/common.md``): ``dynamo.replay.run_trace_replay(trace, replay_mode="online", ...)``
on a 10-request Mooncake trace, one request every 50 ms. Its online mode is driven by the wall
clock, so its numbers jitter between runs (0.57 s wall for 571 ms simulated); servesim's are exact.
"""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from servesim.replay import TelemetryOptions, run_synthetic_trace_replay, run_trace_replay

from cases import WALL_CLOCK

EXAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "trace-examples"


def _offline(summary):
    return {k: v for k, v in summary.items() if k not in WALL_CLOCK}


@pytest.fixture
def trace(tmp_path):
    """The probe's trace: 10 requests, one every 50 ms."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(
        json.dumps({"timestamp": i * 50, "input_length": 512, "output_length": 16, "hash_ids": [i * 10 + j for j in range(4)]})
        + "\n"
        for i in range(10)
    ))
    return str(path)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        # Split by worker (round robin): every shard is paced.
        {"num_workers": 3, "sla_ttft_ms": 50.0},
        {"num_workers": 2, "router_mode": "kv_router"},
        {"replay_concurrency": 2, "extra_engine_args": {"dp_size": 2}},
    ],
)
def test_online_returns_the_offline_summary(trace, kwargs):
    offline = run_trace_replay(trace, **kwargs)
    started = time.perf_counter()
    online = run_trace_replay(trace, replay_mode="online", **kwargs)
    wall = time.perf_counter() - started
    assert type(online) is dict
    assert list(online) == list(offline.summary)
    assert _offline(online) == _offline(offline.summary)
    duration_s = online["duration_ms"] / 1000.0
    assert duration_s > 0.45
    assert duration_s <= wall < 3 * duration_s + 0.5
    # The wall time the summary reports covers the paced run.
    assert online["wall_time_ms"] >= online["duration_ms"]


def test_online_synthetic_replay_is_paced_too():
    args = (256, 16, 20)
    offline = run_synthetic_trace_replay(*args, request_rate=40.0)
    started = time.perf_counter()
    online = run_synthetic_trace_replay(*args, request_rate=40.0, replay_mode="online")
    wall = time.perf_counter() - started
    assert _offline(online) == _offline(offline.summary)
    duration_s = online["duration_ms"] / 1000.0
    assert duration_s > 0.3
    assert duration_s <= wall < 3 * duration_s + 0.5


def test_online_agentic_summary_has_the_model_projection():
    trace = EXAMPLES / "agentic_mooncake" / "agentic_v2.jsonl"
    if not trace.exists():
        pytest.skip(f"{trace} is missing (the shared reference beside the checkout)")
    kwargs = dict(trace_format="agentic_mooncake", execution_model="target-model")
    offline = run_trace_replay(str(trace), **kwargs)
    online = run_trace_replay(str(trace), replay_mode="online", **kwargs)
    assert _offline(online) == _offline(offline.summary)
    assert online["agentic_model_projection"]["target_model"] == "target-model"


def test_online_report_jsonl_path_writes_the_offline_records(trace, tmp_path):
    # The reference writes the online run's records too (all at the end of the run).
    online_path, offline_path = tmp_path / "online.jsonl", tmp_path / "offline.jsonl"
    run_trace_replay(trace, replay_mode="online", report_jsonl_path=online_path)
    run_trace_replay(trace, report_jsonl_path=offline_path)

    def records(path):
        # uuids are random per run, as in the reference.
        return [{k: v for k, v in json.loads(line).items() if k != "uuid"} for line in path.read_text().splitlines()]

    assert len(records(online_path)) == 10
    assert records(online_path) == records(offline_path)


def test_sigint_from_a_thread_stops_a_paced_replay():
    # Three requests a minute apart: two minutes paced.
    fired = []

    def interrupt():
        time.sleep(0.5)
        fired.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    started = time.perf_counter()
    thread.start()
    with pytest.raises(KeyboardInterrupt):
        run_synthetic_trace_replay(128, 4, 3, arrival_interval_ms=60_000.0, replay_mode="online")
    stopped = time.perf_counter()
    thread.join()
    assert fired and stopped - fired[0] < 1.0
    assert stopped - started < 2.0


# The reference's online-only errors (probed as above), and the checks around them.
@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"kv_event_lag_ms": 5.0}, ValueError, "kv_event_lag_ms only supports replay_mode='offline'"),
        ({"max_sim_time_ms": 0}, ValueError, "max_sim_time_ms only supports replay_mode='offline'"),
        ({"max_sim_time_ms": -1}, ValueError, "max_sim_time_ms must be a finite, non-negative value"),
        ({"kv_event_lag_ms": -1}, ValueError, "kv_event_lag_ms must be finite and non-negative, got -1"),
        (
            {"prefill_engine_args": {"engine": {"worker_type": "prefill"}},
             "decode_engine_args": {"engine": {"worker_type": "decode"}}},
            Exception,
            "disagg replay only supports replay_mode='offline'",
        ),
        ({"num_workers": 0}, Exception, "online replay requires num_workers >= 1"),
        # The mode is checked before the telemetry options' values.
        ({"telemetry_options": TelemetryOptions(sample_interval_ms=-1)}, ValueError,
         "replay telemetry only supports replay_mode='offline'"),
        ({"capture_per_request": True}, ValueError,
         "capture_per_request only supports replay_mode='offline'; use report_jsonl_path for online request records"),
        ({"planner_config": {}}, ValueError, "planner_config replay only supports replay_mode='offline'"),
        # Checked before the lag's mode, as the reference does.
        ({"kv_event_lag_ms": 5.0, "max_sim_time_ms": 3}, ValueError, "kv_event_lag_ms only supports replay_mode='offline'"),
        ({"replay_concurrency": 0, "num_workers": 0}, Exception, "replay_concurrency must be at least 1"),
    ],
)
def test_online_errors_are_the_references(trace, kwargs, error, message):
    with pytest.raises(Exception) as info:
        run_trace_replay(trace, replay_mode="online", **kwargs)
    assert type(info.value) is error
    assert str(info.value) == message


def test_online_accepts_what_costs_nothing_offline(trace):
    # A zero lag is no lag (the reference accepts it online).
    summary = run_trace_replay(trace, replay_mode="online", kv_event_lag_ms=0.0)
    assert summary["completed_requests"] == 10


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"kv_event_lag_ms": 5.0}, ValueError, "kv_event_lag_ms only supports replay_mode='offline'"),
        (
            {"prefill_engine_args": {"engine": {"worker_type": "prefill"}},
             "decode_engine_args": {"engine": {"worker_type": "decode"}}},
            Exception,
            "disagg replay only supports replay_mode='offline'",
        ),
        ({"num_workers": 0}, Exception, "online replay requires num_workers >= 1"),
        ({"capture_per_request": True}, ValueError, "capture_per_request only supports replay_mode='offline'"),
    ],
)
def test_online_synthetic_errors_are_the_references(kwargs, error, message):
    with pytest.raises(Exception) as info:
        run_synthetic_trace_replay(16, 2, 2, request_rate=5.0, replay_mode="online", **kwargs)
    assert type(info.value) is error
    assert str(info.value) == message


def test_offline_range_errors_are_the_references(trace):
    # Offline too: ValueErrors with the reference's wording.
    for kwargs, message in [
        ({"max_sim_time_ms": -1}, "max_sim_time_ms must be a finite, non-negative value"),
        ({"kv_event_lag_ms": -1.5}, "kv_event_lag_ms must be finite and non-negative, got -1.5"),
    ]:
        with pytest.raises(ValueError) as info:
            run_trace_replay(trace, **kwargs)
        assert str(info.value) == message

"""What the binding itself must do: release the GIL during a replay, stop on Ctrl-C, and
return the report shapes the API promises (no reference needed)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from servesim.mocker import ReasoningConfig, run_mocker_trace_replay
from servesim.replay import ReplayReport, run_synthetic_trace_replay, run_trace_replay

from cases import TRACES

# Long enough to interrupt: a few seconds of replay.
LONG = dict(input_tokens=2048, output_tokens=256, request_count=400_000, request_rate=2000.0)


def _synthetic(**kw):
    args = dict(input_tokens=256, output_tokens=16, request_count=200, request_rate=50.0)
    args.update(kw)
    return run_synthetic_trace_replay(args.pop("input_tokens"), args.pop("output_tokens"), args.pop("request_count"), **args)


def test_gil_is_released_during_a_replay():
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    started = time.perf_counter()
    # Replays back to back for at least 0.3 s, however fast one is on this machine.
    replays = 0
    while time.perf_counter() - started < 0.3:
        _synthetic(request_count=60_000, request_rate=500.0, num_workers=1)
        replays += 1
    elapsed = time.perf_counter() - started
    stop.set()
    t.join()
    # A thread that never got the GIL would have counted only between replays.
    assert ticks > elapsed * 100, (ticks, elapsed, replays)


def test_ctrl_c_stops_a_long_replay():
    code = (
        "import sys\n"
        "from servesim.replay import run_synthetic_trace_replay\n"
        "print('start', flush=True)\n"
        "try:\n"
        f"    run_synthetic_trace_replay(**{LONG!r})\n"
        "    print('finished')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "start"
    time.sleep(0.5)
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == "interrupted"
    assert time.perf_counter() - sent < 2.0


def test_report_shapes():
    report = _synthetic(capture_per_request=True, sla_ttft_ms=1000)
    assert isinstance(report, ReplayReport)
    assert list(report.to_dict()) == ["summary", "per_request", "coverage", "planner"]
    assert report.coverage == {"capture_per_request": True, "capture_planner_details": False, "per_request_records": 200}
    assert report.planner is None
    assert len(report.summary) == 84 and "goodput_completed_requests" in report.summary
    # One-turn synthetic requests are outside any session: Dynamo 1.6.1 reports null.
    assert (report.per_request[0]["session_id"], report.per_request[0]["turn_index"]) == (None, None)
    without = _synthetic()
    assert without.per_request is None and len(without.summary) == 81
    # Online runs are paced on the wall clock (test_online.py): a short one.
    online = _synthetic(request_count=20, request_rate=200.0, replay_mode="online")
    assert isinstance(online, dict) and online["num_requests"] == 20 and len(online) == 81


def test_report_jsonl_path_writes_the_records(tmp_path):
    path = tmp_path / "records.jsonl"
    report = _synthetic(report_jsonl_path=path, capture_per_request=True)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 200
    assert list(lines[0])[:3] == ["session_id", "turn_index", "uuid"]
    assert [r["arrival_time_ms"] for r in lines] == [r["arrival_time_ms"] for r in report.per_request]


def test_reasoning_config_and_engine_args_forms(tmp_path):
    rc = ReasoningConfig(1, 2, 1.5)  # not range-checked here, as in the reference
    assert (rc.start_thinking_token_id, rc.end_thinking_token_id, rc.thinking_ratio) == (1, 2, 1.5)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(
        json.dumps({"timestamp": i * 100, "input_length": 1024, "output_length": 8, "hash_ids": [i, i + 1]}) + "\n"
        for i in range(10)
    ))
    as_map = run_mocker_trace_replay(str(trace), extra_engine_args={"engine": {"block_size": 16}})
    as_text = run_mocker_trace_replay(trace, extra_engine_args='{"engine": {"block_size": 16}}')
    drop = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
    assert {k: v for k, v in as_map.summary.items() if k not in drop} == {
        k: v for k, v in as_text.summary.items() if k not in drop
    }
    # A planner for disaggregated pools does not fit aggregated workers.
    with pytest.raises(Exception, match="planner_config: mode \"disagg\" does not match the cluster"):
        run_trace_replay(str(trace), planner_config={"mode": "disagg"})


# The reference's own example (shared/reference/aisimulate-howto.md, Dynamo 1.6.1's
# run_trace_replay with the planner in the loop): 3993 completed, gpu_hours 0.777305869102486,
# 204 ticks, 128 scaling events.
PLANNER_EXAMPLE = {
    "mode": "agg", "optimization_target": "load",
    "decode_scale_up_kv_rate": 90, "decode_scale_down_kv_rate": 70,
    "load_adjustment_interval_seconds": 5, "max_gpu_budget": 8, "decode_engine_num_gpu": 1,
    "report_interval_hours": None, "live_dashboard_port": 0,
}


def test_planner_in_the_loop_matches_the_reference_example():
    trace = TRACES / "mooncake_synthetic_trace.jsonl"
    if not trace.exists():
        pytest.skip(f"{trace} is missing (the shared traces beside the checkout)")
    kwargs = dict(
        trace_format="mooncake", trace_block_size=512,
        extra_engine_args={"engine": {"backend": "vllm", "num_gpu_blocks": 4096}},
        num_workers=1, router_mode="round_robin",
    )
    report = run_trace_replay([str(trace)], planner_config=PLANNER_EXAMPLE, **kwargs)
    s, p = report.summary, report.planner
    assert s["completed_requests"] == 3993
    assert s["gpu_hours"] == pytest.approx(0.777305869102486, rel=1e-9)
    assert s["planner_total_ticks"] == p.total_ticks == 204
    assert len(p.scaling_events) == 128
    assert list(report.to_dict()["planner"]) == [
        "metadata", "ticks", "scaling_events", "lifecycle_operations", "total_ticks", "html_report_path",
    ]
    assert len(p.ticks) == 204 and p.html_report_path is None
    assert report.coverage == {"capture_per_request": False, "capture_planner_details": True, "per_request_records": 0}
    # Without details: the same decisions, no tick records.
    lean = run_trace_replay([str(trace)], planner_config=json.dumps(PLANNER_EXAMPLE), capture_planner_details=False, **kwargs)
    assert lean.planner.ticks == [] and lean.planner.scaling_events == p.scaling_events
    assert lean.coverage["capture_planner_details"] is False


def test_prefetch_model_resolves_local_paths_and_the_hugging_face_cache(tmp_path, monkeypatch, caplog):
    import asyncio

    from servesim.mocker.main import prefetch_model

    model = tmp_path / "model"
    model.mkdir()
    assert asyncio.run(prefetch_model(str(model))) == str(model)

    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    repo = hub / "models--acme--tiny-llm"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "def456").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("def456\n")
    assert asyncio.run(prefetch_model("acme/tiny-llm")) == str(repo / "snapshots" / "def456")

    # Without refs/main, a single snapshot is the answer; two are ambiguous.
    (repo / "refs" / "main").unlink()
    with caplog.at_level("WARNING"):
        assert asyncio.run(prefetch_model("acme/tiny-llm")) == "acme/tiny-llm"
    assert "not in the Hugging Face cache" in caplog.text
    (repo / "snapshots" / "abc123").rmdir()
    assert asyncio.run(prefetch_model("acme/tiny-llm")) == str(repo / "snapshots" / "def456")

    # Not local, not cached: returned as given (servesim never downloads).
    assert asyncio.run(prefetch_model("acme/absent")) == "acme/absent"


# Recorded from Dynamo 1.6.1 (the reference venv of ../shared/parity/setup.sh) with
#   run_synthetic_trace_replay(256, 16, 50, request_rate=5.0, arrival_speedup_ratio=2.0)
#   run_synthetic_trace_replay(256, 16, 50, arrival_interval_ms=100.0, arrival_speedup_ratio=4.0)
# (duration_ms 9066.80213573226 at speedup 1: the speedup divides the generated arrivals).
def test_synthetic_arrival_speedup_ratio_compresses_the_generated_arrivals():
    s = run_synthetic_trace_replay(256, 16, 50, request_rate=5.0, arrival_speedup_ratio=2.0).summary
    assert s["duration_ms"] == pytest.approx(4586.761025366127, rel=1e-12)
    assert s["mean_ttft_ms"] == pytest.approx(29.681790367692173, rel=1e-9)
    s = run_synthetic_trace_replay(256, 16, 50, arrival_interval_ms=100.0, arrival_speedup_ratio=4.0).summary
    assert s["duration_ms"] == pytest.approx(1359.7073919999996, rel=1e-12)


@pytest.mark.parametrize(
    "kw",
    [{}, {"request_rate": 5.0, "arrival_interval_ms": 10.0}, {"request_rate": 5.0, "replay_concurrency": 2}],
)
def test_synthetic_replay_needs_exactly_one_load_control(kw):
    with pytest.raises(Exception) as e:
        run_synthetic_trace_replay(256, 16, 50, **kw)
    assert type(e.value) is Exception
    assert str(e.value) == (
        "synthetic replay requires exactly one of replay_concurrency, request_rate, or arrival_interval_ms"
    )


@pytest.mark.parametrize("ratio, shown", [(0.0, "0"), (-1.0, "-1"), (float("nan"), "NaN")])
def test_synthetic_arrival_speedup_ratio_must_be_positive(ratio, shown):
    with pytest.raises(Exception) as e:
        run_synthetic_trace_replay(256, 16, 5, request_rate=5.0, arrival_speedup_ratio=ratio)
    assert str(e.value) == f"arrival_speedup_ratio must be a finite positive number, got {shown}"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_num_workers_is_refused_for_a_disaggregated_replay(num_workers):
    # Dynamo 1.6.1's message for the same call.
    prefill = {"engine": {"block_size": 64, "num_gpu_blocks": 8192, "worker_type": "prefill"}}
    decode = {"engine": {"block_size": 64, "num_gpu_blocks": 4096, "worker_type": "decode"}}
    with pytest.raises(Exception) as e:
        run_synthetic_trace_replay(
            256, 16, 5, request_rate=5.0, prefill_engine_args=prefill, decode_engine_args=decode, num_workers=num_workers
        )
    assert str(e.value) == (
        "num_workers is only used for aggregated replay; use num_prefill_workers and num_decode_workers for disagg replay"
    )

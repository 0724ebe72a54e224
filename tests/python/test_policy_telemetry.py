"""Router policy classes (``router_config``'s ``router_policy_config``) and ``telemetry_options``
through the Python API.

The parity half compares with goldens recorded from Dynamo 1.6.1 in a scratch directory:

    /tmp/servesim-ref2/bin/python scripts/record_python_goldens.py --extras

(writes goldens/extras.json from ``cases.extras_outcomes``; the ``samples_<i>`` entries are
the telemetry samples of ``cases.TELEMETRY_SAMPLE_CASES``, compared whole: same keys in the same
order, integers and ids exact, floats to 1e-6). The rest checks what the samples promise: their
counters add up to the summary, every sink sees the same samples, a raising callback stops the
run.
"""

import json
import math
import time

import pytest

import cases
from servesim.replay import (
    ReplayReport,
    ReplayTelemetryDetails,
    TelemetryOptions,
    run_synthetic_trace_replay,
    run_trace_replay,
)

EXTRAS = json.loads((cases.GOLDENS / "extras.json").read_text())
REL = cases.REL
WALL_CLOCK = cases.WALL_CLOCK
_close = cases.close


def _same_sample(got, expected, path, off):
    """Collects where ``got`` departs from ``expected``: keys and their order, list lengths,
    types, integers and strings exactly, floats to ``REL``."""
    if isinstance(expected, dict):
        if not isinstance(got, dict) or list(got) != list(expected):
            off.append((path, "keys", list(got) if isinstance(got, dict) else got, list(expected)))
            return
        for k in expected:
            _same_sample(got[k], expected[k], f"{path}.{k}", off)
    elif isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            off.append((path, "length", got, expected))
            return
        for i, (g, e) in enumerate(zip(got, expected)):
            _same_sample(g, e, f"{path}[{i}]", off)
    elif type(got) is not type(expected) or not _close(got, expected):
        off.append((path, got, expected))


# Behind a KV router the reference's worker gauges during a pass show its admissions but not
# yet its completions, a state servesim's engines do not keep (docs/telemetry.md, "Known
# gaps"): there, running/waiting requests and block counts are not compared.
KV_GAUGES = ("running_requests", "waiting_requests", "active_blocks", "inactive_blocks")
KV_ROUTER_SAMPLES = {"samples_2"}


def _without_gauges(outcome):
    out = json.loads(json.dumps(outcome))
    for sample in out["samples"]:
        for w in sample["prefill_scheduler_metrics"] + sample["decode_scheduler_metrics"]:
            for k in KV_GAUGES + ("active_cache_usage", "physical_cache_usage"):
                w[k] = None
    return out


def _assert_same(got, expected, case_id=None):
    if "samples" in expected:
        if case_id in KV_ROUTER_SAMPLES:
            got, expected = _without_gauges(got), _without_gauges(expected)
        off = []
        _same_sample(got, expected, "", off)
        assert not off, off[:10]
        return
    if "error" in expected:
        assert got.get("error") == expected["error"]
        return
    assert "error" not in got, got["error"]
    assert list(got["summary"]) == list(expected["summary"])
    off = {k: (got["summary"][k], v) for k, v in expected["summary"].items() if not _close(got["summary"][k], v)}
    assert not off, off
    for key in set(expected) - {"summary", "records"}:
        assert got[key] == expected[key], key
    if "records" in expected:
        assert len(got["records"]) == len(expected["records"])
        for g, e in zip(got["records"], expected["records"]):
            assert all(_close(a, b) for a, b in zip(g, e)), (g, e)


@pytest.fixture(scope="module")
def servesim_extras(tmp_path_factory):
    return cases.extras_outcomes("servesim.mocker", tmp_path_factory.mktemp("extras"))


@pytest.mark.parametrize("case_id", list(EXTRAS))
def test_matches_reference(case_id, servesim_extras):
    _assert_same(servesim_extras[case_id], EXTRAS[case_id], case_id)


def test_policy_goldens_tell_the_classes_apart():
    # The recorded runs differ where they should, so matching them means the policy is applied:
    # latency requests (even input lengths) go first under the policy file.
    def mean_ttft(case_id, parity):
        rows = [t for n, t in EXTRAS[case_id]["records"] if n % 2 == parity]
        return sum(rows) / len(rows)

    assert mean_ttft("policy_2", 0) < 0.6 * mean_ttft("policy_2", 1)
    assert math.isclose(mean_ttft("policy_0", 0), mean_ttft("policy_0", 1), rel_tol=0.01)
    # Same requests, same TTFTs (the summaries' means differ in the last bits: the reference
    # sums in no fixed order).
    assert EXTRAS["policy_3"]["records"] == EXTRAS["policy_2"]["records"]  # model m1's profile
    assert EXTRAS["policy_4"]["records"] == EXTRAS["policy_0"]["records"]  # no profile for "other"
    assert EXTRAS["policy_5"]["records"] == EXTRAS["policy_0"]["records"]  # no model name


# --- router policy: servesim's own checks ------------------------------------------------


def _burst(tmp_path, monkeypatch, router_config, **kw):
    cases.write_extras_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    return run_trace_replay(
        "burst.jsonl",
        trace_block_size=64,
        extra_engine_args=cases.POLICY_ENGINE,
        num_workers=2,
        router_mode="kv_router",
        router_config=router_config,
        **kw,
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("- 1\n- 2\n", "failed to parse router policy config bad.yaml: "),
        (
            "policy_classes: [{name: x, policy_family: latency, cache_bucket: cached, quantum: 1, bogus: 3}]\n",
            "failed to parse router policy config bad.yaml: `policy_classes[0]`: unknown field `bogus`",
        ),
        ("router: {router_queue_threshold: 1}\n", "failed to parse router policy config bad.yaml: `router`: "),
    ],
)
def test_a_bad_policy_file_is_a_value_error_naming_it(tmp_path, monkeypatch, text, message):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ValueError) as e:
        _burst(tmp_path, monkeypatch, {"router_policy_config": "bad.yaml"})
    assert str(e.value).startswith(message), str(e.value)


def test_the_policy_environment_variable_is_not_read(tmp_path, monkeypatch):
    # As in the reference's replay: only the router configuration names a policy file.
    monkeypatch.setenv("DYN_ROUTER_POLICY_CONFIG", str(tmp_path / "classes.yaml"))
    with_env = _burst(tmp_path, monkeypatch, None).summary
    monkeypatch.delenv("DYN_ROUTER_POLICY_CONFIG")
    without = _burst(tmp_path, monkeypatch, None).summary
    assert with_env["mean_ttft_ms"] == without["mean_ttft_ms"]


def test_policy_config_in_a_json_router_config(tmp_path, monkeypatch):
    by_mapping = _burst(tmp_path, monkeypatch, {"router_policy_config": "classes.yaml"}).summary
    by_text = _burst(tmp_path, monkeypatch, '{"router_policy_config": "classes.yaml"}').summary
    assert by_mapping["mean_ttft_ms"] == by_text["mean_ttft_ms"]
    assert by_mapping["mean_ttft_ms"] != _burst(tmp_path, monkeypatch, None).summary["mean_ttft_ms"]


# --- telemetry: servesim's samples -----------------------------------------------------------

AGG = dict(num_workers=3, router_mode="kv_router", shared_prefix_ratio=0.5, num_prefix_groups=2, turns_per_session=3)
DISAGG = dict(
    prefill_engine_args={"engine": {"worker_type": "prefill"}},
    decode_engine_args={"engine": {"worker_type": "decode"}},
    num_prefill_workers=2,
    num_decode_workers=2,
)


def _synthetic(telemetry_options=None, **kw):
    return run_synthetic_trace_replay(512, 64, 60, request_rate=20.0, telemetry_options=telemetry_options, **kw)


def _workers(sample):
    return sample["prefill_scheduler_metrics"] + sample["decode_scheduler_metrics"]


@pytest.mark.parametrize("topology", [AGG, DISAGG], ids=["aggregated", "disaggregated"])
def test_sample_counters_add_up_to_the_summary(topology):
    report = _synthetic(TelemetryOptions(sample_interval_ms=250), **topology)
    assert isinstance(report, ReplayReport) and isinstance(report.telemetry, ReplayTelemetryDetails)
    s, samples = report.summary, report.telemetry.samples
    assert report.telemetry.sample_interval_ms == 250.0
    traffic = [x["traffic"] for x in samples]
    assert sum(t["arriving_requests"] for t in traffic) == s["num_requests"] == 60 * topology.get("turns_per_session", 1)
    assert sum(t["completed_requests"] for t in traffic) == s["completed_requests"]
    assert sum(t["avg_osl"] * t["completed_requests"] for t in traffic) == s["total_output_tokens"]
    assert sum(t["avg_isl"] * t["completed_requests"] for t in traffic) == s["total_input_tokens"]
    assert sum(t["ttft_count"] for t in traffic) == s["num_ttft_samples"]
    mean_ttft = sum(t["avg_ttft_ms"] * t["ttft_count"] for t in traffic) / s["num_ttft_samples"]
    assert math.isclose(mean_ttft, s["mean_ttft_ms"], rel_tol=1e-9)
    mean_itl = sum(t["avg_itl_ms"] * t["itl_count"] for t in traffic) / s["num_tpot_samples"]
    assert math.isclose(mean_itl, s["mean_tpot_ms"], rel_tol=1e-9)
    # A baseline at t = 0, one sample every 250 ms of simulated time, a final one at the end.
    assert [x["sample_ordinal"] for x in samples] == list(range(len(samples)))
    assert [x["kind"] for x in samples] == ["baseline"] + ["periodic"] * (len(samples) - 2) + ["final"]
    assert [x["sampled_at_ms"] for x in samples[:-1]] == [250.0 * i for i in range(len(samples) - 1)]
    assert samples[-1]["sampled_at_ms"] == s["duration_ms"]
    assert [x["interval_start_ms"] for x in samples[1:]] == [x["sampled_at_ms"] for x in samples[:-1]]
    # Every block count stays within the worker's cache; usage is their fraction.
    for w in (w for x in samples for w in _workers(x)):
        assert w["active_blocks"] + w["inactive_blocks"] <= w["total_blocks"]
        assert w["active_cache_usage"] == w["active_blocks"] / w["total_blocks"]
    if "prefill_engine_args" in topology:
        assert {(len(x["prefill_scheduler_metrics"]), len(x["decode_scheduler_metrics"])) for x in samples} == {(2, 2)}
        assert {(tuple(x["active_prefill_ids"]), tuple(x["active_decode_ids"])) for x in samples} == {((0, 1), (0, 1))}
    else:
        assert {len(x["decode_scheduler_metrics"]) for x in samples} == {3}
        assert all(x["prefill_scheduler_metrics"] == [] and x["active_decode_ids"] == [0, 1, 2] for x in samples)
        # KV-router placements with shared prefixes find cached blocks.
        assert sum(x["traffic"]["router_kv_hit_rate_count"] for x in samples) == s["num_requests"]
        assert any(x["traffic"]["avg_router_kv_hit_rate"] > 0 for x in samples)
        assert 0 < s["prefix_cache_reused_ratio"] and s["committed_prefill_tokens"] < s["total_input_tokens"]


def test_telemetry_does_not_change_the_run():
    plain = _synthetic(**AGG).summary
    sampled = _synthetic(TelemetryOptions(sample_interval_ms=100), **AGG).summary
    assert list(plain) == list(sampled)
    off = {k: (plain[k], sampled[k]) for k in plain if k not in WALL_CLOCK and not _close(plain[k], sampled[k])}
    assert not off, off


def test_every_sink_sees_the_same_samples(tmp_path):
    seen = []
    path = tmp_path / "telemetry.jsonl"
    options = TelemetryOptions(sample_interval_ms=200, callback=seen.append, jsonl_path=path, capture_in_memory=True)
    report = _synthetic(options, num_workers=2)
    assert report.telemetry.samples == seen
    assert [json.loads(line) for line in path.read_text().splitlines()] == seen
    assert report.to_dict()["telemetry"] == {"sample_interval_ms": 200.0, "samples": seen}
    # Without in-memory capture the file is still written and the report carries no telemetry.
    path.unlink()
    report = _synthetic(TelemetryOptions(sample_interval_ms=200, jsonl_path=str(path)), num_workers=2)
    assert report.telemetry is None and "telemetry" not in report.to_dict()
    assert [json.loads(line) for line in path.read_text().splitlines()] == seen


def test_a_raising_callback_stops_the_run():
    calls = 0

    def fail(sample):
        nonlocal calls
        calls += 1
        raise RuntimeError(f"sample {sample['kind']} at {sample['sampled_at_ms']}")

    started = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"^sample baseline at 0\.0$"):
        run_synthetic_trace_replay(
            2048, 256, 400_000, request_rate=2000.0, telemetry_options=TelemetryOptions(callback=fail)
        )
    assert calls == 1
    assert time.perf_counter() - started < 5


def test_an_unwritable_telemetry_file_is_an_error(tmp_path):
    # The reference opens the file lazily and ignores this; servesim says so before running.
    missing = tmp_path / "no-such-dir" / "t.jsonl"
    with pytest.raises(Exception, match="no-such-dir/t.jsonl: cannot create"):
        _synthetic(TelemetryOptions(jsonl_path=missing))


def test_options_are_frozen_and_default_as_the_reference():
    options = TelemetryOptions()
    assert repr(options) == "TelemetryOptions(sample_interval_ms=1000.0, capture_in_memory=None, callback=None, jsonl_path=None)"
    with pytest.raises(AttributeError):
        options.sample_interval_ms = 5.0


def test_trace_replay_samples_with_policy_classes(tmp_path, monkeypatch):
    # The burst arrives at t = 0: the baseline sees it routed (the router queue holds what the
    # policy classes keep back, prefill_busy_threshold 0), the first periodic sample counts all
    # 40 arrivals, and the queue drains to empty.
    report = _burst(
        tmp_path,
        monkeypatch,
        {"router_policy_config": "classes.yaml"},
        telemetry_options=TelemetryOptions(sample_interval_ms=50),
    )
    samples = report.telemetry.samples
    traffic = [x["traffic"] for x in samples]
    assert traffic[0]["arriving_requests"] == 0 and traffic[1]["arriving_requests"] == 40
    assert sum(t["arriving_requests"] for t in traffic) == 40
    assert samples[0]["router_pending_decode_requests"] > 0 and samples[-1]["router_pending_decode_requests"] == 0
    assert sum(t["completed_requests"] for t in traffic) == report.summary["completed_requests"] == 40
    assert sum(t["router_kv_hit_rate_count"] for t in traffic) == 40

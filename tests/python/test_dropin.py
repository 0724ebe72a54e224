"""Drop-in differences from Dynamo 1.6.1's dynamo.mocker / dynamo.replay found by the
2026-12 check (shared/reference/python-dropin-2026-12.md), each pinned to the reference's
observed behaviour: values and messages below were printed by the reference (the parity venv
of ../shared/parity/setup.sh plus numpy) for the same calls."""

import asyncio
import json
import sys
import warnings
from types import SimpleNamespace

import pytest

from servesim.llm import KvRouterConfig
from servesim.mocker.args import parse_args, resolve_planner_profile_data
from servesim.mocker.config import (
    apply_worker_engine_args_overrides,
    build_mocker_engine_args,
    build_runtime_config,
    normalize_mocker_config,
)
from servesim.mocker.main import prefetch_model
from servesim.mocker.utils import kv_cache
from servesim.mocker.utils._npz import write_npz
from servesim.replay import PlannerReplayDetails, ReplayReport, run_synthetic_trace_replay, run_trace_replay

ROWS = "".join(
    f'{{"timestamp": {i * 50}, "input_length": {300 + 64 * i}, "output_length": {3 + i}, "hash_ids": [0, {i + 1}]}}\n'
    for i in range(6)
)


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(ROWS)
    return str(path)


def _simulated(summary):
    """A summary without its wall-clock values (the reference's differ run to run as well)."""
    wall = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
    return {k: v for k, v in summary.items() if k not in wall}


def _profile(path, ttft=100.0, itl=200.0):
    write_npz(path, {
        "prefill_isl": ((2,), [1.0, 100.0]),
        "prefill_ttft_ms": ((2,), [ttft, ttft]),
        "decode_active_kv_tokens": ((2,), [1.0, 100.0]),
        "decode_context_length": ((2,), [1.0, 100.0]),
        "decode_itl": ((2, 2), [itl] * 4),
    })
    return path


# --- dynamo_profile timing ---------------------------------------------------------------

def test_dynamo_profile_is_a_timing_provider(tmp_path):
    # Dynamo's own unit test (test_profile_is_an_explicit_timing_provider), through servesim.replay.
    path = _profile(tmp_path / "profile.npz")
    profile = {"type": "external", "provider": "dynamo_profile", "config": {"path": str(path)}}
    config = normalize_mocker_config({"engine": {"timing_model": profile}})
    assert config["engine"]["timing_model"] == profile
    assert normalize_mocker_config(json.dumps(config)) == config
    result = run_synthetic_trace_replay(4, 2, 1, extra_engine_args=config, arrival_interval_ms=10)
    assert result.summary["mean_ttft_ms"] == 100
    assert result.summary["mean_tpot_ms"] == 200
    config["engine"]["timing_model"] = {"type": "fixed", "prefill_ms": 2.0, "decode_ms": 3.0}
    result = run_synthetic_trace_replay(4, 2, 1, extra_engine_args=config, arrival_interval_ms=10)
    assert (result.summary["mean_ttft_ms"], result.summary["mean_tpot_ms"]) == (2, 3)
    with pytest.raises(ValueError, match="planner_profile_data"):
        normalize_mocker_config({"dynamo": {"planner_profile_data": str(path)}})


def test_planner_profile_flag_times_as_the_profile(tmp_path, trace):
    path = _profile(tmp_path / "p.npz", ttft=40.0, itl=7.0)
    args = parse_args(["--planner-profile-data", str(path)])
    args.planner_profile_data = resolve_planner_profile_data(args.planner_profile_data).npz_path
    config = build_mocker_engine_args(args)
    assert config["engine"]["timing_model"] == {
        "type": "external", "provider": "dynamo_profile", "config": {"path": str(path)}}
    report = run_trace_replay([trace], extra_engine_args=config)
    # A flat profile times every pass as the fixed model with the same costs does.
    own = run_trace_replay([trace], extra_engine_args={"engine": {"timing_model": {
        "type": "fixed", "prefill_ms": 40.0, "decode_ms": 7.0}}})
    assert _simulated(report.summary) == _simulated(own.summary)
    assert report.summary["min_ttft_ms"] == 40


def test_dynamo_profile_errors(tmp_path):
    path = str(_profile(tmp_path / "p.npz"))

    def timing(config):
        return {"engine": {"timing_model": {"type": "external", "provider": "dynamo_profile", "config": config}}}

    with pytest.raises(ValueError, match=r'^Failed to open NPZ file: "/nonexistent.npz": No such file'):
        normalize_mocker_config(timing({"path": "/nonexistent.npz"}))
    with pytest.raises(ValueError, match="engine.timing_model.config.extra"):
        normalize_mocker_config(timing({"path": path, "extra": 1}))
    with pytest.raises(ValueError, match="engine.timing_model.config.path"):
        normalize_mocker_config(timing({}))
    with pytest.raises(ValueError, match=r"engine\.timing_model\.config\.path: invalid type: integer `3`, expected path string"):
        normalize_mocker_config(timing({"path": 3}))
    with pytest.raises(ValueError, match='unknown external timing provider "bogus"; expected "ais", "aic" or "dynamo_profile"'):
        normalize_mocker_config({"engine": {"timing_model": {"type": "external", "provider": "bogus", "config": {}}}})


def test_usize_fields_say_usize():
    with pytest.raises(ValueError, match="^invalid engine launch config: tensor_parallel_size: invalid value: integer `-1`, expected usize$"):
        normalize_mocker_config({"tensor_parallel_size": -1})


# --- parameter names as the API page spells them ------------------------------------------

def test_parameter_names_follow_the_reference(tmp_path):
    assert resolve_planner_profile_data(planner_profile_data=None).npz_path is None
    assert asyncio.run(prefetch_model(model_path=str(tmp_path))) == str(tmp_path)
    block_size, rc = build_runtime_config(engine_args=normalize_mocker_config({}))
    assert block_size == 64 and rc.bootstrap_port is None and rc.bootstrap_host is None


def test_runtime_config_names_the_bootstrap_endpoint(monkeypatch):
    monkeypatch.setenv("DYN_HTTP_RPC_HOST", "127.0.0.1")
    base = normalize_mocker_config({"engine": {"worker_type": "prefill"}})
    _, rc = build_runtime_config(apply_worker_engine_args_overrides(base, bootstrap_port=7000))
    assert (rc.bootstrap_host, rc.bootstrap_port) == ("127.0.0.1", 7000)
    rc.set_disaggregated_endpoint(bootstrap_port=7001)
    assert (rc.bootstrap_host, rc.bootstrap_port) == (None, 7001)


# --- replay arguments ---------------------------------------------------------------------

def test_report_jsonl_path_also_fills_per_request(trace, tmp_path):
    for capture in (False, True):
        out = tmp_path / f"records-{capture}.jsonl"
        report = run_trace_replay([trace], report_jsonl_path=out, capture_per_request=capture)
        assert len(report.per_request) == 6 == len(out.read_text().splitlines())
        assert report.coverage == {"capture_per_request": True, "capture_planner_details": False,
                                   "per_request_records": 6}
    report = run_synthetic_trace_replay(64, 2, 3, request_rate=10.0, report_jsonl_path=tmp_path / "s.jsonl")
    assert len(report.per_request) == 3


@pytest.mark.parametrize("kwargs, error, message", [
    ({"sla_ttft_ms": -1}, ValueError, "sla_ttft_ms must be a finite, non-negative value, got -1"),
    ({"sla_itl_ms": -2.5}, ValueError, "sla_itl_ms must be a finite, non-negative value, got -2.5"),
    ({"sla_e2e_ms": float("inf")}, ValueError, "sla_e2e_ms must be a finite, non-negative value, got inf"),
    ({"sla_ttft_ms": float("nan")}, ValueError, "sla_ttft_ms must be a finite, non-negative value, got NaN"),
    ({"sla_ttft_ms": 0, "sla_itl_ms": -1}, ValueError, "sla_itl_ms must be a finite, non-negative value, got -1"),
    ({"sla_ttft_ms": 10, "sla_e2e_ms": 100}, Exception,
     "invalid replay spec: sla.e2e_ms is mutually exclusive with sla.ttft_ms/itl_ms"),
    ({"sla_itl_ms": 10, "sla_e2e_ms": 0}, Exception,
     "invalid replay spec: sla.e2e_ms is mutually exclusive with sla.ttft_ms/itl_ms"),
    ({"sla_ttft_ms": 0}, Exception, "invalid replay spec: sla.ttft_ms must be finite and positive, got 0"),
    ({"sla_itl_ms": 0.0}, Exception, "invalid replay spec: sla.itl_ms must be finite and positive, got 0"),
    ({"capture_per_request": "yes"}, TypeError,
     "argument 'capture_per_request': 'str' object cannot be converted to 'PyBool'"),
    ({"capture_per_request": None}, TypeError,
     "argument 'capture_per_request': 'NoneType' object cannot be converted to 'PyBool'"),
    ({"replay_concurrency": -1}, Exception, "replay_concurrency must be at least 1"),
    ({"agentic_lanes": -1}, Exception, "agentic_lanes must be at least 1"),
    ({"replay_concurrency": 2.0}, TypeError,
     "argument 'replay_concurrency': 'float' object cannot be interpreted as an integer"),
])
def test_trace_replay_refuses_what_the_reference_refuses(trace, kwargs, error, message):
    with pytest.raises(error) as e:
        run_trace_replay([trace], **kwargs)
    assert type(e.value) is error and str(e.value) == message


@pytest.mark.parametrize("args, kwargs, error, message", [
    (("128", 8, 4), {}, TypeError, "argument 'input_tokens': 'str' object cannot be interpreted as an integer"),
    ((128.7, 8, 4), {}, TypeError, "argument 'input_tokens': 'float' object cannot be interpreted as an integer"),
    ((128, 8.0, 4), {}, TypeError, "argument 'output_tokens': 'float' object cannot be interpreted as an integer"),
    ((None, 8, 4), {}, TypeError, "argument 'input_tokens': 'NoneType' object cannot be interpreted as an integer"),
    ((-5, 8, 4), {}, OverflowError, "can't convert negative int to unsigned"),
    ((128, 0, 4), {}, Exception, "output_tokens must be at least 1"),
    ((0, 0, 4), {}, Exception, "input_tokens must be at least 1"),
    ((128, 8, 0), {}, Exception, "request_count must be at least 1"),
    ((128, 8, 4), {"turns_per_session": 2.0}, TypeError,
     "argument 'turns_per_session': 'float' object cannot be interpreted as an integer"),
    ((128, 8, 4), {"arrival_seed": 2.0}, TypeError,
     "argument 'arrival_seed': 'float' object cannot be interpreted as an integer"),
    ((128, 8, 4), {"request_rate": "10"}, TypeError, "argument 'request_rate': must be real number, not str"),
    ((128, 8, 4), {"sla_ttft_ms": -1}, ValueError, "sla_ttft_ms must be a finite, non-negative value, got -1"),
])
def test_synthetic_replay_refuses_what_the_reference_refuses(args, kwargs, error, message):
    kwargs = {"request_rate": 10.0, **kwargs}
    with pytest.raises(error) as e:
        run_synthetic_trace_replay(*args, **kwargs)
    assert type(e.value) is error and str(e.value) == message


def test_zero_turns_run_as_single_turn_sessions():
    a = run_synthetic_trace_replay(128, 8, 4, request_rate=10.0, turns_per_session=0).summary
    b = run_synthetic_trace_replay(128, 8, 4, request_rate=10.0, turns_per_session=1).summary
    assert a["completed_requests"] == 4
    assert _simulated(a) == _simulated(b)


# --- KvRouterConfig -----------------------------------------------------------------------

def test_kv_router_config_behaves_as_dynamos():
    k = KvRouterConfig()
    assert (k.overlap_score_weight, k.prefill_load_scale, k.overlap_score_credit,
            k.overlap_score_credit_decay, k.decode_active_request_weight) == (1.0, 1.0, 1.0, 0.0, 0.0)
    k = KvRouterConfig(overlap_score_weight=2.0)
    assert (k.overlap_score_weight, k.prefill_load_scale, k.overlap_score_credit) == (2.0, 2.0, 1.0)
    k = KvRouterConfig(overlap_score_weight=0.0)
    assert (k.overlap_score_weight, k.prefill_load_scale, k.overlap_score_credit) == (0.0, 0.0, 0.0)
    k = KvRouterConfig.from_json('{"router_temperature": 0.5, "prefill_load_scale": 2}')
    assert (k.prefill_load_scale, k.overlap_score_weight) == (2.0, 2.0)
    with pytest.raises(ValueError, match=r"^Failed to parse KvRouterConfig JSON: unknown field `bogus`, expected one of"):
        KvRouterConfig.from_json('{"bogus": 1}')
    with pytest.raises(ValueError, match=r"^Failed to parse KvRouterConfig JSON: disk_cache_hit_weight must be between 0 and 1$"):
        KvRouterConfig.from_json('{"disk_cache_hit_weight": 3}')
    k = KvRouterConfig().with_overrides(prefill_load_scale=5.0, overlap_score_credit=0.5)
    assert (k.prefill_load_scale, k.overlap_score_credit) == (5.0, 0.5)
    assert KvRouterConfig(prefill_load_scale=3.0).with_overrides(2.0).prefill_load_scale == 2.0
    c = KvRouterConfig()
    c.prefill_load_scale = 4.0
    assert (c.prefill_load_scale, c.overlap_score_weight) == (4.0, 4.0)
    c.overlap_score_weight = 0.0
    assert (c.prefill_load_scale, c.overlap_score_credit) == (0.0, 0.0)
    assert KvRouterConfig(1.5, 0.5, 0.1, 0.2, False).prefill_load_scale == 1.5
    with pytest.raises(AttributeError):
        c.router_temperature = 1.0
    for kwargs, message in [
        ({"overlap_score_credit": -1}, "overlap_score_credit must be a finite, non-negative number"),
        ({"router_approximate_cache_policy": "x"}, "unknown approximate cache policy \"x\", expected 'ttl' or 'lru'"),
        ({"router_approximate_cache_policy": "lru"},
         "router_approximate_cache_policy=lru requires use_kv_events=false; the local side indexer is TTL-only"),
        ({"router_temperature": -1.0}, "router_temperature must be finite and non-negative"),
        # Dynamo 1.6.1's order: credit, host weight, disk weight, temperature.
        ({"host_cache_hit_weight": -1.0, "router_temperature": -1.0}, "host_cache_hit_weight must be between 0 and 1"),
        ({"host_cache_hit_weight": -1.0, "overlap_score_credit": -1.0},
         "overlap_score_credit must be a finite, non-negative number"),
        ({"disk_cache_hit_weight": 3.0, "host_cache_hit_weight": 3.0}, "host_cache_hit_weight must be between 0 and 1"),
        ({"disk_cache_hit_weight": 3.0, "router_temperature": -1.0}, "disk_cache_hit_weight must be between 0 and 1"),
    ]:
        with pytest.raises(ValueError) as e:
            KvRouterConfig(**kwargs)
        assert str(e.value) == message
    with pytest.raises(TypeError, match="argument 'router_temperature': must be real number, not str"):
        KvRouterConfig(router_temperature="x")


def test_kv_router_config_drives_the_replay_as_its_json_does(trace):
    cfg = KvRouterConfig(prefill_load_scale=2.0, overlap_score_credit=0.5, router_queue_threshold=0.5)
    assert json.loads(cfg.to_json()) == {"overlap_score_credit": 0.5, "prefill_load_scale": 2.0,
                                         "router_queue_threshold": 0.5}
    kw = dict(router_mode="kv_router", num_workers=2, capture_per_request=True)
    a = run_trace_replay([trace], router_config=cfg, **kw)
    b = run_trace_replay([trace], router_config=json.loads(cfg.to_json()), **kw)
    assert _simulated(a.summary) == _simulated(b.summary)
    assert [r["decode_worker_idx"] for r in a.per_request] == [r["decode_worker_idx"] for r in b.per_request]
    # What servesim does not model is refused by name.
    with pytest.raises(Exception, match="router_track_output_blocks"):
        run_trace_replay([trace], router_config=KvRouterConfig(router_track_output_blocks=True), **kw)


# --- configuration round trips and refusals ------------------------------------------------

def test_normalize_is_stable_and_keeps_num_gpu_blocks_is_explicit():
    x = normalize_mocker_config({"engine": {"block_size": 16}})
    assert normalize_mocker_config(json.dumps(x)) == x
    assert x["num_gpu_blocks_is_explicit"] is False
    assert apply_worker_engine_args_overrides(x, bootstrap_port=5)["num_gpu_blocks_is_explicit"] is False
    y = normalize_mocker_config({"engine": {"num_gpu_blocks": 100}})
    assert y["num_gpu_blocks_is_explicit"] is True
    assert normalize_mocker_config(json.dumps(y))["num_gpu_blocks_is_explicit"] is True


@pytest.mark.parametrize("bad", [1.1, -0.1, float("nan"), float("inf")])
def test_gpu_memory_utilization_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        normalize_mocker_config({"gpu_memory_utilization": bad})


# --- CLI warnings ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv, category, message", [
    (["--router-temperature", "0"], FutureWarning,
     "--router-temperature is deprecated and will be removed in v1.7; use router_temperature in the default "
     "policy parameters in --router-policy-config."),
    (["--no-load-aware"], FutureWarning,
     "--no-load-aware is deprecated and will be removed in v1.7; use the load-only policy and router tracking "
     "settings in --router-policy-config."),
    (["--kv-overlap-score-weight", "1"], FutureWarning,
     "--kv-overlap-score-weight is deprecated and will be removed in v1.7; use prefill_load_scale in the default "
     "policy parameters in --router-policy-config."),
    (["--router-queue-threshold", "0.5"], FutureWarning,
     "--router-queue-threshold is deprecated and will be removed in v1.7; use "
     "policy_classes[].prefill_busy_threshold_frac in --router-policy-config."),
    (["--router-queue-policy", "fcfs"], FutureWarning,
     "--router-queue-policy is deprecated and will be removed in v1.7; use policy_classes[].queue_policy in "
     "--router-policy-config."),
    (["--router-decode-policy", "x"], FutureWarning,
     "--router-decode-policy is deprecated and will be removed in v1.7; use worker_selection.decode in "
     "--router-policy-config."),
    (["--engine-type", "sglang", "--sglang-page-size", "16"], FutureWarning,
     "--sglang-page-size is deprecated and will be removed in Dynamo 1.8.0 (two releases after 1.6.0); "
     "use --block-size."),
    (["--is-prefill-worker"], DeprecationWarning,
     "--is-prefill-worker is deprecated, use --disaggregation-mode=prefill"),
])
def test_deprecation_warnings_say_what_the_reference_says(argv, category, message):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parse_args(argv)
    assert [(w.category, str(w.message)) for w in caught] == [(category, message)]


# --- kv_cache -------------------------------------------------------------------------------

def _fake_transformers(from_pretrained):
    return SimpleNamespace(AutoConfig=SimpleNamespace(from_pretrained=from_pretrained))


def test_kv_bytes_through_transformers_when_installed(monkeypatch, tmp_path):
    text = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=4, num_attention_heads=8, hidden_size=64,
                           dtype="bfloat16")
    seen = []

    def from_pretrained(model_path, **kwargs):
        seen.append((model_path, kwargs))
        return SimpleNamespace(get_text_config=lambda: text)

    monkeypatch.setitem(sys.modules, "transformers", _fake_transformers(from_pretrained))
    assert kv_cache.compute_kv_bytes_per_token("org/model") == 256
    # A GPT-2 style config.json (n_layer/n_head/n_embd) goes through transformers too.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 8}))
    assert kv_cache.compute_kv_bytes_per_token(str(tmp_path)) == 256
    assert seen == [("org/model", {"trust_remote_code": False}), (str(tmp_path), {"trust_remote_code": False})]

    def boom(model_path, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setitem(sys.modules, "transformers", _fake_transformers(boom))
    with pytest.raises(RuntimeError, match="boom"):
        kv_cache.compute_kv_bytes_per_token("org/model")
    # Without transformers a hub id is None, with a warning.
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert kv_cache.compute_kv_bytes_per_token("org/model") is None


def test_kv_dtype_bytes_of_a_config_object():
    cfg = SimpleNamespace(dtype="bfloat16")
    assert kv_cache.get_kv_cache_dtype_bytes(cfg, "int8") == 1
    assert kv_cache.get_kv_cache_dtype_bytes(cfg, "fp8") == 1
    assert kv_cache.get_kv_cache_dtype_bytes(cfg, "auto") == 2
    assert kv_cache.get_kv_cache_dtype_bytes(SimpleNamespace(torch_dtype="torch.float32")) == 4


# --- report objects ---------------------------------------------------------------------------

def test_planner_details_defaults_and_plain_to_dict():
    from dataclasses import dataclass
    from enum import Enum

    class Outcome(Enum):
        APPLIED = "applied"

    @dataclass
    class Event:
        at_s: float
        outcome: Outcome

    details = PlannerReplayDetails(total_ticks=4)
    assert (details.metadata, details.ticks, details.scaling_events, details.lifecycle_operations) == ({}, [], [], [])
    details.scaling_events.append(Event(1.0, Outcome.APPLIED))
    report = ReplayReport(summary={}, per_request=None, coverage={}, planner=details)
    assert report.to_dict()["planner"]["scaling_events"] == [{"at_s": 1.0, "outcome": "applied"}]
    assert json.dumps(report.to_dict())


def test_worker_takes_its_steps_from_the_module(monkeypatch):
    # As Dynamo's own worker() test does: every step is looked up on servesim.mocker.main.
    import servesim.mocker.main as mocker_main

    args = parse_args(["--model-path", "test-model", "--num-workers", "2"])
    captured = []

    async def fake_prefetch(model_path):
        return "/test-model"

    async def fake_launch(_args, config):
        captured.append(config)

    monkeypatch.setattr(mocker_main, "parse_args", lambda: args)
    monkeypatch.setattr(mocker_main, "prefetch_model", fake_prefetch)
    monkeypatch.setattr(mocker_main, "compute_kv_bytes_per_token", lambda *_: 2048)
    monkeypatch.setattr(mocker_main, "launch_workers", fake_launch)
    asyncio.run(mocker_main.worker())
    assert len(captured) == 1
    assert captured[0]["engine"]["kv_transfer_bytes_per_token"] == 2048


@pytest.mark.parametrize("kwargs, message", [
    ({"num_workers": 2**32 - 1}, r"^num_workers: 4294967295 workers need about 16384\.0 GiB of memory; this machine has "),
    ({"turns_per_session": 10**9}, r"^turns_per_session 1000000000 × input_tokens 128: the sessions in flight need about "),
])
def test_counts_beyond_memory_are_refused_instead_of_aborting(kwargs, message):
    # The reference (and servesim before) aborted the interpreter out of memory here.
    with pytest.raises(Exception, match=message):
        run_synthetic_trace_replay(128, 8, 4, request_rate=10.0, **kwargs)


# --- KvRouterConfig's own checks (probed on Dynamo 1.6.1) --------------------------------

@pytest.mark.parametrize("text, message", [
    ('{"router_approximate_cache_policy": "lru", "use_kv_events": false}',
     "unknown field `router_approximate_cache_policy`, expected one of"),
    ('{"durable_kv_events": true}', "durable_kv_events=true is not supported by this runtime"),
    ('{"router_tracking_hash": "keyed-xxh3-v1"}', "keyed-xxh3-v1 requires router_tracking_key_file"),
    ('{"router_tracking_hash": "keyed-xxh3-v1", "router_tracking_key_file": "/k"}',
     "keyed-xxh3-v1 requires a nonempty router_tracking_key_id"),
    ('{"router_tracking_key_id": "k"}', "router tracking key options require router_tracking_hash=keyed-xxh3-v1"),
])
def test_kv_router_config_json_refusals(text, message):
    with pytest.raises(ValueError) as e:
        KvRouterConfig.from_json(text)
    assert str(e.value).startswith("Failed to parse KvRouterConfig JSON: " + message)


def test_kv_router_config_constructor_refusals():
    with pytest.raises(ValueError, match="^keyed-xxh3-v1 requires router_tracking_key_file$"):
        KvRouterConfig(router_tracking_hash="keyed-xxh3-v1")
    with pytest.raises(ValueError, match='^router_tracking_hash must be public-xxh3-v1 or keyed-xxh3-v1, got "x"$'):
        KvRouterConfig(router_tracking_hash="x")
    with pytest.raises(ValueError, match="^unknown shared_cache_type: \"host\", expected 'none' or 'hicache'$"):
        KvRouterConfig(shared_cache_type="host")
    KvRouterConfig(router_tracking_hash="keyed-xxh3-v1", router_tracking_key_file="/k", router_tracking_key_id="k")


# Keys that tune a live deployment: Dynamo 1.6.1's offline replay accepts them and gives the
# same run as without them (probed on the p_router_queue_fcfs_priorities workload, whose
# reference runs are deterministic: every summary value identical), and so does servesim.
DEPLOYMENT_ONLY = {
    "host_cache_hit_weight": 0.1, "disk_cache_hit_weight": 0.9, "router_replica_sync": True,
    "router_snapshot_threshold": 10, "router_reset_states": True, "router_ttl_secs": 0.5,
    "router_event_threads": 1, "skip_initial_worker_wait": True, "use_remote_indexer": True,
    "serve_indexer": True, "durable_kv_events": False,
}


def test_deployment_only_router_keys_leave_the_replay_unchanged(tmp_path):
    import os

    trace = os.path.join(os.path.dirname(__file__), "..", "parity", "policy_classes.jsonl")
    engine = {"engine": {"block_size": 64, "num_gpu_blocks": 4096, "max_num_batched_tokens": 1024}}

    def run(extra):
        config = KvRouterConfig.from_json(json.dumps({"router_queue_threshold": 0.25, **extra}))
        report = run_trace_replay(trace, trace_block_size=128, router_config=config, router_mode="kv_router",
                                  num_workers=2, extra_engine_args=engine)
        return _simulated(report.summary)

    plain = run({})
    # Dynamo 1.6.1's mean TTFT for this run (its golden, tests/parity/p_router_queue_fcfs_priorities).
    assert abs(plain["mean_ttft_ms"] - 1541.1058096949982) < 1e-6 * 1541.1
    for key, value in DEPLOYMENT_ONLY.items():
        assert run({key: value}) == plain, key


# --- per-request session ids ---------------------------------------------------------------

def test_per_request_session_ids_are_dynamos(tmp_path):
    # Dynamo 1.6.1 reports session_id and turn_index null for a request outside a session (a
    # trace row without session_id, a one-turn synthetic request); sessions keep their names.
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"timestamp": i * 50, "input_length": 100, "output_length": 3,
                                         "hash_ids": [i]}) + "\n" for i in range(3)))
    sessions = tmp_path / "sessions.jsonl"
    rows = []
    for i in range(4):
        row = {"session_id": f"s{i // 2}", "input_length": 100, "output_length": 3, "hash_ids": [i]}
        row.update({"delay": 5} if i % 2 else {"timestamp": 0})
        rows.append(json.dumps(row) + "\n")
    sessions.write_text("".join(rows))

    def ids(report):
        return sorted(((r["session_id"] or ""), r["turn_index"] if r["turn_index"] is not None else -1)
                      for r in report.per_request)

    assert ids(run_trace_replay(str(plain), capture_per_request=True)) == [("", -1)] * 3
    assert ids(run_trace_replay(str(sessions), capture_per_request=True)) == [("s0", 0), ("s0", 1), ("s1", 0), ("s1", 1)]
    single = run_synthetic_trace_replay(100, 3, 3, capture_per_request=True, arrival_interval_ms=10)
    assert ids(single) == [("", -1)] * 3
    turns = run_synthetic_trace_replay(100, 3, 2, turns_per_session=2, capture_per_request=True, arrival_interval_ms=10)
    assert ids(turns) == [("session_0", 0), ("session_0", 1), ("session_1", 0), ("session_1", 1)]

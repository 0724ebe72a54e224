"""The calls the parity suite makes on both implementations.

Each case is ``(function, args, kwargs)``; ``function`` is a name resolved by
:func:`resolve` in ``dynamo.mocker`` (the reference) or ``servesim.mocker``. The recording
script (``scripts/record_python_goldens.py``) runs them on the reference and stores what
:func:`outcome` returns; ``test_parity.py`` runs them on servesim and compares.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
from pathlib import Path

# The engine parity tolerance (README "Parity and speed"): 1e-6 relative.
REL = 1e-6


def close(a, b):
    """Numbers (not booleans) equal to ``REL`` (NaN equals NaN); anything else exactly."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=REL, abs_tol=1e-9)
    return a == b

HERE = Path(__file__).resolve().parent
GOLDENS = HERE / "goldens"
# The public Mooncake traces, beside the checkout (never committed).
TRACES = Path(os.environ.get("SERVESIM_TRACES", HERE.parents[1].parent / "shared" / "traces"))
CONVERSATION = str(TRACES / "mooncake_conversation_trace.jsonl")
SYNTHETIC = str(TRACES / "mooncake_synthetic_trace.jsonl")

_MODULES = {
    "normalize_mocker_config": "config",
    "performance_config": "config",
    "engine_limit": "config",
    "apply_worker_engine_args_overrides": "config",
    "build_mocker_engine_args": "config",
    "load_mocker_engine_args": "config",
    "parse_args": "args",
    "validate_worker_type_args": "args",
    "parse_bootstrap_ports": "args",
    "resolve_planner_profile_data": "args",
    "compute_stagger_delay": "main",
    "run_mocker_trace_replay": "",
    "ReasoningConfig": "",
}


def resolve(package: str, name: str):
    """``package`` is ``dynamo.mocker`` or ``servesim.mocker``; ``replay.NAME`` names the
    replay module (``dynamo.replay.api`` / ``servesim.replay``)."""
    if name.startswith("replay."):
        module = "dynamo.replay.api" if package.startswith("dynamo") else "servesim.replay"
        return getattr(importlib.import_module(module), name.split(".", 1)[1])
    if name == "build_from_argv":
        parse = resolve(package, "parse_args")
        build = resolve(package, "build_mocker_engine_args")
        return lambda argv: build(parse(argv))
    sub = _MODULES[name]
    module = importlib.import_module(f"{package}.{sub}" if sub else package)
    return getattr(module, name)


def _jsonable(value):
    if isinstance(value, argparse.Namespace):
        return {k: _jsonable(v) for k, v in vars(value).items() if k != "router_advertisement"}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def outcome(package: str, case) -> dict:
    """``{"ok": result}`` or ``{"error": [type name, message]}`` (``SystemExit`` → its code)."""
    import warnings

    name, args, kwargs = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = resolve(package, name)(*args, **kwargs)
        except SystemExit as e:
            return {"error": ["SystemExit", str(e.code)]}
        except Exception as e:  # noqa: BLE001 - the type and message are what is compared
            return {"error": [type(e).__name__, str(e)]}
    return {"ok": _jsonable(result)}


# --- normalize_mocker_config: accepted configurations -------------------------------------
NORMALIZE_OK = [
    None,
    {},
    {"engine": {"backend": "sglang"}},
    {"engine": {"backend": "trtllm"}},
    {"engine": {"block_size": 16}},
    {"engine": {"num_gpu_blocks": 100}, "dp_size": 2},
    {"engine": {"max_model_len": 4096, "max_num_seqs": 8}},
    {"engine": {"max_num_batched_tokens": 2048, "enable_chunked_prefill": False}},
    {"engine": {"enable_prefix_caching": False}},
    {"engine": {"speedup_ratio": 0}},
    {"engine": {"speedup_ratio": 2, "decode_speedup_ratio": 3.5}},
    {"engine": {"preemption_mode": "fifo"}},
    {"engine": {"worker_type": "prefill", "kv_transfer_bandwidth": 25}},
    {"engine": {"worker_type": "decode", "kv_transfer_timing_mode": "destination_missing"}},
    {"engine": {"kv_bytes_per_token": 5}},
    {"engine": {"kv_transfer_bytes_per_token": 131072}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": "0.5"}},
    {"engine": {"aic_nextn": 3, "aic_nextn_accept_rates": "0.9,0.7,0.5", "aic_mtp_seed": 7}},
    {"engine": {"timing_model": {"type": "fixed", "prefill_ms": 1, "decode_ms": 2}}},
    {"engine": {"timing_model": {"type": "polynomial"}}},
    {"engine": {"sglang": {"schedule_policy": "lpm"}}},
    {"engine": {"backend": "sglang", "sglang": {"max_prefill_tokens": 4096, "chunked_prefill_size": 1024}}},
    {"engine": {"backend": "sglang", "sglang": {"clip_max_new_tokens": 64, "schedule_conservativeness": 0.5}}},
    {"engine": {"backend": "trtllm", "trtllm": {"capacity_scheduler_policy": "guaranteed_no_evict"}}},
    {"engine": {"emit_kv_events": True, "emit_kv_token_ids": True}},
    {"engine": {"prefill_schedule_interval": 2, "prefill_decode_interval": 3}},
    {"tensor_parallel_size": 4},
    {"startup_time": 12.5, "gpu_memory_utilization": 0.8},
    {"mem_fraction_static": 0.88, "free_gpu_memory_fraction": 0.9, "cuda_graph_reserved_bytes": 1024},
    {"dynamo": {"reasoning": {"start_thinking_token_id": 1, "end_thinking_token_id": 2, "thinking_ratio": 0.5}}},
    {"dynamo": {"router_queue_policy": "wspt", "enable_local_indexer": True}},
    {"dynamo": {"bootstrap_port": 9000, "zmq_kv_events_port": 5557, "zmq_replay_port": 5558}},
    {"dynamo": {"handoff_session_timeout_ms": 1000, "response_replay_trace_path": "/tmp/x.jsonl"}},
    {"engine": []},
    '{"engine": {"block_size": 32}}',
    "{}",
    {"engine": {"prefill_schedule_interval": 4}, "dp_size": 2},
    {"engine": {"backend": "sglang", "prefill_decode_interval": 3}},
]

# --- normalize_mocker_config: rejected configurations --------------------------------------
NORMALIZE_BAD = [
    {"engine": {"foo": 1}},
    {"engine": {"block_size": "x"}},
    {"engine": {"backend": "tgi"}},
    {"block_size": 16},
    {"engine": {"block_size": 0}},
    "[]",
    [],
    {"dynamo": {"reasoning": {"start_thinking_token_id": 1, "end_thinking_token_id": 2, "thinking_ratio": 2}}},
    {"engine": {"max_num_seqs": -1}},
    {"engine": {"max_model_len": "x"}},
    {"engine": {"max_num_seqs": 1.5}},
    {"engine": {"speedup_ratio": "x"}},
    {"engine": {"enable_prefix_caching": 1}},
    {"engine": {"aic_nextn": "x"}},
    {"engine": {"aic_mtp_seed": -1}},
    {"engine": {"worker_type": "x"}},
    {"engine": {"preemption_mode": "x"}},
    {"engine": {"kv_transfer_timing_mode": "x"}},
    {"engine": {"timing_model": {"type": "x"}}},
    {"engine": {"timing_model": {"type": "fixed"}}},
    {"engine": {"sglang": {"foo": 1}}},
    {"engine": {"trtllm": {"capacity_scheduler_policy": "x"}}},
    {"dynamo": {"foo": 1}},
    {"dynamo": {"reasoning": {"start_thinking_token_id": 1}}},
    {"dp_size": "x"},
    {"engine": {"num_gpu_blocks": None}},
    {"engine": {"sglang": {"schedule_policy": "x"}}},
    {"dp_size": 0},
    {"engine": {"num_gpu_blocks": 0}},
    {"engine": {"max_num_seqs": 0}},
    {"startup_time": "x"},
    {"dynamo": {"bootstrap_port": -1}},
    {"dynamo": {"bootstrap_port": 70000}},
    {"engine": {"native_host_offload": {"num_host_blocks": 10}}},
    {"engine": {"backend": "sglang", "native_host_offload": {"num_host_blocks": 10}}},
    {"engine": {"timing_model": {"type": "external", "provider": "dynamo_profile", "config": {"path": "/nonexistent.npz"}}}},
    {"engine": {"speedup_ratio": -1}},
    {"engine": {"prefix_match_unit": 3}},
    {"engine": {"max_model_len": -5}},
    {"engine": {"enable_prefix_caching": None}},
    {"dynamo": None},
    {"engine": None},
    {"dynamo": {"router_queue_policy": "x"}},
    5,
    # The prefill cadences' checks, in Dynamo's order and words.
    {"engine": {"prefill_schedule_interval": 0}},
    {"engine": {"prefill_schedule_interval": -1}},
    {"engine": {"prefill_schedule_interval": 1.5}},
    {"engine": {"prefill_schedule_interval": None}},
    {"engine": {"backend": "sglang", "prefill_schedule_interval": 2}},
    {"engine": {"backend": "trtllm", "prefill_schedule_interval": 4}},
    {"engine": {"backend": "sglang", "prefill_decode_interval": -1}},
    {"engine": {"backend": "trtllm", "prefill_decode_interval": 2}},
]

# --- parse_args ------------------------------------------------------------------------------
ARGV = [
    [],
    ["--num-workers", "3", "--bootstrap-ports", "1,2,3"],
    ["--engine-type", "sglang", "--sglang-page-size", "4"],
    ["--engine-type", "sglang", "--sglang-page-size", "4", "--block-size", "4"],
    ["--is-prefill-worker"],
    ["--is-decode-worker"],
    ["--disaggregation-mode", "prefill"],
    ["--disaggregation-mode", "decode", "--endpoint", "dyn://x.y.z"],
    ["--no-enable-prefix-caching", "--num-gpu-blocks", "100"],
    ["--num-gpu-blocks-override", "512", "--block-size", "16", "--max-model-len", "8192"],
    ["--no-enable-chunked-prefill", "--max-num-seqs", "4", "--max-num-batched-tokens", "1024"],
    ["--router-mode", "kv", "--no-router-kv-events", "--router-temperature", "0.5"],
    ["--ais-nextn", "2", "--aic-system", "x"],
    ["--aic-perf-model", "--model-path", "/models/x"],
    ["--load-aware"],
    ["--no-load-aware"],
    ["--active-decode-blocks-threshold", "None"],
    ["--active-prefill-tokens-threshold", "100", "--active-prefill-tokens-threshold-frac", "0.5"],
    ["--sglang-schedule-policy", "fcfs"],
    ["--speedup-ratio", "0", "--decode-speedup-ratio", "2.5"],
    ["--data-parallel-size", "4", "--startup-time", "3"],
    ["--planner-profile-data", "/tmp/p.npz"],
    ["--extra-engine-args", "/tmp/e.json"],
    ["--num-workers", "2", "--zmq-kv-events-ports", "5557,5558", "--zmq-replay-ports", "6000,6001"],
    ["--kv-cache-dtype", "fp8", "--kv-bytes-per-token", "1024"],
    ["--num-host-blocks", "10", "--host-offload-d2h-bandwidth-gbps", "5"],
    ["--stagger-delay", "-1", "--discovery-backend", "file", "--event-plane", "zmq"],
    ["--request-plane", "nats", "--response-plane", "quic"],
    ["--reasoning", '{"start_thinking_token_id": 1, "end_thinking_token_id": 2, "thinking_ratio": 0.3}'],
    ["--router-track-output-blocks", "--no-router-assume-kv-reuse", "--router-replica-sync"],
    ["--router-queue-policy", "wspt", "--router-queue-threshold", "1.5"],
    ["--shared-cache-type", "hicache", "--router-ttl-secs", "30", "--router-approximate-cache-policy", "lru"],
    ["--router-prefill-load-model", "AIS", "--router-event-threads", "2"],
    ["--kv-transfer-bandwidth", "25", "--kv-transfer-timing-mode", "destination_missing"],
    ["--trtllm-capacity-scheduler-policy", "guaranteed_no_evict", "--engine-type", "trtllm"],
    ["--sglang-max-prefill-tokens", "100", "--sglang-chunked-prefill-size", "50", "--sglang-clip-max-new-tokens", "10"],
    ["--model-name", "m", "--model-path", "/m", "--response-replay-trace-path", "/tmp/r"],
]
ARGV_BAD = [
    ["--num-workers", "0"],
    ["--num-workers", "2", "--bootstrap-ports", "1"],
    ["--zmq-replay-ports", "1"],
    ["--is-prefill-worker", "--is-decode-worker"],
    ["--is-prefill-worker", "--disaggregation-mode", "agg"],
    ["--ais-nextn", "1", "--aic-nextn", "2"],
    ["--engine-type", "sglang", "--sglang-page-size", "4", "--block-size", "8"],
    ["--disaggregation-mode", "other"],
    ["--kv-cache-dtype", "int4"],
    ["--num-workers", "x"],
    ["--bootstrap-ports", "1,,2"],
    ["--unknown-flag"],
]

# --- build_mocker_engine_args from argument lists -------------------------------------------
BUILD_ARGV = [
    [],
    ["--engine-type", "sglang", "--sglang-schedule-policy", "lpm"],
    ["--num-gpu-blocks-override", "100", "--block-size", "16", "--data-parallel-size", "2"],
    ["--ais-nextn", "2", "--ais-nextn-accept-rates", "0.8,0.6"],
    ["--is-prefill-worker", "--kv-bytes-per-token", "1024", "--kv-transfer-bandwidth", "10"],
    ["--reasoning", '{"start_thinking_token_id": 1, "end_thinking_token_id": 2, "thinking_ratio": 0.3}'],
    ["--engine-type", "trtllm", "--startup-time", "5", "--gpu-memory-utilization", "0.8"],
    ["--host-offload-d2h-bandwidth-gbps", "5"],
    ["--ais-perf-config", '{"model": "x"}', "--ais-system", "h100"],
]

# --- the other helpers -----------------------------------------------------------------------
OTHER = [
    ("compute_stagger_delay", [10, 0], {}),
    ("compute_stagger_delay", [10, 0.5], {}),
    ("compute_stagger_delay", [10, -1], {}),
    ("compute_stagger_delay", [64, -1], {}),
    ("compute_stagger_delay", [200, -1], {}),
    ("compute_stagger_delay", [10, -2], {}),
    ("compute_stagger_delay", [10, -0.5], {}),
    ("parse_bootstrap_ports", [""], {}),
    ("parse_bootstrap_ports", [None], {}),
    ("parse_bootstrap_ports", ["1, 2,3"], {}),
    ("parse_bootstrap_ports", ["1,,2"], {}),
    ("parse_bootstrap_ports", ["a"], {}),
    ("engine_limit", [{"engine": {"max_num_seqs": 5}}, "max_num_seqs"], {}),
    ("engine_limit", [{"engine": {"max_num_seqs": 5}}, "nope"], {}),
    ("performance_config", [{"engine": {"timing_model": {"type": "external", "provider": "ais", "config": {"a": 1}}}}], {}),
    ("performance_config", [{"engine": {"timing_model": {"type": "polynomial"}}}], {}),
    ("apply_worker_engine_args_overrides", [{}], {"bootstrap_port": 9000, "kv_bytes_per_token": 64, "ais_mtp_seed": 3}),
    ("apply_worker_engine_args_overrides", [{}], {"zmq_kv_events_port": 5557, "zmq_replay_port": 5558}),
    ("apply_worker_engine_args_overrides", [{}], {"bootstrap_port": -1}),
    ("resolve_planner_profile_data", [Path("/nonexistent/profile.npz")], {}),
    ("resolve_planner_profile_data", [Path("/")], {}),
    ("ReasoningConfig", [-1, 2, 0.5], {}),
    ("ReasoningConfig", ["a", 2, 0.5], {}),
    ("replay.run_trace_replay", [SYNTHETIC], {"agentic_lanes": True}),
    ("replay.run_trace_replay", [SYNTHETIC], {"agentic_lanes": "2"}),
    ("replay.run_trace_replay", [SYNTHETIC], {"weka_nested_timestamp_basis": 3}),
    ("replay.run_trace_replay", [SYNTHETIC], {"weka_nested_timestamp_basis": "x"}),
    ("replay.run_trace_replay", [SYNTHETIC], {"weka_nested_timestamp_basis": "auto"}),
    ("replay.run_trace_replay", [SYNTHETIC], {"execution_model": 5}),
    ("replay.run_trace_replay", [SYNTHETIC], {"execution_model": "  "}),
    ("replay.run_trace_replay", [SYNTHETIC], {"trace_format": "weka"}),
    ("replay.run_trace_replay", [SYNTHETIC], {"trace_format": "agentic_mooncake"}),
    ("replay.run_trace_replay", [SYNTHETIC], {"capture_per_request": True, "replay_mode": "online"}),
    ("replay.run_trace_replay", [SYNTHETIC], {"planner_config": {}, "replay_mode": "online"}),
    ("replay.run_trace_replay", [[SYNTHETIC, SYNTHETIC]], {"planner_config": {}}),
    ("replay.run_trace_replay", [[]], {"planner_config": {}, "trace_format": "dynamo"}),
    ("run_mocker_trace_replay", [SYNTHETIC], {"trace_format": "x"}),
    ("run_mocker_trace_replay", [SYNTHETIC], {"router_mode": "x"}),
    ("run_mocker_trace_replay", [[]], {}),
    ("run_mocker_trace_replay", [[SYNTHETIC, SYNTHETIC]], {}),
    ("run_mocker_trace_replay", [SYNTHETIC], {"replay_concurrency": 0}),
    ("run_mocker_trace_replay", [SYNTHETIC], {"arrival_speedup_ratio": 0}),
    ("run_mocker_trace_replay", [SYNTHETIC], {"trace_block_size": 0}),
    ("run_mocker_trace_replay", [SYNTHETIC], {"extra_engine_args": {"engine": {"foo": 1}}}),
    ("run_mocker_trace_replay", [SYNTHETIC], {"extra_engine_args": '{"engine": {"block_size": "x"}}'}),
]

# --- replays (summary within parity tolerance; key sets and order) ---------------------------
REPLAYS = [
    ("run_mocker_trace_replay", [CONVERSATION], {"num_workers": 2, "capture_per_request": True}),
    ("run_mocker_trace_replay", [SYNTHETIC], {"num_workers": 4, "sla_ttft_ms": 500, "sla_itl_ms": 30}),
    (
        "run_mocker_trace_replay",
        [SYNTHETIC],
        {"extra_engine_args": {"engine": {"block_size": 32, "max_num_seqs": 64}}, "capture_per_request": True},
    ),
    ("run_mocker_trace_replay", [SYNTHETIC], {"replay_concurrency": 16, "num_workers": 2}),
    ("run_mocker_trace_replay", [SYNTHETIC], {"extra_engine_args": '{"engine": {"backend": "trtllm"}}', "num_workers": 2}),
    ("run_mocker_trace_replay", [SYNTHETIC], {"arrival_speedup_ratio": 4.0, "sla_e2e_ms": 20000}),
    (
        "replay.run_trace_replay",
        [SYNTHETIC],
        {"prefill_engine_args": {"engine": {"worker_type": "prefill"}}, "decode_engine_args": {"engine": {"worker_type": "decode"}},
         "num_prefill_workers": 2, "num_decode_workers": 2},
    ),
    # Stopped at 30 s of virtual time: later arrivals never come, requests in flight are
    # incomplete, the duration is the last instant before the cutoff.
    ("replay.run_trace_replay", [SYNTHETIC], {"num_workers": 2, "max_sim_time_ms": 30000}),
]

# Wall-clock quantities differ between runs of either implementation.
WALL_CLOCK = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}


def replay_outcome(package: str, case) -> dict:
    """A replay's summary (less wall-clock keys), its key order, per-request key order, and
    the first record's nested key orders."""
    name, args, kwargs = case
    report = resolve(package, name)(*args, **kwargs)
    out = {
        "summary_keys": list(report.summary),
        "summary": {k: v for k, v in report.summary.items() if k not in WALL_CLOCK},
        "coverage": report.coverage,
        "to_dict_keys": list(report.to_dict()),
        "per_request_is_none": report.per_request is None,
    }
    if report.per_request:
        first = report.per_request[0]
        out["record_keys"] = list(first)
        out["routing_history_keys"] = list(first["routing_history"][0]) if first["routing_history"] else []
        out["admission_history_keys"] = list(first["admission_history"][0]) if first["admission_history"] else []
        out["num_records"] = len(report.per_request)
        # Request-level values. The reference's record order is not deterministic (it differs
        # between two runs of the same call), so records are compared as a sorted multiset.
        out["records"] = sorted(
            [r["input_length"], r["output_length"], r["ttft_ms"], r["e2e_latency_ms"], r["terminal_status"]]
            for r in report.per_request
        )
    return out


def all_cases():
    """Every non-replay case, with a stable id."""
    out = []
    for i, c in enumerate(NORMALIZE_OK):
        out.append((f"normalize_ok_{i}", ("normalize_mocker_config", [c], {})))
    for i, c in enumerate(NORMALIZE_BAD):
        out.append((f"normalize_bad_{i}", ("normalize_mocker_config", [c], {})))
    for i, argv in enumerate(ARGV):
        out.append((f"argv_{i}", ("parse_args", [argv], {})))
    for i, argv in enumerate(ARGV_BAD):
        out.append((f"argv_bad_{i}", ("parse_args", [argv], {})))
    for i, argv in enumerate(BUILD_ARGV):
        out.append((f"build_{i}", ("build_from_argv", [argv], {})))
    for i, c in enumerate(OTHER):
        out.append((f"other_{i}_{c[0]}", c))
    return out


def dump(path: Path, data, indent=1) -> None:
    path.write_text(json.dumps(data, indent=indent) + "\n")


# --- router policy classes and telemetry options (goldens/extras.json) ------------------------
# Recorded by `scripts/record_python_goldens.py --extras` inside a scratch directory that
# `write_extras_inputs` fills, so that the relative paths (and the messages naming them) match.

POLICY_ENGINE = {"engine": {"block_size": 64, "max_num_batched_tokens": 512}}
# Four classes: latency and batch families, each split by uncached ISL; requests name a family.
POLICY_CLASSES = """default_policy_family: batch
uncached_isl_buckets:
  - {min_tokens: 0, bucket: cached}
  - {min_tokens: 32, bucket: uncached}
policy_classes:
  - {name: lat_c, policy_family: latency, cache_bucket: cached, quantum: 1, prefill_busy_threshold: 0}
  - {name: lat_u, policy_family: latency, cache_bucket: uncached, quantum: 4, prefill_busy_threshold: 0}
  - {name: bat_c, policy_family: batch, cache_bucket: cached, quantum: 1, prefill_busy_threshold: 0}
  - {name: bat_u, policy_family: batch, cache_bucket: uncached, quantum: 1, prefill_busy_threshold: 0}
"""


def write_extras_inputs(directory: Path) -> None:
    """A burst of 40 requests at t = 0 (distinct prompts of 400 + i tokens; even ones ask for
    the ``latency`` family, odd ones ``batch``), the policy file, the same profile under
    ``models: {m1: ...}``."""
    rows = [
        {
            "timestamp": 0,
            "input_length": 400 + i,
            "output_length": 4,
            "hash_ids": [1000 + i * 10 + k for k in range(8)],
            "policy_class": "latency" if i % 2 == 0 else "batch",
        }
        for i in range(40)
    ]
    (directory / "burst.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "classes.yaml").write_text(POLICY_CLASSES)
    nested = "".join(f"    {line}\n" for line in POLICY_CLASSES.splitlines())
    (directory / "models.yaml").write_text("models:\n  m1:\n" + nested)


def _router_config(package: str, config):
    """The router configuration as each implementation takes it: Dynamo's ``KvRouterConfig``
    (which reads the policy file when it is built) or servesim's mapping."""
    if config is None or not package.startswith("dynamo"):
        return config
    from dynamo.llm import KvRouterConfig

    return KvRouterConfig(**config)


# (router_config, extra keywords) of KV-router replays of the burst.
POLICY_REPLAYS = [
    (None, {}),
    ({"router_queue_threshold": 0.0}, {}),
    ({"router_policy_config": "classes.yaml"}, {}),
    ({"router_policy_config": "models.yaml"}, {"model_name": "m1"}),
    ({"router_policy_config": "models.yaml"}, {"model_name": "other"}),
    ({"router_policy_config": "models.yaml"}, {}),
    ({"router_policy_config": "missing.yaml"}, {}),
]


def policy_outcome(package: str, case) -> dict:
    """Summary (less wall-clock keys) and the (input length, TTFT) of every request, or the
    error (type, message)."""
    router_config, kwargs = case
    run = resolve(package, "replay.run_trace_replay")
    try:
        report = run(
            "burst.jsonl",
            trace_block_size=64,
            extra_engine_args=POLICY_ENGINE,
            num_workers=2,
            router_mode="kv_router",
            router_config=_router_config(package, router_config),
            capture_per_request=True,
            **kwargs,
        )
    except Exception as e:  # noqa: BLE001 - the type and message are what is compared
        return {"error": [type(e).__name__, str(e)]}
    return {
        "summary": {k: v for k, v in report.summary.items() if k not in WALL_CLOCK},
        "records": sorted([r["input_length"], r["ttft_ms"]] for r in report.per_request),
    }


TELEMETRY_ENGINE = {"engine": {"block_size": 16, "num_gpu_blocks": 256}}
# (TelemetryOptions keywords, or a plain dict given as the options; extra run keywords).
# A callback is named: "append" (collects the samples), "five" (not callable).
TELEMETRY_CASES = [
    ({"sample_interval_ms": 100.0}, {}),
    ({"sample_interval_ms": 100}, {"num_workers": 2}),
    ({"sample_interval_ms": True}, {}),
    ({}, {}),
    ({"sample_interval_ms": 100.0, "callback": "append"}, {}),
    ({"sample_interval_ms": 100.0, "callback": "append", "capture_in_memory": True}, {}),
    ({"sample_interval_ms": 100.0, "jsonl_path": "telemetry.jsonl"}, {}),
    ({"sample_interval_ms": 0}, {}),
    ({"sample_interval_ms": -1.0}, {}),
    ({"sample_interval_ms": float("nan")}, {}),
    ({"sample_interval_ms": float("inf")}, {}),
    ({"sample_interval_ms": "100"}, {}),
    ({"capture_in_memory": False}, {}),
    ({"sample_interval_ms": 100.0, "callback": "five"}, {}),
    ({"sample_interval_ms": 100.0}, {"replay_mode": "online"}),
    ({"capture_in_memory": False}, {"replay_mode": "online"}),
    ("dict", {}),
]


def telemetry_outcome(package: str, case) -> dict:
    """A synthetic replay (8 requests of 256 + 32 tokens, one every 50 ms) with telemetry:
    its summary (less wall-clock keys), ``to_dict`` keys, whether ``telemetry`` is set and its
    interval, and whether the callback was called; or the error (type, message). Samples are
    compared in ``telemetry_samples_outcome``'s cases."""
    options_kwargs, kwargs = case
    api = "dynamo.replay.api" if package.startswith("dynamo") else "servesim.replay"
    module = importlib.import_module(api)
    called = []
    if options_kwargs == "dict":
        options = {"sample_interval_ms": 100.0}
    else:
        options_kwargs = dict(options_kwargs)
        callback = options_kwargs.get("callback")
        if callback == "append":
            options_kwargs["callback"] = called.append
        elif callback == "five":
            options_kwargs["callback"] = 5
        options = module.TelemetryOptions(**options_kwargs)
    try:
        report = module.run_synthetic_trace_replay(
            256, 32, 8, arrival_interval_ms=50, extra_engine_args=TELEMETRY_ENGINE, telemetry_options=options, **kwargs
        )
    except Exception as e:  # noqa: BLE001 - the type and message are what is compared
        return {"error": [type(e).__name__, str(e)]}
    telemetry = report.telemetry
    return {
        "summary": {k: v for k, v in report.summary.items() if k not in WALL_CLOCK},
        "to_dict_keys": list(report.to_dict()),
        "telemetry_is_none": telemetry is None,
        "sample_interval_ms": None if telemetry is None else telemetry.sample_interval_ms,
        "telemetry_keys": None if telemetry is None else list(telemetry.to_dict()),
        "callback_called": bool(called),
    }


# Replays whose telemetry samples are compared whole with the reference's: (positional
# arguments of run_synthetic_trace_replay, keywords, sample interval in ms). Aggregated round
# robin over two workers; 1 prefill + 2 decode workers; a KV router over one worker (the
# reference breaks KV-router ties at random, so more workers would not be reproducible) with
# shared prefixes; two-turn sessions on one worker (prefix reuse, cached blocks). None preempts:
# a request resumed after a preemption makes its next token in a recomputing pass, which
# servesim counts as a decode forward and the reference does not (docs/telemetry.md).
_SMALL_KV = {"engine": {"block_size": 16, "num_gpu_blocks": 256}}
TELEMETRY_SAMPLE_CASES = [
    ((256, 32, 4), {"arrival_interval_ms": 50, "extra_engine_args": _SMALL_KV, "num_workers": 2}, 100.0),
    (
        (256, 8, 4),
        {
            "arrival_interval_ms": 30,
            "prefill_engine_args": {"engine": {"worker_type": "prefill", "block_size": 16, "num_gpu_blocks": 256}},
            "decode_engine_args": {"engine": {"worker_type": "decode", "block_size": 16, "num_gpu_blocks": 256}},
            "num_prefill_workers": 1,
            "num_decode_workers": 2,
        },
        50.0,
    ),
    (
        (256, 16, 8),
        {
            "arrival_interval_ms": 20,
            "extra_engine_args": _SMALL_KV,
            "router_mode": "kv_router",
            "shared_prefix_ratio": 0.5,
            "num_prefix_groups": 2,
        },
        50.0,
    ),
    (
        (256, 64, 12),
        {
            "arrival_interval_ms": 5,
            "extra_engine_args": {"engine": {"block_size": 16, "num_gpu_blocks": 320}},
            "shared_prefix_ratio": 0.75,
            "num_prefix_groups": 1,
            "turns_per_session": 2,
        },
        250.0,
    ),
]


def telemetry_samples_outcome(package: str, case) -> dict:
    """The samples (captured in memory and passed to a callback) and the run's duration."""
    args, kwargs, interval = case
    api = "dynamo.replay.api" if package.startswith("dynamo") else "servesim.replay"
    module = importlib.import_module(api)
    seen = []
    options = module.TelemetryOptions(sample_interval_ms=interval, capture_in_memory=True, callback=seen.append)
    report = module.run_synthetic_trace_replay(*args, telemetry_options=options, **kwargs)
    return {
        "duration_ms": report.summary["duration_ms"],
        "callback_is_captured": seen == report.telemetry.samples,
        "samples": report.telemetry.samples,
    }


def extras_outcomes(package: str, directory: Path) -> dict:
    """Every policy and telemetry case, run inside ``directory`` (filled here)."""
    write_extras_inputs(directory)
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        out = {f"policy_{i}": policy_outcome(package, c) for i, c in enumerate(POLICY_REPLAYS)}
        out.update({f"telemetry_{i}": telemetry_outcome(package, c) for i, c in enumerate(TELEMETRY_CASES)})
        out.update({f"samples_{i}": telemetry_samples_outcome(package, c) for i, c in enumerate(TELEMETRY_SAMPLE_CASES)})
    finally:
        os.chdir(cwd)
    return out


# --- speculative decoding: aic_nextn, its rates and seed, an AIS config's nextn/speculation ---
# goldens/speculation.json, recorded with `scripts/record_python_goldens.py --speculation` by a
# Python that has Dynamo 1.6.1 and aisimulate (../shared/parity/setup_aisimulate.sh --with-dynamo).
def _spec_ais(**extra):
    config = {"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "worker_type": "aggregated"}
    config.update(extra)
    return {"type": "external", "provider": "ais", "config": config}


_NGRAM = {"kind": "ngram", "params": {"num_speculative_tokens": 2}}
SPEC_NORMALIZE = [
    {"engine": {"aic_nextn": 2}},
    {"engine": {"aic_nextn": 3, "aic_nextn_accept_rates": "1,1"}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": "1,0.5,0.25"}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": " 0.9 , 0.5 "}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": ""}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": "5e-1,.25"}},
    {"engine": {"aic_nextn": 4, "aic_nextn_accept_rates": "1e-7,INF"}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": "1_0"}},
    {"engine": {"aic_nextn": 1, "aic_mtp_seed": 7}},
    {"engine": {"aic_mtp_seed": 3, "decode_speedup_ratio": 2.0}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": "1.5,0.5"}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": "0.9,2"}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": "nan"}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": "abc"}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": "0.9,"}},
    {"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": [0.9, 0.5]}},
    {"engine": {"aic_nextn_accept_rates": "0.5"}},
    {"engine": {"aic_nextn": 0}},
    {"engine": {"aic_nextn": 6, "decode_speedup_ratio": 2.0}},
    {"engine": {"aic_nextn": 0, "aic_nextn_accept_rates": "abc"}},
    {"engine": {"aic_nextn": 2, "decode_speedup_ratio": 2.0}},
    {"engine": {"aic_nextn": 2, "decode_speedup_ratio": 2.0, "aic_nextn_accept_rates": "abc"}},
    {"engine": {"aic_nextn": 2, "aic_mtp_seed": -1}},
    {"engine": {"aic_nextn": "2"}},
    {"engine": {"aic_nextn": 9, "max_model_len": 0}},
    {"engine": {"aic_nextn": 9}, "dp_size": 0},
    {"engine": {"aic_nextn": 9}, "tensor_parallel_size": 0},
    {"engine": {"aic_nextn": 9}, "gpu_memory_utilization": 1.5},
    {"engine": {"aic_nextn": 9, "native_host_offload": {"num_host_blocks": 4}}},
    {"engine": {"aic_nextn": 2, "decode_speedup_ratio": -1.0}},
    {"engine": {"max_model_len": 0, "decode_speedup_ratio": -1.0}},
    {"engine": {}, "startup_time": -1.0},
    {"engine": {}, "mem_fraction_static": 1.5},
    # An AIS timing config: its nextn is the launch's unless given, and must agree with it.
    {"engine": {"timing_model": _spec_ais(nextn=2)}},
    {"engine": {"aic_nextn_accept_rates": "0.5", "timing_model": _spec_ais(nextn=2)}},
    {"engine": {"aic_nextn": 1, "timing_model": _spec_ais(nextn=2)}},
    {"engine": {"aic_nextn": 2, "timing_model": _spec_ais()}},
    {"engine": {"aic_nextn": 6, "timing_model": _spec_ais(nextn=2)}},
    {"engine": {"aic_nextn": 1, "decode_speedup_ratio": 2.0, "timing_model": _spec_ais(nextn=2)}},
    {"engine": {"timing_model": _spec_ais(nextn=6)}},
    {"engine": {"aic_nextn": 1, "timing_model": _spec_ais(worker_type="decode")}},
    # Draft schemes: only ngram is known; a valid one is refused by the engine launch.
    {"engine": {"timing_model": _spec_ais(speculation=_NGRAM)}},
    {"engine": {"aic_nextn": 2, "timing_model": _spec_ais(speculation=_NGRAM)}},
    {"engine": {"timing_model": _spec_ais(nextn=2, speculation=_NGRAM)}},
    {"engine": {"backend": "sglang", "timing_model": _spec_ais(backend="sglang", speculation=_NGRAM)}},
    {"engine": {"timing_model": _spec_ais(speculation={"kind": "ngram", "params": {"num_speculative_tokens": 6}})}},
    {"engine": {"timing_model": _spec_ais(speculation={"kind": "mtp", "params": {"num_speculative_tokens": 2}})}},
    {"engine": {"timing_model": _spec_ais(speculation={"kind": "eagle3", "params": {"num_speculative_tokens": 2}})}},
    {"engine": {"timing_model": _spec_ais(speculation={"kind": "draft_model", "params": {"num_speculative_tokens": 2}})}},
    {"engine": {"timing_model": _spec_ais(speculation={"kind": "ngram", "params": {"num_speculative_tokens": 2, "trigger_rate": 0.5}})}},
    {"engine": {"timing_model": _spec_ais(speculation="ngram")}},
    {"engine": {"timing_model": _spec_ais(speculation={"kind": "ngram"})}},
    {"engine": {"timing_model": _spec_ais(speculation={"kind": "ngram", "params": {"num_speculative_tokens": 2.0}})}},
    {"engine": {"timing_model": _spec_ais(speculation={"kind": "ngram", "params": {"num_speculative_tokens": 2}, "x": 1})}},
    {"engine": {"timing_model": _spec_ais(speculation=_NGRAM)}, "gpu_memory_utilization": 1.5},
    {"engine": {"timing_model": _spec_ais(pp=2, speculation=_NGRAM)}},
    {"engine": {"timing_model": _spec_ais(worker_type="decode", speculation=_NGRAM)}},
    {"engine": {"timing_model": _spec_ais(speculation=_NGRAM)}, "tensor_parallel_size": 2},
    {"engine": {"timing_model": _spec_ais(estimation_mode="op_level", speculation=_NGRAM)}},
]
SPEC_ARGV = [
    ["--ais-nextn", "2"],
    ["--ais-nextn", "3", "--ais-nextn-accept-rates", "0.9,0.5"],
    ["--aic-nextn", "1", "--aic-mtp-seed", "5"],
    ["--ais-nextn", "2", "--ais-nextn-accept-rates", "2"],
    ["--ais-nextn-accept-rates", "0.5"],
    ["--ais-nextn", "0"],
    ["--engine-type", "sglang", "--ais-nextn", "2"],
    ["--engine-type", "trtllm", "--ais-nextn", "1", "--ais-nextn-accept-rates", ""],
    ["--disaggregation-mode", "decode", "--ais-nextn", "2"],
    ["--disaggregation-mode", "prefill", "--ais-nextn", "2"],
    ["--ais-perf-config", json.dumps({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm",
                                      "speculation": _NGRAM})],
    ["--ais-perf-config", json.dumps({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "nextn": 2})],
]
_SPEC_ENGINE = {"num_gpu_blocks": 512, "block_size": 16}
SPEC_REPLAYS = [
    {"extra_engine_args": {"engine": dict(_SPEC_ENGINE, aic_nextn=2)}},
    {"extra_engine_args": {"engine": dict(_SPEC_ENGINE, aic_nextn=2, aic_nextn_accept_rates="0.9,0.5", aic_mtp_seed=7)}},
    {"extra_engine_args": {"engine": dict(_SPEC_ENGINE, aic_nextn=1, aic_mtp_seed=2**64 - 1)}},
    {"extra_engine_args": {"engine": dict(_SPEC_ENGINE, aic_nextn=3, aic_nextn_accept_rates="1,1")}},
    {"extra_engine_args": {"engine": dict(_SPEC_ENGINE, aic_nextn=2, aic_nextn_accept_rates="0.6,0.6")}, "num_workers": 2},
    {"extra_engine_args": {"engine": dict(_SPEC_ENGINE, backend="sglang", aic_nextn=2, aic_nextn_accept_rates="0.7,0.4",
                                          aic_mtp_seed=3)}},
    {"extra_engine_args": {"engine": dict(_SPEC_ENGINE, backend="trtllm", aic_nextn=2, aic_nextn_accept_rates="0.7,0.4",
                                          aic_mtp_seed=3)}},
    {"prefill_engine_args": {"engine": dict(_SPEC_ENGINE, worker_type="prefill")},
     "decode_engine_args": {"engine": dict(_SPEC_ENGINE, worker_type="decode", aic_nextn=2, aic_nextn_accept_rates="0.8,0.6",
                                           aic_mtp_seed=5)}, "num_decode_workers": 2},
    {"prefill_engine_args": {"engine": dict(_SPEC_ENGINE, worker_type="prefill", aic_nextn=2)},
     "decode_engine_args": {"engine": dict(_SPEC_ENGINE, worker_type="decode")}},
    {"extra_engine_args": {"engine": {"timing_model": _spec_ais(nextn=2)}}},
]
SPEC_SUMMARY = ["completed_requests", "total_output_tokens", "duration_ms", "mean_ttft_ms", "p99_ttft_ms",
                "mean_itl_ms", "mean_tpot_ms", "mean_e2e_latency_ms"]


def speculation_cases():
    """Every speculation case, with a stable id: ``(id, kind, payload)``."""
    out = [(f"normalize_{i}", "normalize", c) for i, c in enumerate(SPEC_NORMALIZE)]
    out += [(f"argv_{i}", "argv", a) for i, a in enumerate(SPEC_ARGV)]
    out += [(f"replay_{i}", "replay", r) for i, r in enumerate(SPEC_REPLAYS)]
    return out


def speculation_outcome(package: str, kind: str, payload) -> dict:
    """The speculative keys of an accepted configuration (``engine`` and, for AIS, its
    timing config's ``nextn``), or a replay's summary values, or the error's type and message.
    ``package`` is ``dynamo`` or ``servesim``."""
    import warnings

    config = importlib.import_module(f"{package}.mocker.config")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if kind == "normalize":
                result = config.normalize_mocker_config(payload)
            elif kind == "argv":
                args = importlib.import_module(f"{package}.mocker.args")
                result = config.build_mocker_engine_args(args.parse_args(payload))
            else:
                replay = importlib.import_module(f"{package}.replay")
                report = replay.run_synthetic_trace_replay(256, 64, 20, replay_concurrency=4, **payload)
                return {"ok": {k: report.summary[k] for k in SPEC_SUMMARY}}
        except SystemExit as e:
            return {"error": ["SystemExit", str(e.code)]}
        except Exception as e:  # noqa: BLE001 - the type and message are what is compared
            return {"error": [type(e).__name__, str(e)]}
    engine = result["engine"]
    timing = engine.get("timing_model") or {}
    out = {k: engine.get(k) for k in ("aic_nextn", "aic_nextn_accept_rates", "aic_mtp_seed", "worker_type",
                                       "decode_speedup_ratio")}
    if isinstance(timing.get("config"), dict):
        out["ais_nextn"] = timing["config"].get("nextn")
        out["ais_speculation"] = timing["config"].get("speculation")
    return {"ok": out}

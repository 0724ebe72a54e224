#!/usr/bin/env python3
"""Runs one case through the reference (NVIDIA Dynamo 1.6.1's offline replay) and prints its
summary as JSON. Like ../shared/parity/dynamo_replay.py, plus the keys that script cannot pass:

  "router_config": {...}       a KvRouterConfig as JSON (e.g. {"router_temperature": 0.5})
  "kv_event_lag_ms": 5.0       delay of KV events seen by the router
  "model_name": "m"            picks the model profile of a router policy config
  "traces": [...]              several trace files (Dynamo shards) instead of "trace"
  "prefill_dp_size", "decode_dp_size"  attention-DP ranks per prefill / decode worker
  "trace_format", "trace_block_size" (null: the format's own), "agentic_lanes",
  "execution_model", "weka_nested_timestamp_basis", "trace_shared_prefix_ratio",
  "trace_num_prefix_groups"    the trace-format options of run_trace_replay
  "launch": {...}              top-level keys of every engine-args object besides "engine"
                               (e.g. {"dynamo": {"router_queue_policy": "lcfs"}},
                               {"gpu_memory_utilization": 0.8})
  "record_cache_tiers": true   add "x_cache_tiers" to the summary: where each request's first
                               admission found its reused prompt (device G1 or host G2 offload),
                               which the reference reports only per request

Run it with the reference's interpreter:
  $(../shared/parity/setup.sh) scripts/reference_replay.py CASE.json [--per-request OUT.json]
"""
import json, os, sys, time

os.environ.setdefault("RUST_LOG", "error")
from dynamo._core import KvRouterConfig  # noqa: E402
from dynamo.replay.api import run_trace_replay, run_synthetic_trace_replay  # noqa: E402


LAUNCH = {}


def engine_args(engine, dp_size):
    if engine is None:
        return None
    args = {**LAUNCH, "engine": dict(engine)}
    if dp_size and dp_size != 1:
        args["dp_size"] = dp_size
    return args


def cache_tiers(per_request):
    """Totals and per-request rows of the reference's first-admission cache-tier attribution
    (`first_admission_{g1,host}_reused_input_tokens`), in the reference's request order."""
    rows = [{"arrival_time_ms": r["arrival_time_ms"], "first_admit_ms": r["first_admit_ms"],
             "ttft_ms": r["ttft_ms"], "reused_input_tokens": r["reused_input_tokens"],
             "g1_reused_input_tokens": r.get("first_admission_g1_reused_input_tokens"),
             "host_reused_input_tokens": r.get("first_admission_host_reused_input_tokens")}
            for r in per_request]
    return {
        "g1_reused_input_tokens": sum(r["g1_reused_input_tokens"] or 0 for r in rows),
        "host_reused_input_tokens": sum(r["host_reused_input_tokens"] or 0 for r in rows),
        "requests_with_host_hits": sum(1 for r in rows if r["host_reused_input_tokens"]),
        "requests": rows,
    }


def main():
    case = json.load(open(sys.argv[1]))
    LAUNCH.update(case.get("launch") or {})
    per_request_out = sys.argv[sys.argv.index("--per-request") + 1] if "--per-request" in sys.argv else None
    router_config = case.get("router_config")
    if router_config is not None:
        router_config = KvRouterConfig.from_json(json.dumps(router_config))
    common = dict(
        extra_engine_args=engine_args(case.get("engine"), case.get("dp_size")),
        prefill_engine_args=engine_args(case.get("prefill_engine"), case.get("prefill_dp_size", 1)),
        decode_engine_args=engine_args(case.get("decode_engine"), case.get("decode_dp_size", 1)),
        router_config=router_config,
        num_workers=case.get("num_workers", 1),
        num_prefill_workers=case.get("num_prefill_workers", 1),
        num_decode_workers=case.get("num_decode_workers", 1),
        replay_concurrency=case.get("replay_concurrency"),
        router_mode=case.get("router_mode", "round_robin"),
        arrival_speedup_ratio=case.get("arrival_speedup_ratio", 1.0),
        sla_ttft_ms=case.get("sla_ttft_ms"), sla_itl_ms=case.get("sla_itl_ms"),
        sla_e2e_ms=case.get("sla_e2e_ms"),
        capture_per_request=per_request_out is not None or bool(case.get("record_cache_tiers")),
    )
    if case.get("model_name") is not None:
        common["model_name"] = case["model_name"]
    start = time.perf_counter()
    traces = case.get("traces") or ([case["trace"]] if case.get("trace") else None)
    if traces:
        extra = {}
        if case.get("kv_event_lag_ms") is not None:
            extra["kv_event_lag_ms"] = case["kv_event_lag_ms"]
        for key in ["agentic_lanes", "execution_model", "weka_nested_timestamp_basis",
                    "trace_shared_prefix_ratio", "trace_num_prefix_groups"]:
            if case.get(key) is not None:
                extra[key] = case[key]
        report = run_trace_replay(
            traces, trace_format=case.get("trace_format", "mooncake"),
            trace_block_size=case.get("trace_block_size", 512), **extra, **common)
    else:
        s = case["synthetic"]
        report = run_synthetic_trace_replay(
            s["input_tokens"], s["output_tokens"], s["request_count"],
            request_rate=s.get("request_rate"), arrival_interval_ms=s.get("arrival_interval_ms"),
            arrival_seed=s.get("arrival_seed", 42), turns_per_session=s.get("turns_per_session", 1),
            shared_prefix_ratio=s.get("shared_prefix_ratio", 0.0),
            num_prefix_groups=s.get("num_prefix_groups", 0),
            inter_turn_delay_ms=s.get("inter_turn_delay_ms", 0.0), **common)
    summary = dict(report.summary)
    summary["call_wall_ms"] = (time.perf_counter() - start) * 1000.0
    if case.get("record_cache_tiers"):
        summary["x_cache_tiers"] = cache_tiers(report.per_request)
    if per_request_out:
        json.dump(report.per_request, open(per_request_out, "w"))
    json.dump(summary, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()

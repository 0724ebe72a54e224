"""The mocker's command line, with the flags, defaults, aliases and post-parse rules of
``dynamo.mocker.args`` in Dynamo 1.6.1 (flag table: ``shared/reference/python-api.md`` §4).

Differences: the router-advertisement flags do not read their ``DYN_*`` environment
variables (the transport flags do), and ``args.router_advertisement`` is a plain
:class:`WorkerRouterConfig` namespace.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from servesim import __version__

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_PREFILL_ENDPOINT",
    "ProfileDataResult",
    "resolve_planner_profile_data",
    "validate_worker_type_args",
    "parse_bootstrap_ports",
    "parse_args",
    "WorkerRouterConfig",
]

_NS = os.environ.get("DYN_NAMESPACE", "dynamo")
DEFAULT_ENDPOINT = f"dyn://{_NS}.backend.generate"
DEFAULT_PREFILL_ENDPOINT = f"dyn://{_NS}.prefill.generate"

_NPZ_KEYS = ("prefill_isl", "prefill_ttft_ms", "decode_active_kv_tokens", "decode_context_length", "decode_itl")


class ProfileDataResult:
    """A resolved ``--planner-profile-data``: the NPZ path and the temporary directory that
    holds it when it was converted (removed when this object goes away)."""

    def __init__(self, npz_path: Optional[Path], tmpdir: Optional[tempfile.TemporaryDirectory]):
        self.npz_path = npz_path
        self._tmpdir = tmpdir

    def __del__(self):
        if self._tmpdir is not None:
            try:
                self._tmpdir.cleanup()
            except Exception:
                pass


def resolve_planner_profile_data(planner_profile_data: Optional[Path]) -> ProfileDataResult:
    """Resolves ``--planner-profile-data`` to a mocker NPZ as Dynamo does: ``None`` stays
    ``None``; a mocker-format NPZ is used as it is; a profiler results directory is converted
    (:mod:`servesim.mocker.utils.planner_profiler_perf_data_converter`) to ``perf_data.npz`` in
    a temporary directory that lives as long as the result; anything else raises the
    reference's ``FileNotFoundError``. Needs no numpy."""
    if planner_profile_data is None:
        return ProfileDataResult(None, None)
    from .utils.planner_profiler_perf_data_converter import (
        convert_profile_results_to_npz,
        is_mocker_format_npz,
        is_profile_results_dir,
    )

    p = planner_profile_data
    if is_mocker_format_npz(p):
        return ProfileDataResult(p, None)
    if is_profile_results_dir(p):
        tmpdir = tempfile.TemporaryDirectory(prefix="mocker_perf_data_")
        npz_path = Path(tmpdir.name) / "perf_data.npz"
        convert_profile_results_to_npz(p, npz_path)
        return ProfileDataResult(npz_path, tmpdir)
    raise FileNotFoundError(
        f"Path '{p}' is neither a mocker-format NPZ file nor a valid profiler results directory.\n"
        "Expected either:\n"
        f"  - A .npz file with keys: {', '.join(_NPZ_KEYS)}\n"
        "  - A directory containing selected_prefill_interpolation/raw_data.npz and selected_decode_interpolation/raw_data.npz\n"
        "  - A directory containing prefill_raw_data.json and decode_raw_data.json"
    )


def validate_worker_type_args(args) -> None:
    """Reconcile ``--disaggregation-mode`` with the deprecated ``--is-prefill-worker`` /
    ``--is-decode-worker`` flags (mutates ``args``)."""
    legacy_prefill = bool(getattr(args, "is_prefill_worker", False))
    legacy_decode = bool(getattr(args, "is_decode_worker", False))
    mode = getattr(args, "disaggregation_mode", None)
    if (legacy_prefill or legacy_decode) and mode is not None:
        raise ValueError(
            "Cannot combine --is-prefill-worker/--is-decode-worker with --disaggregation-mode. "
            "Use only --disaggregation-mode."
        )
    if legacy_prefill and legacy_decode:
        raise ValueError(
            "Cannot specify both --is-prefill-worker and --is-decode-worker. "
            "A worker must be either prefill, decode, or aggregated (neither flag set)."
        )
    if legacy_prefill or legacy_decode:
        flag, mode = ("--is-prefill-worker", "prefill") if legacy_prefill else ("--is-decode-worker", "decode")
        warnings.warn(
            f"{flag} is deprecated, use --disaggregation-mode={mode}", DeprecationWarning, stacklevel=2
        )
    if mode is None:
        mode = "agg"
    args.disaggregation_mode = mode
    args.is_prefill_worker = mode == "prefill"
    args.is_decode_worker = mode == "decode"


def parse_bootstrap_ports(ports_str: Optional[str]) -> list[int]:
    """``"1,2"`` → ``[1, 2]``; empty or ``None`` → ``[]``."""
    if not ports_str:
        return []
    return [int(p.strip()) for p in ports_str.split(",")]


def _nullable(kind):
    def parse(value):
        if value is None or value == "" or value == "None":
            return None
        return kind(value)

    parse.__name__ = f"nullable_{kind.__name__}"
    return parse


def _json_or_file(value: str):
    s = value.strip()
    if s.startswith("{"):
        return json.loads(s)
    text = Path(value).read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        import yaml

        return yaml.safe_load(text)


def _conditional_disagg_config(value: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


class _Deprecated(argparse.Action):
    """A flag that still works but warns (``--no-X`` spellings store False)."""

    def __init__(self, option_strings, dest, nargs=None, boolean=False, replacement=None, **kwargs):
        self.boolean = boolean
        self.replacement = replacement
        if boolean:
            nargs = 0
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def format_usage(self):
        # As argparse.BooleanOptionalAction shows itself: `--load-aware | --no-load-aware`.
        return " | ".join(self.option_strings) if self.boolean else self.option_strings[0]

    def __call__(self, parser, namespace, values, option_string=None):
        warnings.warn(
            f"{option_string} is deprecated and will be removed in v1.7; use {self.replacement}.",
            FutureWarning,
            stacklevel=2,
        )
        if self.boolean:
            values = not option_string.startswith("--no-")
        setattr(namespace, self.dest, values)


@dataclass
class WorkerRouterConfig:
    """The router hints a worker advertises (built from the router flags)."""

    router_mode: Optional[str] = None
    overlap_score_weight: Optional[float] = None
    router_temperature: float = 0.0
    use_kv_events: bool = True
    router_queue_policy: str = "fcfs"

    @classmethod
    def from_cli_args(cls, args) -> "WorkerRouterConfig":
        return cls(
            router_mode=args.router_mode,
            overlap_score_weight=args.overlap_score_weight,
            router_temperature=args.router_temperature,
            use_kv_events=args.use_kv_events,
            router_queue_policy=args.router_queue_policy,
        )


def _add_router_arguments(p: argparse.ArgumentParser) -> None:
    add = p.add_argument
    g = argparse.BooleanOptionalAction
    add("--router-mode", dest="router_mode", type=str, default=None,
        choices=["round-robin", "random", "power-of-two", "kv", "direct", "least-loaded", "device-aware-weighted"])
    add("--router-session-affinity-ttl-secs", dest="session_affinity_ttl_secs", type=int, default=None)
    add("--router-session-affinity-mode", dest="session_affinity_mode", type=str, default="hard", choices=("hard", "soft"))
    add("--active-decode-blocks-threshold", type=_nullable(float), default=None)
    add("--active-prefill-tokens-threshold", type=_nullable(int), default=None)
    add("--active-prefill-tokens-threshold-frac", type=_nullable(float), default=None)
    add("--load-aware", "--no-load-aware", dest="load_aware", action=_Deprecated, replacement="the load-only policy and router tracking settings in --router-policy-config", boolean=True, default=False)
    add("--router-kv-overlap-score-credit", dest="overlap_score_credit", action=_Deprecated, replacement="overlap_score_credit in the default policy parameters in --router-policy-config", type=float, default=1.0)
    add("--router-kv-overlap-score-credit-decay", dest="overlap_score_credit_decay", action=_Deprecated, replacement="overlap_score_credit_decay in the default policy parameters in --router-policy-config", type=float, default=0.0)
    add("--router-kv-overlap-score-weight", "--kv-overlap-score-weight", dest="overlap_score_weight",
        action=_Deprecated, replacement="prefill_load_scale in the default policy parameters in --router-policy-config", type=float, default=None, help=argparse.SUPPRESS)
    add("--router-prefill-load-scale", dest="prefill_load_scale", action=_Deprecated, replacement="prefill_load_scale in the default policy parameters in --router-policy-config", type=float, default=1.0)
    add("--router-decode-active-request-weight", dest="decode_active_request_weight", action=_Deprecated, replacement="decode_active_request_weight in the default policy parameters in --router-policy-config", type=float, default=0.0)
    add("--router-host-cache-hit-weight", dest="host_cache_hit_weight", type=float, default=0.75)
    add("--router-disk-cache-hit-weight", dest="disk_cache_hit_weight", type=float, default=0.25)
    add("--router-temperature", dest="router_temperature", action=_Deprecated, replacement="router_temperature in the default policy parameters in --router-policy-config", type=float, default=0.0)
    add("--router-kv-events", "--kv-events", dest="use_kv_events", action=g, default=True)
    add("--router-replica-sync", dest="router_replica_sync", action=g, default=False)
    add("--router-track-active-blocks", "--track-active-blocks", dest="router_track_active_blocks", action=g, default=True)
    add("--router-track-output-blocks", "--track-output-blocks", dest="router_track_output_blocks", action=g, default=False)
    add("--router-assume-kv-reuse", "--assume-kv-reuse", dest="router_assume_kv_reuse", action=g, default=True)
    add("--router-track-prefill-tokens", dest="router_track_prefill_tokens", action=g, default=True)
    add("--router-tracking-hash", type=str, default="public-xxh3-v1", choices=["public-xxh3-v1", "keyed-xxh3-v1"])
    add("--router-tracking-key-file", type=str, default=None)
    add("--router-tracking-key-id", type=str, default=None)
    add("--router-prefill-load-model", type=str, default="none", choices=["none", "ais"])
    add("--router-ttl-secs", type=float, default=120.0)
    add("--router-approximate-cache-policy", type=str, default="ttl", choices=["ttl", "lru"])
    add("--router-queue-threshold", action=_Deprecated, replacement="policy_classes[].prefill_busy_threshold_frac in --router-policy-config", type=_nullable(float), default=None)
    add("--router-policy-config", type=str, default=None)
    add("--router-conditional-disagg", dest="conditional_disagg_enabled", action=g, default=False)
    add("--router-conditional-disagg-config", dest="conditional_disagg_config", type=_conditional_disagg_config, default=None,
        metavar="JSON")
    add("--router-prefill-policy", action=_Deprecated, replacement="worker_selection.prefill in --router-policy-config", type=str, default=None)
    add("--router-decode-policy", action=_Deprecated, replacement="worker_selection.decode in --router-policy-config", type=str, default=None)
    add("--router-event-threads", type=int, default=4)
    add("--router-queue-policy", action=_Deprecated, replacement="policy_classes[].queue_policy in --router-policy-config", type=str, default="fcfs", choices=["fcfs", "wspt"])
    add("--use-remote-indexer", action=g, default=False)
    add("--enable-session-prefix-index", action=g, default=False)
    add("--shared-cache-multiplier", action=_Deprecated, replacement="shared_cache_multiplier in the default policy parameters in --router-policy-config", type=float, default=None)
    add("--shared-cache-type", type=str, default="none", choices=["none", "hicache"])
    add("--router-predicted-ttl-secs", type=float, default=None)


_AIS_SUFFIXES = (
    "perf-model", "system", "backend", "backend-version", "tp-size", "moe-tp-size", "moe-ep-size",
    "attention-dp-size", "nextn", "nextn-accept-rates", "mtp-seed",
)


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Mocker engine for testing Dynamo LLM infrastructure with vLLM-style CLI.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--version", action="version", version=f"Dynamo Mocker {__version__}")
    add("--model-path", type=str, default=None)
    add("--endpoint", type=str, default=None)
    add("--model-name", type=str, default=None)
    add("--num-gpu-blocks-override", dest="num_gpu_blocks", type=int, default=None,
        help="Number of GPU blocks (non-AIS mocker uses 16384)")
    add("--block-size", type=int, default=None, help="Tokens per block (vLLM 64, SGLang 1, TRTLLM 32)")
    add("--max-model-len", type=int, default=None)
    add("--max-num-seqs", type=int, default=256)
    add("--max-num-batched-tokens", type=int, default=8192)
    add("--enable-prefix-caching", action="store_true", default=True)
    add("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    add("--enable-chunked-prefill", action="store_true", default=True)
    add("--no-enable-chunked-prefill", dest="enable_chunked_prefill", action="store_false")
    add("--preemption-mode", type=str, default="lifo")
    add("--speedup-ratio", type=float, default=1.0, help="0 = infinite speedup")
    add("--decode-speedup-ratio", type=float, default=1.0)
    add("--data-parallel-size", dest="dp_size", type=int, default=None)
    add("--startup-time", type=float, default=None)
    add("--planner-profile-data", type=Path, default=None)
    add("--ais-perf-model", "--aic-perf-model", dest="ais_perf_model", action="store_true", default=False)
    add("--gpu-memory-utilization", type=float, default=None)
    add("--mem-fraction-static", type=float, default=None)
    add("--free-gpu-memory-fraction", type=float, default=None)
    for name, kind in (("system", str), ("backend", str), ("backend-version", str), ("tp-size", int),
                       ("moe-tp-size", int), ("moe-ep-size", int), ("attention-dp-size", int), ("nextn", int),
                       ("nextn-accept-rates", str)):
        add(f"--ais-{name}", f"--aic-{name}", dest=f"ais_{name.replace('-', '_')}", type=kind, default=None)
    add("--ais-mtp-seed", "--aic-mtp-seed", dest="ais_mtp_seed", type=int, default=42)
    add("--num-workers", type=int, default=1)
    add("--ais-perf-config", type=_json_or_file, default=None)
    add("--reasoning", type=str, default=None)
    add("--response-replay-trace-path", type=str, default=None)
    add("--engine-type", type=str, default="vllm")
    add("--sglang-schedule-policy", type=str, default=None)
    add("--sglang-page-size", type=int, default=None)
    add("--sglang-max-prefill-tokens", type=int, default=None)
    add("--sglang-chunked-prefill-size", type=int, default=None)
    add("--sglang-clip-max-new-tokens", type=int, default=None)
    add("--sglang-schedule-conservativeness", type=float, default=None)
    add("--sglang-generate", action="store_true", default=False)
    add("--trtllm-capacity-scheduler-policy", type=str, default=None)
    add("--extra-engine-args", type=Path, default=None)
    add("--disaggregation-mode", type=str, default=None, choices=["agg", "prefill", "decode"])
    add("--is-prefill-worker", action="store_true", default=False)
    add("--is-decode-worker", action="store_true", default=False)
    add("--zmq-kv-events-ports", type=str, default=None)
    add("--zmq-replay-ports", type=str, default=None)
    add("--bootstrap-ports", type=str, default=None)
    add("--kv-transfer-bandwidth", type=float, default=None)
    add("--kv-transfer-timing-mode", default="full_prompt")
    add("--kv-cache-dtype", type=str, default="auto",
        choices=["auto", "bfloat16", "fp8", "fp8_ds_mla", "fp8_e4m3", "fp8_e5m2", "fp8_inc"])
    add("--kv-bytes-per-token", type=int, default=None)
    add("--num-host-blocks", type=int, default=None)
    add("--host-offload-d2h-bandwidth-gbps", type=float, default=None)
    add("--host-offload-h2d-bandwidth-gbps", type=float, default=None)
    add("--stagger-delay", type=float, default=0.0, help="-1 = auto")
    add("--discovery-backend", type=str, default=os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
        choices=["kubernetes", "etcd", "file", "mem"])
    add("--request-plane", type=str, default=os.environ.get("DYN_REQUEST_PLANE", "tcp"), choices=["nats", "tcp"])
    add("--response-plane", type=str, default=os.environ.get("DYN_RESPONSE_PLANE", "tcp"), choices=["tcp", "quic"])
    add("--event-plane", type=str, default=os.environ.get("DYN_EVENT_PLANE"), choices=["nats", "zmq"])
    _add_router_arguments(p)
    return p


def _ports(args, flag: str, value: Optional[str]) -> list[int]:
    ports = parse_bootstrap_ports(value)
    if ports and len(ports) != args.num_workers:
        raise ValueError(
            f"--{flag} must have exactly --num-workers ({args.num_workers}) ports, got {len(ports)}: {ports}"
        )
    return ports


def parse_args(argv=None) -> argparse.Namespace:
    """Parse the mocker's flags (``sys.argv[1:]`` when ``argv`` is None) and apply the
    reference's post-parse rules."""
    parser = _build_parser()
    given = list(argv) if argv is not None else None
    import sys

    tokens = given if given is not None else sys.argv[1:]
    for suffix in _AIS_SUFFIXES:
        new, old = f"--ais-{suffix}", f"--aic-{suffix}"
        spelled = {t.split("=", 1)[0] for t in tokens if isinstance(t, str)}
        if new in spelled and old in spelled:
            parser.error(f"{new} and its legacy --aic spelling cannot be combined")
    args = parser.parse_args(given)
    if args.sglang_schedule_policy == "fcfs":
        warnings.warn(
            "--sglang-schedule-policy fcfs is deprecated and will be removed in Dynamo 1.8.0 "
            "(two releases after 1.6.0); use --sglang-schedule-policy fifo.",
            FutureWarning,
            stacklevel=2,
        )
        args.sglang_schedule_policy = "fifo"
    if args.sglang_page_size is not None:
        warnings.warn(
            "--sglang-page-size is deprecated and will be removed in Dynamo 1.8.0 (two releases after 1.6.0); "
            "use --block-size.",
            FutureWarning,
            stacklevel=2,
        )
        if args.engine_type == "sglang":
            if args.block_size is not None and args.block_size != args.sglang_page_size:
                parser.error("--sglang-page-size and --block-size must match")
            args.block_size = args.sglang_page_size
    args.router_advertisement = WorkerRouterConfig.from_cli_args(args)
    validate_worker_type_args(args)
    if args.num_workers < 1:
        raise ValueError(f"--num-workers must be at least 1, got {args.num_workers}")
    args.bootstrap_ports_list = _ports(args, "bootstrap-ports", args.bootstrap_ports)
    args.zmq_kv_events_ports_list = _ports(args, "zmq-kv-events-ports", args.zmq_kv_events_ports)
    args.zmq_replay_ports_list = _ports(args, "zmq-replay-ports", args.zmq_replay_ports)
    if args.zmq_replay_ports_list and not args.zmq_kv_events_ports_list:
        raise ValueError("--zmq-replay-ports requires --zmq-kv-events-ports")
    if args.endpoint is None:
        args.endpoint = DEFAULT_PREFILL_ENDPOINT if args.is_prefill_worker else DEFAULT_ENDPOINT
    return args

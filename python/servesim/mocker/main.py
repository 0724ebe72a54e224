"""``dynamo.mocker.main`` (Dynamo 1.6.1) on servesim's live server: ``python -m servesim.mocker``
takes the flags of ``python -m dynamo.mocker`` and serves the simulated workers in this process,
behind servesim's own routing frontend (OpenAI-compatible HTTP with SSE, Prometheus
``/metrics``, KV events over ZMQ). No etcd, NATS or separate frontend is needed.

Where the reference registers each worker with Dynamo's distributed runtime (one
``DistributedRuntime`` per worker, found by a separate ``dynamo.frontend``), servesim starts one
:class:`servesim._core.LiveServer` holding every worker and listening itself:

- HTTP: ``DYN_HTTP_HOST`` (default ``127.0.0.1``; Dynamo's frontend binds ``0.0.0.0``) and
  ``DYN_HTTP_PORT`` (default 8000; 0 picks a free port), the variables behind
  ``dynamo.frontend --http-host/--http-port``. ``SERVESIM_WORKER_BASE_PORT``: worker *i* also
  serves the API on its own port, base + *i*. ``SERVESIM_SHUTDOWN_TIMEOUT``: seconds in-flight
  responses may go on after SIGTERM/SIGINT (default 30; a second signal stops at once).
- Ignored (they configure Dynamo's distributed runtime, which servesim does not have):
  ``--discovery-backend``, ``--request-plane``, ``--response-plane``, ``--event-plane``,
  ``--endpoint``, ``--bootstrap-ports``, ``--sglang-generate`` and the router flags that tune a
  live deployment. The router flags select servesim's router: ``--router-mode kv`` the KV
  router, configured from the other router flags; ``round-robin`` or none round robin; other
  modes are not modelled (warning, round robin).
- ``--zmq-kv-events-ports`` / ``--zmq-replay-ports``: worker *i* publishes its KV events on the
  *i*-th port, in the layout Dynamo's mocker writes (maps tagged by ``type``).
- Per-worker MTP seeds (``aic_mtp_seed + i`` with ``--ais-nextn``) are not applied: all
  workers share one engine configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

os.environ.setdefault("DYN_COMPUTE_THREADS", "0")

# Module-level, as in the reference: worker() looks them up here (tests and wrappers patch them).
from servesim.mocker.args import parse_args, resolve_planner_profile_data  # noqa: E402
from servesim.mocker.config import (  # noqa: E402
    apply_worker_engine_args_overrides,
    build_runtime_config,
    load_mocker_engine_args,
)
from servesim.mocker.utils.kv_cache import compute_kv_bytes_per_token  # noqa: E402

__all__ = [
    "compute_stagger_delay",
    "graceful_shutdown",
    "prefetch_model",
    "worker",
    "launch_workers",
    "main",
]

logger = logging.getLogger(__name__)


def compute_stagger_delay(num_workers: int, stagger_delay: float):
    """Seconds between worker starts: ``stagger_delay`` itself when ≥ 0; with ``-1`` (auto)
    0 for up to 32 workers, 0.1 up to 128, else 0.2."""
    if stagger_delay >= 0:
        return stagger_delay
    if stagger_delay == -1:
        if num_workers <= 32:
            return 0.0
        if num_workers <= 128:
            return 0.1
        return 0.2
    raise ValueError(
        f"Invalid --stagger-delay value: {stagger_delay}. Use -1 for auto mode, 0 to disable, "
        "or a positive value for explicit delay."
    )


async def graceful_shutdown(runtimes) -> None:
    """Calls ``shutdown()`` on each runtime (for a :class:`~servesim._core.LiveServer`: stop
    accepting and let in-flight responses finish; it returns at once)."""
    logger.info("Received shutdown signal, shutting down the live server(s)")
    for rt in runtimes:
        rt.shutdown()
    logger.info("Shutdown started")


def _hf_hub_cache() -> Path:
    """Where Hugging Face keeps downloaded repositories: ``HF_HUB_CACHE``, else
    ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _cached_snapshot(repo_id: str):
    """The snapshot directory of ``repo_id`` (``org/name``) already in the Hugging Face cache:
    the revision ``refs/main`` names, else the only snapshot there is; ``None`` if absent."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        return None
    repo = _hf_hub_cache() / f"models--{parts[0]}--{parts[1]}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = snapshots / ref.read_text().strip()
        if candidate.is_dir():
            return candidate
    found = sorted(p for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []
    return found[0] if len(found) == 1 else None


async def prefetch_model(model_path: str) -> str:
    """The model path workers should load: ``model_path`` itself when it exists locally, else the
    snapshot of that Hugging Face repository already in the local cache. servesim never
    downloads (the reference fetches the repository's configuration from the hub here); like
    the reference, a path it cannot resolve is logged as a warning and returned unchanged."""
    if os.path.exists(model_path):
        return model_path
    try:
        snapshot = _cached_snapshot(model_path)
    except OSError as e:
        logger.warning("Failed to prefetch model %s: %s", model_path, e)
        return model_path
    if snapshot is None:
        logger.warning(
            "Failed to prefetch model %s: not a local path and not in the Hugging Face cache at %s "
            "(servesim does not download models)",
            model_path,
            _hf_hub_cache(),
        )
        return model_path
    return str(snapshot)


def _local_model_dir(model_path):
    """The local directory of ``model_path`` (itself, or its snapshot in the Hugging Face cache),
    else ``None``; no warnings (``prefetch_model`` gives them)."""
    if not model_path:
        return None
    if os.path.isdir(model_path):
        return model_path
    try:
        snapshot = _cached_snapshot(model_path)
    except OSError:
        return None
    return str(snapshot) if snapshot is not None else None


def _env_port(name: str, default):
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        port = int(value)
    except ValueError:
        raise ValueError(f"{name} must be a port number (0-65535), got {value!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{name} must be a port number (0-65535), got {value!r}")
    return port


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not (seconds >= 0 and seconds != float("inf")):
        raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return seconds


# Router flags (dest → KvRouterConfig key) passed to the KV router when set.
_KV_ROUTER_KEYS = (
    ("overlap_score_credit", "overlap_score_credit"),
    ("overlap_score_credit_decay", "overlap_score_credit_decay"),
    ("prefill_load_scale", "prefill_load_scale"),
    ("overlap_score_weight", "overlap_score_weight"),
    ("decode_active_request_weight", "decode_active_request_weight"),
    ("router_temperature", "router_temperature"),
    ("router_track_active_blocks", "router_track_active_blocks"),
    ("router_assume_kv_reuse", "router_assume_kv_reuse"),
    ("router_track_prefill_tokens", "router_track_prefill_tokens"),
    ("router_queue_threshold", "router_queue_threshold"),
    ("router_queue_policy", "router_queue_policy"),
    # Features servesim does not model: their neutral values pass, others are refused by name.
    ("use_kv_events", "use_kv_events"),
    ("router_track_output_blocks", "router_track_output_blocks"),
    ("enable_session_prefix_index", "enable_session_prefix_index"),
    ("shared_cache_type", "shared_cache_type"),
    ("shared_cache_multiplier", "shared_cache_multiplier"),
    ("router_predicted_ttl_secs", "router_predicted_ttl_secs"),
    ("conditional_disagg_enabled", "conditional_disagg_enabled"),
    ("router_policy_config", "router_policy_config"),
    ("router_prefill_policy", "router_prefill_policy"),
    ("router_decode_policy", "router_decode_policy"),
)


def _router(args):
    """``(router_mode, router_config JSON or None)`` for servesim's frontend from the router
    flags the reference's workers advertise."""
    import json

    mode = getattr(args, "router_mode", None)
    if mode in (None, "round-robin"):
        return "round_robin", None
    if mode != "kv":
        logger.warning("--router-mode %s is not modelled by servesim; routing round robin", mode)
        return "round_robin", None
    config = {}
    for dest, key in _KV_ROUTER_KEYS:
        value = getattr(args, dest, None)
        if value is not None:
            config[key] = value
    if getattr(args, "router_prefill_load_model", "none") not in (None, "none"):
        logger.warning("--router-prefill-load-model is not supported in-process; ignored")
    return "kv_router", json.dumps(config)


def _stagger_total(num_workers: int, delay: float, batch_size: int = 32, batch_pause: float = 2.0) -> float:
    if delay <= 0:
        return 0.0
    total = (num_workers - 1) * delay
    if num_workers > batch_size:
        total += batch_pause * ((num_workers + batch_size - 1) // batch_size - 1)
    return total


async def _until_stopped(runtimes, timeout=None) -> bool:
    """Waits (without blocking the event loop) until every runtime has stopped; False on
    timeout."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while not all(rt.stopped for rt in runtimes):
        if deadline is not None and loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def launch_workers(args: argparse.Namespace, base_engine_args, *, on_started=None):
    """Start ``args.num_workers`` simulated workers in this process behind one routing
    frontend, and serve until SIGTERM/SIGINT (or until :func:`graceful_shutdown` is called on
    the servers). The stagger delay (``compute_stagger_delay``) spaces the workers' start: worker
    *i* serves after ``startup_time + i·delay`` (plus Dynamo's 2 s pause every 32 workers).

    ``on_started`` (servesim only): called with the list of running
    :class:`~servesim._core.LiveServer` objects once they listen (their ``url`` gives the bound
    address when ``DYN_HTTP_PORT`` is 0).
    """
    from servesim import _core
    from servesim.mocker.config import core_config_text

    stagger_delay = compute_stagger_delay(args.num_workers, args.stagger_delay)
    batch_size, batch_pause = 32, 2.0
    if stagger_delay > 0:
        logger.info(
            f"Staggering {args.num_workers} worker launches: "
            f"{stagger_delay}s between workers, {batch_pause}s pause every {batch_size} workers "
            f"(estimated total: {_stagger_total(args.num_workers, stagger_delay):.1f}s)"
        )
    router_mode, router_config = _router(args)
    host = os.environ.get("DYN_HTTP_HOST") or "127.0.0.1"
    port = _env_port("DYN_HTTP_PORT", 8000)
    worker_base_port = _env_port("SERVESIM_WORKER_BASE_PORT", None)
    shutdown_timeout = _env_seconds("SERVESIM_SHUTDOWN_TIMEOUT", 30.0)
    model_dir = _local_model_dir(args.model_path)
    if args.model_path and model_dir is None:
        logger.warning(
            "--model-path %s is not a local directory or a cached Hugging Face snapshot; "
            "using servesim's approximate tokenizer",
            args.model_path,
        )
    model_name = args.model_name or args.model_path or None

    runtimes = []
    logger.info(f"Launching {args.num_workers} mocker worker(s) in one servesim live server")
    server = _core.LiveServer(
        core_config_text(base_engine_args),
        num_workers=args.num_workers,
        host=host,
        port=port,
        worker_base_port=worker_base_port,
        model_path=model_dir,
        model_name=model_name,
        stagger_delay=float(stagger_delay),
        router_mode=router_mode,
        router_config=router_config,
        zmq_kv_events_ports=list(args.zmq_kv_events_ports_list or []),
        zmq_replay_ports=list(args.zmq_replay_ports_list or []),
        zmq_event_format="named",
        shutdown_timeout=shutdown_timeout,
    )
    runtimes.append(server)
    try:
        loop = asyncio.get_running_loop()
        signals = 0

        def signal_handler():
            nonlocal signals
            signals += 1
            if signals == 1:
                loop.create_task(graceful_shutdown(runtimes))
            else:
                logger.info("Second signal: dropping in-flight requests now")
                for rt in runtimes:
                    rt.shutdown(force=True)

        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, signal_handler)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or no signal support: shutdown() still works
        logger.info("Signal handlers set up for graceful shutdown")
        # Printed once a signal would be handled: whoever waits for this line may send one.
        print(
            f"servesim: serving {server.model_name} on {server.url} ({server.num_workers} worker(s))",
            flush=True,
        )
        for w, (h, p) in enumerate(server.worker_addresses):
            print(f"servesim: worker {w} on http://{h}:{p}", flush=True)
        if on_started is not None:
            on_started(list(runtimes))
        # Workers come up one stagger delay apart (the server holds each until its time).
        if not await _until_stopped(runtimes, _stagger_total(args.num_workers, stagger_delay)):
            logger.info(f"All {args.num_workers} mocker worker(s) created and running")
        await _until_stopped(runtimes)
        for sig in installed:
            loop.remove_signal_handler(sig)
    finally:
        logger.info("Shutting down the live server(s)")
        for rt in runtimes:
            rt.shutdown()
        for rt in runtimes:
            if not rt.stopped:
                # Leaving early (an exception, a cancelled task): no grace period.
                rt.shutdown(force=True)
                rt.wait(5.0)
    for rt in runtimes:
        report = rt.shutdown_report()
        if report and not report["drained"]:
            logger.warning(
                "Shutdown: %d connection(s) dropped with a response in flight", report["aborted_connections"]
            )


async def worker():
    """Parse the mocker's flags and serve its workers until SIGTERM/SIGINT (the reference's
    steps: planner profile, model prefetch, KV bytes per token from ``config.json``, engine
    configuration, per-worker overrides, launch)."""
    args = parse_args()
    profile_data_result = resolve_planner_profile_data(args.planner_profile_data)
    args.planner_profile_data = profile_data_result.npz_path
    try:
        local_model_path = None
        if args.model_path and (args.num_workers > 1 or args.kv_bytes_per_token is None):
            local_model_path = await prefetch_model(args.model_path)
        if args.kv_bytes_per_token is None and args.model_path:
            args.kv_bytes_per_token = compute_kv_bytes_per_token(local_model_path or args.model_path, args.kv_cache_dtype)
        engine_args = load_mocker_engine_args(args)
        logger.info(
            "Loaded canonical engine config from JSON file"
            if args.extra_engine_args
            else "Created canonical engine config from CLI arguments"
        )
        engine_args = apply_worker_engine_args_overrides(engine_args, kv_bytes_per_token=args.kv_bytes_per_token)
        await launch_workers(args, engine_args)
    finally:
        del profile_data_result


def main():
    """``python -m servesim.mocker``: runs :func:`worker` on uvloop when it is installed, else
    on asyncio's own loop."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if uvloop is not None and hasattr(uvloop, "run"):
        uvloop.run(worker())
    else:
        asyncio.run(worker())

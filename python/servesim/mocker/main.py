"""Launch helpers of ``dynamo.mocker.main`` that need no distributed runtime."""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["compute_stagger_delay", "graceful_shutdown", "prefetch_model"]

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
    """Calls ``shutdown()`` on each runtime."""
    for rt in runtimes:
        rt.shutdown()


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


async def prefetch_model(path: str) -> str:
    """The model path workers should load: ``path`` itself when it exists locally, else the
    snapshot of that Hugging Face repository already in the local cache. servesim never
    downloads (the reference fetches the repository's configuration from the hub here); like
    the reference, a path it cannot resolve is logged as a warning and returned unchanged."""
    if os.path.exists(path):
        return path
    try:
        snapshot = _cached_snapshot(path)
    except OSError as e:
        logger.warning("Failed to prefetch model %s: %s", path, e)
        return path
    if snapshot is None:
        logger.warning(
            "Failed to prefetch model %s: not a local path and not in the Hugging Face cache at %s "
            "(servesim does not download models)",
            path,
            _hf_hub_cache(),
        )
        return path
    return str(snapshot)

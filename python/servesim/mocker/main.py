"""Launch helpers of ``dynamo.mocker.main`` that need no distributed runtime."""

from __future__ import annotations

__all__ = ["compute_stagger_delay", "graceful_shutdown"]


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

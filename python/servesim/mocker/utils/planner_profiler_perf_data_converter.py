"""Planner profiler results to the mocker's NPZ profile, as
``dynamo.mocker.utils.planner_profiler_perf_data_converter`` converts them (Dynamo 1.6.1).

A profiler results directory holds the prefill sweep (``selected_prefill_interpolation/
raw_data.npz`` with ``prefill_isl``, ``prefill_ttft``; or ``prefill_raw_data.json``) and the
decode sweep (``selected_decode_interpolation/raw_data.npz`` with ``x_kv_usage``,
``y_context_length``, ``z_itl``, ``max_kv_tokens``; or ``decode_raw_data.json``). Dynamo turns
every measurement into a forward pass, fits its planner's regressions to them, and samples the
fits on a grid:

* prefill: ``wall_time = a + b · sum_prefill_tokens`` (least squares; a fit with ``b < 0`` is
  refused), sampled at ``resolution`` prompt lengths from the smallest to the largest measured
  one, in ms, at least 1e-3 ms;
* decode: ``wall_time = a + b · num_decode_requests + c · sum_decode_kv_tokens`` (``c < 0``
  refused; ``b`` below -1e-6 set to 0 after the fit), sampled on ``resolution`` KV-token counts
  from 0 to the largest measured one × ``resolution`` context lengths from 1 to the largest mean
  context, with ``max(1, kv / context)`` requests.

Passes measured at 0 ms are left out of the fits (they still widen the grids). The fits are
ordinary least squares with an intercept, solved here without numpy or scikit-learn; results
agree with Dynamo's to floating-point rounding. The NPZ is written as ``numpy.savez`` writes it
(``.npz`` is appended to a name without it).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

from ._npz import NpzError, npz_member_names, read_npz, write_npz

__all__ = ["convert_profile_results_to_npz", "is_profile_results_dir", "is_mocker_format_npz"]

logger = logging.getLogger(__name__)

MOCKER_NPZ_KEYS = ("prefill_isl", "prefill_ttft_ms", "decode_active_kv_tokens", "decode_context_length", "decode_itl")
_EPS = sys.float_info.epsilon
# Dynamo's tolerance for a negative batch-size coefficient of the decode fit.
_RELAXABLE_NEG_TOLERANCE = 1e-6


def _column(name: str, values) -> List[float]:
    if isinstance(values, tuple):  # (shape, values) from an NPZ
        values = values[1]
    if not isinstance(values, list):
        values = [values]
    return values


def _load_arrays(npz_path: str, json_path: str, keys: Sequence[str], what: str) -> dict:
    if os.path.exists(npz_path):
        arrays = read_npz(npz_path)
        missing = [k for k in keys if k not in arrays]
        if missing:
            raise KeyError(f"{missing[0]} is not a file in the archive")
        return {k: arrays[k][1] for k in keys}
    if os.path.exists(json_path):
        with open(json_path) as f:
            data = json.load(f)
        return {k: _column(k, data[k]) for k in keys}
    raise FileNotFoundError(f"{what} profiling data not found at {npz_path} or {json_path}")


def _prefill_passes(results_dir: str) -> List[Tuple[int, float]]:
    """(prompt tokens, wall time in s) of each prefill measurement."""
    data = _load_arrays(
        os.path.join(results_dir, "selected_prefill_interpolation", "raw_data.npz"),
        os.path.join(results_dir, "prefill_raw_data.json"),
        ("prefill_isl", "prefill_ttft"),
        "Prefill",
    )
    return [(int(isl), float(ttft) / 1000.0) for isl, ttft in zip(data["prefill_isl"], data["prefill_ttft"])]


def _decode_passes(results_dir: str) -> List[Tuple[int, int, float]]:
    """(requests, KV tokens, wall time in s) of each decode measurement."""
    npz_path = os.path.join(results_dir, "selected_decode_interpolation", "raw_data.npz")
    data = _load_arrays(
        npz_path,
        os.path.join(results_dir, "decode_raw_data.json"),
        ("x_kv_usage", "y_context_length", "z_itl", "max_kv_tokens"),
        "Decode",
    )
    max_kv_tokens = int(data["max_kv_tokens"][0]) if os.path.exists(npz_path) else int(_scalar(data["max_kv_tokens"]))
    out = []
    for kv_usage, ctx_len, itl_ms in zip(data["x_kv_usage"], data["y_context_length"], data["z_itl"]):
        kv = int(round(float(kv_usage) * max_kv_tokens))
        batch = max(1, int(round(kv / float(ctx_len)))) if ctx_len > 0 else 1
        out.append((batch, kv, float(itl_ms) / 1000.0))
    return out


def _scalar(v):
    return v[0] if isinstance(v, list) and len(v) == 1 else v


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _fit_1d(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float]:
    """Least squares ``y = intercept + coef · x``: (coef, intercept)."""
    xm, ym = _mean(xs), _mean(ys)
    xc = [x - xm for x in xs]
    sxx = math.fsum(v * v for v in xc)
    coef = 0.0 if sxx == 0.0 else math.fsum(a * (y - ym) for a, y in zip(xc, ys)) / sxx
    return coef, ym - xm * coef


def _fit_2d(xs: Sequence[Tuple[float, float]], ys: Sequence[float]) -> Tuple[List[float], float]:
    """Minimum-norm least squares ``y = intercept + c0 · x0 + c1 · x1`` (the solution
    ``scipy.linalg.lstsq`` gives, with its rank cutoff), through a one-sided Jacobi SVD of the
    centred two-column design matrix."""
    m0, m1, ym = _mean([x[0] for x in xs]), _mean([x[1] for x in xs]), _mean(ys)
    a = [x[0] - m0 for x in xs]
    b = [x[1] - m1 for x in xs]
    yc = [y - ym for y in ys]
    alpha = math.fsum(v * v for v in a)
    beta = math.fsum(v * v for v in b)
    gamma = math.fsum(p * q for p, q in zip(a, b))
    if gamma == 0.0:
        c, s = 1.0, 0.0
    else:
        zeta = (beta - alpha) / (2.0 * gamma)
        t = (1.0 if zeta >= 0 else -1.0) / (abs(zeta) + math.sqrt(1.0 + zeta * zeta))
        c = 1.0 / math.sqrt(1.0 + t * t)
        s = c * t
    # A·V = [u0·σ0, u1·σ1] with V = [[c, s], [-s, c]].
    cols = ([c * p - s * q for p, q in zip(a, b)], [s * p + c * q for p, q in zip(a, b)])
    vs = ((c, -s), (s, c))
    sigmas2 = [math.fsum(v * v for v in col) for col in cols]
    smax = math.sqrt(max(sigmas2))
    cutoff = max(len(xs), 2) * _EPS * smax
    coef = [0.0, 0.0]
    for col, v, s2 in zip(cols, vs, sigmas2):
        if s2 == 0.0 or math.sqrt(s2) <= cutoff:
            continue
        w = math.fsum(p * q for p, q in zip(col, yc)) / s2
        coef[0] += v[0] * w
        coef[1] += v[1] * w
    return coef, ym - (m0 * coef[0] + m1 * coef[1])


def _linspace(start: float, stop: float, num: int) -> List[float]:
    """``numpy.linspace(start, stop, num)``."""
    if num < 0:
        raise ValueError(f"Number of samples, {num}, must be non-negative.")
    if num == 0:
        return []
    if num == 1:
        return [float(start)]
    div = num - 1
    delta = stop - start
    step = delta / div
    if step == 0:
        out = [(i / div) * delta + start for i in range(num)]
    else:
        out = [i * step + start for i in range(num)]
    out[-1] = float(stop)
    return out


def convert_profile_results_to_npz(
    profile_results_dir: Union[str, Path],
    output_path: Union[str, Path],
    resolution: int = 100,
) -> Path:
    """Converts a planner profiler results directory to the mocker's NPZ profile at
    ``output_path`` (see the module's description); returns ``output_path``."""
    results_dir = str(Path(profile_results_dir).resolve())
    output_path = Path(output_path)
    logger.info(f"Converting profile results from {results_dir}...")

    prefill = _prefill_passes(results_dir)
    if not prefill:
        raise FileNotFoundError(f"No prefill profiling data found in {results_dir}")
    observed = [(float(isl), wall) for isl, wall in prefill if wall != 0.0]
    if not observed:
        raise RuntimeError("Failed to fit prefill regression from profiling data")
    coef, intercept = _fit_1d([x for x, _ in observed], [y for _, y in observed])
    if coef < 0:
        logger.warning(f"Regression produced negative coefficients {[coef]}, model rejected")
        raise RuntimeError("Failed to fit prefill regression from profiling data")
    isl_values = [float(isl) for isl, _ in prefill]
    prefill_x = _linspace(min(isl_values), max(isl_values), resolution)
    prefill_y = [max(1e-6, x * coef + intercept) * 1000.0 for x in prefill_x]

    decode = _decode_passes(results_dir)
    if not decode:
        raise FileNotFoundError(f"No decode profiling data found in {results_dir}")
    observed2 = [((float(n), float(kv)), wall) for n, kv, wall in decode if wall != 0.0]
    if not observed2:
        raise RuntimeError("Failed to fit decode regression from profiling data")
    coefs, intercept2 = _fit_2d([x for x, _ in observed2], [y for _, y in observed2])
    if coefs[1] < 0:
        logger.warning(f"Regression produced negative coefficients {coefs}, model rejected")
        raise RuntimeError("Failed to fit decode regression from profiling data")
    if coefs[0] < -_RELAXABLE_NEG_TOLERANCE:
        coefs[0] = 0.0
    max_kv = max(float(kv) for _, kv, _ in decode)
    ctx_values = [float(kv) / max(1, n) for n, kv, _ in decode if n > 0]
    max_ctx = max(ctx_values) if ctx_values else 8192.0
    kv_axis = _linspace(0, max_kv, resolution)
    ctx_axis = _linspace(1, max_ctx, resolution)
    itl = []
    for kv in kv_axis:
        for ctx in ctx_axis:
            bs = max(1, kv / ctx) if ctx > 0 else 1
            itl.append(max(1e-6, bs * coefs[0] + kv * coefs[1] + intercept2) * 1000.0)

    target = output_path if str(output_path).endswith(".npz") else Path(str(output_path) + ".npz")
    write_npz(
        target,
        {
            "prefill_isl": ((len(prefill_x),), prefill_x),
            "prefill_ttft_ms": ((len(prefill_y),), prefill_y),
            "decode_active_kv_tokens": ((len(kv_axis),), kv_axis),
            "decode_context_length": ((len(ctx_axis),), ctx_axis),
            "decode_itl": ((len(kv_axis), len(ctx_axis)), itl),
        },
    )
    logger.info(f"Wrote perf data to {output_path}")
    return output_path


def is_profile_results_dir(path: Path) -> bool:
    """A directory with the profiler's prefill and decode sweeps (NPZ or JSON form)."""
    path = Path(path)
    if not path.is_dir():
        return False
    has_prefill = (path / "selected_prefill_interpolation" / "raw_data.npz").exists() or (
        path / "prefill_raw_data.json"
    ).exists()
    has_decode = (path / "selected_decode_interpolation" / "raw_data.npz").exists() or (
        path / "decode_raw_data.json"
    ).exists()
    return has_prefill and has_decode


def is_mocker_format_npz(path: Path) -> bool:
    """A ``.npz`` file holding every array of the mocker's profile (contents not checked)."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".npz":
        return False
    try:
        return set(MOCKER_NPZ_KEYS).issubset(npz_member_names(path))
    except (NpzError, OSError):
        return False


def main(argv: Optional[Sequence[str]] = None) -> None:
    import argparse

    logging.basicConfig(level=logging.INFO)
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile_results_dir", type=str, required=True)
    parser.add_argument("--resolution", type=int, default=100)
    parser.add_argument("--output_dir", type=str, default="")
    args = parser.parse_args(argv)
    output_dir = Path(args.output_dir or args.profile_results_dir).resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    convert_profile_results_to_npz(args.profile_results_dir, output_dir / "perf_data.npz", args.resolution)


if __name__ == "__main__":
    main()

"""KV cache bytes per token from a model's ``config.json``, as ``dynamo.mocker.utils.kv_cache``
computes it (Dynamo 1.6.1): ``layers · 2 · kv_heads · (hidden / heads) · dtype_bytes``.

Difference: the reference falls back to ``transformers.AutoConfig`` (which may download) for a
hub id or a configuration layout it does not recognise; servesim reads local files only and
returns ``None`` with a warning there.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

__all__ = ["TORCH_DTYPE_BYTES", "get_kv_cache_dtype_bytes", "compute_kv_bytes_per_token"]

logger = logging.getLogger(__name__)

TORCH_DTYPE_BYTES = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "fp8_ds_mla": 1,
    "fp8_e4m3": 1,
    "fp8_inc": 1,
    "int8": 1,
}

# Where multimodal and multi-module configurations keep the language model's sizes.
_TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config", "decoder", "thinker_config")
_REQUIRED_KEYS = ("num_hidden_layers", "num_attention_heads", "hidden_size")


def _get(config: dict, *names: str) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return None


def get_kv_cache_dtype_bytes(config: dict, kv_cache_dtype: str = "auto") -> int:
    """Bytes per KV element: the model's dtype for ``"auto"``, else ``kv_cache_dtype``'s (2 when
    unknown)."""
    if kv_cache_dtype == "auto":
        dtype = str(_get(config, "dtype", "torch_dtype") or "float16")
        if dtype.startswith("torch."):
            dtype = dtype[len("torch."):]
        return TORCH_DTYPE_BYTES.get(dtype, 2)
    return TORCH_DTYPE_BYTES.get(kv_cache_dtype, 2)


def _find_text_config(config: dict, depth: int = 3) -> Optional[dict]:
    if all(isinstance(config.get(k), int) for k in _REQUIRED_KEYS):
        return config
    if depth == 0:
        return None
    for key in _TEXT_CONFIG_KEYS:
        sub = config.get(key)
        if isinstance(sub, dict):
            found = _find_text_config(sub, depth - 1)
            if found is not None:
                return found
    return None


def compute_kv_bytes_per_token(model_path: str, kv_cache_dtype: str = "auto") -> Optional[int]:
    """KV bytes per token of the model in directory ``model_path``, or ``None`` (with a warning)
    when its ``config.json`` is missing, unreadable or lacks the sizes."""
    try:
        if not os.path.isdir(model_path):
            raise OSError(f"{model_path} is not a local directory (servesim does not download models)")
        with open(os.path.join(model_path, "config.json")) as f:
            config = _find_text_config(json.load(f))
        if config is None:
            raise ValueError(f"config.json layout of {model_path} not recognized")
    except (OSError, ValueError, KeyError) as e:
        logger.warning("Could not compute kv_bytes_per_token from model config: %s", e)
        return None
    layers, heads, hidden = (config.get(k) for k in _REQUIRED_KEYS)
    if heads == 0:
        logger.warning(
            "Could not compute kv_bytes_per_token: model config for %s lacks layer, head, or hidden sizes (%s)",
            model_path,
            (layers, heads, hidden),
        )
        return None
    kv_heads = _get(config, "num_key_value_heads", "num_kv_heads")
    if kv_heads is None:
        kv_heads = heads
    return layers * 2 * kv_heads * (hidden // heads) * get_kv_cache_dtype_bytes(config, kv_cache_dtype)

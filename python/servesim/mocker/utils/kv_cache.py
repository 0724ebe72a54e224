"""KV cache bytes per token from a model's ``config.json``, as ``dynamo.mocker.utils.kv_cache``
computes it (Dynamo 1.6.1): ``layers · 2 · kv_heads · (hidden / heads) · dtype_bytes``.

A hub id, or a configuration layout this module does not recognise, goes through
``transformers.AutoConfig`` as in the reference (which may download) when transformers is
installed. Difference: without transformers servesim returns ``None`` with a warning where the
reference raises ``ImportError``.
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


def _get(config: Any, *names: str) -> Any:
    """The first non-None of ``names`` in a dict or a configuration object."""
    for name in names:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if value is not None:
            return value
    return None


def get_kv_cache_dtype_bytes(config: Any, kv_cache_dtype: str = "auto") -> int:
    """Bytes per KV element: the model's dtype for ``"auto"`` (from a dict or a configuration
    object), else ``kv_cache_dtype``'s (2 when unknown)."""
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


def _load_config(model_path: str) -> Any:
    """The model's text configuration: a local ``config.json`` of a layout this module knows,
    else (a hub id, or another layout) ``transformers.AutoConfig`` when transformers is
    installed, as the reference does; without it, ``OSError``."""
    if os.path.isdir(model_path):
        with open(os.path.join(model_path, "config.json")) as f:
            found = _find_text_config(json.load(f))
        if found is not None:
            return found
        logger.info("config.json layout not recognized, resolving %s through transformers", model_path)
    try:
        from transformers import AutoConfig
    except ImportError:
        raise OSError(
            f"{model_path}: not a local model directory with a recognised config.json, and transformers "
            "is not installed to resolve it"
        ) from None
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=False)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    return config


def compute_kv_bytes_per_token(model_path: str, kv_cache_dtype: str = "auto") -> Optional[int]:
    """KV bytes per token of a model, or ``None`` (with a warning) when its configuration is
    missing, unreadable or lacks the sizes. Other errors (of transformers) propagate."""
    try:
        config = _load_config(model_path)
    except (OSError, ValueError, KeyError) as e:
        logger.warning("Could not compute kv_bytes_per_token from model config: %s", e)
        return None
    layers, heads, hidden = (_get(config, k) for k in _REQUIRED_KEYS)
    if not all(isinstance(v, int) for v in (layers, heads, hidden)) or heads == 0:
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

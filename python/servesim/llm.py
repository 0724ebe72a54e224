"""``KvRouterConfig`` of ``dynamo.llm`` (Dynamo 1.6.1), so that a script that builds one for
``router_config=`` runs with ``dynamo`` replaced by ``servesim``.

The constructor, ``from_json``, ``copy``, ``with_overrides`` and the five settable properties
behave as the reference's (including the deprecated ``overlap_score_weight``: it sets
``prefill_load_scale``, and 0 also sets ``overlap_score_credit`` to 0). The object records the
fields that differ from their defaults; ``to_json`` gives them in ``from_json``'s form, which is
what servesim's KV router reads (and where it refuses a setting it does not model, by name).
Differences: every field is readable as an attribute (the reference exposes five), and the
constructor checks only what the reference checks when it is built; the rest is checked when a
replay reads the configuration.
"""

from __future__ import annotations

import copy as _copy
import json
import math
import os
from typing import Any, Optional

__all__ = ["KvRouterConfig"]

# Every field of the reference's JSON form, with its default, in its order.
_DEFAULTS: dict[str, Any] = {
    "overlap_score_credit": 1.0,
    "overlap_score_credit_decay": 0.0,
    "prefill_load_scale": 1.0,
    "decode_active_request_weight": 0.0,
    "overlap_score_weight": None,
    "host_cache_hit_weight": 0.75,
    "disk_cache_hit_weight": 0.25,
    "router_temperature": 0.0,
    "use_kv_events": True,
    "durable_kv_events": False,
    "router_replica_sync": False,
    "router_track_active_blocks": True,
    "router_track_output_blocks": False,
    "router_assume_kv_reuse": True,
    "router_track_prefill_tokens": True,
    "router_tracking_hash": "public-xxh3-v1",
    "router_tracking_key_file": None,
    "router_tracking_key_id": None,
    "router_prefill_load_model": "none",
    "router_snapshot_threshold": None,
    "router_reset_states": False,
    "router_ttl_secs": 120.0,
    "router_approximate_cache_policy": "ttl",
    "router_queue_threshold": None,
    "router_policy_config": None,
    "router_prefill_policy": None,
    "router_decode_policy": None,
    "router_event_threads": 4,
    "skip_initial_worker_wait": False,
    "router_queue_policy": "fcfs",
    "use_remote_indexer": False,
    "serve_indexer": False,
    "enable_session_prefix_index": False,
    "shared_cache_multiplier": None,
    "shared_cache_type": "none",
    "router_predicted_ttl_secs": None,
    "conditional_disagg_enabled": False,
    "conditional_disagg_policy": "isl_bounding",
    "conditional_disagg_eff_isl_threshold": 2048,
    "conditional_disagg_eff_isl_ratio_threshold": 0.7,
    "conditional_disagg_prefill_busy_threshold": None,
    "conditional_disagg_decode_busy_threshold": None,
}
# Keys the reference's JSON form takes (from_json's list; the per-phase policies are
# constructor arguments only).
# The approximate-cache policy is a constructor argument only as well (probed on Dynamo 1.6.1:
# from_json refuses it as an unknown field).
_JSON_KEYS = [k for k in _DEFAULTS
              if k not in ("router_prefill_policy", "router_decode_policy", "router_approximate_cache_policy")]
_FLOATS = {k for k, v in _DEFAULTS.items() if isinstance(v, float)} | {
    "router_queue_threshold", "shared_cache_multiplier", "router_predicted_ttl_secs",
    "conditional_disagg_prefill_busy_threshold", "conditional_disagg_decode_busy_threshold",
}
_SETTABLE = ("overlap_score_credit", "overlap_score_credit_decay", "overlap_score_weight", "prefill_load_scale",
             "decode_active_request_weight")


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"argument '{name}': must be real number, not {type(value).__name__}")
    return float(value)


class KvRouterConfig:
    """Values for the KV router (see the module's description)."""

    def __init__(
        self,
        overlap_score_weight: Optional[float] = None,
        host_cache_hit_weight: float = 0.75,
        disk_cache_hit_weight: float = 0.25,
        router_temperature: float = 0.0,
        use_kv_events: bool = True,
        *,
        router_replica_sync: bool = False,
        router_track_active_blocks: bool = True,
        router_track_output_blocks: bool = False,
        router_assume_kv_reuse: bool = True,
        router_track_prefill_tokens: bool = True,
        router_prefill_load_model: str = "none",
        router_ttl_secs: float = 120.0,
        router_approximate_cache_policy: str = "ttl",
        router_queue_threshold: Optional[float] = None,
        router_event_threads: int = 4,
        router_queue_policy: str = "fcfs",
        use_remote_indexer: bool = False,
        serve_indexer: bool = False,
        enable_session_prefix_index: bool = False,
        shared_cache_multiplier: Optional[float] = None,
        shared_cache_type: str = "none",
        router_predicted_ttl_secs: Optional[float] = None,
        conditional_disagg_enabled: bool = False,
        conditional_disagg_policy: str = "isl_bounding",
        conditional_disagg_eff_isl_threshold: int = 2048,
        conditional_disagg_eff_isl_ratio_threshold: float = 0.7,
        conditional_disagg_prefill_busy_threshold: Optional[float] = None,
        conditional_disagg_decode_busy_threshold: Optional[float] = None,
        overlap_score_credit: float = 1.0,
        overlap_score_credit_decay: float = 0.0,
        prefill_load_scale: float = 1.0,
        decode_active_request_weight: float = 0.0,
        router_policy_config: Optional[str] = None,
        router_prefill_policy: Optional[str] = None,
        router_decode_policy: Optional[str] = None,
        router_tracking_hash: str = "public-xxh3-v1",
        router_tracking_key_file: Optional[str | os.PathLike[str]] = None,
        router_tracking_key_id: Optional[str] = None,
    ) -> None:
        given = dict(locals())
        del given["self"]
        values = dict(_DEFAULTS)
        for name, value in given.items():
            if value is None:
                continue
            if name in _FLOATS:
                value = _real(name, value)
            elif isinstance(value, os.PathLike):
                value = os.fspath(value)
            values[name] = value
        self._values = values
        if overlap_score_weight is not None:
            self._apply_overlap_score_weight(values["overlap_score_weight"])
        self._validate()

    def _apply_overlap_score_weight(self, weight: float) -> None:
        # Deprecated alias: wins over prefill_load_scale; 0 also turns the overlap credit off.
        self._values["prefill_load_scale"] = weight
        if weight == 0.0:
            self._values["overlap_score_credit"] = 0.0
        self._values["overlap_score_weight"] = None

    def _validate(self) -> None:
        v = self._values
        # Dynamo 1.6.1's own checks (probed), in its words.
        tracking = v["router_tracking_hash"]
        if tracking not in ("public-xxh3-v1", "keyed-xxh3-v1"):
            raise ValueError(f"router_tracking_hash must be public-xxh3-v1 or keyed-xxh3-v1, got {json.dumps(tracking)}")
        if tracking == "keyed-xxh3-v1":
            if not v["router_tracking_key_file"]:
                raise ValueError("keyed-xxh3-v1 requires router_tracking_key_file")
            if not v["router_tracking_key_id"]:
                raise ValueError("keyed-xxh3-v1 requires a nonempty router_tracking_key_id")
        elif v["router_tracking_key_file"] is not None or v["router_tracking_key_id"] is not None:
            raise ValueError("router tracking key options require router_tracking_hash=keyed-xxh3-v1")
        if v["shared_cache_type"] not in ("none", "hicache"):
            raise ValueError(f"unknown shared_cache_type: {json.dumps(v['shared_cache_type'])}, expected 'none' or 'hicache'")
        if not (math.isfinite(v["overlap_score_credit"]) and v["overlap_score_credit"] >= 0):
            raise ValueError("overlap_score_credit must be a finite, non-negative number")
        # Dynamo 1.6.1's order: credit, host weight, disk weight, temperature.
        for weight in ("host_cache_hit_weight", "disk_cache_hit_weight"):
            if not 0.0 <= v[weight] <= 1.0:
                raise ValueError(f"{weight} must be between 0 and 1")
        if not (math.isfinite(v["router_temperature"]) and v["router_temperature"] >= 0):
            raise ValueError("router_temperature must be finite and non-negative")
        policy = v["router_approximate_cache_policy"]
        if policy not in ("ttl", "lru"):
            raise ValueError(f"unknown approximate cache policy {json.dumps(policy)}, expected 'ttl' or 'lru'")
        if policy == "lru" and v["use_kv_events"]:
            raise ValueError(
                "router_approximate_cache_policy=lru requires use_kv_events=false; the local side indexer is TTL-only"
            )

    @staticmethod
    def from_json(config_json: str) -> "KvRouterConfig":
        """A configuration from the reference's JSON form (unknown keys refused)."""
        try:
            data = json.loads(config_json)
        except json.JSONDecodeError as e:
            raise ValueError(f"Failed to parse KvRouterConfig JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        if not isinstance(data, dict):
            raise ValueError("Failed to parse KvRouterConfig JSON: expected an object")
        for key in data:
            if key not in _JSON_KEYS:
                expected = ", ".join(f"`{k}`" for k in _JSON_KEYS)
                raise ValueError(f"Failed to parse KvRouterConfig JSON: unknown field `{key}`, expected one of {expected}")
        if data.get("durable_kv_events") is True:
            raise ValueError("Failed to parse KvRouterConfig JSON: durable_kv_events=true is not supported by this runtime")
        out = KvRouterConfig.__new__(KvRouterConfig)
        out._values = dict(_DEFAULTS)
        for key, value in data.items():
            if value is not None:
                out._values[key] = _real(key, value) if key in _FLOATS else value
        if out._values["overlap_score_weight"] is not None:
            out._apply_overlap_score_weight(out._values["overlap_score_weight"])
        try:
            out._validate()
        except ValueError as e:
            raise ValueError(f"Failed to parse KvRouterConfig JSON: {e}") from None
        return out

    def copy(self) -> "KvRouterConfig":
        return _copy.deepcopy(self)

    def with_overrides(
        self,
        overlap_score_weight: Optional[float] = None,
        *,
        overlap_score_credit: Optional[float] = None,
        overlap_score_credit_decay: Optional[float] = None,
        prefill_load_scale: Optional[float] = None,
        decode_active_request_weight: Optional[float] = None,
    ) -> "KvRouterConfig":
        """A copy with the given values set (``None`` keeps this one's)."""
        out = self.copy()
        for name, value in (
            ("overlap_score_credit", overlap_score_credit),
            ("overlap_score_credit_decay", overlap_score_credit_decay),
            ("prefill_load_scale", prefill_load_scale),
            ("decode_active_request_weight", decode_active_request_weight),
        ):
            if value is not None:
                out._values[name] = _real(name, value)
        if overlap_score_weight is not None:
            out._apply_overlap_score_weight(_real("overlap_score_weight", overlap_score_weight))
        out._validate()
        return out

    def to_json(self) -> str:
        """The fields that differ from their defaults, in ``from_json``'s form."""
        return json.dumps({k: v for k, v in self._values.items() if v != _DEFAULTS[k]})

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values")
        if values is not None and name in values:
            if name == "overlap_score_weight":
                return values["prefill_load_scale"]
            return values[name]
        raise AttributeError(f"'KvRouterConfig' object has no attribute '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_values":
            object.__setattr__(self, name, value)
        elif name == "overlap_score_weight":
            self._apply_overlap_score_weight(_real(name, value))
        elif name in _SETTABLE:
            self._values[name] = _real(name, value)
        else:
            raise AttributeError(f"'KvRouterConfig' object attribute '{name}' is read-only")

    def __repr__(self) -> str:
        return f"KvRouterConfig({self.to_json()})"

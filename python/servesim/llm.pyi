import os
from typing import Any, Literal, Optional, Union

class KvRouterConfig:
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
        router_approximate_cache_policy: Literal["ttl", "lru"] = "ttl",
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
        router_tracking_hash: Literal["public-xxh3-v1", "keyed-xxh3-v1"] = "public-xxh3-v1",
        router_tracking_key_file: Optional[Union[str, os.PathLike[str]]] = None,
        router_tracking_key_id: Optional[str] = None,
    ) -> None: ...
    @staticmethod
    def from_json(config_json: str) -> KvRouterConfig: ...
    def copy(self) -> KvRouterConfig: ...
    overlap_score_credit: float
    overlap_score_credit_decay: float
    overlap_score_weight: float
    prefill_load_scale: float
    decode_active_request_weight: float
    def with_overrides(
        self,
        overlap_score_weight: Optional[float] = None,
        *,
        overlap_score_credit: Optional[float] = None,
        overlap_score_credit_decay: Optional[float] = None,
        prefill_load_scale: Optional[float] = None,
        decode_active_request_weight: Optional[float] = None,
    ) -> KvRouterConfig: ...
    def to_json(self) -> str: ...
    def __getattr__(self, name: str) -> Any: ...

"""Host (G2) KV offload from the mocker's flags: ``--num-host-blocks``,
``--host-offload-{d2h,h2d}-bandwidth-gbps`` and ``--kv-bytes-per-token`` map to the engine's
``native_host_offload`` and ``kv_cache_bytes_per_token`` as Dynamo 1.6.1's
``dynamo.mocker.config._build_native_host_offload`` maps them, the normalised section is
Dynamo's (default bandwidths 32 GB/s, the latency only when set), and a replay with it runs
the host tier (``first_admission_host_reused_input_tokens`` in the per-request records).

The replay numbers are those of ``tests/parity/offload_fixed_h2d_load.golden.json``
(recorded from Dynamo 1.6.1 with ``scripts/parity.py tests/parity/offload_fixed_h2d_load.json
--record``): request A' keeps 1 block in G1 and loads 3 from the host, TTFT 88 ms."""

from pathlib import Path

import pytest

from servesim import replay
from servesim.mocker.args import parse_args
from servesim.mocker.config import build_mocker_engine_args, normalize_mocker_config

PARITY = Path(__file__).resolve().parents[1] / "parity"


def test_flags_map_as_dynamo_maps_them():
    args = parse_args([
        "--num-host-blocks", "64",
        "--host-offload-d2h-bandwidth-gbps", "4",
        "--kv-bytes-per-token", "131072",
    ])
    engine = build_mocker_engine_args(args)["engine"]
    # Dynamo normalises what the flags build: the bandwidth not given gets its default.
    assert engine["native_host_offload"] == {"num_host_blocks": 64, "d2h_bandwidth_gbps": 4.0, "h2d_bandwidth_gbps": 32.0}
    assert engine["kv_cache_bytes_per_token"] == 131072
    # Dynamo also passes --kv-bytes-per-token on as the transfer geometry.
    assert engine["kv_transfer_bytes_per_token"] == 131072


def test_bandwidth_flags_need_host_blocks():
    with pytest.raises(ValueError, match="--host-offload-\\* flags require --num-host-blocks"):
        build_mocker_engine_args(parse_args(["--host-offload-h2d-bandwidth-gbps", "4"]))


def test_normalised_section_is_dynamos():
    engine = normalize_mocker_config(
        {"engine": {"kv_cache_bytes_per_token": 1000, "native_host_offload": {"num_host_blocks": 8}}}
    )["engine"]
    assert engine["native_host_offload"] == {"num_host_blocks": 8, "d2h_bandwidth_gbps": 32.0, "h2d_bandwidth_gbps": 32.0}
    assert engine["kv_cache_bytes_per_token"] == 1000


def test_normalised_g3_section_is_dynamos():
    engine = normalize_mocker_config(
        {"engine": {"kv_cache_bytes_per_token": 1000, "native_host_offload": {"num_host_blocks": 8},
                    "g3_offload": {"scope": "worker_local", "num_g3_blocks": 8}}}
    )["engine"]
    assert engine["g3_offload"] == {
        "scope": "worker_local", "num_g3_blocks": 8, "latency_to_first_byte_ms": 0.1,
        "read_bandwidth_gbps": 10.0, "write_bandwidth_gbps": 10.0,
        "shared_read_bandwidth_gbps": 80.0, "shared_write_bandwidth_gbps": 80.0,
    }
    with pytest.raises(ValueError, match="g3_offload requires native_host_offload"):
        normalize_mocker_config({"engine": {"g3_offload": {"scope": "worker_local", "num_g3_blocks": 8}}})


@pytest.mark.parametrize(
    "host, message",
    [
        ({}, "missing field `num_host_blocks`"),
        ({"num_host_blocks": 0}, "native_host_offload.num_host_blocks must be positive"),
        ({"num_host_blocks": 8, "scope": "worker_local"}, "is a G3 scope"),
    ],
)
def test_bad_sections_are_refused_with_dynamos_messages(host, message):
    with pytest.raises(ValueError, match=message):
        normalize_mocker_config({"engine": {"kv_cache_bytes_per_token": 1000, "native_host_offload": host}})


def test_replay_loads_from_the_host():
    engine = {
        "backend": "vllm", "block_size": 16, "num_gpu_blocks": 6,
        "timing_model": {"type": "fixed", "prefill_ms": 40.0, "decode_ms": 10.0},
        "kv_cache_bytes_per_token": 1_000_000,
        "native_host_offload": {"num_host_blocks": 16, "d2h_bandwidth_gbps": 1.0, "h2d_bandwidth_gbps": 1.0},
    }
    report = replay.run_trace_replay(
        str(PARITY / "offload_fixed_probe.jsonl"),
        extra_engine_args={"engine": engine},
        trace_block_size=16,
        capture_per_request=True,
    )
    records = sorted(report.per_request, key=lambda r: r["arrival_time_ms"])
    last = records[-1]
    assert (last["first_admission_g1_reused_input_tokens"], last["first_admission_host_reused_input_tokens"]) == (16, 48)
    # Each first admission splits its reuse too (Dynamo 1.6.1 writes the split on first
    # admissions only; recorded with scripts/reference_replay.py --per-request).
    assert last["admission_history"] == [{
        "admission_ordinal": 0, "pool_admission_ordinal": 0, "pool": "agg", "at_ms": 448.0,
        "reused_input_tokens": 64, "g1_reused_input_tokens": 16, "host_reused_input_tokens": 48,
        "is_readmission": False,
    }]
    assert list(records[0]["admission_history"][0]) == list(last["admission_history"][0]), "the reference's key order"
    assert last["first_token_ms"] - last["arrival_time_ms"] == pytest.approx(88.0)


def test_shared_pool_section_is_dynamos():
    # Printed by Dynamo 1.6.1's normalize_mocker_config: the scope only when shared, a pool cap
    # only when not 80 GB/s, the layout id last.
    engine = normalize_mocker_config({"engine": {
        "kv_cache_bytes_per_token": 1024,
        "native_host_offload": {"num_host_blocks": 10, "scope": "cluster_shared", "kv_layout_id": "tp1",
                                "shared_d2h_bandwidth_gbps": 5, "latency_to_first_byte_ms": 0.5},
    }})["engine"]
    section = engine["native_host_offload"]
    assert list(section.items()) == [
        ("scope", "cluster_shared"), ("num_host_blocks", 10), ("d2h_bandwidth_gbps", 32.0),
        ("h2d_bandwidth_gbps", 32.0), ("shared_d2h_bandwidth_gbps", 5.0), ("latency_to_first_byte_ms", 0.5),
        ("kv_layout_id", "tp1"),
    ]
    with pytest.raises(ValueError, match="cluster_shared native_host_offload requires a nonempty kv_layout_id"):
        normalize_mocker_config({"engine": {"kv_cache_bytes_per_token": 1024,
                                            "native_host_offload": {"num_host_blocks": 10, "scope": "cluster_shared"}}})


def test_replay_shares_one_host_pool():
    # tests/parity/offload_shared_sessions_dp2 through the Python replay: its golden's numbers.
    import json

    case = json.loads((PARITY / "offload_shared_sessions_dp2.json").read_text())
    golden = json.loads((PARITY / "offload_shared_sessions_dp2.golden.json").read_text())
    report = replay.run_trace_replay(
        str(PARITY / case["trace"]),
        extra_engine_args={"engine": case["engine"], "dp_size": case["dp_size"]},
        trace_block_size=case["trace_block_size"],
        num_workers=case["num_workers"],
    )
    assert report.summary["g2_domains"] == golden["g2_domains"]
    assert report.summary["mean_ttft_ms"] == pytest.approx(golden["mean_ttft_ms"], rel=1e-9)


def test_replay_shares_one_host_pool_across_prefill_and_decode():
    # tests/parity/offload_disagg_shared_cross through the Python replay: its golden's numbers.
    import json

    case = json.loads((PARITY / "offload_disagg_shared_cross.json").read_text())
    golden = json.loads((PARITY / "offload_disagg_shared_cross.golden.json").read_text())
    report = replay.run_trace_replay(
        str(PARITY / case["trace"]),
        prefill_engine_args={"engine": case["prefill_engine"]},
        decode_engine_args={"engine": case["decode_engine"]},
        trace_block_size=case["trace_block_size"],
        num_prefill_workers=case["num_prefill_workers"],
        num_decode_workers=case["num_decode_workers"],
    )
    assert report.summary["g2_domains"] == golden["g2_domains"]
    assert report.summary["host_offload_hit_tokens"] == golden["x_cache_tiers"]["host_reused_input_tokens"]
    assert report.summary["mean_ttft_ms"] == pytest.approx(golden["mean_ttft_ms"], rel=1e-6)


def test_prefill_and_decode_must_agree_on_a_shared_pool():
    # Dynamo 1.6.1 raises a plain Exception here too ("engine error: ... participants are
    # incompatible: Contract {...} vs Contract {...}").
    host = {"num_host_blocks": 64, "scope": "cluster_shared", "kv_layout_id": "tp1"}
    engine = {"kv_cache_bytes_per_token": 131072, "native_host_offload": host}
    with pytest.raises(Exception, match=r"participants are incompatible: .*num_host_blocks 64 \(prefill\) vs 128"):
        replay.run_trace_replay(
            str(PARITY / "offload_shared_cross.jsonl"),
            prefill_engine_args={"engine": engine},
            decode_engine_args={"engine": {**engine, "native_host_offload": {**host, "num_host_blocks": 128}}},
            trace_block_size=64,
        )

"""/metrics read by prometheus_client's parser: vLLM names, labels, buckets and values."""

import threading
import time

from conftest import FIXED, Server, client, samples

VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
VLLM_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
VLLM_E2E = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


def value(s, name, **labels):
    vals = [v for (l, v) in s[name] if all(l.get(k) == str(x) for k, x in labels.items())]
    assert len(vals) == 1, (name, labels, s.get(name))
    return vals[0]


def buckets(s, name):
    return [float(l["le"]) for (l, _) in s[name + "_bucket"] if l["le"] != "+Inf"]


def test_vllm_metrics_after_requests():
    engine = {"timing_model": FIXED, "block_size": 16}
    with Server("--speedup-ratio", "10", "--model-name", "org/model", engine=engine) as srv:
        c = client(srv)
        prompt = list(range(500, 580))  # 80 tokens: 5 blocks
        for _ in range(3):
            c.completions.create(model="org/model", prompt=prompt, max_tokens=5)
        families, s = samples(srv.metrics())
        types = {n: f.type for n, f in families.items()}
        for g in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]:
            assert types[g] == "gauge", g
        for n in ["vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"]:
            assert types[n] == "counter", n
        for h in ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds"]:
            assert types[h] == "histogram", h
        labels = s["vllm:num_requests_running"][0][0]
        assert labels["model_name"] == "org/model" and labels["engine"] == "0"
        assert buckets(s, "vllm:time_to_first_token_seconds") == VLLM_TTFT
        assert buckets(s, "vllm:inter_token_latency_seconds") == VLLM_ITL
        assert buckets(s, "vllm:e2e_request_latency_seconds") == VLLM_E2E
        assert value(s, "vllm:time_to_first_token_seconds_count") == 3
        assert value(s, "vllm:e2e_request_latency_seconds_count") == 3
        assert value(s, "vllm:inter_token_latency_seconds_count") == 3 * 4
        # vLLM's request phase histograms: queue + prefill is TTFT and prefill + decode is the
        # inference time, request by request, so their sums agree too.
        phases = ["queue", "prefill", "decode", "inference"]
        for p in phases:
            name = f"vllm:request_{p}_time_seconds"
            assert types[name] == "histogram", name
            assert buckets(s, name) == VLLM_E2E
            assert value(s, name + "_count") == 3
        total = {p: value(s, f"vllm:request_{p}_time_seconds_sum") for p in phases}
        assert abs(total["queue"] + total["prefill"] - value(s, "vllm:time_to_first_token_seconds_sum")) < 1e-6
        assert abs(total["prefill"] + total["decode"] - total["inference"]) < 1e-6
        assert total["decode"] > 0 and total["prefill"] > 0
        # Fixed 40 ms prefill at speedup 10: every TTFT is about 4 ms (below 5 ms, above 1 ms).
        ttft = {float(l["le"]) if l["le"] != "+Inf" else 1e9: v for (l, v) in s["vllm:time_to_first_token_seconds_bucket"]}
        assert ttft[0.001] == 0 and ttft[0.01] == 3
        # 80 prompt tokens queried per request; the 2nd and 3rd reuse 4 blocks (64 tokens).
        assert value(s, "vllm:prefix_cache_queries_total") == 240
        assert value(s, "vllm:prefix_cache_hits_total") == 128
        assert value(s, "vllm:num_preemptions_total") == 0
        assert value(s, "vllm:num_requests_running") == 0
        assert value(s, "vllm:kv_cache_usage_perc") == 0


def test_gauges_while_requests_run():
    engine = {"timing_model": FIXED, "block_size": 16, "num_gpu_blocks": 100, "max_num_seqs": 2}
    with Server("--speedup-ratio", "1", engine=engine) as srv:
        c = client(srv)
        def one(salt):
            c.completions.create(model="servesim-model", prompt=[salt * 1000 + i for i in range(160)], max_tokens=40)

        threads = [threading.Thread(target=one, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        _, s = samples(srv.metrics())
        assert value(s, "vllm:num_requests_running") == 2
        assert value(s, "vllm:num_requests_waiting") == 1
        usage = value(s, "vllm:kv_cache_usage_perc")
        assert 0.2 <= usage <= 0.3, usage  # two distinct 160+ token requests: 11 blocks each, of 100
        for t in threads:
            t.join()


def test_trtllm_and_sglang_names():
    with Server("--speedup-ratio", "0", "--engine-type", "trtllm") as srv:
        client(srv).completions.create(model="servesim-model", prompt="hello", max_tokens=2)
        families, s = samples(srv.metrics())
        assert "trtllm:num_requests_running" in families and "trtllm:time_to_first_token_seconds" in families
        assert not any(n.startswith("vllm:") for n in families)
        assert not any("prefix_cache" in n for n in families)
    with Server("--speedup-ratio", "0", "--engine-type", "sglang") as srv:
        client(srv).completions.create(model="servesim-model", prompt="hello", max_tokens=2)
        families, s = samples(srv.metrics())
        for n in ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:cache_hit_rate", "sglang:num_requests"]:
            assert n in families, n
        assert value(s, "sglang:num_requests_total") == 1
        assert buckets(s, "sglang:time_to_first_token_seconds")[:3] == [0.1, 0.2, 0.4]
        assert s["sglang:num_running_reqs"][0][0]["engine_type"] == "sglang"


def test_data_parallel_ranks_are_labelled():
    with Server("--speedup-ratio", "0", "--data-parallel-size", "2") as srv:
        c = client(srv)
        for _ in range(4):
            c.completions.create(model="servesim-model", prompt="hello", max_tokens=2)
        _, s = samples(srv.metrics())
        assert value(s, "vllm:e2e_request_latency_seconds_count", engine=0) == 2
        assert value(s, "vllm:e2e_request_latency_seconds_count", engine=1) == 2

//! The live server over HTTP, in-process: servers on port 0, driven by a hyper client.

mod common;

use std::time::{Duration, Instant};

use common::*;
use http_body_util::BodyExt;
use serde_json::json;
use servesim_cluster::Topology;
use servesim_engine::Role;
use servesim_live::ServeOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_chat_and_models() {
    let server = start(json!({"speedup_ratio": 0.0}), 1).await;
    let addr = server.addr();
    assert_ne!(addr.port(), 0, "port 0 binds a free port");

    let (status, body) = post(addr, "/v1/completions", json!({"prompt": "hello world", "max_tokens": 5})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["usage"]["completion_tokens"], 5);
    assert_eq!(body["usage"]["prompt_tokens"], 4);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert!(!body["choices"][0]["text"].as_str().unwrap().is_empty());

    let chat = json!({"model": "servesim-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3});
    let (status, body) = post(addr, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["tool_calls"], json!([]));
    assert_eq!(body["usage"]["completion_tokens"], 3);

    let (status, _, models) = call(addr, "GET", "/v1/models", None).await;
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "servesim-model");

    let (status, err) = post(addr, "/v1/completions", json!({"prompt": "x", "max_tokens": "many"})).await;
    assert_eq!((status, err["error"]["param"].as_str()), (400, Some("max_tokens")));
    let (status, err) = post(addr, "/v1/completions", json!({"prompt": "x", "model": "other"})).await;
    assert_eq!((status, err["error"]["type"].as_str()), (404, Some("NotFoundError")));
    let (status, _, err) = call(addr, "GET", "/v1/completions", None).await;
    assert_eq!((status, err["error"]["type"].as_str()), (405, Some("MethodNotAllowedError")));
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_sse_chunks_ending_in_done() {
    let server = start(json!({"speedup_ratio": 0.0}), 1).await;
    let addr = server.addr();
    for chat in [false, true] {
        let (path, mut req) = if chat {
            ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Hi"}]}))
        } else {
            ("/v1/completions", json!({"prompt": [1, 2, 3]}))
        };
        req["max_tokens"] = json!(6);
        req["stream"] = json!(true);
        req["stream_options"] = json!({"include_usage": true});
        let mut conn = Conn::open(addr).await;
        let resp = conn.send("POST", path, Some(&req)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        assert_eq!(resp.headers()["x-servesim-worker"], "0");
        let events = events(resp).await;
        let object = if chat { "chat.completion.chunk" } else { "text_completion" };
        assert!(events.iter().all(|e| e["object"] == object));
        let text: Vec<&str> = events
            .iter()
            .filter_map(|e| e["choices"].get(0))
            .filter_map(|c| if chat { c["delta"]["content"].as_str() } else { c["text"].as_str() })
            .filter(|t| !t.is_empty())
            .collect();
        assert_eq!(text.len(), 6, "one chunk per token");
        if chat {
            assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant", "the role opens a chat stream");
        }
        let last = &events[events.len() - 2];
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        let usage = &events[events.len() - 1];
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 6);
    }
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_frees_its_kv() {
    // 20 ms passes: the stream runs for 20 s unless aborted.
    let server = start(json!({"timing_model": {"type": "fixed", "prefill_ms": 20.0, "decode_ms": 20.0}}), 1).await;
    let addr = server.addr();
    let mut conn = Conn::open(addr).await;
    let req = json!({"prompt": (0..320).collect::<Vec<u32>>(), "max_tokens": 1000, "stream": true});
    let resp = conn.send("POST", "/v1/completions", Some(&req)).await;
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a first chunk").expect("data");
    assert!(first.data_ref().is_some_and(|d| d.starts_with(b"data: ")));
    assert!(metric(addr, "vllm:kv_cache_usage_perc").await > 0.0);
    drop(body);
    conn.drop_connection();
    let dropped = Instant::now();
    eventually(Duration::from_secs(2), "KV freed after the disconnect", || async {
        metric(addr, "vllm:kv_cache_usage_perc").await == 0.0 && metric(addr, "vllm:num_requests_running").await == 0.0
    })
    .await;
    assert!(dropped.elapsed() < Duration::from_millis(500), "within a few passes: {:?}", dropped.elapsed());
    assert_eq!(metric(addr, "vllm:e2e_request_latency_seconds_count").await, 0.0, "aborted, not finished");
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disaggregated_requests_go_from_prefill_to_decode_workers() {
    let engine = args(json!({"speedup_ratio": 0.0}));
    let topology = Topology::disaggregated((engine.clone(), 1), (engine, 2)).expect("a topology");
    let server = start_with(options(topology)).await;
    let addr = server.addr();
    for k in 0..2u32 {
        let req = json!({"prompt": (0..100).map(|t| k * 1000 + t).collect::<Vec<u32>>(), "max_tokens": 4,
                         "nvext": {"extra_fields": ["worker_id"]}});
        let (status, body) = post(addr, "/v1/completions", req).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["usage"]["completion_tokens"], 4);
        let ids = &body["nvext"]["worker_id"];
        assert_eq!(ids["prefill_worker_id"], 0);
        assert_eq!(ids["decode_worker_id"], json!(k + 1), "decode workers in turn");
    }
    eventually(Duration::from_secs(2), "every side's KV freed", || async {
        metric(addr, "vllm:kv_cache_usage_perc").await == 0.0
    })
    .await;
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_server_hands_its_kv_to_a_decode_server() {
    let one = |role| options(Topology::one_side(role, args(json!({"speedup_ratio": 0.0})), 1).expect("a topology"));
    let prefill = start_with(one(Role::Prefill)).await;
    let decode = start_with(one(Role::Decode)).await;
    let prompt: Vec<u32> = (0..100).collect();
    let req = json!({"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": true}});
    let (status, body) = post(prefill.addr(), "/v1/completions", req).await;
    assert_eq!(status, 200, "{body}");
    let kv = body["kv_transfer_params"].clone();
    assert_eq!(kv["do_remote_prefill"], true);
    assert_eq!(kv["remote_port"], prefill.addr().port());
    assert_eq!(kv["remote_block_ids"], json!((0..7).collect::<Vec<u32>>()));

    let req = json!({"prompt": prompt, "max_tokens": 5, "kv_transfer_params": kv});
    let (status, body) = post(decode.addr(), "/v1/completions", req).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 5);
    let (status, body) = post(decode.addr(), "/v1/completions", json!({"prompt": prompt, "max_tokens": 5})).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("kv_transfer_params")));
    stop(prefill).await;
    stop(decode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_then_drops_what_is_left() {
    let server = start(json!({"timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 10.0}}), 1).await;
    let addr = server.addr();
    let mut conn = Conn::open(addr).await;
    let req = json!({"prompt": [1, 2, 3], "max_tokens": 5000, "stream": true});
    let resp = conn.send("POST", "/v1/completions", Some(&req)).await;
    let mut body = resp.into_body();
    body.frame().await.expect("a first chunk").expect("data");
    let started = Instant::now();
    let report = server.shutdown(Duration::from_millis(300), std::future::pending()).await;
    assert!(!report.drained && !report.forced, "{report:?}");
    assert_eq!(report.aborted_connections, 1);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    // The cut stream says so: an error event, then [DONE] (as vLLM ends a stream that fails).
    let mut rest = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        rest.extend_from_slice(frame.data_ref().map(|d| &d[..]).unwrap_or_default());
    }
    let rest = String::from_utf8_lossy(&rest);
    let events: Vec<&str> = rest.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{rest}");
    let error: serde_json::Value = serde_json::from_str(events[events.len() - 2]).expect("a JSON event");
    assert_eq!(error["error"]["type"], "ServiceUnavailableError", "{error}");
    assert_eq!(error["error"]["code"], 503);
    assert_eq!(error["error"]["message"], "the server is shutting down: the request was aborted");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "no longer accepting");
    assert!(
        servesim_live::shutdown_outcome(report, Duration::from_millis(300)).is_err(),
        "a cut stream fails the exit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_a_request_still_waiting_with_503() {
    let server = start(json!({"timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 10.0}}), 1).await;
    let addr = server.addr();
    let waiting = tokio::spawn(post(addr, "/v1/completions", json!({"prompt": [1, 2, 3], "max_tokens": 5000})));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let report = server.shutdown(Duration::from_millis(100), std::future::pending()).await;
    assert_eq!(report.aborted_connections, 1, "{report:?}");
    let (status, body) = waiting.await.unwrap();
    assert_eq!((status, body["error"]["type"].as_str()), (503, Some("ServiceUnavailableError")), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_and_half_sent_connections_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = start(json!({"speedup_ratio": 0.0}), 1).await;
    let addr = server.addr();
    // One connection that sent nothing, one halfway through its headers, one kept alive after
    // a response: none has a request in flight (the header timeout is 10 s, the idle one 60 s).
    let mut quiet = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
    half.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let mut kept = Conn::open(addr).await;
    let resp = kept.send("POST", "/v1/completions", Some(&json!({"prompt": [1, 2], "max_tokens": 2}))).await;
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let report = server.shutdown(Duration::from_secs(5), std::future::pending()).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "waited {:?} for connections with nothing in flight",
        started.elapsed()
    );
    assert_eq!((report.drained, report.aborted_connections), (true, 0), "{report:?}");
    assert!(servesim_live::shutdown_outcome(report, Duration::from_secs(5)).is_ok());
    for s in [&mut quiet, &mut half] {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await.expect("closed, not waiting");
        assert!(matches!(n, Ok(0) | Err(_)), "closed without a response: {n:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_frontend_cost_delays_a_request_before_the_engine_sees_it() {
    // 20 ms passes at real time, and a calibrated front end of 250 ms.
    let topology = Topology::one_side(Role::Aggregated, args(json!({})), 1).expect("a topology");
    let server = start_with(ServeOptions { frontend_ms: 250.0, ..options(topology) }).await;
    let addr = server.addr();
    let started = Instant::now();
    let (status, body) = post(addr, "/v1/completions", json!({"prompt": "hello", "max_tokens": 1})).await;
    assert_eq!(status, 200, "{body}");
    // The client waits for the front end and the pass ...
    assert!(started.elapsed() >= Duration::from_millis(270), "{:?}", started.elapsed());
    // ... while the engine's TTFT, as vLLM measures it, starts when the request reaches it.
    let ttft = metric(addr, "vllm:time_to_first_token_seconds_sum").await;
    assert!((0.015..0.2).contains(&ttft), "engine TTFT {ttft} s");
    stop(server).await;
}

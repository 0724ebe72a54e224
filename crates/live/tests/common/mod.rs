//! Shared by the HTTP integration tests: a server on port 0 and a small hyper client.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use servesim_cluster::{RouterMode, Topology};
use servesim_engine::{Role, WorkerArgs};
use servesim_live::tokenizer::Tokenizer;
use servesim_live::{ServeOptions, Server, Timeouts};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Engine arguments as JSON (Dynamo's flat form), with fixed pass times unless given.
pub fn args(json: Value) -> WorkerArgs {
    let mut v =
        serde_json::json!({"timing_model": {"type": "fixed", "prefill_ms": 20.0, "decode_ms": 5.0}, "block_size": 16});
    for (k, x) in json.as_object().expect("an object") {
        v[k] = x.clone();
    }
    WorkerArgs::from_value(&v).expect("valid engine arguments")
}

pub fn options(topology: Topology) -> ServeOptions {
    ServeOptions {
        host: "127.0.0.1".into(),
        port: 0,
        worker_base_port: None,
        model_name: "servesim-model".into(),
        model_path: None,
        topology,
        router: RouterMode::RoundRobin,
        prefill_load_estimator: None,
        router_seed: 42,
        max_model_len: None,
        stagger_delay_s: 0.0,
        zmq_kv_events_ports: Vec::new(),
        zmq_replay_ports: Vec::new(),
        zmq_event_format: servesim_live::zmq::EventFormat::Vllm,
        seed: 0,
        timeouts: Timeouts::default(),
        shutdown_timeout: Duration::from_secs(5),
        metrics_max_ranks: servesim_live::metrics::DEFAULT_METRICS_MAX_RANKS,
        frontend_ms: 0.0,
    }
}

/// `workers` aggregated workers.
pub async fn start(engine: Value, workers: u32) -> Server {
    start_with(options(Topology::one_side(Role::Aggregated, args(engine), workers).expect("a topology"))).await
}

pub async fn start_with(opts: ServeOptions) -> Server {
    servesim_live::start(opts, Tokenizer::approximate()).await.expect("the server starts")
}

pub async fn stop(server: Server) {
    let report = server.shutdown(Duration::from_secs(5), std::future::pending()).await;
    assert!(report.drained, "{report:?}");
}

/// An open HTTP/1.1 connection.
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    task: JoinHandle<()>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.expect("handshake");
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Conn { sender, task }
    }

    pub async fn send(&mut self, method: &str, path: &str, body: Option<&Value>) -> hyper::Response<Incoming> {
        let bytes = body.map(|b| Bytes::from(serde_json::to_vec(b).expect("JSON"))).unwrap_or_default();
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "servesim")
            .header("content-type", "application/json")
            .body(Full::new(bytes))
            .expect("a request");
        self.sender.send_request(req).await.expect("a response")
    }

    /// Closes the socket at once (a client that goes away).
    pub fn drop_connection(self) {
        self.task.abort();
    }
}

/// One request on its own connection: status, headers and the body as JSON (or text).
pub async fn call(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, hyper::HeaderMap, Value) {
    let mut conn = Conn::open(addr).await;
    let resp = conn.send(method, path, body).await;
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("the body").to_bytes();
    let value =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (parts.status.as_u16(), parts.headers, value)
}

pub async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let (status, _, v) = call(addr, "POST", path, Some(&body)).await;
    (status, v)
}

/// The `data:` events of an SSE body, up to and without `[DONE]` (asserted present).
pub async fn events(resp: hyper::Response<Incoming>) -> Vec<Value> {
    let bytes = resp.into_body().collect().await.expect("the stream").to_bytes();
    let text = String::from_utf8(bytes.to_vec()).expect("UTF-8");
    let data: Vec<&str> = text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("a JSON event")).collect()
}

/// The sum of a metric's samples on `/metrics`.
pub async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (status, _, body) = call(addr, "GET", "/metrics", None).await;
    assert_eq!(status, 200);
    let text = body.as_str().expect("text");
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until `cond` holds (checked every 10 ms), failing after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

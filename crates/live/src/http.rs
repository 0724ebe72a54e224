//! The OpenAI-compatible HTTP API, served by the frontend (all workers) and by each worker's
//! own port: `/v1/models`, `/v1/completions`, `/v1/chat/completions` (JSON or SSE), `/health`
//! and `/metrics`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::Stream;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::cluster::{AbortGuard, Cluster, Done, Out};
use servesim_engine::Role;
use crate::openai::{self, ApiError, GenRequest};
use crate::tokenizer::Tokenizer;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 32 * 1024 * 1024;

/// What every handler of one listener shares.
pub struct Service {
    pub cluster: Arc<Cluster>,
    pub tokenizer: Arc<Tokenizer>,
    pub model: String,
    pub max_model_len: u32,
    /// None for the frontend, Some(w) for worker w's own port.
    pub worker: Option<usize>,
    /// When each worker starts serving (after its startup time and stagger).
    pub ready_at: Arc<Vec<Instant>>,
    pub created: u64,
    /// Distinguishes response ids of different processes.
    pub id_salt: u64,
    /// Where this listener is reachable (named in `kv_transfer_params`).
    pub host: String,
    pub port: u16,
}

impl Service {
    fn ready_at(&self) -> Instant {
        match self.worker {
            Some(w) => self.ready_at[w],
            None => self.ready_at.iter().copied().max().unwrap_or_else(Instant::now),
        }
    }
}

pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/health", get(health))
        .route("/live", get(|| async { Json(json!({"status": "live"})) }))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(service)
}

struct Json(Value);

impl IntoResponse for Json {
    fn into_response(self) -> Response {
        let mut r = Response::new(Body::from(serde_json::to_vec(&self.0).expect("JSON serialises")));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = Json(self.body()).into_response();
        *r.status_mut() = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        r
    }
}

/// A request's rank thread is gone (it can only have panicked; /health reports it too).
const ENGINE_STOPPED: &str = "the engine stopped";

fn engine_stopped() -> ApiError {
    ApiError { status: 500, message: ENGINE_STOPPED.into(), param: None }
}

async fn method_not_allowed(req: Request) -> ApiError {
    let message = format!("{} is not allowed on {}", req.method(), req.uri().path());
    ApiError { status: 405, message, param: None }
}

async fn not_found(req: Request) -> ApiError {
    ApiError { status: 404, message: format!("no route for {} {}", req.method(), req.uri().path()), param: None }
}

async fn health(State(s): State<Arc<Service>>) -> Response {
    if let Some(rank) = s.cluster.stopped_rank() {
        let mut r =
            Json(json!({"status": "unhealthy", "error": format!("engine rank {rank} stopped")})).into_response();
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        return r;
    }
    if Instant::now() >= s.ready_at() {
        Json(json!({"status": "ready"})).into_response()
    } else {
        let mut r = Json(json!({"status": "notready"})).into_response();
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        r
    }
}

async fn metrics(State(s): State<Arc<Service>>) -> Response {
    let text = crate::metrics::render(&s.cluster.metrics_of(s.worker), &s.model, s.cluster.backend);
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    r
}

async fn models(State(s): State<Arc<Service>>) -> Json {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.model,
            "object": "model",
            "created": s.created,
            "owned_by": "servesim",
            "root": s.model,
            "parent": null,
            "max_model_len": s.max_model_len,
            "permission": [],
        }],
    }))
}

async fn completions(State(s): State<Arc<Service>>, req: Request) -> Response {
    generate(s, req, false).await.unwrap_or_else(IntoResponse::into_response)
}

async fn chat_completions(State(s): State<Arc<Service>>, req: Request) -> Response {
    generate(s, req, true).await.unwrap_or_else(IntoResponse::into_response)
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Everything a response needs besides the tokens.
struct Frame {
    service: Arc<Service>,
    chat: bool,
    id: String,
    created: u64,
    model: String,
    prompt_tokens: u32,
    include_usage: bool,
    want_worker_id: bool,
}

impl Frame {
    fn usage(&self, completion: u32, cached: u32) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    /// What a prefill-only server tells the client to pass on to a decode server.
    fn kv_transfer_params(&self, done: &Done) -> Option<Value> {
        let blocks = done.remote_blocks?;
        let s = &self.service;
        Some(json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_engine_id": format!("servesim-{}-worker-{}", s.id_salt, done.prefill_worker.unwrap_or(0)),
            "remote_host": s.host,
            "remote_port": s.port,
            "remote_block_ids": (0..blocks).collect::<Vec<u32>>(),
            "tp_size": 1,
        }))
    }

    fn nvext(&self, done: &Done) -> Option<Value> {
        self.want_worker_id.then(
            || json!({"worker_id": {"prefill_worker_id": done.prefill_worker, "decode_worker_id": done.decode_worker}}),
        )
    }
}

async fn generate(s: Arc<Service>, req: Request, chat: bool) -> Result<Response, ApiError> {
    let body = axum::body::to_bytes(req.into_body(), BODY_LIMIT).await.map_err(|e| {
        // Over the limit, or a body that could not be read (the client went away, a broken
        // chunked encoding).
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(err) = source {
            if err.is::<http_body_util::LengthLimitError>() {
                let message = format!("the request body is larger than {BODY_LIMIT} bytes");
                return ApiError { status: 413, message, param: None };
            }
            source = err.source();
        }
        ApiError::bad(format!("cannot read the request body: {e}"))
    })?;
    // Tokenizing a large prompt takes a while: keep it off the threads that serve streams.
    let g: GenRequest = if body.len() > 64 * 1024 {
        let (tok, max_len) = (s.tokenizer.clone(), s.max_model_len);
        tokio::task::spawn_blocking(move || openai::parse(&body, chat, &tok, max_len))
            .await
            .map_err(|_| ApiError { status: 500, message: "request parsing failed".into(), param: None })??
    } else {
        openai::parse(&body, chat, &s.tokenizer, s.max_model_len)?
    };
    if let Some(m) = &g.model {
        if *m != s.model {
            return Err(ApiError {
                status: 404,
                message: format!("The model `{m}` does not exist."),
                param: Some("model".into()),
            });
        }
    }
    let pin = match (g.worker, s.worker) {
        (_, Some(w)) => Some(w),
        (Some(w), None) if (w as usize) < s.cluster.num_workers() => Some(w as usize),
        (Some(w), None) => {
            return Err(ApiError::field("nvext", format!("no worker {w}: there are {}", s.cluster.num_workers())))
        }
        (None, None) => None,
    };
    match s.cluster.single_role() {
        Some(Role::Decode) if !g.remote_prefill => {
            return Err(ApiError::field(
                "kv_transfer_params",
                "this server only decodes (--disaggregation-mode decode): send the kv_transfer_params a prefill \
                 server returned",
            ))
        }
        _ => {}
    }
    tokio::time::sleep_until(s.ready_at().into()).await;
    let prompt_tokens = g.prompt.len() as u32;
    let sub = s.cluster.submit(g.prompt.into(), g.max_tokens, pin).map_err(|_| ApiError::bad("unknown worker"))?;
    let frame = Frame {
        chat,
        id: format!("{}-{:016x}{:016x}", if chat { "chatcmpl" } else { "cmpl" }, s.id_salt, rand_suffix()),
        created: unix_now(),
        model: s.model.clone(),
        prompt_tokens,
        include_usage: g.include_usage,
        want_worker_id: g.want_worker_id,
        service: s,
    };
    let mut rx = sub.rx;
    let guard = sub.guard;
    // News that ends the request early, as the error the client gets (nothing left to cancel).
    let progress = |news: Option<Out>| match news {
        Some(Out::Failed(why)) => {
            guard.finish();
            Err(ApiError::bad(why))
        }
        None => {
            guard.finish();
            Err(engine_stopped())
        }
        Some(o) => Ok(o),
    };
    // Wait for the first news so a refused request still gets a proper error status.
    let first = progress(rx.recv().await)?;
    if g.stream {
        let worker = guard.worker();
        let stream =
            SseStream { rx, guard: Some(guard), frame, pending: Some(first), tokens: 0, started: false, done: false };
        let mut r = Response::new(Body::from_stream(stream));
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        if let Some(w) = worker {
            h.insert("x-servesim-worker", HeaderValue::from(w));
        }
        return Ok(r);
    }
    let mut tokens: Vec<u32> = Vec::with_capacity(g.max_tokens.min(1 << 16) as usize);
    let mut next = first;
    let done = loop {
        match next {
            Out::Token(t) => tokens.push(t),
            Out::Tokens(ts) => tokens.extend_from_slice(&ts),
            Out::Done(d) => break d,
            Out::Failed(_) => unreachable!("failures end the request in `progress`"),
        }
        next = progress(rx.recv().await)?;
    };
    guard.finish();
    let text = frame.service.tokenizer.decode(&tokens);
    let n = tokens.len() as u32;
    let choice = if chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
               "logprobs": null, "finish_reason": "length", "stop_reason": null})
    } else {
        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length", "stop_reason": null})
    };
    let mut body = json!({
        "id": frame.id,
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": frame.created,
        "model": frame.model,
        "choices": [choice],
        "usage": frame.usage(n, done.cached_tokens),
    });
    if let Some(nv) = frame.nvext(&done) {
        body["nvext"] = nv;
    }
    if let Some(kv) = frame.kv_transfer_params(&done) {
        body["kv_transfer_params"] = kv;
    }
    let mut r = Json(body).into_response();
    r.headers_mut().insert("x-servesim-worker", HeaderValue::from(done.decode_worker));
    Ok(r)
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // A bijective mix so consecutive ids do not look consecutive.
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The SSE body: every message the stream has received becomes chunks, written together.
struct SseStream {
    rx: UnboundedReceiver<Out>,
    guard: Option<AbortGuard>,
    frame: Frame,
    /// The first message, received before the response started.
    pending: Option<Out>,
    tokens: u32,
    started: bool,
    done: bool,
}

impl SseStream {
    fn chunk_head(&self, buf: &mut Vec<u8>) {
        let f = &self.frame;
        buf.extend_from_slice(b"data: {\"id\":\"");
        buf.extend_from_slice(f.id.as_bytes());
        buf.extend_from_slice(if f.chat {
            b"\",\"object\":\"chat.completion.chunk\",\"created\":"
        } else {
            b"\",\"object\":\"text_completion\",\"created\":"
        });
        buf.extend_from_slice(f.created.to_string().as_bytes());
        buf.extend_from_slice(b",\"model\":");
        serde_json::to_writer(&mut *buf, &f.model).expect("writing to a Vec");
        buf.extend_from_slice(b",\"choices\":[");
    }

    fn text_chunk(&self, buf: &mut Vec<u8>, text: &str, role: bool) {
        self.chunk_head(buf);
        if self.frame.chat {
            buf.extend_from_slice(if role {
                b"{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":"
            } else {
                b"{\"index\":0,\"delta\":{\"content\":"
            });
            serde_json::to_writer(&mut *buf, text).expect("writing to a Vec");
            buf.extend_from_slice(b"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        } else {
            buf.extend_from_slice(b"{\"index\":0,\"text\":");
            serde_json::to_writer(&mut *buf, text).expect("writing to a Vec");
            buf.extend_from_slice(b",\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}]}\n\n");
        }
    }

    fn token(&mut self, buf: &mut Vec<u8>, id: u32) {
        if self.frame.chat && !self.started {
            self.text_chunk(buf, "", true);
        }
        self.started = true;
        self.tokens += 1;
        let piece = self.frame.service.tokenizer.piece(id);
        self.text_chunk(buf, &piece, false);
    }

    fn finish(&mut self, buf: &mut Vec<u8>, done: &Done) {
        self.chunk_head(buf);
        let choice = if self.frame.chat {
            json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length", "stop_reason": null})
        } else {
            json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "length", "stop_reason": null})
        };
        serde_json::to_writer(&mut *buf, &choice).expect("writing to a Vec");
        buf.extend_from_slice(b"]");
        if let Some(nv) = self.frame.nvext(done) {
            buf.extend_from_slice(b",\"nvext\":");
            serde_json::to_writer(&mut *buf, &nv).expect("writing to a Vec");
        }
        if let Some(kv) = self.frame.kv_transfer_params(done) {
            buf.extend_from_slice(b",\"kv_transfer_params\":");
            serde_json::to_writer(&mut *buf, &kv).expect("writing to a Vec");
        }
        buf.extend_from_slice(b"}\n\n");
        if self.frame.include_usage {
            self.chunk_head(buf);
            buf.extend_from_slice(b"],\"usage\":");
            serde_json::to_writer(&mut *buf, &self.frame.usage(self.tokens, done.cached_tokens))
                .expect("writing to a Vec");
            buf.extend_from_slice(b"}\n\n");
        }
        buf.extend_from_slice(b"data: [DONE]\n\n");
        self.end();
    }

    fn fail(&mut self, buf: &mut Vec<u8>, why: &str) {
        let err = ApiError { status: 500, message: why.to_string(), param: None };
        buf.extend_from_slice(b"data: ");
        serde_json::to_writer(&mut *buf, &err.body()).expect("writing to a Vec");
        buf.extend_from_slice(b"\n\ndata: [DONE]\n\n");
        self.end();
    }

    fn end(&mut self) {
        self.done = true;
        if let Some(g) = self.guard.take() {
            g.finish();
        }
    }

    fn write(&mut self, buf: &mut Vec<u8>, out: Out) {
        match out {
            Out::Token(t) => self.token(buf, t),
            Out::Tokens(ts) => {
                for &t in ts.iter() {
                    self.token(buf, t);
                }
            }
            Out::Done(d) => self.finish(buf, &d),
            Out::Failed(why) => self.fail(buf, &why),
        }
    }
}

impl Stream for SseStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let mut buf = Vec::new();
        if let Some(first) = this.pending.take() {
            this.write(&mut buf, first);
        }
        while !this.done {
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(out)) => this.write(&mut buf, out),
                Poll::Ready(None) => this.fail(&mut buf, ENGINE_STOPPED),
                Poll::Pending => break,
            }
        }
        if buf.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(Some(Ok(Bytes::from(buf))))
        }
    }
}

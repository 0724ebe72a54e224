//! The OpenAI-compatible HTTP API, served by the frontend (all workers) and by each worker's
//! own port: `/v1/models`, `/v1/completions`, `/v1/chat/completions` (JSON or SSE), `/health`
//! and `/metrics`.
//!
//! This module wires the routes and holds what the handlers share: the listener's [`Service`],
//! a response's `Frame`, the errors a request can end with. A completion request takes the
//! path of `generate.rs` (read, parse, check, submit, answer); a streamed answer is the SSE body
//! of `sse.rs`.

mod generate;
mod sse;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Serialize;
use servesim_engine::RejectReason;
use tokio::sync::watch;

use crate::conn::CutMark;
use crate::frontend::Frontend;
use crate::openai::response::{self as wire, Choice, Completion, Health, KvTransferParams, Nvext, WorkerIds};
use crate::openai::{ApiError, ErrorKind};
use crate::rank::stream::Done;
use crate::tokenizer::Tokenizer;

pub use generate::BODY_LIMIT;
pub use sse::SSE_WRITE_BYTES;

/// What every handler of one listener shares.
pub struct Service {
    pub frontend: Arc<Frontend>,
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
    /// How long a request's body may take to arrive once its headers are in.
    pub body_timeout: std::time::Duration,
    /// Set when the shutdown's grace period is over: responses still in flight end now, a
    /// stream with an error event and `[DONE]`, any other with a 503.
    pub aborting: watch::Receiver<bool>,
    /// Most ranks `/metrics` lists one by one (see [`crate::metrics::render`]).
    pub metrics_max_ranks: usize,
    /// The front end's modelled cost, waited before each request is submitted.
    pub frontend_delay: std::time::Duration,
}

/// Resolves once the shutdown's grace period is over (never if the server is gone without one).
async fn aborting(flag: watch::Receiver<bool>) {
    let mut flag = flag;
    if flag.wait_for(|set| *set).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What a response still in flight when the shutdown's grace period ends becomes.
fn shutting_down() -> ApiError {
    ApiError::new(ErrorKind::Unavailable, "the server is shutting down: the request was aborted")
}

/// Runs `fut` unless the shutdown's grace period ends first: then the 503 of [`shutting_down`],
/// and `cut` marks the connection as dropped with a request in flight.
async fn unless_aborted<T>(s: &Service, cut: &CutMark, fut: impl Future<Output = T>) -> Result<T, ApiError> {
    tokio::select! {
        out = fut => Ok(out),
        _ = aborting(s.aborting.clone()) => {
            cut.set();
            Err(shutting_down())
        }
    }
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
        .route("/live", get(|| async { JsonBody(Health { status: "live", error: None }) }))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(service)
}

struct JsonBody<T>(T);

impl<T: Serialize> IntoResponse for JsonBody<T> {
    fn into_response(self) -> Response {
        let mut r = Response::new(Body::from(serde_json::to_vec(&self.0).expect("JSON serialises")));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = JsonBody(self.body()).into_response();
        *r.status_mut() = StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        r
    }
}

/// A request's rank thread is gone (it can only have panicked; /health reports it too).
const ENGINE_STOPPED: &str = "the engine stopped";

fn engine_stopped() -> ApiError {
    ApiError::new(ErrorKind::Internal, ENGINE_STOPPED)
}

/// A request the engine (or the disaggregated handoff) refused.
fn rejected(reason: RejectReason) -> ApiError {
    ApiError::bad(format!("request rejected: {}", reason.describe()))
}

async fn method_not_allowed(req: Request) -> ApiError {
    let message = format!("{} is not allowed on {}", req.method(), req.uri().path());
    ApiError::new(ErrorKind::MethodNotAllowed, message)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("no route for {} {}", req.method(), req.uri().path()))
}

async fn health(State(s): State<Arc<Service>>) -> Response {
    if let Some(rank) = s.frontend.stopped_rank() {
        let error = Some(format!("engine rank {rank} stopped"));
        let mut r = JsonBody(Health { status: "unhealthy", error }).into_response();
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        return r;
    }
    if Instant::now() >= s.ready_at() {
        JsonBody(Health { status: "ready", error: None }).into_response()
    } else {
        let mut r = JsonBody(Health { status: "notready", error: None }).into_response();
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        r
    }
}

async fn metrics(State(s): State<Arc<Service>>) -> Response {
    let text =
        crate::metrics::render(&s.frontend.metrics_of(s.worker), &s.model, s.frontend.backend, s.metrics_max_ranks);
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    r
}

async fn models(State(s): State<Arc<Service>>) -> Response {
    let card = wire::ModelCard {
        id: &s.model,
        object: "model",
        created: s.created,
        owned_by: "servesim",
        root: &s.model,
        parent: wire::Null,
        max_model_len: s.max_model_len,
        permission: [],
    };
    JsonBody(wire::ModelList { object: "list", data: [card] }).into_response()
}

async fn completions(State(s): State<Arc<Service>>, req: Request) -> Response {
    generate::generate(s, req, false).await.unwrap_or_else(IntoResponse::into_response)
}

async fn chat_completions(State(s): State<Arc<Service>>, req: Request) -> Response {
    generate::generate(s, req, true).await.unwrap_or_else(IntoResponse::into_response)
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
    /// What a prefill-only server tells the client to pass on to a decode server.
    fn kv_transfer_params(&self, done: &Done) -> Option<KvTransferParams<'_>> {
        let blocks = done.remote_blocks?;
        let s = &self.service;
        Some(KvTransferParams {
            do_remote_prefill: true,
            do_remote_decode: false,
            remote_engine_id: format!("servesim-{}-worker-{}", s.id_salt, done.prefill_worker.unwrap_or(0)),
            remote_host: &s.host,
            remote_port: s.port,
            remote_block_ids: (0..blocks).collect(),
            tp_size: 1,
        })
    }

    fn nvext(&self, done: &Done) -> Option<Nvext> {
        self.want_worker_id.then_some(Nvext {
            worker_id: WorkerIds { prefill_worker_id: done.prefill_worker, decode_worker_id: done.decode_worker },
        })
    }

    /// The response envelope around `choices`.
    fn completion<'a>(&'a self, chunk: bool, choices: &'a [Choice<'a>]) -> Completion<'a> {
        Completion {
            id: &self.id,
            object: wire::object(self.chat, chunk),
            created: self.created,
            model: &self.model,
            choices,
            usage: None,
            nvext: None,
            kv_transfer_params: None,
        }
    }
}

//! The OpenAI-compatible HTTP API, served by the frontend (all workers) and by each worker's
//! own port: `/v1/models`, `/v1/completions`, `/v1/chat/completions` (JSON or SSE), `/health`
//! and `/metrics`.

use std::convert::Infallible;
use std::future::Future;
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
use serde::Serialize;
use servesim_engine::{RejectReason, Role};
use tokio::sync::mpsc::Receiver;
use tokio::sync::watch;

use crate::conn::CutMark;
use crate::frontend::{AbortGuard, Frontend};
use crate::openai::response::{self as wire, Choice, Completion, Health, KvTransferParams, Nvext, Usage, WorkerIds};
use crate::openai::{self, ApiError, ErrorKind, GenRequest};
use crate::rank::stream::{Done, StreamMsg};
use crate::tokenizer::Tokenizer;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 32 * 1024 * 1024;

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

/// A refusal after which the connection closes (the rest of the body is never read).
fn closing(e: ApiError) -> Response {
    let mut r = e.into_response();
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Reads the request body: refused before reading when its declared length is over the limit,
/// and when it takes longer than the body timeout.
async fn read_body(s: &Service, req: Request) -> Result<Vec<u8>, Response> {
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > BODY_LIMIT as u64) {
        return Err(closing(too_large()));
    }
    let read = collect(req.into_body(), declared.unwrap_or(0) as usize);
    let Ok(body) = tokio::time::timeout(s.body_timeout, read).await else {
        let message = format!("the request body did not arrive within {} s", s.body_timeout.as_secs_f64());
        return Err(closing(ApiError::new(ErrorKind::RequestTimeout, message)));
    };
    body.map_err(closing)
}

fn too_large() -> ApiError {
    ApiError::new(ErrorKind::PayloadTooLarge, format!("the request body is larger than {BODY_LIMIT} bytes"))
}

/// The body's bytes, copied once into one buffer of its declared length (collecting frames and
/// then joining them, as `axum::body::to_bytes` does, holds the body twice).
async fn collect(body: Body, declared: usize) -> Result<Vec<u8>, ApiError> {
    use http_body_util::BodyExt;
    // Only the pages written are resident, so a declared length that is a lie costs nothing.
    let mut out = Vec::with_capacity(declared.min(BODY_LIMIT));
    let mut body = body;
    while let Some(frame) = body.frame().await {
        // A body that could not be read: the client went away, a broken chunked encoding.
        let frame = frame.map_err(|e| ApiError::bad(format!("cannot read the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > BODY_LIMIT {
                return Err(too_large());
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// Bodies larger than this are parsed (and their prompts tokenized) on the blocking pool, at
/// most [`heavy_parses`] at a time.
const HEAVY_BODY: usize = 64 * 1024;

/// How many large bodies are parsed at once: one per core (at least 2). Parsing is CPU-bound,
/// so more at once would not finish sooner, but each holds a few times its body in memory; this
/// bounds that to a few times [`BODY_LIMIT`] per core whatever the number of clients. Bodies
/// waiting their turn hold only themselves.
fn heavy_parses() -> &'static tokio::sync::Semaphore {
    static PERMITS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    PERMITS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        tokio::sync::Semaphore::new(cores.max(2))
    })
}

/// Gives memory freed by a large request back to the system. glibc keeps freed memory in its
/// arenas (a parse allocates from whichever thread's arena), so without this the peak of a few
/// large bodies stays resident; `malloc_trim` also releases free pages inside the heaps.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only returns free memory to the system; it is safe to call at any
        // time from any thread.
        unsafe {
            malloc_trim(0);
        }
    }
}

async fn generate(s: Arc<Service>, req: Request, chat: bool) -> Result<Response, ApiError> {
    // Set if the shutdown cuts this response (the server's accept loop puts it on each request).
    let cut = req.extensions().get::<CutMark>().cloned().unwrap_or_default();
    let body = match read_body(&s, req).await {
        Ok(b) => b,
        Err(r) => return Ok(r),
    };
    // Tokenizing a large prompt takes a while: keep it off the threads that serve streams.
    let g: GenRequest = if body.len() > HEAVY_BODY {
        let permit = unless_aborted(&s, &cut, heavy_parses().acquire())
            .await?
            .map_err(|_| ApiError::new(ErrorKind::Internal, "request parsing failed"))?;
        let (tok, max_len) = (s.tokenizer.clone(), s.max_model_len);
        let parsed = tokio::task::spawn_blocking(move || {
            let g = openai::parse(body, chat, &tok, max_len);
            release_freed_memory();
            g
        })
        .await;
        drop(permit);
        parsed.map_err(|_| ApiError::new(ErrorKind::Internal, "request parsing failed"))??
    } else {
        openai::parse(body, chat, &s.tokenizer, s.max_model_len)?
    };
    if let Some(m) = &g.model {
        if *m != s.model {
            return Err(ApiError {
                kind: ErrorKind::NotFound,
                message: format!("The model `{m}` does not exist."),
                param: Some("model".into()),
            });
        }
    }
    let pin = match (g.worker, s.worker) {
        (_, Some(w)) => Some(w),
        (Some(w), None) if (w as usize) < s.frontend.num_workers() => Some(w as usize),
        (Some(w), None) => {
            return Err(ApiError::field("nvext", format!("no worker {w}: there are {}", s.frontend.num_workers())))
        }
        (None, None) => None,
    };
    match s.frontend.single_role() {
        Some(Role::Decode) if !g.remote_prefill => {
            return Err(ApiError::field(
                "kv_transfer_params",
                "this server only decodes (--disaggregation-mode decode): send the kv_transfer_params a prefill \
                 server returned",
            ))
        }
        _ => {}
    }
    unless_aborted(&s, &cut, tokio::time::sleep_until(s.ready_at().into())).await?;
    let prompt_tokens = g.prompt.len() as u32;
    let sub = s.frontend.submit(g.prompt.into(), g.max_tokens, pin).map_err(|_| ApiError::bad("unknown worker"))?;
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
    let progress = |news: Option<StreamMsg>| match news {
        Some(StreamMsg::Failed(reason)) => {
            guard.finish();
            Err(rejected(reason))
        }
        None => {
            guard.finish();
            Err(engine_stopped())
        }
        Some(o) => Ok(o),
    };
    // Wait for the first news so a refused request still gets a proper error status.
    let first = progress(unless_aborted(&frame.service, &cut, rx.recv()).await?)?;
    if g.stream {
        let worker = guard.worker();
        let aborting = Some(Box::pin(aborting(frame.service.aborting.clone())) as Aborting);
        let stream = SseStream {
            rx,
            guard: Some(guard),
            frame,
            pending: Some(first),
            next: 0,
            tokens: 0,
            started: false,
            done: false,
            aborting,
            cut,
        };
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
            StreamMsg::Token(t) => tokens.push(t),
            StreamMsg::Tokens(ts) => tokens.extend_from_slice(&ts),
            StreamMsg::Done { tail, done } => {
                tokens.extend_from_slice(&tail);
                break done;
            }
            StreamMsg::Failed(_) => unreachable!("failures end the request in `progress`"),
        }
        next = progress(unless_aborted(&frame.service, &cut, rx.recv()).await?)?;
    };
    guard.finish();
    let text = frame.service.tokenizer.decode(&tokens);
    let n = tokens.len() as u32;
    let choices = [Choice::whole(chat, &text)];
    let body = Completion {
        usage: Some(Usage::new(frame.prompt_tokens, n, done.cached_tokens)),
        nvext: frame.nvext(&done),
        kv_transfer_params: frame.kv_transfer_params(&done),
        ..frame.completion(false, &choices)
    };
    let mut r = JsonBody(body).into_response();
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

/// Most bytes of events one write of a stream holds. A stream renders its tokens only as fast
/// as its client takes them: hyper polls the body for more only once its write buffer (at most
/// [`crate::server::WRITE_BUFFER`]) has room, and tokens not yet rendered wait as ids, 4 bytes
/// each (never more than the request's `max_tokens`), instead of as ~150 bytes of JSON.
pub const SSE_WRITE_BYTES: usize = 16 * 1024;

type Aborting = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The SSE body: messages the stream has received become chunks, at most [`SSE_WRITE_BYTES`]
/// of them a write.
struct SseStream {
    rx: Receiver<StreamMsg>,
    guard: Option<AbortGuard>,
    frame: Frame,
    /// A message not yet written out in full: the first one, received before the response
    /// started, or one that did not fit in the last write.
    pending: Option<StreamMsg>,
    /// How many tokens of `pending` have been written.
    next: usize,
    tokens: u32,
    started: bool,
    done: bool,
    /// Resolves when the shutdown's grace period is over (taken once it has).
    aborting: Option<Aborting>,
    cut: CutMark,
}

impl SseStream {
    /// Writes one `data:` event holding `body`.
    fn event<T: Serialize>(buf: &mut Vec<u8>, body: &T) {
        buf.extend_from_slice(b"data: ");
        serde_json::to_writer(&mut *buf, body).expect("writing to a Vec");
        buf.extend_from_slice(b"\n\n");
    }

    fn token(&mut self, buf: &mut Vec<u8>, id: u32) {
        let f = &self.frame;
        if f.chat && !self.started {
            Self::event(buf, &f.completion(true, &[Choice::piece(true, "", true)]));
        }
        self.started = true;
        self.tokens += 1;
        let piece = f.service.tokenizer.piece(id);
        Self::event(buf, &f.completion(true, &[Choice::piece(f.chat, &piece, false)]));
    }

    fn finish(&mut self, buf: &mut Vec<u8>, done: &Done) {
        let f = &self.frame;
        let choices = [Choice::last(f.chat)];
        let last = Completion {
            nvext: f.nvext(done),
            kv_transfer_params: f.kv_transfer_params(done),
            ..f.completion(true, &choices)
        };
        Self::event(buf, &last);
        if f.include_usage {
            let usage = Usage::new(f.prompt_tokens, self.tokens, done.cached_tokens);
            Self::event(buf, &Completion { usage: Some(usage), ..f.completion(true, &[]) });
        }
        buf.extend_from_slice(b"data: [DONE]\n\n");
        self.end();
    }

    fn fail(&mut self, buf: &mut Vec<u8>, err: ApiError) {
        Self::event(buf, &err.body());
        buf.extend_from_slice(b"data: [DONE]\n\n");
        self.end();
    }

    fn end(&mut self) {
        self.done = true;
        if let Some(g) = self.guard.take() {
            g.finish();
        }
    }

    /// The shutdown's grace period is over: the stream ends with an error event and `[DONE]`,
    /// and its request is aborted (the guard is dropped unfinished, which frees its KV).
    fn cut(&mut self, buf: &mut Vec<u8>) {
        self.cut.set();
        Self::event(buf, &shutting_down().body());
        buf.extend_from_slice(b"data: [DONE]\n\n");
        self.done = true;
        self.pending = None;
        drop(self.guard.take());
    }

    /// Writes what `out` holds from token `self.next` on, stopping once `buf` holds
    /// [`SSE_WRITE_BYTES`]; what is left goes back to `pending`.
    fn write(&mut self, buf: &mut Vec<u8>, out: StreamMsg) {
        let ids: &[u32] = match &out {
            StreamMsg::Token(t) => std::slice::from_ref(t),
            StreamMsg::Tokens(ts) => ts,
            StreamMsg::Done { tail, .. } => tail,
            StreamMsg::Failed(_) => &[],
        };
        while self.next < ids.len() {
            if buf.len() >= SSE_WRITE_BYTES {
                self.pending = Some(out);
                return;
            }
            let id = ids[self.next];
            self.next += 1;
            self.token(buf, id);
        }
        self.next = 0;
        match out {
            StreamMsg::Token(_) | StreamMsg::Tokens(_) => {}
            StreamMsg::Done { done, .. } => self.finish(buf, &done),
            StreamMsg::Failed(reason) => self.fail(buf, ApiError::new(ErrorKind::Internal, rejected(reason).message)),
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
        if let Some(a) = this.aborting.as_mut() {
            if a.as_mut().poll(cx).is_ready() {
                this.aborting = None;
                this.cut(&mut buf);
                return Poll::Ready(Some(Ok(Bytes::from(buf))));
            }
        }
        while !this.done && buf.len() < SSE_WRITE_BYTES {
            if let Some(out) = this.pending.take() {
                this.write(&mut buf, out);
                continue;
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(out)) => this.write(&mut buf, out),
                Poll::Ready(None) => this.fail(&mut buf, engine_stopped()),
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

//! A completion request's path: read the body (bounded in size and time), parse it (large ones
//! on the blocking pool), check it against this listener, submit it, and answer with the whole
//! completion or hand the stream to [`super::sse`].

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use servesim_engine::Role;
use tokio::sync::mpsc::Receiver;

use super::{engine_stopped, rejected, sse, unless_aborted, Frame, JsonBody, Service};
use crate::conn::CutMark;
use crate::frontend::AbortGuard;
use crate::openai::response::{Choice, Completion, Usage};
use crate::openai::{self, ApiError, ErrorKind, GenRequest};
use crate::rank::stream::StreamMsg;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 32 * 1024 * 1024;

/// Bodies larger than this are parsed (and their prompts tokenized) on the blocking pool, at
/// most [`heavy_parses`] at a time.
const HEAVY_BODY: usize = 64 * 1024;

pub(super) async fn generate(s: Arc<Service>, req: Request, chat: bool) -> Result<Response, ApiError> {
    // Set if the shutdown cuts this response (the server's accept loop puts it on each request).
    let cut = req.extensions().get::<CutMark>().cloned().unwrap_or_default();
    let body = match read_body(&s, req).await {
        Ok(b) => b,
        Err(r) => return Ok(r),
    };
    let g = parse(&s, &cut, body, chat).await?;
    let pin = placement(&s, &g)?;
    unless_aborted(&s, &cut, tokio::time::sleep_until(s.ready_at().into())).await?;
    if !s.frontend_delay.is_zero() {
        unless_aborted(&s, &cut, tokio::time::sleep(s.frontend_delay)).await?;
    }
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
    let (mut rx, guard) = (sub.rx, sub.guard);
    // Wait for the first news so a refused request still gets a proper error status.
    let first = next(&mut rx, &guard, &frame.service, &cut).await?;
    if g.stream {
        return Ok(sse::response(rx, guard, frame, first, cut));
    }
    whole(frame, rx, guard, first, g.max_tokens, cut).await
}

/// The request's next news from its stream. News that ends it early is the error the client
/// gets (and there is nothing left to cancel): a refusal, or the rank thread gone.
async fn next(
    rx: &mut Receiver<StreamMsg>,
    guard: &AbortGuard,
    s: &Service,
    cut: &CutMark,
) -> Result<StreamMsg, ApiError> {
    match unless_aborted(s, cut, rx.recv()).await? {
        Some(StreamMsg::Failed(reason)) => {
            guard.finish();
            Err(rejected(reason))
        }
        None => {
            guard.finish();
            Err(engine_stopped())
        }
        Some(news) => Ok(news),
    }
}

/// The non-streamed answer: every token, then one completion holding their text.
async fn whole(
    frame: Frame,
    mut rx: Receiver<StreamMsg>,
    guard: AbortGuard,
    first: StreamMsg,
    max_tokens: u32,
    cut: CutMark,
) -> Result<Response, ApiError> {
    let mut tokens: Vec<u32> = Vec::with_capacity(max_tokens.min(1 << 16) as usize);
    let mut news = first;
    let done = loop {
        match news {
            StreamMsg::Token(t) => tokens.push(t),
            StreamMsg::Tokens(ts) => tokens.extend_from_slice(&ts),
            StreamMsg::Done { tail, done } => {
                tokens.extend_from_slice(&tail);
                break done;
            }
            StreamMsg::Failed(_) => unreachable!("failures end the request in `next`"),
        }
        news = next(&mut rx, &guard, &frame.service, &cut).await?;
    };
    guard.finish();
    let text = frame.service.tokenizer.decode(&tokens);
    let n = tokens.len() as u32;
    let choices = [Choice::whole(frame.chat, &text)];
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

/// Parses the body into a request. Tokenizing a large prompt takes a while: bodies over
/// [`HEAVY_BODY`] are parsed on the blocking pool, off the threads that serve streams.
async fn parse(s: &Service, cut: &CutMark, body: Vec<u8>, chat: bool) -> Result<GenRequest, ApiError> {
    if body.len() <= HEAVY_BODY {
        return openai::parse(body, chat, &s.tokenizer, s.max_model_len);
    }
    let failed = || ApiError::new(ErrorKind::Internal, "request parsing failed");
    let permit = unless_aborted(s, cut, heavy_parses().acquire()).await?.map_err(|_| failed())?;
    let (tok, max_len) = (s.tokenizer.clone(), s.max_model_len);
    let parsed = tokio::task::spawn_blocking(move || {
        let g = openai::parse(body, chat, &tok, max_len);
        release_freed_memory();
        g
    })
    .await;
    drop(permit);
    parsed.map_err(|_| failed())?
}

/// Checks the request against this listener: the model it names, the worker it asks for (a
/// worker's own port pins its requests there), and on a decode-only server the prefill's
/// `kv_transfer_params`. `Some(w)`: the request runs on worker `w`.
fn placement(s: &Service, g: &GenRequest) -> Result<Option<usize>, ApiError> {
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
    if s.frontend.single_role() == Some(Role::Decode) && !g.remote_prefill {
        return Err(ApiError::field(
            "kv_transfer_params",
            "this server only decodes (--disaggregation-mode decode): send the kv_transfer_params a prefill server \
             returned",
        ));
    }
    Ok(pin)
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

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The per-process part of a response id: a counter, mixed.
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

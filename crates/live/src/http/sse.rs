//! A streamed answer: the SSE body that renders a request's stream messages into
//! `chat.completion.chunk` / `text_completion` events as fast as the client takes them, ends with
//! `data: [DONE]`, and turns the end of the shutdown's grace period into an error event.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::Response;
use futures_util::Stream;
use serde::Serialize;
use tokio::sync::mpsc::Receiver;

use super::{aborting, engine_stopped, rejected, shutting_down, Frame};
use crate::conn::CutMark;
use crate::frontend::AbortGuard;
use crate::openai::response::{Choice, Completion, Usage};
use crate::openai::{ApiError, ErrorKind};
use crate::rank::stream::{Done, StreamMsg};

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

/// The streamed response of a request whose first news is `first`: its SSE body and headers
/// (`x-servesim-worker` once the request is placed).
pub(super) fn response(
    rx: Receiver<StreamMsg>,
    guard: AbortGuard,
    frame: Frame,
    first: StreamMsg,
    cut: CutMark,
) -> Response {
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
    r
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

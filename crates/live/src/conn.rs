//! One client connection's deadlines, enforced on its socket.
//!
//! [`TimedIo`] wraps the TCP stream hyper reads and writes:
//! - while no request is in flight it fails reads that wait too long: `header` after the
//!   connection opened or after the first byte of a request arrived, `idle` after the previous
//!   response ended (keep-alive);
//! - a write that makes no progress for `write` fails (a client that stopped reading its
//!   response). hyper then drops the connection, and with it the response: a stream's request
//!   is aborted and its KV freed.
//!
//! Whether a request is in flight is told by the service: [`ConnState::begin`] when hyper hands
//! it a request, and the [`Tracked`] response body, which ends the request when dropped (hyper
//! drops it once the response is written). A request body's own deadline is the handler's.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// How long a connection may take at each stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// To send a request's headers: from the connection opening, or from the request's first
    /// byte.
    pub header: Duration,
    /// To send a request's body, once its headers are in.
    pub body: Duration,
    /// Between requests on a kept-alive connection.
    pub idle: Duration,
    /// For a client to take any of a response's bytes while the server has some to send.
    pub write: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: Duration::from_secs(10),
            body: Duration::from_secs(30),
            idle: Duration::from_secs(60),
            write: Duration::from_secs(30),
        }
    }
}

/// Set by a handler whose response the shutdown cut (a stream ended with an error event, a 503):
/// its connection counts as dropped with a request in flight, even if the cut response was
/// written and the connection closed before the connection's task saw the shutdown. It reaches
/// handlers as a request extension.
#[derive(Clone, Debug, Default)]
pub struct CutMark(Arc<AtomicBool>);

impl CutMark {
    pub fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What the service tells the socket about one connection.
#[derive(Debug)]
pub struct ConnState {
    /// A response of this connection was cut at shutdown.
    pub cut: CutMark,
    /// Requests in flight (their responses not yet written).
    active: AtomicUsize,
    /// Requests begun so far.
    begun: AtomicU64,
    /// When the last response ended.
    idle_since: Mutex<Instant>,
    /// A read that waited while a request was in flight: its deadline starts when the request
    /// ends, so it is woken then.
    reader: Mutex<Option<Waker>>,
}

impl ConnState {
    pub fn new() -> Arc<Self> {
        Arc::new(ConnState {
            cut: CutMark::default(),
            active: AtomicUsize::new(0),
            begun: AtomicU64::new(0),
            idle_since: Mutex::new(Instant::now()),
            reader: Mutex::new(None),
        })
    }

    /// Whether a request is in flight.
    pub fn in_flight(&self) -> bool {
        self.active.load(Ordering::SeqCst) > 0
    }

    /// A request arrived; it ends when the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::SeqCst);
        self.begun.fetch_add(1, Ordering::SeqCst);
        ActiveGuard(self.clone())
    }
}

/// One request in flight on a connection.
#[derive(Debug)]
pub struct ActiveGuard(Arc<ConnState>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.active.fetch_sub(1, Ordering::SeqCst);
        if let Some(w) = self.0.reader.lock().unwrap_or_else(|p| p.into_inner()).take() {
            w.wake();
        }
    }
}

/// A response body that holds its request's [`ActiveGuard`] until hyper drops it.
pub struct Tracked {
    pub inner: axum::body::Body,
    pub guard: ActiveGuard,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A deadline, armed lazily.
struct Deadline {
    sleep: Pin<Box<Sleep>>,
    at: Option<Instant>,
}

impl Deadline {
    fn new() -> Self {
        Deadline { sleep: Box::pin(tokio::time::sleep(Duration::ZERO)), at: None }
    }

    /// Whether `at` has passed; if not, the task is woken when it does.
    fn expired(&mut self, at: Instant, cx: &mut Context<'_>) -> bool {
        if self.at != Some(at) {
            self.at = Some(at);
            self.sleep.as_mut().reset(at.into());
        }
        self.sleep.as_mut().poll(cx).is_ready()
    }
}

use std::future::Future;

/// The connection's socket with its deadlines (see the module docs).
pub struct TimedIo {
    tcp: TcpStream,
    state: Arc<ConnState>,
    timeouts: Timeouts,
    opened: Instant,
    /// The request whose headers are arriving: how many had begun before it, and its deadline.
    head: Option<(u64, Instant)>,
    read: Deadline,
    /// Since when writes have made no progress.
    stalled_since: Option<Instant>,
    write: Deadline,
}

impl TimedIo {
    pub fn new(tcp: TcpStream, state: Arc<ConnState>, timeouts: Timeouts) -> Self {
        TimedIo {
            tcp,
            state,
            timeouts,
            opened: Instant::now(),
            head: None,
            read: Deadline::new(),
            stalled_since: None,
            write: Deadline::new(),
        }
    }

    fn timed_out(what: &str) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, what.to_string())
    }

    /// A write that returned `Pending`: fails once writes have been stuck for too long.
    fn write_pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let since = *self.stalled_since.get_or_insert_with(Instant::now);
        if self.write.expired(since + self.timeouts.write, cx) {
            return Poll::Ready(Err(Self::timed_out("the client took no response bytes for the write timeout")));
        }
        Poll::Pending
    }

    fn wrote<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => self.write_pending(cx),
            ready => {
                self.stalled_since = None;
                ready
            }
        }
    }
}

impl AsyncRead for TimedIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let r = Pin::new(&mut this.tcp).poll_read(cx, buf);
        let waiting_for_head = this.state.active.load(Ordering::SeqCst) == 0;
        let begun = this.state.begun.load(Ordering::SeqCst);
        let current_head = this.head.filter(|h| h.0 == begun);
        match r {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                if waiting_for_head && current_head.is_none() {
                    this.head = Some((begun, Instant::now() + this.timeouts.header));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if waiting_for_head => {
                let deadline = match current_head {
                    Some((_, at)) => at,
                    None if begun == 0 => this.opened + this.timeouts.header,
                    None => *this.state.idle_since.lock().unwrap_or_else(|p| p.into_inner()) + this.timeouts.idle,
                };
                if this.read.expired(deadline, cx) {
                    let what = if current_head.is_some() || begun == 0 { "header" } else { "idle" };
                    return Poll::Ready(Err(Self::timed_out(&format!("{what} timeout"))));
                }
                Poll::Pending
            }
            Poll::Pending => {
                let mut reader = this.state.reader.lock().unwrap_or_else(|p| p.into_inner());
                if !reader.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *reader = Some(cx.waker().clone());
                }
                drop(reader);
                // The request may have ended in between.
                if this.state.active.load(Ordering::SeqCst) == 0 {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
            other => other,
        }
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.tcp).poll_write(cx, buf);
        self.wrote(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs);
        self.wrote(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.tcp).poll_flush(cx);
        self.wrote(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.tcp).poll_shutdown(cx);
        self.wrote(r, cx)
    }
}

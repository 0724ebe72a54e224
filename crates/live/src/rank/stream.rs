//! A request's way back to its client: the messages its stream carries ([`StreamMsg`]), the
//! sending side whichever rank has the request writes to ([`Sink`]), and the state the stream
//! and the ranks share ([`RequestState`]: cancelled, finished, where the request is).

use std::sync::atomic::{AtomicBool, AtomicUsize};

use servesim_engine::RejectReason;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{OwnedPermit, Receiver, Sender};

/// What a request's stream receives.
#[derive(Debug)]
pub enum StreamMsg {
    /// Tokens released at the end of one pass (or of several, for a stream that fell behind).
    Token(u32),
    Tokens(Box<[u32]>),
    /// The request generated all its tokens: the last ones that had not been sent yet, and how
    /// it went.
    Done {
        tail: Box<[u32]>,
        done: Done,
    },
    /// The engine (or the disaggregated handoff) refused the request.
    Failed(RejectReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done {
    /// Prompt tokens served from the prefix cache (at prefill).
    pub cached_tokens: u32,
    pub prefill_worker: Option<u32>,
    pub decode_worker: u32,
    /// A prefill-only server finished the prompt: its KV blocks, for a remote decode worker.
    pub remote_blocks: Option<u32>,
}

/// State a request's stream and the ranks share.
#[derive(Debug)]
pub struct RequestState {
    pub cancelled: AtomicBool,
    pub finished: AtomicBool,
    /// Global index of the rank that has the request now (`NOWHERE` before placement).
    pub location: AtomicUsize,
}

impl RequestState {
    /// A request not placed yet.
    pub fn new() -> RequestState {
        RequestState {
            cancelled: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            location: AtomicUsize::new(NOWHERE),
        }
    }
}

impl Default for RequestState {
    fn default() -> RequestState {
        RequestState::new()
    }
}

pub const NOWHERE: usize = usize::MAX;

/// Messages a stream's channel holds before its tokens wait on the rank instead.
pub const STREAM_BUFFER: usize = 64;

/// The sending side of a request's stream, used by whichever rank has the request. It never
/// waits: when the client falls behind and the channel is full, new tokens wait in `backlog`
/// (4 bytes each) and go out together with the next ones that fit. The end of the stream has a
/// slot reserved from the start, so it is always delivered, behind everything before it. A
/// client that takes nothing for the write timeout has its connection closed, which drops the
/// receiver: the next send reports [`ClientGone`] and the rank aborts the request.
#[derive(Debug)]
pub struct Sink {
    tx: Sender<StreamMsg>,
    last: Option<OwnedPermit<StreamMsg>>,
    backlog: Vec<u32>,
}

/// The client of a request went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientGone;

impl Sink {
    /// A stream's channel: its sink and its receiver.
    pub fn channel() -> (Sink, Receiver<StreamMsg>) {
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_BUFFER + 1);
        let last = tx.clone().try_reserve_owned().ok();
        (Sink { tx, last, backlog: Vec::new() }, rx)
    }

    /// Sends the tokens of one pass, or keeps them until there is room.
    pub fn tokens(&mut self, ids: impl ExactSizeIterator<Item = u32>) -> Result<(), ClientGone> {
        if self.tx.is_closed() {
            return Err(ClientGone);
        }
        if self.tx.capacity() == 0 {
            // Still full: the tokens join the backlog, which grows amortised. (Boxing it for a
            // send that fails, then unboxing it, copied it whole every pass: quadratic in the
            // tokens of a stream whose client has stopped reading.)
            self.backlog.extend(ids);
            return Ok(());
        }
        let msg = if !self.backlog.is_empty() {
            self.backlog.extend(ids);
            StreamMsg::Tokens(std::mem::take(&mut self.backlog).into_boxed_slice())
        } else if ids.len() == 1 {
            StreamMsg::Token(ids.into_iter().next().expect("one token"))
        } else {
            StreamMsg::Tokens(ids.collect())
        };
        match self.tx.try_send(msg) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(StreamMsg::Token(t))) => {
                self.backlog.push(t);
                Ok(())
            }
            Err(TrySendError::Full(StreamMsg::Tokens(ts))) => {
                self.backlog = ts.into_vec();
                Ok(())
            }
            Err(TrySendError::Full(_)) => unreachable!("only tokens are sent here"),
            Err(TrySendError::Closed(_)) => Err(ClientGone),
        }
    }

    /// Ends the stream: what is left of its tokens, then `done`.
    pub fn done(&mut self, done: Done) {
        let tail = std::mem::take(&mut self.backlog).into_boxed_slice();
        self.end(StreamMsg::Done { tail, done });
    }

    /// Ends the stream with a refusal.
    pub fn fail(&mut self, reason: RejectReason) {
        self.end(StreamMsg::Failed(reason));
    }

    fn end(&mut self, msg: StreamMsg) {
        if let Some(permit) = self.last.take() {
            permit.send(msg);
        }
    }
}

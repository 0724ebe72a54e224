//! A disaggregated request's handoff from a prefill worker to a decode worker, as one state
//! machine: drivers report what happened ([`Fact`]) and carry out what it asks for ([`Step`]).
//!
//! ```text
//!  vLLM, TRT-LLM (source first)            SGLang (destination first)
//!  place on prefill ─ prompt computed      place on decode ─ pages reserved
//!        │ SourceHeld                             │ DestinationReserved
//!  place on decode ─ pages reserved        place on prefill ─ prompt computed
//!        │ DestinationReserved                    │ SourceHeld
//!        └──────────── start transfer (delay from the prefill side's KV bandwidth) ─┘
//!                           │ TransferLanded
//!                      activate on the decode worker
//!                           │ Activated
//!                      release the prefill worker's copy
//! ```
//!
//! A decode worker refuses a prompt it can never hold; an abort undoes whatever the request
//! holds on either side. The machine knows nothing of time or threads: replay maps steps onto
//! its event heap, the live server onto channels and timers.

use std::sync::Arc;

use servesim_engine::timing::whole_ns;
use servesim_engine::{Backend, KvTransfer, KvTransferTimingMode, RejectReason};

/// Which side of the handoff goes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The prompt is computed, then a decode worker reserves blocks (vLLM, TRT-LLM).
    SourceFirst,
    /// A decode worker reserves pages, then the prompt is computed (SGLang's bootstrap).
    DestinationFirst,
}

impl Order {
    /// The order the decode engine's backend uses.
    pub fn for_backend(backend: Backend) -> Order {
        match backend {
            Backend::Sglang => Order::DestinationFirst,
            Backend::Vllm | Backend::Trtllm => Order::SourceFirst,
        }
    }
}

/// Something that happened to the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fact {
    /// The prefill worker computed the prompt and holds its KV.
    SourceHeld,
    /// The decode worker reserved blocks; it already had `reused_tokens` of the prompt cached.
    DestinationReserved { reused_tokens: u32 },
    /// The decode worker refused the prompt (it can never hold it).
    DestinationRefused(RejectReason),
    /// The prefill worker refused the prompt.
    SourceRefused(RejectReason),
    /// The KV arrived at the decode worker.
    TransferLanded,
    /// The decode worker took the KV; the request is its own now.
    Activated,
    /// The client went away.
    Aborted,
    /// The prefill worker computed the prompt, but the client had gone meanwhile: the prompt
    /// is held only to be released (a live server learns of the two at once).
    SourceHeldAfterAbort,
}

/// What the driver must do next.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// Place the request on the prefill pool and submit its prompt there.
    PlaceOnPrefill,
    /// Place the request on the decode pool; it waits there for blocks.
    PlaceOnDecode,
    /// Move the KV: report [`Fact::TransferLanded`] after `delay_ms`.
    StartTransfer { delay_ms: f64 },
    /// Give the transferred KV to the decode worker.
    Activate,
    /// The prefill worker may free its copy of the KV.
    ReleaseSource,
    /// Take the request off the prefill worker (its prompt was never handed over).
    AbortSource,
    /// Take the request off the decode worker.
    AbortDestination,
    /// The request ends, refused for this reason.
    Reject(RejectReason),
}

/// How long the KV of a prompt takes to move: the prefill side's transfer settings and the
/// decode side's block size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransferTiming {
    pub kv: KvTransfer,
    pub block_size: u32,
}

impl TransferTiming {
    /// Tokens that move for a `prompt_len`-token prompt when the destination had `reused`
    /// cached: the whole prompt, or the whole blocks it lacks (the partial last one included).
    pub fn tokens(&self, prompt_len: u32, reused: u32) -> u64 {
        match self.kv.mode {
            KvTransferTimingMode::FullPrompt => prompt_len as u64,
            KvTransferTimingMode::DestinationMissing => {
                let bs = self.block_size as u64;
                (prompt_len as u64).div_ceil(bs).saturating_sub(reused as u64 / bs) * bs
            }
        }
    }

    /// The transfer time in ms: in whole nanoseconds as Dynamo's clock keeps it, or exact as
    /// aisimulate's replay does (`KvTransfer::whole_ns`).
    pub fn delay_ms(&self, prompt_len: u32, reused: u32) -> f64 {
        let ms = self.kv.ms(self.tokens(prompt_len, reused));
        if self.kv.whole_ns {
            whole_ns(ms)
        } else {
            ms
        }
    }
}

/// Hears what every handoff is told and what it answers, with its request's id: the first
/// step (`fact` None), then each fact and the steps it leads to. Tests use it to compare what
/// two drivers do with one scenario; nothing listens by default. (See
/// [`crate::Topology::tap_handoffs`].)
#[derive(Clone)]
pub struct HandoffTap(Arc<TapFn>);

/// What a [`HandoffTap`] calls: request id, the fact (None for the first step), the steps.
type TapFn = dyn Fn(u64, Option<Fact>, &[Step]) + Send + Sync;

impl HandoffTap {
    pub fn new(f: impl Fn(u64, Option<Fact>, &[Step]) + Send + Sync + 'static) -> HandoffTap {
        HandoffTap(Arc::new(f))
    }
}

impl std::fmt::Debug for HandoffTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandoffTap")
    }
}

impl PartialEq for HandoffTap {
    fn eq(&self, other: &HandoffTap) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The handoff state of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Handoff {
    order: Order,
    prompt_len: u32,
    on_prefill: bool,
    on_decode: bool,
    source_held: bool,
    reserved: Option<u32>,
    transferring: bool,
    landed: bool,
    activated: bool,
    source_released: bool,
    ended: bool,
    /// Who hears this handoff, and the request's id.
    tap: Option<(u64, HandoffTap)>,
}

impl Handoff {
    pub fn new(order: Order, prompt_len: u32) -> Handoff {
        Handoff {
            order,
            prompt_len,
            on_prefill: false,
            on_decode: false,
            source_held: false,
            reserved: None,
            transferring: false,
            landed: false,
            activated: false,
            source_released: false,
            ended: false,
            tap: None,
        }
    }

    /// The same handoff, heard by `tap` as request `id`'s.
    pub fn tapped(self, id: u64, tap: Option<HandoffTap>) -> Handoff {
        Handoff { tap: tap.map(|t| (id, t)), ..self }
    }

    /// A request whose prompt a prefill server elsewhere computed and holds (a decode-only
    /// server): it only needs a destination, then the transfer.
    pub fn remote_source(prompt_len: u32) -> Handoff {
        Handoff { source_held: true, ..Handoff::new(Order::SourceFirst, prompt_len) }
    }

    /// The first step, when the request arrives.
    pub fn start(&mut self) -> Step {
        let step = self.first_step();
        if let Some((id, tap)) = &self.tap {
            (tap.0)(*id, None, &[step]);
        }
        step
    }

    fn first_step(&mut self) -> Step {
        match self.order {
            Order::SourceFirst if !self.source_held => {
                self.on_prefill = true;
                Step::PlaceOnPrefill
            }
            Order::SourceFirst | Order::DestinationFirst => {
                self.on_decode = true;
                Step::PlaceOnDecode
            }
        }
    }

    /// Prompt tokens the decode worker already had, once it reserved blocks.
    pub fn reused_tokens(&self) -> Option<u32> {
        self.reserved
    }

    /// Whether the prefill worker still holds the request (or will: it was placed there).
    pub fn holds_source(&self) -> bool {
        self.on_prefill && !self.source_released
    }

    /// Records `fact` and returns the steps it leads to, in order.
    pub fn on(&mut self, fact: Fact, timing: &TransferTiming) -> Vec<Step> {
        let steps = self.steps(fact, timing);
        if let Some((id, tap)) = &self.tap {
            (tap.0)(*id, Some(fact), &steps);
        }
        steps
    }

    fn steps(&mut self, fact: Fact, timing: &TransferTiming) -> Vec<Step> {
        if self.ended {
            return Vec::new();
        }
        match fact {
            Fact::SourceHeld => {
                self.source_held = true;
                match self.reserved {
                    Some(_) => self.transfer(timing),
                    None => {
                        self.on_decode = true;
                        vec![Step::PlaceOnDecode]
                    }
                }
            }
            Fact::DestinationReserved { reused_tokens } => {
                self.reserved = Some(reused_tokens);
                if self.source_held {
                    self.transfer(timing)
                } else {
                    self.on_prefill = true;
                    vec![Step::PlaceOnPrefill]
                }
            }
            Fact::DestinationRefused(reason) => {
                self.ended = true;
                let mut steps = Vec::new();
                if self.holds_source() {
                    self.source_released = true;
                    steps.push(if self.source_held { Step::ReleaseSource } else { Step::AbortSource });
                }
                steps.push(Step::Reject(reason));
                steps
            }
            Fact::SourceRefused(reason) => {
                self.ended = true;
                self.source_released = true;
                let mut steps = Vec::new();
                if self.on_decode {
                    steps.push(Step::AbortDestination);
                }
                steps.push(Step::Reject(reason));
                steps
            }
            Fact::TransferLanded => {
                self.landed = true;
                vec![Step::Activate]
            }
            Fact::Activated => {
                self.activated = true;
                self.source_released = true;
                vec![Step::ReleaseSource]
            }
            Fact::Aborted => self.abort(),
            Fact::SourceHeldAfterAbort => {
                self.source_held = true;
                self.abort()
            }
        }
    }

    /// The client went away: undo what each side holds.
    fn abort(&mut self) -> Vec<Step> {
        self.ended = true;
        let mut steps = Vec::new();
        if self.holds_source() {
            self.source_released = true;
            steps.push(if self.source_held { Step::ReleaseSource } else { Step::AbortSource });
        }
        if self.on_decode {
            steps.push(Step::AbortDestination);
        }
        steps
    }

    fn transfer(&mut self, timing: &TransferTiming) -> Vec<Step> {
        self.transferring = true;
        let reused = self.reserved.expect("the destination is reserved");
        vec![Step::StartTransfer { delay_ms: timing.delay_ms(self.prompt_len, reused) }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(mode: KvTransferTimingMode) -> TransferTiming {
        TransferTiming {
            kv: KvTransfer {
                bytes_per_token: Some(1_000_000),
                bandwidth_gbps: Some(1.0),
                mode,
                state_bytes: 0,
                whole_ns: true,
            },
            block_size: 64,
        }
    }

    /// Feeds facts in order; returns every step, starting with the first.
    fn run(order: Order, facts: &[Fact]) -> Vec<Step> {
        let t = timing(KvTransferTimingMode::FullPrompt);
        let mut h = Handoff::new(order, 100);
        let mut steps = vec![h.start()];
        for &f in facts {
            steps.extend(h.on(f, &t));
        }
        steps
    }

    #[test]
    fn vllm_computes_the_prompt_first() {
        let steps = run(
            Order::SourceFirst,
            &[Fact::SourceHeld, Fact::DestinationReserved { reused_tokens: 0 }, Fact::TransferLanded, Fact::Activated],
        );
        assert_eq!(
            steps,
            vec![
                Step::PlaceOnPrefill,
                Step::PlaceOnDecode,
                Step::StartTransfer { delay_ms: 100.0 },
                Step::Activate,
                Step::ReleaseSource
            ]
        );
    }

    #[test]
    fn sglang_reserves_the_destination_first() {
        let steps = run(
            Order::DestinationFirst,
            &[Fact::DestinationReserved { reused_tokens: 0 }, Fact::SourceHeld, Fact::TransferLanded, Fact::Activated],
        );
        assert_eq!(
            steps,
            vec![
                Step::PlaceOnDecode,
                Step::PlaceOnPrefill,
                Step::StartTransfer { delay_ms: 100.0 },
                Step::Activate,
                Step::ReleaseSource
            ]
        );
        assert_eq!(Order::for_backend(Backend::Sglang), Order::DestinationFirst);
        assert_eq!(Order::for_backend(Backend::Trtllm), Order::SourceFirst);
    }

    #[test]
    fn a_remote_source_needs_only_a_destination() {
        let t = timing(KvTransferTimingMode::FullPrompt);
        let mut h = Handoff::remote_source(100);
        assert_eq!(h.start(), Step::PlaceOnDecode);
        assert_eq!(
            h.on(Fact::DestinationReserved { reused_tokens: 0 }, &t),
            vec![Step::StartTransfer { delay_ms: 100.0 }]
        );
        assert_eq!(h.on(Fact::TransferLanded, &t), vec![Step::Activate]);
        // Nobody here holds the source: the release is a no-op for the driver (no prefill rank).
        assert_eq!(h.on(Fact::Activated, &t), vec![Step::ReleaseSource]);
    }

    #[test]
    fn a_refused_destination_releases_the_source_and_rejects() {
        let steps =
            run(Order::SourceFirst, &[Fact::SourceHeld, Fact::DestinationRefused(RejectReason::ExceedsKvCapacity)]);
        assert_eq!(
            &steps[2..],
            &[Step::ReleaseSource, Step::Reject(RejectReason::ExceedsKvCapacity)],
            "the prefill copy is freed before the request ends"
        );
        // SGLang: refused before any prompt was computed.
        let steps = run(Order::DestinationFirst, &[Fact::DestinationRefused(RejectReason::ExceedsMaxModelLen)]);
        assert_eq!(&steps[1..], &[Step::Reject(RejectReason::ExceedsMaxModelLen)]);
    }

    #[test]
    fn a_refused_prompt_frees_the_reserved_destination() {
        let steps = run(
            Order::DestinationFirst,
            &[Fact::DestinationReserved { reused_tokens: 0 }, Fact::SourceRefused(RejectReason::ExceedsKvCapacity)],
        );
        assert_eq!(&steps[2..], &[Step::AbortDestination, Step::Reject(RejectReason::ExceedsKvCapacity)]);
        let steps = run(Order::SourceFirst, &[Fact::SourceRefused(RejectReason::ExceedsMaxModelLen)]);
        assert_eq!(&steps[1..], &[Step::Reject(RejectReason::ExceedsMaxModelLen)]);
    }

    #[test]
    fn an_abort_undoes_what_each_side_holds() {
        assert_eq!(run(Order::SourceFirst, &[Fact::Aborted])[1..], [Step::AbortSource]);
        assert_eq!(
            run(Order::SourceFirst, &[Fact::SourceHeld, Fact::DestinationReserved { reused_tokens: 0 }, Fact::Aborted])
                [3..],
            [Step::ReleaseSource, Step::AbortDestination]
        );
        assert_eq!(
            run(Order::DestinationFirst, &[Fact::DestinationReserved { reused_tokens: 0 }, Fact::Aborted])[2..],
            [Step::AbortSource, Step::AbortDestination]
        );
        // After the handoff the request is the decode worker's alone.
        let done = [
            Fact::SourceHeld,
            Fact::DestinationReserved { reused_tokens: 0 },
            Fact::TransferLanded,
            Fact::Activated,
            Fact::Aborted,
        ];
        assert_eq!(run(Order::SourceFirst, &done)[5..], [Step::AbortDestination]);
        // Nothing happens after the end.
        let mut h = Handoff::new(Order::SourceFirst, 10);
        h.start();
        h.on(Fact::Aborted, &timing(KvTransferTimingMode::FullPrompt));
        assert!(h.on(Fact::SourceHeld, &timing(KvTransferTimingMode::FullPrompt)).is_empty());
    }

    #[test]
    fn a_prompt_finished_after_the_client_left_is_only_released() {
        // vLLM: nothing was asked of a decode worker yet, so only the prompt's KV is freed.
        assert_eq!(run(Order::SourceFirst, &[Fact::SourceHeldAfterAbort])[1..], [Step::ReleaseSource]);
        // SGLang: the decode worker's reserved pages go too; no transfer starts.
        assert_eq!(
            run(Order::DestinationFirst, &[Fact::DestinationReserved { reused_tokens: 0 }, Fact::SourceHeldAfterAbort])
                [2..],
            [Step::ReleaseSource, Step::AbortDestination]
        );
    }

    #[test]
    fn a_tap_hears_every_fact_and_step() {
        let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
        let h2 = heard.clone();
        let tap = HandoffTap::new(move |id, fact, steps: &[Step]| h2.lock().unwrap().push((id, fact, steps.to_vec())));
        let t = timing(KvTransferTimingMode::FullPrompt);
        let mut h = Handoff::new(Order::SourceFirst, 100).tapped(9, Some(tap));
        h.start();
        h.on(Fact::SourceHeld, &t);
        assert_eq!(
            *heard.lock().unwrap(),
            vec![(9, None, vec![Step::PlaceOnPrefill]), (9, Some(Fact::SourceHeld), vec![Step::PlaceOnDecode])]
        );
    }

    #[test]
    fn transfer_tokens_follow_the_timing_mode() {
        let full = timing(KvTransferTimingMode::FullPrompt);
        assert_eq!(full.tokens(1000, 512), 1000);
        let missing = timing(KvTransferTimingMode::DestinationMissing);
        // ceil(1000 / 64) = 16 blocks, 8 of them cached: 8 blocks move, the partial one included.
        assert_eq!(missing.tokens(1000, 512), 512);
        assert_eq!(missing.tokens(1000, 0), 1024);
        // 1 MB per token at 1 GB/s: 1 ms per token.
        assert_eq!(missing.delay_ms(1000, 512), 512.0);
        let none = TransferTiming { kv: KvTransfer { bytes_per_token: None, ..full.kv }, ..full };
        assert_eq!(none.delay_ms(1000, 0), 0.0);
    }
}

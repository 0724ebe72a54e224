//! [`Engine`]: one simulated engine (one data-parallel rank), whichever scheduler family the
//! configuration asks for. Drivers only talk to this type.

use crate::config::{Backend, EngineConfig};
use crate::handoff::Reserved;
use crate::output::{PassOutput, RejectReason, Stretch};
use crate::request::EngineRequest;
use crate::sglang::SglangEngine;
use crate::vllm::VllmEngine;

/// Options that are not part of the user-visible engine configuration.
#[derive(Clone, Copy, Debug, Default)]
pub struct EngineOptions {
    /// Record KV cache events in [`PassOutput::kv_events`] (routers and live publishers need
    /// them; plain round-robin replay does not).
    pub record_kv_events: bool,
    /// Position of this engine in its pool (worker × dp_size + rank): offsets its random seeds
    /// so workers draw different streams.
    pub engine_index: u32,
    /// Per-pass timing noise (off: durations are the timing model's).
    pub timing_jitter: Option<crate::timing::TimingJitter>,
}

/// Aggregate counters since the engine was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineCounters {
    pub preemptions: u64,
    /// Prompt tokens looked up in the prefix cache at admission, and those found.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
}

/// A simulated engine of any family.
#[derive(Debug)]
pub enum Engine {
    /// vLLM, and TRT-LLM (the same core with guaranteed-no-evict admission).
    Vllm(Box<VllmEngine>),
    /// SGLang: radix prefix cache, extend-or-decode passes, retraction.
    Sglang(Box<SglangEngine>),
}

macro_rules! delegate {
    ($self:ident, $e:ident => $body:expr) => {
        match $self {
            Engine::Vllm($e) => $body,
            Engine::Sglang($e) => $body,
        }
    };
}

impl Engine {
    pub fn new(cfg: EngineConfig, options: EngineOptions) -> Self {
        match cfg.backend {
            Backend::Vllm | Backend::Trtllm => Engine::Vllm(Box::new(VllmEngine::new(cfg, options))),
            Backend::Sglang => Engine::Sglang(Box::new(SglangEngine::new(cfg, options))),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        delegate!(self, e => e.config())
    }

    /// Draws every generated token id (other than planned tokens and thinking boundaries) from
    /// `vocabulary`, for requests submitted from now on; None restores arbitrary `u32` ids.
    pub fn set_output_vocabulary(&mut self, vocabulary: Option<std::sync::Arc<[u32]>>) {
        delegate!(self, e => e.set_output_vocabulary(vocabulary))
    }

    /// Also reports the token ids of stored blocks ([`PassOutput::stored_tokens`]), for
    /// publishers whose wire format carries them. Needs KV event recording.
    pub fn set_record_block_tokens(&mut self, on: bool) {
        delegate!(self, e => e.set_record_block_tokens(on))
    }

    /// Cancels request `id` between passes: it leaves the engine at once and its KV blocks are
    /// freed (computed full blocks stay cached). No output is reported for it. False if the
    /// engine does not have it.
    pub fn abort(&mut self, id: u64) -> bool {
        delegate!(self, e => e.abort(id))
    }

    /// Queues a request; it is considered for admission at the next pass.
    pub fn submit(&mut self, request: EngineRequest) {
        delegate!(self, e => e.submit(request))
    }

    /// Executes one forward pass starting at `now_ms` and describes it in `out`.
    pub fn step(&mut self, now_ms: f64, out: &mut PassOutput) {
        delegate!(self, e => e.step(now_ms, out))
    }

    /// A pass shared by the `dp_size` attention-DP ranks of a worker begins; it is the worker's
    /// pass number `wave_step` (counted from 0, and again from 0 once every rank is drained).
    /// Drivers that run a worker's ranks in lockstep call this on every rank before the ranks
    /// with work [`Engine::step`], and [`Engine::end_group_pass`] on every rank after; a rank
    /// stepped without them is a worker of its own. The prefill cadences need it: vLLM's
    /// `prefill_schedule_interval` and SGLang's `prefill_decode_interval`.
    pub fn begin_group_pass(&mut self, wave_step: u64, dp_size: u32) {
        match self {
            Engine::Vllm(e) => e.begin_group_pass(wave_step, dp_size),
            Engine::Sglang(e) => e.begin_group_pass(),
        }
    }

    /// Whether this rank computed prompt tokens in the current shared pass (false if it did
    /// not step).
    pub fn prefilled_in_pass(&self) -> bool {
        match self {
            Engine::Vllm(_) => false,
            Engine::Sglang(e) => e.prefilled_in_pass(),
        }
    }

    /// Whether this rank ran the model in the current shared pass (false if it did not step).
    pub fn ran_model_in_pass(&self) -> bool {
        match self {
            Engine::Vllm(_) => false,
            Engine::Sglang(e) => e.ran_model_in_pass(),
        }
    }

    /// The shared pass ended; `any_prefilled` and `any_ran_model` are over all of the worker's
    /// ranks ([`Engine::prefilled_in_pass`], [`Engine::ran_model_in_pass`]).
    pub fn end_group_pass(&mut self, any_prefilled: bool, any_ran_model: bool) {
        match self {
            Engine::Vllm(_) => {}
            Engine::Sglang(e) => e.end_group_pass(any_prefilled, any_ran_model),
        }
    }

    /// Whether the last pass only counted down SGLang's prefill/decode interval: it may take no
    /// time and have no effect, and the next pass is due at once.
    pub fn deferred_in_pass(&self) -> bool {
        match self {
            Engine::Vllm(_) => false,
            Engine::Sglang(e) => e.deferred_in_pass(),
        }
    }

    /// Whether nothing is left on this rank: no request queued, running, held or reserved.
    pub fn is_drained(&self) -> bool {
        delegate!(self, e => e.is_drained())
    }

    /// Whether a pass would have anything to do.
    pub fn has_work(&self) -> bool {
        delegate!(self, e => e.has_work())
    }

    pub fn num_running(&self) -> usize {
        delegate!(self, e => e.num_running())
    }

    /// What waits in the queues (for the planner's forward-pass snapshots).
    pub fn queue_load(&self) -> crate::output::QueueLoad {
        delegate!(self, e => e.queue_load())
    }

    pub fn num_waiting(&self) -> usize {
        delegate!(self, e => e.num_waiting())
    }

    /// KV blocks (pages) held by requests.
    pub fn active_blocks(&self) -> u32 {
        delegate!(self, e => e.active_blocks())
    }

    /// Cached blocks (pages) no request holds: reusable, evictable.
    pub fn inactive_blocks(&self) -> u32 {
        delegate!(self, e => e.inactive_blocks())
    }

    pub fn counters(&self) -> EngineCounters {
        delegate!(self, e => e.counters())
    }

    /// When the next host (G2) KV transfer completes; None without host offload or transfers.
    /// The engine has no clock: a driver wakes an idle engine then and calls
    /// [`Engine::advance_transfers`] (a busy one applies completions at its pass boundary).
    pub fn next_transfer_deadline(&self) -> Option<f64> {
        match self {
            Engine::Vllm(e) => e.next_transfer_deadline(),
            Engine::Sglang(_) => None,
        }
    }

    /// Completes the host transfers due by `now_ms` on an idle engine; true if any did (the
    /// engine may then have work). The KV events they cause (loaded blocks cached on the
    /// device, host residency) go to `events` at once, as Dynamo 1.6.1 publishes them when it
    /// wakes an idle rank, not with its next pass.
    pub fn advance_transfers(&mut self, now_ms: f64, events: &mut PassOutput) -> bool {
        match self {
            Engine::Vllm(e) => {
                let any = e.advance_transfers(now_ms);
                e.drain_kv_events(events);
                any
            }
            Engine::Sglang(_) => false,
        }
    }

    /// The shared pass of the worker's attention-DP ranks ends at `end_ms`: with a host cache,
    /// every rank (stepped or idle) reaches its transfer boundary there; the KV events of loads
    /// that complete go to `out`. Drivers call it on every rank of a group right after the
    /// ranks' steps, once the group's end is known.
    pub fn finish_group_pass(&mut self, end_ms: f64, out: &mut PassOutput) {
        match self {
            Engine::Vllm(e) => e.finish_group_pass(end_ms, out),
            Engine::Sglang(_) => {}
        }
    }

    /// Makes this engine a client of a deployment's shared host pool and/or shared G3 pool
    /// (`cluster_shared`), before it sees a request. Only vLLM engines have host offload (the
    /// configuration refuses the others).
    pub fn join_shared_pools(
        &mut self,
        host: Option<&crate::offload::SharedHostPool>,
        g3: Option<&crate::offload::SharedG3Pool>,
    ) {
        if let Engine::Vllm(e) = self {
            e.join_shared_pools(host, g3);
        }
    }

    /// Whether the driver must call [`Engine::finish_group_pass`] at the end of each pass (in
    /// virtual time, after the passes that end earlier elsewhere), even for a rank driven alone:
    /// true with a shared host pool, which every rank advances.
    pub fn defers_transfer_boundary(&self) -> bool {
        match self {
            Engine::Vllm(e) => e.defers_transfer_boundary(),
            Engine::Sglang(_) => false,
        }
    }

    /// With a G3 tier: serves its transfers up to `now_ms` (applied to the tier, handed to the
    /// host cache at the next advance) and returns how many it has completed so far.
    pub fn g3_sync(&mut self, now_ms: f64) -> Option<u64> {
        match self {
            Engine::Vllm(e) => e.g3_sync(now_ms),
            Engine::Sglang(_) => None,
        }
    }

    /// With a G3 tier: its first completion after `after_ms` (possibly served already by a pass
    /// computed ahead), or its next first byte.
    pub fn g3_next_event_after(&self, after_ms: f64) -> Option<f64> {
        match self {
            Engine::Vllm(e) => e.g3_next_event_after(after_ms),
            Engine::Sglang(_) => None,
        }
    }

    /// With a G3 tier, after a pass that took no time and had no effect: whether it moved a
    /// transfer (or one is due now), so that Dynamo 1.6.1 runs the pass again at once.
    pub fn g3_retry_now(&self, now_ms: f64) -> bool {
        match self {
            Engine::Vllm(e) => e.g3_retry_now(now_ms),
            Engine::Sglang(_) => false,
        }
    }

    /// Another worker's G3 tier completed a transfer since this engine last looked: at its next
    /// advance, the requests waiting on a transfer try again (Dynamo 1.6.1 wakes them on any
    /// completion in the deployment's G3 registry).
    pub fn note_g3_deployment_progress(&mut self) {
        if let Engine::Vllm(e) = self {
            e.note_g3_deployment_progress();
        }
    }

    /// Host-offload counters, when the engine has a host cache.
    pub fn host_counters(&self) -> Option<crate::vllm::HostCounters> {
        match self {
            Engine::Vllm(e) => e.host_counters(),
            Engine::Sglang(_) => None,
        }
    }

    /// Plans several decode-only passes to run at once, if nothing can change during them and
    /// they all start before `horizon_ms`; false when a normal step is needed. Nothing changes
    /// until [`Engine::commit_stretch`].
    pub fn plan_stretch(&mut self, now_ms: f64, horizon_ms: f64, out: &mut Stretch) -> bool {
        match self {
            Engine::Vllm(e) => e.plan_stretch(now_ms, horizon_ms, out),
            Engine::Sglang(_) => false,
        }
    }

    /// Runs the first `passes` passes of the stretch just planned.
    pub fn commit_stretch(&mut self, passes: u32) {
        match self {
            Engine::Vllm(e) => e.commit_stretch(passes),
            Engine::Sglang(_) => unreachable!("SGLang engines plan no stretches"),
        }
    }

    /// Decode worker: accepts a request whose prompt is computed on a prefill worker; it waits
    /// for its KV blocks (see [`crate::handoff`]). Refused if it can never fit.
    pub fn accept_destination(&mut self, request: EngineRequest) -> Result<(), RejectReason> {
        delegate!(self, e => e.accept_destination(request))
    }

    /// Decode worker: reserves blocks for the oldest accepted request if an attempt is due.
    /// Drivers call it after every pass, after a command that may free capacity (activation,
    /// release, abort) and when a request is accepted between passes.
    pub fn retry_destination(&mut self) -> Option<Reserved> {
        delegate!(self, e => e.retry_destination())
    }

    /// Decode worker: the KV of a reserved request has arrived.
    pub fn activate(&mut self, id: u64) {
        delegate!(self, e => e.activate(id))
    }

    /// Prefill worker: the decode side has the KV of finished request `id`; free it.
    pub fn release_held(&mut self, id: u64) {
        delegate!(self, e => e.release_held(id))
    }
}

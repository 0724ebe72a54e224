//! What sets TRT-LLM's scheduler apart from vLLM's in the shared core: how much of the cache a
//! request must find free to be admitted, whether running requests are preempted when blocks
//! run out (and which), how much of a cached prefix is reused, and how long an output may be.
//! The scheduler asks its [`Policy`] and never looks at the backend.

use crate::config::{Backend, EngineConfig, PreemptionMode};

/// Admission, preemption and output rules of the vLLM-style core, chosen at construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    /// vLLM: a request is admitted when its known tokens fit; when a running request needs a
    /// block and none is free, running requests are preempted (by recompute) in this order.
    Optimistic(PreemptionMode),
    /// TRT-LLM's `guaranteed_no_evict`: a request is admitted only when its whole lifetime
    /// (prompt and every output token) fits next to what running requests will still grow
    /// into, so nothing is ever preempted.
    GuaranteedNoEvict,
}

impl Policy {
    /// The policy of a configuration's backend (TRT-LLM's, or vLLM's for any other).
    pub fn of(cfg: &EngineConfig) -> Policy {
        match cfg.backend {
            Backend::Trtllm => Policy::GuaranteedNoEvict,
            Backend::Vllm | Backend::Sglang => Policy::Optimistic(cfg.preemption_mode),
        }
    }

    /// The output a request of `prompt` tokens may generate when it asks for `output`: TRT-LLM
    /// clamps it to what the cache (of `kv_capacity_tokens`) and `max_model_len` can hold next
    /// to the prompt; vLLM keeps it (generation stops at `max_model_len` instead).
    pub fn output_limit(self, prompt: u32, output: u32, kv_capacity_tokens: u64, max_model_len: Option<u32>) -> u32 {
        match self {
            Policy::Optimistic(_) => output,
            Policy::GuaranteedNoEvict => {
                let mut limit = kv_capacity_tokens.saturating_sub(prompt as u64) as u32;
                if let Some(max_len) = max_model_len {
                    limit = limit.min(max_len.saturating_sub(prompt));
                }
                output.min(limit)
            }
        }
    }

    /// Tokens a request must have blocks for to be admitted (or reserved as a destination):
    /// its `known` tokens under vLLM, its whole lifetime (`prompt` + `max_output`) under
    /// TRT-LLM.
    pub fn footprint_tokens(self, known: u32, prompt: u32, max_output: u32) -> u32 {
        match self {
            Policy::Optimistic(_) => known,
            Policy::GuaranteedNoEvict => prompt + max_output,
        }
    }

    /// Whether a request whose footprint is `blocks` can never be admitted into a cache of
    /// `capacity` blocks of `block_size` tokens. TRT-LLM also refuses a prompt that fills the
    /// whole cache (no room would be left for a token).
    pub fn never_fits(self, blocks: u32, prompt: u32, capacity: u32, block_size: u32) -> bool {
        blocks > capacity || (self == Policy::GuaranteedNoEvict && prompt as u64 >= capacity as u64 * block_size as u64)
    }

    /// Blocks that admission must leave free for requests already in the cache: under TRT-LLM,
    /// what each will still grow into by its last token (`requests` yields each one's lifetime
    /// in tokens and the blocks it holds); none under vLLM, which preempts when blocks run out
    /// (`requests` is not read).
    pub fn promised_blocks(self, block_size: u32, requests: impl Iterator<Item = (u32, u32)>) -> u32 {
        match self {
            Policy::Optimistic(_) => 0,
            Policy::GuaranteedNoEvict => {
                requests.map(|(lifetime, held)| lifetime.div_ceil(block_size).saturating_sub(held)).sum()
            }
        }
    }

    /// Whether a destination whose footprint is `blocks` may reserve them now, with `free`
    /// blocks free. vLLM reserves whenever the blocks are there; TRT-LLM also leaves room for
    /// the growth promised to running requests and to earlier handoffs (see
    /// [`Policy::promised_blocks`]; neither is read under vLLM).
    pub fn destination_fits(
        self,
        blocks: u32,
        free: u32,
        block_size: u32,
        running: impl Iterator<Item = (u32, u32)>,
        handoffs: impl Iterator<Item = (u32, u32)>,
    ) -> bool {
        match self {
            Policy::Optimistic(_) => true,
            Policy::GuaranteedNoEvict => {
                let available = free
                    .saturating_sub(self.promised_blocks(block_size, running))
                    .saturating_sub(self.promised_blocks(block_size, handoffs));
                blocks <= available
            }
        }
    }

    /// The running request to preempt when a block is needed and none is free (`running` holds
    /// slots in admission order): the newest or the oldest under vLLM, none under TRT-LLM.
    pub fn victim(self, running: &[u32]) -> Option<u32> {
        match self {
            Policy::Optimistic(PreemptionMode::Lifo) => running.last().copied(),
            Policy::Optimistic(PreemptionMode::Fifo) => running.first().copied(),
            Policy::GuaranteedNoEvict => None,
        }
    }

    /// Whether a request that still has tokens to generate recomputes at least its last known
    /// token instead of reusing the cached block that holds it (vLLM needs that token's
    /// logits); TRT-LLM reuses every full cached block.
    pub fn recomputes_last_token(self) -> bool {
        matches!(self, Policy::Optimistic(_))
    }

    /// Whether a destination's reservation reuses prompt blocks already cached here (vLLM) or
    /// takes fresh blocks for the whole prompt (TRT-LLM).
    pub fn reserve_reuses_cache(self) -> bool {
        matches!(self, Policy::Optimistic(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIFO: Policy = Policy::Optimistic(PreemptionMode::Lifo);
    const FIFO: Policy = Policy::Optimistic(PreemptionMode::Fifo);
    const NO_EVICT: Policy = Policy::GuaranteedNoEvict;

    #[test]
    fn chosen_by_backend_and_preemption_mode() {
        let cfg = |json| Policy::of(&EngineConfig::parse_json(json).unwrap());
        assert_eq!(cfg(r#"{}"#), LIFO);
        assert_eq!(cfg(r#"{"preemption_mode": "fifo"}"#), FIFO);
        assert_eq!(cfg(r#"{"engine_type": "trtllm", "preemption_mode": "fifo"}"#), NO_EVICT);
    }

    #[test]
    fn only_trtllm_clamps_the_output() {
        // 100 tokens of cache, a 30-token prompt.
        assert_eq!(LIFO.output_limit(30, 500, 100, None), 500);
        assert_eq!(NO_EVICT.output_limit(30, 500, 100, None), 70);
        assert_eq!(NO_EVICT.output_limit(30, 500, 100, Some(50)), 20, "max_model_len is tighter");
        assert_eq!(NO_EVICT.output_limit(30, 10, 100, Some(50)), 10, "short outputs are kept");
        assert_eq!(NO_EVICT.output_limit(130, 10, 100, None), 0, "a prompt beyond the cache leaves none");
    }

    #[test]
    fn footprint_is_the_known_sequence_or_the_lifetime() {
        assert_eq!(FIFO.footprint_tokens(40, 30, 100), 40);
        assert_eq!(NO_EVICT.footprint_tokens(40, 30, 100), 130);
        // 10 blocks of 16 tokens.
        assert!(!LIFO.never_fits(10, 160, 10, 16));
        assert!(LIFO.never_fits(11, 10, 10, 16));
        assert!(NO_EVICT.never_fits(10, 160, 10, 16), "a prompt filling the cache leaves no room for a token");
        assert!(!NO_EVICT.never_fits(10, 159, 10, 16));
    }

    #[test]
    fn trtllm_keeps_the_growth_of_admitted_requests_free() {
        // (lifetime tokens, blocks held) at 16 tokens a block: 2 and 0 blocks still to come.
        let running = || [(64, 2), (30, 2)].into_iter();
        assert_eq!(NO_EVICT.promised_blocks(16, running()), 2);
        let untouched = std::iter::from_fn(|| -> Option<(u32, u32)> { panic!("vLLM promises nothing") });
        assert_eq!(LIFO.promised_blocks(16, untouched), 0);
        let handoffs = || [(48, 1)].into_iter();
        // 6 free, 2 promised to running requests, 2 to an earlier handoff: 2 are left.
        assert!(NO_EVICT.destination_fits(2, 6, 16, running(), handoffs()));
        assert!(!NO_EVICT.destination_fits(3, 6, 16, running(), handoffs()));
        assert!(FIFO.destination_fits(30, 0, 16, running(), handoffs()));
    }

    #[test]
    fn victims_follow_the_preemption_mode_and_trtllm_has_none() {
        let running = [4, 9, 2];
        assert_eq!(LIFO.victim(&running), Some(2));
        assert_eq!(FIFO.victim(&running), Some(4));
        assert_eq!(NO_EVICT.victim(&running), None);
        assert_eq!(LIFO.victim(&[]), None);
    }

    #[test]
    fn only_vllm_recomputes_the_last_token_and_reuses_cache_for_destinations() {
        assert!(LIFO.recomputes_last_token() && LIFO.reserve_reuses_cache());
        assert!(!NO_EVICT.recomputes_last_token() && !NO_EVICT.reserve_reuses_cache());
    }
}

//! A request between its arrival and its end, as both drivers keep it: the prompt and its
//! block hashes, how much it generates, its routing metadata, where it was placed and, in a
//! disaggregated cluster, its handoff. `T` is the driver's own baggage (replay: the session it
//! belongs to; live: the client's stream).

use std::sync::Arc;

use servesim_engine::{BlockHashes, EngineRequest, Prompt, Role};
use servesim_router::RouteRequest;

use crate::handoff::Handoff;
use crate::topology::Topology;

/// The seed of a request's generated token ids: the run's seed mixed with the request id, so
/// every request draws its own stream and the same run draws the same tokens.
pub fn token_seed(run_seed: u64, id: u64) -> u64 {
    run_seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[derive(Clone, Debug)]
pub struct Flight<T> {
    pub id: u64,
    pub prompt: Prompt,
    /// Hashes of the prompt's full blocks, when something routes on them (empty otherwise:
    /// engines hash what they need themselves).
    pub hashes: BlockHashes,
    pub max_output: u32,
    pub token_seed: u64,
    /// Exact output token ids (a trace's `output_token_ids`).
    pub planned_output: Option<Arc<[u32]>>,
    pub priority: i32,
    pub strict_priority: u32,
    pub arrival_ms: f64,
    /// The router policy class (or family) the request asks for (trace `policy_class`).
    pub policy_class: Option<Arc<str>>,
    /// Targets (`worker × dp + rank`) in the prefill (or aggregated) pool and the decode pool.
    pub prefill_target: Option<usize>,
    pub decode_target: Option<usize>,
    pub handoff: Option<Handoff>,
    pub extra: T,
}

impl<T> Flight<T> {
    /// A request arriving at `arrival_ms`, not placed yet: its generated tokens seeded from the
    /// run's `run_seed`, at default priority, with no exact output, routing hashes or policy
    /// class (a driver that has them sets the fields), and the handoff `topology` gives it.
    pub fn new(
        id: u64,
        prompt: Prompt,
        max_output: u32,
        arrival_ms: f64,
        run_seed: u64,
        topology: &Topology,
        extra: T,
    ) -> Flight<T> {
        let handoff = topology.handoff(id, prompt.len());
        Flight {
            id,
            prompt,
            hashes: BlockHashes::default(),
            max_output,
            token_seed: token_seed(run_seed, id),
            planned_output: None,
            priority: 0,
            strict_priority: 0,
            arrival_ms,
            policy_class: None,
            prefill_target: None,
            decode_target: None,
            handoff,
            extra,
        }
    }

    /// The request as an engine of `role` sees it: a prefill worker computes only the prompt (and
    /// one token nobody sees).
    pub fn engine_request(&self, role: Role) -> EngineRequest {
        let prefill_only = role == Role::Prefill;
        EngineRequest {
            id: self.id,
            prompt: self.prompt.clone(),
            max_output: if prefill_only { 1 } else { self.max_output },
            token_seed: self.token_seed,
            hashes: (!self.hashes.is_empty()).then(|| self.hashes.clone()),
            planned_output: if prefill_only { None } else { self.planned_output.clone() },
        }
    }

    /// The request as the router sees it.
    pub fn route_request(&self) -> RouteRequest<'_> {
        RouteRequest {
            id: self.id,
            hashes: &self.hashes.seq,
            isl: self.prompt.len(),
            priority: self.priority,
            strict_priority: self.strict_priority,
            arrival_ms: self.arrival_ms,
            policy_class: self.policy_class.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_worker_gets_only_the_prompt() {
        let args = servesim_engine::WorkerArgs::parse_json("{}").unwrap();
        let topology = Topology::disaggregated((args.clone(), 1), (args, 1)).unwrap();
        let f = Flight {
            planned_output: Some(vec![5, 6].into()),
            ..Flight::new(7, Prompt::Tokens(vec![1, 2, 3].into()), 20, 0.0, 42, &topology, ())
        };
        assert!(f.handoff.is_some(), "a disaggregated request is handed off");
        assert_eq!(f.token_seed, token_seed(42, 7));
        let p = f.engine_request(Role::Prefill);
        assert_eq!((p.max_output, p.planned_output.is_none(), p.hashes.is_none()), (1, true, true));
        let d = f.engine_request(Role::Decode);
        assert_eq!((d.max_output, d.planned_output.as_deref()), (20, Some(&[5, 6][..])));
        assert_ne!(token_seed(42, 7), token_seed(42, 8));
        assert_eq!(f.route_request().isl, 3);
    }
}

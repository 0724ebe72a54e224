//! What a cluster is made of: one aggregated pool of workers, or a prefill pool and a decode
//! pool, each with an engine configuration and a deployment (ranks per worker, GPUs, startup
//! time, KV transfer). One validation serves `predict` and `serve`. The topology also answers
//! what both drivers ask of it: which pool a role's requests start in, the handoff a new
//! request needs, and whose transfer settings time it.

use servesim_engine::{Deployment, EngineConfig, Role, WorkerArgs};

use crate::handoff::{Handoff, HandoffTap, Order, TransferTiming};

/// A configuration that cannot make a cluster. `field` names what is wrong in the terms of the
/// worker arguments (`num_workers`, `dp_size`, `block_size`, ...), for front ends to map onto
/// their own flags or keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyError {
    pub field: &'static str,
    pub message: String,
}

impl std::fmt::Display for TopologyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for TopologyError {}

fn error(field: &'static str, message: impl Into<String>) -> TopologyError {
    TopologyError { field, message: message.into() }
}

/// Workers of one role, all with the same engine and deployment.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSpec {
    pub role: Role,
    /// The worker's engine configuration (a rank's is [`PoolSpec::rank_engine`]).
    pub engine: EngineConfig,
    pub deployment: Deployment,
    /// Workers at the start of a run.
    pub workers: u32,
}

impl PoolSpec {
    /// Attention data-parallel ranks per worker.
    pub fn dp(&self) -> usize {
        self.deployment.dp_size as usize
    }

    /// The engine configuration of each rank (SGLang splits some budgets among ranks).
    pub fn rank_engine(&self) -> EngineConfig {
        self.engine.for_attention_dp(self.deployment.dp_size)
    }

    /// The target of `worker`'s rank `rank`: targets number a pool's ranks worker after worker.
    pub fn target(&self, worker: usize, rank: usize) -> usize {
        worker * self.dp() + rank
    }

    /// The (worker, rank) of `target`.
    pub fn locate(&self, target: usize) -> (usize, usize) {
        (target / self.dp(), target % self.dp())
    }
}

/// The pools of a cluster: `[aggregated]` or `[prefill, decode]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    pools: Vec<PoolSpec>,
    /// Hears every handoff of a run (see [`Topology::tap_handoffs`]).
    tap: Option<HandoffTap>,
}

impl Topology {
    /// One pool of `workers` aggregated workers.
    pub fn aggregated(args: WorkerArgs, workers: u32) -> Result<Topology, TopologyError> {
        if args.engine.role != Role::Aggregated {
            return Err(error(
                "worker_type",
                format!(
                    "a {} worker_type needs a disaggregated cluster (prefill and decode workers)",
                    args.engine.role.name()
                ),
            ));
        }
        Ok(Topology { pools: vec![pool(Role::Aggregated, args, workers, "num_workers")?], tap: None })
    }

    /// One pool of `workers` workers of a single role, for a server that is one side of a
    /// disaggregated deployment whose other side runs elsewhere (Dynamo's
    /// `--disaggregation-mode prefill|decode`).
    pub fn one_side(role: Role, args: WorkerArgs, workers: u32) -> Result<Topology, TopologyError> {
        if role == Role::Aggregated {
            return Topology::aggregated(args, workers);
        }
        Ok(Topology { pools: vec![pool(role, args, workers, "num_workers")?], tap: None })
    }

    /// A prefill pool and a decode pool with the same block size, as Dynamo's replay requires.
    /// Engines whose worker type is unset (aggregated) take the pool's role.
    pub fn disaggregated(prefill: (WorkerArgs, u32), decode: (WorkerArgs, u32)) -> Result<Topology, TopologyError> {
        let t = Topology::disaggregated_own_block_sizes(prefill, decode)?;
        let (p, d) = (t.pools[0].engine.block_size, t.pools[1].engine.block_size);
        if p != d {
            return Err(error(
                "block_size",
                format!("prefill and decode engines need the same block_size ({p} vs {d})"),
            ));
        }
        Ok(t)
    }

    /// A prefill pool and a decode pool, each with its own block size (aisimulate's engine: the
    /// prompt's blocks are the prefill side's, and a transfer moves the blocks the decode side
    /// lacks, counted in its own blocks).
    pub fn disaggregated_own_block_sizes(
        prefill: (WorkerArgs, u32),
        decode: (WorkerArgs, u32),
    ) -> Result<Topology, TopologyError> {
        let prefill = pool(Role::Prefill, prefill.0, prefill.1, "num_prefill_workers")?;
        let decode = pool(Role::Decode, decode.0, decode.1, "num_decode_workers")?;
        shared_host_agrees(&prefill, &decode)?;
        Ok(Topology { pools: vec![prefill, decode], tap: None })
    }

    /// Whether the pools' engines differ in block size (only a disaggregated cluster's can).
    pub fn mixed_block_sizes(&self) -> bool {
        self.pools.iter().any(|p| p.engine.block_size != self.pools[0].engine.block_size)
    }

    pub fn pools(&self) -> &[PoolSpec] {
        &self.pools
    }

    pub fn is_disaggregated(&self) -> bool {
        self.pools.len() == 2
    }

    /// The pool a request starts in when it takes `role`'s side of the cluster.
    pub fn pool_of(&self, role: Role) -> Option<usize> {
        self.pools.iter().position(|p| p.role == role)
    }

    /// The block size prompts are hashed at (every pool has the same).
    pub fn block_size(&self) -> u32 {
        self.pools[0].engine.block_size
    }

    /// How a handoff's KV transfer is timed: with the prefill pool's settings (the side the KV
    /// leaves from), or a decode-only server's own, for the prefill server elsewhere, over the
    /// decode side's blocks (the ones it lacks are what moves). None for an aggregated cluster,
    /// which hands nothing off.
    pub fn transfer_timing(&self) -> Option<TransferTiming> {
        let source = self.pool_of(Role::Prefill).or(self.pool_of(Role::Decode))?;
        let destination = self.pool_of(Role::Decode).unwrap_or(source);
        Some(TransferTiming {
            kv: self.pools[source].deployment.kv_transfer,
            block_size: self.pools[destination].engine.block_size,
        })
    }

    /// The handoff request `id` with a `prompt_len`-token prompt starts with, if it moves
    /// between workers here: in a disaggregated cluster, in the decode engine's order; on a
    /// decode-only server, from the prefill server elsewhere that holds its prompt. None when
    /// its workers keep it (aggregated) or hand it elsewhere (a prefill-only server).
    pub fn handoff(&self, id: u64, prompt_len: u32) -> Option<Handoff> {
        let decode = &self.pools[self.pool_of(Role::Decode)?];
        let handoff = match self.pool_of(Role::Prefill) {
            Some(_) => Handoff::new(Order::for_backend(decode.engine.backend), prompt_len),
            None => Handoff::remote_source(prompt_len),
        };
        Some(handoff.tapped(id, self.tap.clone()))
    }

    /// The same cluster, with `tap` hearing every handoff [`Topology::handoff`] makes (the
    /// conformance tests compare what the replay and the live driver tell their handoffs).
    pub fn tap_handoffs(self, tap: HandoffTap) -> Topology {
        Topology { tap: Some(tap), ..self }
    }
}

/// Prefill and decode workers whose host offload is `cluster_shared` join one pool for the
/// deployment, as in Dynamo 1.6.1, which refuses participants that disagree on what the pool
/// stores or how large and fast it is.
fn shared_host_agrees(prefill: &PoolSpec, decode: &PoolSpec) -> Result<(), TopologyError> {
    let contract = |p: &PoolSpec| {
        let h = p.engine.host_offload.as_ref().filter(|h| h.cluster_shared)?;
        let block_bytes = u64::from(p.engine.block_size) * p.engine.kv_cache_bytes_per_token.unwrap_or_default();
        Some([
            ("kv_layout_id", h.kv_layout_id.clone().unwrap_or_default()),
            ("tensor_parallel_size", p.deployment.tensor_parallel_size.to_string()),
            ("block bytes", block_bytes.to_string()),
            ("num_host_blocks", h.num_host_blocks.to_string()),
            ("shared_d2h_bandwidth_gbps", h.shared_d2h_bandwidth_gbps.to_string()),
            ("shared_h2d_bandwidth_gbps", h.shared_h2d_bandwidth_gbps.to_string()),
        ])
    };
    let (Some(p), Some(d)) = (contract(prefill), contract(decode)) else { return Ok(()) };
    let differences: Vec<String> = p
        .iter()
        .zip(&d)
        .filter(|(a, b)| a.1 != b.1)
        .map(|((key, a), (_, b))| format!("{key} {a} (prefill) vs {b} (decode)"))
        .collect();
    if differences.is_empty() {
        return Ok(());
    }
    Err(error(
        "native_host_offload",
        format!(
            "cluster_shared host_offload participants are incompatible: the prefill and decode workers \
             share one pool and must agree on it ({})",
            differences.join(", ")
        ),
    ))
}

fn pool(role: Role, mut args: WorkerArgs, workers: u32, count: &'static str) -> Result<PoolSpec, TopologyError> {
    if workers == 0 {
        return Err(error(count, "must be at least 1"));
    }
    match args.engine.role {
        Role::Aggregated => args.engine.role = role,
        r if r == role => {}
        r => {
            return Err(error("worker_type", format!("worker_type {} does not fit the {} pool", r.name(), role.name())))
        }
    }
    Ok(PoolSpec { role, engine: args.engine, deployment: args.deployment, workers })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(json: &str) -> WorkerArgs {
        WorkerArgs::parse_json(json).unwrap()
    }

    #[test]
    fn pools_take_their_roles_and_must_fit_together() {
        let t = Topology::disaggregated((args("{}"), 2), (args("{}"), 3)).unwrap();
        assert_eq!(t.pools()[0].role, Role::Prefill);
        assert_eq!(t.pools()[1].engine.role, Role::Decode);
        assert_eq!(t.pool_of(Role::Decode), Some(1));
        assert!(t.is_disaggregated());
        assert!(t.handoff(1, 100).is_some());
        let e = Topology::disaggregated((args(r#"{"is_decode": true}"#), 1), (args("{}"), 1)).unwrap_err();
        assert_eq!(e.field, "worker_type");
        let e = Topology::disaggregated((args(r#"{"block_size": 16}"#), 1), (args("{}"), 1)).unwrap_err();
        assert_eq!(e.field, "block_size");
        let t = Topology::disaggregated((args(r#"{"dp_size": 2}"#), 1), (args(r#"{"dp_size": 4}"#), 1)).unwrap();
        assert_eq!((t.pools()[0].dp(), t.pools()[1].dp()), (2, 4));
        let e = Topology::aggregated(args("{}"), 0).unwrap_err();
        assert_eq!((e.field, e.message.as_str()), ("num_workers", "must be at least 1"));
        let e = Topology::aggregated(args(r#"{"is_prefill": true}"#), 1).unwrap_err();
        assert!(e.message.contains("needs a disaggregated cluster"), "{e}");
    }

    #[test]
    fn prefill_and_decode_share_one_host_pool_only_if_they_agree_on_it() {
        let shared = |blocks: u32, layout: &str, tp: u32| {
            args(&format!(
                r#"{{"tensor_parallel_size": {tp}, "engine": {{"kv_cache_bytes_per_token": 1024, "native_host_offload":
                    {{"num_host_blocks": {blocks}, "scope": "cluster_shared", "kv_layout_id": "{layout}"}}}}}}"#
            ))
        };
        assert!(Topology::disaggregated((shared(64, "a", 1), 2), (shared(64, "a", 1), 1)).is_ok());
        // A private cache on one side shares nothing.
        let local =
            args(r#"{"engine": {"kv_cache_bytes_per_token": 1024, "native_host_offload": {"num_host_blocks": 8}}}"#);
        assert!(Topology::disaggregated((shared(64, "a", 1), 1), (local, 1)).is_ok());
        let e = Topology::disaggregated((shared(64, "a", 1), 1), (shared(128, "b", 2), 1)).unwrap_err();
        assert_eq!(e.field, "native_host_offload");
        assert_eq!(
            e.message,
            "cluster_shared host_offload participants are incompatible: the prefill and decode workers share one \
             pool and must agree on it (kv_layout_id a (prefill) vs b (decode), tensor_parallel_size 1 (prefill) vs \
             2 (decode), num_host_blocks 64 (prefill) vs 128 (decode))"
        );
    }

    #[test]
    fn a_single_role_server_is_one_pool_of_that_role() {
        let t = Topology::one_side(Role::Decode, args("{}"), 2).unwrap();
        assert_eq!(t.pools().len(), 1);
        assert_eq!((t.pools()[0].role, t.pools()[0].engine.role), (Role::Decode, Role::Decode));
        assert!(!t.is_disaggregated());
        let e = Topology::one_side(Role::Prefill, args(r#"{"is_decode": true}"#), 1).unwrap_err();
        assert_eq!(e.field, "worker_type");
    }

    #[test]
    fn handoffs_are_timed_by_the_side_the_kv_leaves_from() {
        let slow = args(r#"{"kv_transfer_bandwidth": 1.0, "kv_bytes_per_token": 1000000}"#);
        let t = Topology::disaggregated((slow.clone(), 1), (args("{}"), 1)).unwrap();
        assert_eq!(t.transfer_timing().unwrap().delay_ms(100, 0), 100.0, "the prefill pool's bandwidth");
        let t = Topology::disaggregated((args("{}"), 1), (slow.clone(), 1)).unwrap();
        assert_eq!(t.transfer_timing().unwrap().delay_ms(100, 0), 0.0);
        // A decode-only server times the transfer from the prefill server elsewhere with its own.
        let t = Topology::one_side(Role::Decode, slow.clone(), 1).unwrap();
        assert_eq!(t.transfer_timing().unwrap().delay_ms(100, 0), 100.0);
        let mut remote = t.handoff(1, 100).expect("a remote-source handoff");
        assert_eq!(remote.start(), crate::Step::PlaceOnDecode);
        assert!(Topology::one_side(Role::Prefill, slow.clone(), 1).unwrap().handoff(1, 100).is_none());
        let agg = Topology::aggregated(slow, 1).unwrap();
        assert!(agg.transfer_timing().is_none() && agg.handoff(1, 100).is_none());
    }

    /// Each side keeps its block size when asked (aisimulate's engine), and then a transfer moves
    /// the decode side's missing blocks: a 100-token prompt with 64 tokens cached there moves 64
    /// tokens over decode blocks of 32 (prefill blocks of 16 would move 48).
    #[test]
    fn each_side_may_keep_its_block_size_and_transfers_count_the_decode_sides_blocks() {
        let side = |bs: u32| {
            args(&format!(
                r#"{{"block_size": {bs}, "kv_transfer_bandwidth": 1.0, "kv_bytes_per_token": 1000000,
                    "kv_transfer_timing_mode": "destination_missing"}}"#
            ))
        };
        let e = Topology::disaggregated((side(16), 1), (side(32), 1)).unwrap_err();
        assert_eq!(e.to_string(), "block_size: prefill and decode engines need the same block_size (16 vs 32)");
        let t = Topology::disaggregated_own_block_sizes((side(16), 1), (side(32), 1)).unwrap();
        assert!(t.mixed_block_sizes());
        assert_eq!(t.block_size(), 16, "prompts are cut in the prefill side's blocks");
        assert_eq!(t.transfer_timing().unwrap().tokens(100, 64), 64);
        assert!(!Topology::disaggregated((side(16), 1), (side(16), 1)).unwrap().mixed_block_sizes());
    }

    #[test]
    fn targets_number_ranks_worker_after_worker() {
        let t = Topology::aggregated(args(r#"{"dp_size": 4}"#), 3).unwrap();
        let pool = &t.pools()[0];
        assert_eq!(pool.target(2, 1), 9);
        assert_eq!(pool.locate(9), (2, 1));
    }

    #[test]
    fn sglang_ranks_split_the_chunk_budget() {
        let t = Topology::aggregated(args(r#"{"engine": {"backend": "sglang"}, "dp_size": 4}"#), 1).unwrap();
        let pool = &t.pools()[0];
        assert_eq!(pool.dp(), 4);
        assert_eq!(pool.engine.sglang.chunked_prefill_size, 8192);
        assert_eq!(pool.rank_engine().sglang.chunked_prefill_size, 2048);
    }
}

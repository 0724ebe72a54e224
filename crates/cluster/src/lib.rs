//! # servesim-cluster
//!
//! The layer between the engine and the two drivers (the replay event loop and the live
//! server): what a cluster is made of ([`topology`]), where a request goes ([`placement`]), how
//! a disaggregated request moves from a prefill worker to a decode worker ([`handoff`]), the
//! in-flight request ([`flight`]), the router's lifecycle edges of a pass ([`edges`]) and
//! workers that start, drain and stop ([`lifecycle`]). Like
//! the engine it reads no clock, starts no thread and does no I/O: drivers report what
//! happened and carry out what it asks for.

pub mod afd;
pub mod edges;
pub mod flight;
pub mod handoff;
pub mod lifecycle;
pub mod placement;
pub mod topology;

pub use edges::{router_edges, Edge, PassEdges};
pub use flight::{token_seed, Flight};
pub use handoff::{Fact, Handoff, HandoffTap, Order, Step, TransferTiming};
pub use lifecycle::{WorkerState, Workers};
pub use placement::{router_config_for, Placer, RouterMode};
pub use topology::{PoolSpec, Topology, TopologyError};

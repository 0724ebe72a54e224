//! # servesim-engine
//!
//! The simulated LLM engine: admission and scheduling, a paged KV cache with prefix caching,
//! and forward-pass timing. It performs no I/O and reads no clock: [`Engine::step`] is given
//! the time a pass starts and returns what the pass did and when it ends. Drivers (the replay
//! event loop, the live server) own time and request flow.

pub mod config;
pub mod engine;
pub mod handoff;
pub mod hash;
pub mod offload;
pub mod output;
pub mod pool;
pub mod profile;
pub mod request;
mod sequence;
pub mod sglang;
pub mod speculative;
pub mod timing;
pub mod vllm;

pub use config::{
    Backend, ConfigEnv, Deployment, EngineConfig, FileLoader, KvTransfer, KvTransferTimingMode, PreemptionMode, Role,
    SglangSettings, WorkerArgs,
};
pub use engine::{Engine, EngineCounters, EngineOptions};
pub use handoff::Reserved;
pub use hash::BlockHashes;
pub use output::{
    Admission, Finish, Finished, HostKvEvent, KvEvent, PassOutput, QueueLoad, RejectReason, StoredBlock, Stretch,
    TokenOut,
};
pub use request::{output_token, EngineRequest, OutputPlan, Prompt, ReasoningConfig};
pub use servesim_config::ConfigError;
pub use speculative::{SpecSchedule, SpeculativeConfig};
pub use timing::{
    DecodeShape, ExternalTimer, KvMemory, MemoryLimits, PassTimer, PrefillShape, TimerFactory, TimingJitter,
    TimingModel, MAX_TIMING_JITTER_CV,
};

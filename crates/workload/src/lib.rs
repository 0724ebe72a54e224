//! # servesim-workload
//!
//! What a replay releases, and when: trace formats (Mooncake, Dynamo request traces, agentic
//! Mooncake v2, Applied Compute, Weka corpora), agentic dependency graphs, synthetic load, and
//! the load driver that releases their requests on a virtual clock. Every source lowers to the
//! types of [`session`]; [`Workload`] holds one source and [`LoadDriver`] releases its turns.
//! The simulation (`servesim-replay`) takes a `Workload` and a `LoadMode` and asks the driver
//! for requests; nothing here knows about engines beyond the prompt they are given.

pub mod agentic;
pub mod driver;
pub mod error;
pub mod formats;
pub mod ids;
pub mod input;
pub mod paths;
pub mod rows;
pub mod scratch;
pub mod session;
pub mod synthetic;
pub mod time;
pub mod workload;

pub use driver::{LoadDriver, LoadMode};
pub use error::InputError;
pub use formats::{load_mooncake, load_mooncake_delta, load_trace, TraceFormat, TraceOptions, WekaBasis};
pub use ids::MAX_TIME_MS;
pub use session::{Ready, SessionSpec, TurnMeta, TurnSpec};
pub use synthetic::{Arrivals, SyntheticImages, SyntheticSpec, AISIMULATE_GROUP_SEED, GROUP_SEED};
pub use workload::Workload;

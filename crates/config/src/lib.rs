//! One strict reader over JSON configuration objects, and the one error its users report.
//!
//! Every configuration surface of servesim reads through [`Reader`]: the engine's worker JSON and
//! the router's policy (`servesim-engine`, `servesim-router`), the Planner's keys
//! (`servesim-planner`) and the deployment YAML (`servesim-deploy`). Each keeps its own wording,
//! because each follows a different reference (see [`reader`]), but the mechanics are written once:
//! key paths, the difference between a missing key and `null`, and rejecting unknown keys.

mod error;
mod field;
mod file;
pub mod reader;

pub use error::{ConfigError, Result};
pub use field::Field;
pub use file::{read_config_text, MAX_CONFIG_BYTES};
pub use reader::Reader;

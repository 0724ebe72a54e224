//! One error type: what went wrong, in words that name the file, key or query involved.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A configuration value is missing or invalid.
    Config,
    /// Data files are missing, unreadable or malformed.
    Data,
    /// The model (architecture, quantisation, parallel layout) is not supported.
    Unsupported,
    /// A query has no measured point to anchor on (`fallback_policy: deny`).
    NoAnchor,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PerfError {
    pub kind: ErrorKind,
    pub message: String,
}

impl PerfError {
    pub fn config(m: impl Into<String>) -> Self {
        PerfError { kind: ErrorKind::Config, message: m.into() }
    }
    pub fn data(m: impl Into<String>) -> Self {
        PerfError { kind: ErrorKind::Data, message: m.into() }
    }
    pub fn unsupported(m: impl Into<String>) -> Self {
        PerfError { kind: ErrorKind::Unsupported, message: m.into() }
    }
    pub fn no_anchor(m: impl Into<String>) -> Self {
        PerfError { kind: ErrorKind::NoAnchor, message: m.into() }
    }
    /// The same error with `context: ` in front of its message.
    pub fn context(self, context: impl fmt::Display) -> Self {
        PerfError { kind: self.kind, message: format!("{context}: {}", self.message) }
    }
}

impl fmt::Display for PerfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PerfError {}

pub type Result<T> = std::result::Result<T, PerfError>;

//! [`ConfigError`]: a configuration error naming the key path it is about.

use std::fmt;

/// A configuration error naming the key path (`engine.block_size`) it is about; an empty path
/// means the whole document.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError { path: path.into(), message: message.into() }
    }
}

impl ConfigError {
    /// `path: message` (the message alone for an empty path), without the quotes [`Display`]
    /// puts around the path: the form the Planner's and the deployment's messages use.
    ///
    /// [`Display`]: fmt::Display
    pub fn plain(&self) -> String {
        if self.path.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.path, self.message)
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "`{}`: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

pub type Result<T> = std::result::Result<T, ConfigError>;

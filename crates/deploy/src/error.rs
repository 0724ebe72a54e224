//! [`DeployError`]: a configuration error naming its key path, the one error type of the crate's
//! readers and lowering.

/// A configuration error: the key path it is about (empty: the whole document) and why.
#[derive(Clone, Debug, PartialEq)]
pub struct DeployError {
    pub key: String,
    pub message: String,
}

impl DeployError {
    pub fn new(key: impl Into<String>, message: impl std::fmt::Display) -> DeployError {
        DeployError { key: key.into(), message: message.to_string() }
    }
}

impl std::fmt::Display for DeployError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

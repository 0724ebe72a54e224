//! The deployment YAML is read through `servesim-config`'s [`Reader`] in its deployment wording
//! ([`Reader::mapping`]: "must be …", `null` as absent, lax integers). This module adds what is
//! the deploy crate's own: a reader's errors as [`DeployError`]s.

use servesim_config::{ConfigError, Reader};

use crate::error::DeployError;
pub use servesim_config::reader::join;

impl From<ConfigError> for DeployError {
    fn from(e: ConfigError) -> DeployError {
        DeployError { key: e.path, message: e.message }
    }
}

/// An error about a key of the mapping being read, as a [`DeployError`].
pub trait ErrAt {
    fn err(&self, key: &str, msg: impl std::fmt::Display) -> DeployError;
}

impl ErrAt for Reader<'_> {
    fn err(&self, key: &str, msg: impl std::fmt::Display) -> DeployError {
        self.error(key, msg).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{apply_set, parse_yaml};

    fn read_u64(yaml: &str) -> Result<Option<u64>, String> {
        let v = parse_yaml(yaml).unwrap();
        let mut o = Reader::mapping("stop", &v["stop"]).unwrap();
        o.integer("requests").map_err(|e| DeployError::from(e).to_string())
    }

    /// N20: integers too large, out-of-range numbers written as strings, and integral floats.
    #[test]
    fn integers_get_clear_messages() {
        let too_large = "stop.requests: the number is too large (an integer here is at most 18446744073709551615)";
        assert_eq!(read_u64("stop: {requests: 99999999999999999999}"), Err(too_large.to_string()));
        assert_eq!(read_u64("stop: {requests: 1.0e+30}"), Err(too_large.to_string()));
        assert_eq!(read_u64("stop: {requests: 2.0}"), Ok(Some(2)));
        assert_eq!(read_u64("stop: {requests: 2.5}"), Err("stop.requests: must be an integer, got 2.5".into()));
        assert_eq!(
            read_u64("stop: {requests: -3}"),
            Err("stop.requests: must be a non-negative integer, got -3".into())
        );
        assert_eq!(
            read_u64("stop: {requests: -3.0}"),
            Err("stop.requests: must be a non-negative integer, got -3.0".into())
        );
        let mut v = parse_yaml("stop: {}").unwrap();
        apply_set(&mut v, "stop.requests=1e400").unwrap();
        let mut o = Reader::mapping("stop", &v["stop"]).unwrap();
        assert_eq!(
            o.integer("requests").unwrap_err().plain(),
            "stop.requests: \"1e400\" is too large (an integer here is at most 18446744073709551615)"
        );
        let v = parse_yaml("stop: {rate: 1e400, n: 4294967296}").unwrap();
        let mut o = Reader::mapping("stop", &v["stop"]).unwrap();
        assert_eq!(
            o.number("rate").unwrap_err().plain(),
            "stop.rate: \"1e400\" is out of range: a number must be finite"
        );
        assert_eq!(
            o.positive("n").unwrap_err().plain(),
            "stop.n: 4294967296 is too large (an integer here is at most 4294967295)"
        );
    }

    /// N17: an unknown value and an unknown key are shown cut to 80 characters.
    #[test]
    fn long_values_and_keys_are_cut() {
        let long = "v".repeat(1000);
        let v = parse_yaml(&format!("e: {{backend: {long}, {long}: 1}}")).unwrap();
        let mut o = Reader::mapping("e", &v["e"]).unwrap();
        let cut = format!("{:?}… (1000 bytes)", "v".repeat(80));
        assert_eq!(
            o.one_of("backend", &["vllm", "sglang"]).unwrap_err().plain(),
            format!("e.backend: unknown value {cut}; expected one of vllm, sglang")
        );
        assert_eq!(o.finish().unwrap_err().plain(), format!("e.{cut}: unknown key; expected one of: backend"));
    }
}

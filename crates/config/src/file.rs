//! Reading a configuration file whole, bounded: every file servesim parses as one document (a
//! deployment YAML, engine arguments, a router policy, an AIS timing config, a model's
//! config.json, an FPM table's metadata sidecar) goes through [`read_config_text`].

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Largest configuration file servesim reads whole: 64 MiB, far beyond any real one.
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// Reads a configuration file as text, refusing one larger than [`MAX_CONFIG_BYTES`], so that a
/// device or an endless pipe given where a configuration belongs (`/dev/zero`) stops with an
/// error instead of filling memory. Errors are `std::io::Error`s, as `fs::read_to_string`'s are
/// (the same kinds and messages for a missing file or text that is not UTF-8).
pub fn read_config_text(path: impl AsRef<Path>) -> std::io::Result<String> {
    let mut buf = Vec::new();
    File::open(path)?.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_CONFIG_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "larger than {MAX_CONFIG_BYTES} bytes ({} MiB), which no configuration file is (a device or an \
                 endless pipe?)",
                MAX_CONFIG_BYTES >> 20
            ),
        ));
    }
    String::from_utf8(buf)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "stream did not contain valid UTF-8"))
}

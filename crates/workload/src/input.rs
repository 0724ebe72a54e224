//! Opening trace files: plain, gzip or zstd (recognised by their first bytes, whatever the
//! name), from a regular file or from a pipe.
//!
//! A trace is read more than once (validated first, then replayed; every shard of a split run
//! reads it again), so an input that cannot be read twice — a pipe, `/dev/stdin`, a process
//! substitution — is copied once into a temporary file (compressed as it came) that lives as
//! long as the workload. Text is checked as it starts: a UTF-8 byte-order mark is skipped,
//! UTF-16 is refused with a message saying so.
//!
//! Three bounds keep a hostile or broken input from taking the machine's memory or disk
//! ([`Limits`]; each can be raised with an environment variable):
//! - a line (a Weka `.json` object, a Weka JSONL object) may hold at most
//!   [`DEFAULT_MAX_LINE_BYTES`] (`SERVESIM_MAX_LINE_BYTES`);
//! - a compressed file may decompress to at most [`MAX_INFLATE_RATIO`] times its size, or
//!   [`INFLATE_FLOOR`] if that is more (`SERVESIM_MAX_DECOMPRESSED_BYTES` sets the bound);
//! - the spool of a pipe or device may hold at most [`DEFAULT_MAX_SPOOL_BYTES`]
//!   (`SERVESIM_MAX_SPOOL_BYTES`); an input that starts with NUL bytes (`/dev/zero`) is refused
//!   at once. A spool is deleted when the input is dropped, when spooling fails, and (through
//!   [`crate::scratch`]) when the `servesim` process is stopped by SIGINT or SIGTERM.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::InputError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// Longest trace line by default: 256 MiB (the largest real lines seen are about 100 MB: a
/// prompt's `hash_ids`, a session id).
pub const DEFAULT_MAX_LINE_BYTES: u64 = 256 << 20;
/// Sets the longest trace line, in bytes (`K`, `M`, `G` suffixes are binary multiples).
pub const MAX_LINE_ENV: &str = "SERVESIM_MAX_LINE_BYTES";
/// Largest spool of a piped or device input by default: 16 GiB.
pub const DEFAULT_MAX_SPOOL_BYTES: u64 = 16 << 30;
/// Sets the largest spool of a piped or device input, in bytes.
pub const MAX_SPOOL_ENV: &str = "SERVESIM_MAX_SPOOL_BYTES";
/// A compressed trace may decompress to this many times its size (real JSONL traces compress
/// 5 to 50 times; a decompression bomb, thousands of times)...
pub const MAX_INFLATE_RATIO: u64 = 1000;
/// ...or to this many bytes, if that is more: 1 GiB.
pub const INFLATE_FLOOR: u64 = 1 << 30;
/// Sets how many bytes a compressed trace may decompress to (instead of the ratio).
pub const MAX_DECOMPRESSED_ENV: &str = "SERVESIM_MAX_DECOMPRESSED_BYTES";

/// The bounds of reading one input (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_line_bytes: u64,
    pub max_spool_bytes: u64,
    /// `None`: [`MAX_INFLATE_RATIO`] times the compressed size, at least [`INFLATE_FLOOR`].
    pub max_decompressed_bytes: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            max_spool_bytes: DEFAULT_MAX_SPOOL_BYTES,
            max_decompressed_bytes: None,
        }
    }
}

impl Limits {
    /// The defaults, with what the environment variables set.
    pub fn from_env() -> Result<Limits, InputError> {
        let var = |name: &str| -> Result<Option<u64>, InputError> {
            match std::env::var(name) {
                Ok(v) => parse_bytes(&v).map(Some).ok_or_else(|| {
                    InputError::new(format!(
                        "{name}={v:?}: expected a positive number of bytes (e.g. 536870912 or 512M)"
                    ))
                }),
                Err(_) => Ok(None),
            }
        };
        let d = Limits::default();
        Ok(Limits {
            max_line_bytes: var(MAX_LINE_ENV)?.unwrap_or(d.max_line_bytes),
            max_spool_bytes: var(MAX_SPOOL_ENV)?.unwrap_or(d.max_spool_bytes),
            max_decompressed_bytes: var(MAX_DECOMPRESSED_ENV)?,
        })
    }
}

/// A positive byte count, optionally with a binary `K`, `M`, `G` or `T` suffix.
fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, shift) = match t.as_bytes().last()?.to_ascii_uppercase() {
        b'K' => (&t[..t.len() - 1], 10),
        b'M' => (&t[..t.len() - 1], 20),
        b'G' => (&t[..t.len() - 1], 30),
        b'T' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().ok()?;
    (n > 0).then_some(n)?.checked_mul(1u64 << shift)
}

/// The bounded whole-file read of every configuration surface (`servesim-config`'s).
pub use servesim_config::{read_config_text, MAX_CONFIG_BYTES};

/// A byte count as the user reads it: `268435456 bytes (256 MiB)`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    match UNITS.iter().find(|&&(_, s)| n >= 1u64 << s) {
        Some(&(unit, s)) => {
            let v = n as f64 / (1u64 << s) as f64;
            if v.fract() == 0.0 {
                format!("{n} bytes ({v} {unit})")
            } else {
                format!("{n} bytes ({v:.1} {unit})")
            }
        }
        None => format!("{n} bytes"),
    }
}

/// The spool of a non-seekable input: deleted when the last copy of its input is dropped, and
/// registered for deletion if a signal stops the process first.
#[derive(Debug)]
struct Spool {
    temp: Option<tempfile::TempPath>,
    _registered: crate::scratch::Registered,
}

impl Spool {
    fn new(temp: tempfile::TempPath) -> Spool {
        let registered = crate::scratch::Registered::new(&temp);
        Spool { temp: Some(temp), _registered: registered }
    }

    fn path(&self) -> &Path {
        self.temp.as_deref().expect("a spool has its path until dropped")
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        // Deleted before it is unregistered (the field is dropped after this), so a signal in
        // between finds it registered.
        if let Some(temp) = self.temp.take() {
            let _ = temp.close();
        }
    }
}

/// A trace file ready to be read any number of times.
#[derive(Clone, Debug)]
pub struct TraceInput {
    /// The path the user gave (used in messages).
    path: PathBuf,
    /// What is read: the path itself, or the spool of a non-seekable input.
    source: PathBuf,
    compression: Compression,
    limits: Limits,
    /// Bytes of `source` (compressed, when it is).
    size: u64,
    _spool: Option<Arc<Spool>>,
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

impl TraceInput {
    /// Opens a trace with the [`Limits`] the environment sets.
    pub fn open(path: &Path) -> Result<TraceInput, InputError> {
        TraceInput::open_with(path, Limits::from_env()?)
    }

    pub fn open_with(path: &Path, limits: Limits) -> Result<TraceInput, InputError> {
        let meta = std::fs::metadata(path).map_err(|e| InputError::in_file(path, format!("cannot open: {e}")))?;
        if meta.is_dir() {
            return Err(InputError::in_file(path, "is a directory, not a trace file"));
        }
        let (source, spool) = if meta.is_file() {
            (path.to_path_buf(), None)
        } else {
            // A pipe, FIFO or character device: read it once, into a spool.
            let mut input = File::open(path).map_err(|e| InputError::in_file(path, format!("cannot open: {e}")))?;
            let temp = tempfile::NamedTempFile::new()
                .map_err(|e| InputError::in_file(path, format!("cannot create a temporary copy of the input: {e}")))?;
            let (mut file, temp) = temp.into_parts();
            let spool = Spool::new(temp);
            spool_into(&mut input, &mut file, path, limits.max_spool_bytes)?;
            (spool.path().to_path_buf(), Some(Arc::new(spool)))
        };
        let mut head = [0u8; 4];
        let (n, size) = {
            let mut f = File::open(&source).map_err(|e| InputError::in_file(path, format!("cannot open: {e}")))?;
            let size = f.metadata().map(|m| m.len()).unwrap_or(0);
            (read_up_to(&mut f, &mut head).map_err(|e| InputError::in_file(path, format!("cannot read: {e}")))?, size)
        };
        let compression = if n >= 2 && head[..2] == GZIP_MAGIC {
            Compression::Gzip
        } else if n >= 4 && head == ZSTD_MAGIC {
            Compression::Zstd
        } else {
            Compression::None
        };
        Ok(TraceInput { path: path.to_path_buf(), source, compression, limits, size, _spool: spool })
    }

    /// The longest line (or Weka object) this input may have.
    pub fn max_line_bytes(&self) -> u64 {
        self.limits.max_line_bytes
    }

    /// The error of a line longer than [`TraceInput::max_line_bytes`].
    pub fn line_too_long(&self, line: Option<usize>, what: &str) -> InputError {
        let message = format!(
            "{what} is longer than {}, the limit of a trace line; set {MAX_LINE_ENV} to raise it",
            bytes(self.limits.max_line_bytes)
        );
        match line {
            Some(l) => InputError::at_line(&self.path, l, None, message),
            None => InputError::in_file(&self.path, message),
        }
    }

    /// How many bytes the decompressed text may have.
    fn max_decompressed_bytes(&self) -> u64 {
        self.limits
            .max_decompressed_bytes
            .unwrap_or_else(|| self.size.saturating_mul(MAX_INFLATE_RATIO).max(INFLATE_FLOOR))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// A fresh reader of the (decompressed) text, past a UTF-8 byte-order mark.
    pub fn reader(&self) -> Result<Box<dyn BufRead + Send>, InputError> {
        let file =
            File::open(&self.source).map_err(|e| InputError::in_file(&self.path, format!("cannot open: {e}")))?;
        let inflated = |inner: Box<dyn Read + Send>| -> Box<dyn Read + Send> {
            Box::new(Inflated { inner, read: 0, max: self.max_decompressed_bytes(), compressed: self.size })
        };
        let raw: Box<dyn Read + Send> = match self.compression {
            Compression::None => Box::new(file),
            Compression::Gzip => {
                inflated(Box::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(1 << 16, file))))
            }
            Compression::Zstd => inflated(Box::new(
                zstd::stream::read::Decoder::new(file)
                    .map_err(|e| InputError::in_file(&self.path, format!("cannot read zstd data: {e}")))?,
            )),
        };
        let mut reader = BufReader::with_capacity(1 << 20, raw);
        let head = reader.fill_buf().map_err(|e| InputError::in_file(&self.path, format!("cannot read: {e}")))?;
        if head.starts_with(&[0xEF, 0xBB, 0xBF]) {
            reader.consume(3);
        } else if head.starts_with(&[0xFF, 0xFE]) || head.starts_with(&[0xFE, 0xFF]) || utf16_without_bom(head) {
            return Err(InputError::in_file(
                &self.path,
                "the file is UTF-16 text; traces must be UTF-8 (convert it with `iconv -f UTF-16 -t UTF-8`)",
            ));
        }
        Ok(Box::new(reader))
    }
}

/// Copies a non-seekable input into its spool, refusing more than `max` bytes and an input
/// that starts with NUL bytes (a device such as `/dev/zero`; no trace does).
fn spool_into(input: &mut File, spool: &mut File, path: &Path, max: u64) -> Result<(), InputError> {
    use std::io::Write;
    let mut buf = vec![0u8; 1 << 20];
    let mut total: u64 = 0;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(InputError::in_file(path, format!("cannot read: {e}"))),
        };
        if total == 0 && buf[..n.min(4096)].iter().all(|&b| b == 0) {
            return Err(InputError::in_file(
                path,
                "starts with NUL bytes: binary data (a device such as /dev/zero?), not a trace",
            ));
        }
        total += n as u64;
        if total > max {
            return Err(InputError::in_file(
                path,
                format!(
                    "a piped or device input is copied to a temporary file (in $TMPDIR) before it is read, and \
                     this one passed {}; set {MAX_SPOOL_ENV} to allow more, or give a regular file",
                    bytes(max)
                ),
            ));
        }
        spool
            .write_all(&buf[..n])
            .map_err(|e| InputError::in_file(path, format!("cannot write its temporary copy: {e}")))?;
    }
    spool.flush().map_err(|e| InputError::in_file(path, format!("cannot write its temporary copy: {e}")))
}

/// Decompressed text, stopped with an error past `max` bytes.
struct Inflated {
    inner: Box<dyn Read + Send>,
    read: u64,
    max: u64,
    compressed: u64,
}

impl Read for Inflated {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.max {
            return Err(std::io::Error::other(format!(
                "decompresses to more than {} from {} (a decompression bomb?); set {MAX_DECOMPRESSED_ENV} to \
                 allow more",
                bytes(self.max),
                bytes(self.compressed)
            )));
        }
        Ok(n)
    }
}

/// Reads up to and including the next `\n` into `line` (cleared first), taking at most `max`
/// bytes besides the newline. `Ok(None)` when the line is longer.
pub(crate) fn read_line_capped(
    reader: &mut dyn BufRead,
    line: &mut Vec<u8>,
    max: u64,
) -> std::io::Result<Option<usize>> {
    line.clear();
    loop {
        let available = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(Some(line.len()));
        }
        let (take, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        let content = (line.len() + take - usize::from(done)) as u64;
        if content > max {
            return Ok(None);
        }
        line.extend_from_slice(&available[..take]);
        reader.consume(take);
        if done {
            return Ok(Some(line.len()));
        }
    }
}

/// Consumes ASCII whitespace (what a line's `trim_ascii` drops); returns the newlines passed.
pub(crate) fn skip_blanks(reader: &mut dyn BufRead) -> std::io::Result<usize> {
    let mut newlines = 0;
    loop {
        let available = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // Runs of one blank byte (what padding and bombs are made of) eight at a time.
        let mut blank = 0;
        while let Some(word) = available.get(blank..blank + 8) {
            match u64::from_ne_bytes(word.try_into().expect("8 bytes")) {
                0x2020_2020_2020_2020 => {}
                0x0a0a_0a0a_0a0a_0a0a => newlines += 8,
                _ => break,
            }
            blank += 8;
        }
        let rest = &available[blank..];
        let more = rest.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(rest.len());
        newlines += rest[..more].iter().filter(|&&b| b == b'\n').count();
        let blank = blank + more;
        let done = blank < available.len() || available.is_empty();
        reader.consume(blank);
        if done {
            return Ok(newlines);
        }
    }
}

/// ASCII text in UTF-16 has a NUL byte beside every character.
fn utf16_without_bom(head: &[u8]) -> bool {
    head.len() >= 4
        && ((head[0] != 0 && head[1] == 0 && head[3] == 0) || (head[0] == 0 && head[1] != 0 && head[2] == 0))
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Lines of a trace with their 1-based numbers, read into one reused buffer; blank lines are
/// skipped. Read errors (a corrupt compressed stream) name the line they happened at.
pub struct Lines {
    input: TraceInput,
    reader: Box<dyn BufRead + Send>,
    pub(crate) line: Vec<u8>,
    lineno: usize,
}

impl Lines {
    pub fn open(input: &TraceInput) -> Result<Lines, InputError> {
        Ok(Lines { reader: input.reader()?, input: input.clone(), line: Vec::new(), lineno: 0 })
    }

    pub fn path(&self) -> &Path {
        self.input.path()
    }

    /// The next non-blank line (trimmed) and its number.
    pub fn next_line(&mut self) -> Option<Result<(usize, &[u8]), InputError>> {
        loop {
            // Blank lines (and a line's leading blanks) are skipped a buffer at a time: an input
            // of nothing but newlines passes at the speed it decompresses.
            match skip_blanks(&mut self.reader) {
                Ok(newlines) => self.lineno += newlines,
                Err(e) => {
                    return Some(Err(InputError::at_line(
                        self.input.path(),
                        self.lineno + 1,
                        None,
                        format!("cannot read: {e}"),
                    )))
                }
            }
            self.lineno += 1;
            match read_line_capped(&mut self.reader, &mut self.line, self.input.max_line_bytes()) {
                Ok(Some(0)) => return None,
                Ok(Some(_)) => {}
                Ok(None) => {
                    self.line = Vec::new();
                    return Some(Err(self.input.line_too_long(Some(self.lineno), "the line")));
                }
                Err(e) => {
                    return Some(Err(InputError::at_line(
                        self.input.path(),
                        self.lineno,
                        None,
                        format!("cannot read: {e}"),
                    )))
                }
            }
            if !self.line.trim_ascii().is_empty() {
                return Some(Ok((self.lineno, self.line.trim_ascii())));
            }
        }
    }
}

/// Why a line is not a JSON object, when it is something else a user might have written: a
/// JSON array (a row, or a whole file written as one array).
pub fn not_an_object(text: &[u8], first_line: bool) -> Option<String> {
    match text.first() {
        Some(b'{') => None,
        Some(b'[') => Some(if first_line {
            "expected one JSON object per line, found a JSON array (is the file one JSON array? \
             traces are JSON Lines; convert it with `jq -c '.[]'`)"
                .to_string()
        } else {
            "expected a JSON object, found a JSON array".to_string()
        }),
        _ => Some(format!(
            "expected a JSON object, found {}",
            String::from_utf8_lossy(&text[..text.len().min(40)]).trim()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A scratch directory that goes away with the test.
    fn dir() -> tempfile::TempDir {
        tempfile::Builder::new().prefix("servesim-input-").tempdir().unwrap()
    }

    fn read_all(input: &TraceInput) -> Result<String, InputError> {
        let mut s = String::new();
        input.reader()?.read_to_string(&mut s).unwrap();
        Ok(s)
    }

    #[test]
    fn gzip_zstd_and_bom_are_read_as_text() {
        let tmp = dir();
        let text = "{\"a\": 1}\n";
        let plain = tmp.path().join("plain.jsonl");
        std::fs::write(&plain, format!("\u{feff}{text}")).unwrap();
        assert_eq!(read_all(&TraceInput::open(&plain).unwrap()).unwrap(), text);
        let gz = tmp.path().join("named-without-extension");
        let mut enc = flate2::write::GzEncoder::new(File::create(&gz).unwrap(), flate2::Compression::fast());
        enc.write_all(text.as_bytes()).unwrap();
        enc.finish().unwrap();
        let input = TraceInput::open(&gz).unwrap();
        assert_eq!(input.compression(), Compression::Gzip);
        assert_eq!(read_all(&input).unwrap(), text);
        let zst = tmp.path().join("t.jsonl.zst");
        std::fs::write(&zst, zstd::encode_all(text.as_bytes(), 3).unwrap()).unwrap();
        assert_eq!(read_all(&TraceInput::open(&zst).unwrap()).unwrap(), text);
    }

    fn lines_of(input: &TraceInput) -> Vec<Result<(usize, String), String>> {
        let mut lines = Lines::open(input).unwrap();
        let mut out = Vec::new();
        while let Some(l) = lines.next_line() {
            let stop = l.is_err();
            out.push(l.map(|(n, t)| (n, String::from_utf8_lossy(t).into_owned())).map_err(|e| e.to_string()));
            if stop {
                break;
            }
        }
        out
    }

    #[test]
    fn a_line_longer_than_the_limit_is_refused_naming_file_and_line() {
        let tmp = dir();
        let p = tmp.path().join("long-line.jsonl");
        std::fs::write(&p, format!("{{\"a\": 1}}\n\n{{\"hash_ids\": [{}]}}\n", "1,".repeat(40))).unwrap();
        let limits = Limits { max_line_bytes: 64, ..Limits::default() };
        let got = lines_of(&TraceInput::open_with(&p, limits).unwrap());
        assert_eq!(got[0], Ok((1, "{\"a\": 1}".to_string())));
        assert_eq!(
            got[1],
            Err(format!(
                "{}:3: the line is longer than 64 bytes, the limit of a trace line; set SERVESIM_MAX_LINE_BYTES to \
                 raise it",
                p.display()
            ))
        );
        // A line of exactly the limit is read (its newline is not counted).
        let exact = format!("{{\"k\": \"{}\"}}", "x".repeat(64 - 9));
        assert_eq!(exact.len(), 64);
        std::fs::write(&p, format!("{exact}\n")).unwrap();
        assert_eq!(lines_of(&TraceInput::open_with(&p, limits).unwrap()), vec![Ok((1, exact))]);
    }

    #[test]
    fn blank_runs_are_skipped_with_their_line_numbers() {
        let tmp = dir();
        let p = tmp.path().join("blanks.jsonl");
        let text =
            format!("\n{}\n  \t\r\n{}{{\"a\": 1}}\n{}\n{{\"b\": 2}}", " ".repeat(100), "\n".repeat(20), "\n".repeat(9));
        std::fs::write(&p, text).unwrap();
        let got = lines_of(&TraceInput::open(&p).unwrap());
        assert_eq!(got, vec![Ok((24, "{\"a\": 1}".to_string())), Ok((35, "{\"b\": 2}".to_string()))]);
    }

    #[test]
    fn a_decompression_bomb_stops_at_the_limit() {
        let tmp = dir();
        let p = tmp.path().join("bomb.jsonl.zst");
        let bomb = zstd::encode_all(&vec![b' '; 8 << 20][..], 3).unwrap();
        std::fs::write(&p, &bomb).unwrap();
        let limits = Limits { max_decompressed_bytes: Some(1 << 20), ..Limits::default() };
        let got = lines_of(&TraceInput::open_with(&p, limits).unwrap());
        assert_eq!(
            got,
            vec![Err(format!(
                "{}:1: cannot read: decompresses to more than 1048576 bytes (1 MiB) from {} (a decompression \
                 bomb?); set SERVESIM_MAX_DECOMPRESSED_BYTES to allow more",
                p.display(),
                bytes(bomb.len() as u64)
            ))]
        );
        // By default a small file may decompress to 1 GiB, a large one to 1000 times its size.
        let input = TraceInput::open(&p).unwrap();
        assert_eq!(input.max_decompressed_bytes(), 1 << 30);
        let big = TraceInput { size: 10 << 20, ..input };
        assert_eq!(big.max_decompressed_bytes(), 10_000 << 20);
    }

    #[test]
    fn byte_counts_read_with_suffixes() {
        assert_eq!(parse_bytes("512M"), Some(512 << 20));
        assert_eq!(parse_bytes(" 2g "), Some(2 << 30));
        assert_eq!(parse_bytes("1048576"), Some(1 << 20));
        assert_eq!(parse_bytes("0"), None);
        assert_eq!(parse_bytes("-1"), None);
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(bytes(268435456), "268435456 bytes (256 MiB)");
        assert_eq!(bytes(1536), "1536 bytes (1.5 KiB)");
    }

    #[test]
    fn utf16_is_refused_by_name() {
        let tmp = dir();
        let p = tmp.path().join("utf16.jsonl");
        let bytes: Vec<u8> = "{\"a\": 1}\n".encode_utf16().flat_map(|u| u.to_le_bytes()).collect();
        std::fs::write(&p, &bytes).unwrap();
        let e = TraceInput::open(&p).unwrap().reader().err().unwrap().to_string();
        assert!(e.contains("UTF-16"), "{e}");
    }
}

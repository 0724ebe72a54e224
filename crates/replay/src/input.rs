//! Opening trace files: plain, gzip or zstd (recognised by their first bytes, whatever the
//! name), from a regular file or from a pipe.
//!
//! A trace is read more than once (validated first, then replayed; every shard of a split run
//! reads it again), so an input that cannot be read twice — a pipe, `/dev/stdin`, a process
//! substitution — is copied once into a temporary file (compressed as it came) that lives as
//! long as the workload. Text is checked as it starts: a UTF-8 byte-order mark is skipped,
//! UTF-16 is refused with a message saying so.

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

/// A trace file ready to be read any number of times.
#[derive(Clone, Debug)]
pub struct TraceInput {
    /// The path the user gave (used in messages).
    path: PathBuf,
    /// What is read: the path itself, or the spool of a non-seekable input.
    source: PathBuf,
    compression: Compression,
    _spool: Option<Arc<tempfile::TempPath>>,
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

impl TraceInput {
    pub fn open(path: &Path) -> Result<TraceInput, InputError> {
        let meta = std::fs::metadata(path).map_err(|e| InputError::in_file(path, format!("cannot open: {e}")))?;
        if meta.is_dir() {
            return Err(InputError::in_file(path, "is a directory, not a trace file"));
        }
        let (source, spool) = if meta.is_file() {
            (path.to_path_buf(), None)
        } else {
            // A pipe, FIFO or character device: read it once, into a spool.
            let mut input = File::open(path).map_err(|e| InputError::in_file(path, format!("cannot open: {e}")))?;
            let mut spool = tempfile::NamedTempFile::new()
                .map_err(|e| InputError::in_file(path, format!("cannot create a temporary copy of the input: {e}")))?;
            std::io::copy(&mut input, spool.as_file_mut())
                .map_err(|e| InputError::in_file(path, format!("cannot read: {e}")))?;
            let temp = spool.into_temp_path();
            (temp.to_path_buf(), Some(Arc::new(temp)))
        };
        let mut head = [0u8; 4];
        let n = {
            let mut f = File::open(&source).map_err(|e| InputError::in_file(path, format!("cannot open: {e}")))?;
            read_up_to(&mut f, &mut head).map_err(|e| InputError::in_file(path, format!("cannot read: {e}")))?
        };
        let compression = if n >= 2 && head[..2] == GZIP_MAGIC {
            Compression::Gzip
        } else if n >= 4 && head == ZSTD_MAGIC {
            Compression::Zstd
        } else {
            Compression::None
        };
        Ok(TraceInput { path: path.to_path_buf(), source, compression, _spool: spool })
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
        let raw: Box<dyn Read + Send> = match self.compression {
            Compression::None => Box::new(file),
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(1 << 16, file))),
            Compression::Zstd => Box::new(
                zstd::stream::read::Decoder::new(file)
                    .map_err(|e| InputError::in_file(&self.path, format!("cannot read zstd data: {e}")))?,
            ),
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
            self.line.clear();
            self.lineno += 1;
            match self.reader.read_until(b'\n', &mut self.line) {
                Ok(0) => return None,
                Ok(_) => {}
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

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("servesim-input-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn read_all(input: &TraceInput) -> Result<String, InputError> {
        let mut s = String::new();
        input.reader()?.read_to_string(&mut s).unwrap();
        Ok(s)
    }

    #[test]
    fn gzip_zstd_and_bom_are_read_as_text() {
        let text = "{\"a\": 1}\n";
        let plain = dir().join("plain.jsonl");
        std::fs::write(&plain, format!("\u{feff}{text}")).unwrap();
        assert_eq!(read_all(&TraceInput::open(&plain).unwrap()).unwrap(), text);
        let gz = dir().join("named-without-extension");
        let mut enc = flate2::write::GzEncoder::new(File::create(&gz).unwrap(), flate2::Compression::fast());
        enc.write_all(text.as_bytes()).unwrap();
        enc.finish().unwrap();
        let input = TraceInput::open(&gz).unwrap();
        assert_eq!(input.compression(), Compression::Gzip);
        assert_eq!(read_all(&input).unwrap(), text);
        let zst = dir().join("t.jsonl.zst");
        std::fs::write(&zst, zstd::encode_all(text.as_bytes(), 3).unwrap()).unwrap();
        assert_eq!(read_all(&TraceInput::open(&zst).unwrap()).unwrap(), text);
    }

    #[test]
    fn utf16_is_refused_by_name() {
        let p = dir().join("utf16.jsonl");
        let bytes: Vec<u8> = "{\"a\": 1}\n".encode_utf16().flat_map(|u| u.to_le_bytes()).collect();
        std::fs::write(&p, &bytes).unwrap();
        let e = TraceInput::open(&p).unwrap().reader().err().unwrap().to_string();
        assert!(e.contains("UTF-16"), "{e}");
    }
}

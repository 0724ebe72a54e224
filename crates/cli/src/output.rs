//! Report files: refused when they name an input or each other, written to a temporary file
//! beside the destination and renamed over it only when the run succeeds, so a failed or
//! interrupted run leaves the previous report (or nothing) in place, never half of one.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::failure::Failure;

/// Whether two paths name the same file or directory (existing or not).
pub fn same_place(a: &Path, b: &Path) -> bool {
    servesim_workload::paths::same_file(a, b)
}

/// Refuses report paths that are one of `inputs` (trace files, configuration files, shard
/// files) or lie inside an input directory (a corpus the next run would read), or that name the
/// same file as each other. Runs before anything is opened for writing.
pub fn check_report_paths<P: AsRef<Path>>(reports: &[(&str, &Path)], inputs: &[P]) -> Result<(), Failure> {
    for (i, (flag, path)) in reports.iter().enumerate() {
        if let Some(input) = inputs.iter().map(AsRef::as_ref).find(|input| same_place(path, input)) {
            return Err(Failure::input(format!(
                "--{flag} {} is the input {}; refusing to overwrite an input with a report",
                path.display(),
                input.display()
            )));
        }
        if let Some(dir) =
            inputs.iter().map(AsRef::as_ref).find(|input| servesim_workload::paths::inside_dir(path, input))
        {
            return Err(Failure::input(format!(
                "--{flag} {} is inside the input directory {}; refusing to write a report among a run's inputs",
                path.display(),
                dir.display()
            )));
        }
        if let Some((other, _)) = reports[..i].iter().find(|(_, p)| same_place(p, path)) {
            return Err(Failure::input(format!(
                "--{other} and --{flag} name the same file ({}); give each report its own path",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Report files are written in 256 KiB writes: a long run's telemetry file is tens of MB, which
/// 8 KiB writes (BufWriter's default) make thousands of system calls.
fn buffered(file: File) -> BufWriter<File> {
    BufWriter::with_capacity(256 << 10, file)
}

/// A report being written. Until [`ReportFile::commit`] its bytes are in a temporary file in the
/// destination's directory, which is deleted if the report is dropped instead.
pub struct ReportFile {
    shown: PathBuf,
    target: PathBuf,
    out: BufWriter<File>,
    temp: Option<tempfile::TempPath>,
    /// The temporary file, registered for removal if a signal ends the process (a signal
    /// skips `TempPath`'s own clean-up).
    _scratch: Option<servesim_workload::scratch::Registered>,
}

impl ReportFile {
    pub fn create(path: &Path) -> Result<ReportFile, Failure> {
        let cannot = |e: std::io::Error| Failure::input(format!("{}: cannot create: {e}", path.display()));
        // Write through a symlink to its target, as opening it would.
        let target = match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
            _ => path.to_path_buf(),
        };
        let existing = std::fs::metadata(&target).ok();
        // Devices and pipes (/dev/stdout, a FIFO) cannot be replaced by a rename: write to them.
        if existing.as_ref().is_some_and(|m| !m.is_file()) {
            let file = std::fs::OpenOptions::new().write(true).open(&target).map_err(cannot)?;
            return Ok(ReportFile {
                shown: path.to_path_buf(),
                target,
                out: buffered(file),
                temp: None,
                _scratch: None,
            });
        }
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let temp =
            tempfile::Builder::new().prefix(&format!(".{name}.")).suffix(".tmp").tempfile_in(dir).map_err(cannot)?;
        // A temporary file is private (0600); the report gets the permissions the file it
        // replaces had, or the usual 0644.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = existing.map_or(0o644, |m| m.permissions().mode() & 0o7777);
            temp.as_file().set_permissions(std::fs::Permissions::from_mode(mode)).map_err(cannot)?;
        }
        let (file, temp) = temp.into_parts();
        let scratch = Some(servesim_workload::scratch::Registered::new(&temp));
        Ok(ReportFile { shown: path.to_path_buf(), target, out: buffered(file), temp: Some(temp), _scratch: scratch })
    }

    pub fn writer(&mut self) -> &mut BufWriter<File> {
        &mut self.out
    }

    /// The path as the user gave it.
    pub fn path(&self) -> &Path {
        &self.shown
    }

    /// Flushes the report and moves it into place.
    pub fn commit(mut self) -> Result<(), String> {
        let failed = |e: std::io::Error| format!("{}: write failed: {e}", self.shown.display());
        self.out.flush().map_err(failed)?;
        if let Some(temp) = self.temp.take() {
            temp.persist(&self.target).map_err(|e| failed(e.error))?;
        }
        Ok(())
    }
}

/// `s` cut to about `max` characters for a message, saying how long it was.
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let head: String = s.chars().take(max).collect();
    format!("{head}… ({} characters)", s.chars().count())
}

/// Prints to stdout. A reader that went away (`servesim predict ... | head`) is not an error:
/// the rest of the output is dropped and the reports are still written.
pub fn print_out(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Failure::run(format!("stdout: {e}"))),
        _ => Ok(()),
    }
}

/// Writes a whole output file.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    std::fs::write(path, bytes).map_err(|e| Failure::run(format!("{}: write failed: {e}", path.display())))
}

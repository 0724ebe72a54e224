//! The output directory of `predict -c`, `recommend -c` and `recommend merge`, prepared as the
//! reference prepares its own: servesim owns the file names it writes there
//! ([`OWNED`]) and nothing else. `--overwrite` replaces those names and leaves every other file,
//! the run's inputs and the user's notes alike, where it is.
//!
//! A run writes its files into a hidden staging directory inside the output directory and
//! moves them into place when it has finished, so an error leaves the previous results (or
//! nothing) rather than half of new ones. The staging directory is registered for removal on
//! SIGINT/SIGTERM; one left by a killed process is removed by the next run into the directory.
//!
//! Also here: [`Staged`], a directory that is servesim's alone (the candidate pages beside a
//! recommend page), and what a `-c` run reads ([`run_inputs`]), which no output may overwrite
//! ([`check_reports`]).

use std::fs;
use std::path::{Path, PathBuf};

use crate::failure::Failure;

/// The names servesim writes into an output directory: its files, the numbered YAMLs of
/// `recommendations/` and the trial cache's entries in `cache/`. The directories are emptied
/// of servesim's entries only, and removed only when nothing else is left in them.
pub const OWNED: &[&str] = &["prediction.json", "requests.jsonl", "recommendation.json", "recommendation.csv"];
const OWNED_DIRS: &[&str] = &["recommendations", "cache"];
const STAGE_PREFIX: &str = ".servesim-partial-";

/// Whether `name`, inside `recommendations/`, is one of our numbered configurations.
fn is_recommendation(name: &str) -> bool {
    name.strip_suffix(".yaml").is_some_and(|n| n.len() >= 4 && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `name`, inside `cache/`, is one of the trial cache's shard directories (two hex
/// digits) and, inside those, an entry (64 hex digits `.json`) or an entry being written.
fn is_cache_dir(name: &str) -> bool {
    name.len() == 2 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

pub fn is_cache_entry(name: &str) -> bool {
    let hex = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    name.strip_suffix(".json").is_some_and(hex)
        || name.strip_prefix('.').and_then(|n| n.strip_suffix(".partial")).is_some_and(|n| {
            n.split_once('.').is_some_and(|(key, pid)| hex(key) && pid.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// The process a staging directory name belongs to, if the name is one of ours.
fn stage_pid(name: &str) -> Option<u32> {
    name.strip_prefix(STAGE_PREFIX)?.parse().ok()
}

fn alive(pid: u32) -> bool {
    pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() || !Path::new("/proc/self").exists()
}

/// Removes servesim's own entries of `dir/sub` (see [`OWNED_DIRS`]) and the directory if that
/// leaves it empty. Anything else in it stays.
fn remove_owned_dir(dir: &Path, sub: &str) -> std::io::Result<()> {
    let d = dir.join(sub);
    match fs::symlink_metadata(&d) {
        Ok(m) if m.is_dir() => {}
        _ => return Ok(()),
    }
    for e in fs::read_dir(&d)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let ty = e.file_type()?;
        match sub {
            "recommendations" if ty.is_file() && is_recommendation(&name) => fs::remove_file(e.path())?,
            "cache" if ty.is_dir() && is_cache_dir(&name) => {
                for f in fs::read_dir(e.path())? {
                    let f = f?;
                    if f.file_type()?.is_file() && is_cache_entry(&f.file_name().to_string_lossy()) {
                        fs::remove_file(f.path())?;
                    }
                }
                let _ = fs::remove_dir(e.path());
            }
            _ => {}
        }
    }
    let _ = fs::remove_dir(&d);
    Ok(())
}

/// An output directory being written.
pub struct OutputDir {
    target: PathBuf,
    stage: PathBuf,
    /// Whether this run created `target` (a failed run then leaves no empty directory behind).
    created: bool,
    done: bool,
}

impl OutputDir {
    /// Checks `target` and creates it (and a staging directory in it). Refused: a path that is
    /// a file or a symbolic link, a directory holding one of `inputs`, and, without
    /// `overwrite`, a directory with anything in it but the trial cache an interrupted run left.
    pub fn open(target: &Path, overwrite: bool, inputs: &[PathBuf]) -> Result<OutputDir, Failure> {
        let shown = target.display();
        let mut created = false;
        match fs::symlink_metadata(target) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(Failure::input(format!(
                    "{shown}: the output directory is a symbolic link; name the directory it points to"
                )))
            }
            Ok(m) if !m.is_dir() => {
                return Err(Failure::input(format!("{shown}: exists and is not a directory")));
            }
            Ok(_) => {
                if let Some(input) =
                    inputs.iter().find(|i| i.exists() && servesim_workload::paths::inside_dir(i, target))
                {
                    return Err(Failure::input(format!(
                        "{shown}: the output directory holds {}, an input of this run; choose another --output-dir",
                        input.display()
                    )));
                }
                let mut others = Vec::new();
                for e in fs::read_dir(target).map_err(|e| Failure::input(format!("{shown}: cannot read: {e}")))? {
                    let e = e.map_err(|e| Failure::input(format!("{shown}: cannot read: {e}")))?;
                    let name = e.file_name().to_string_lossy().into_owned();
                    if let Some(pid) = stage_pid(&name) {
                        if !alive(pid) {
                            // Left by a killed run: ours to remove.
                            let _ = fs::remove_dir_all(e.path());
                        }
                        continue;
                    }
                    if name != "cache" {
                        others.push(name);
                    }
                }
                if !overwrite && !others.is_empty() {
                    others.sort();
                    return Err(Failure::input(format!(
                        "{shown}: output directory is not empty (it holds {}); pass --overwrite to replace servesim's \
                         outputs in it (other files are kept)",
                        crate::output::clip(&others.join(", "), 120)
                    )));
                }
            }
            Err(_) => {
                fs::create_dir_all(target).map_err(|e| Failure::input(format!("{shown}: cannot create: {e}")))?;
                created = true;
            }
        }
        let stage = target.join(format!("{STAGE_PREFIX}{}", std::process::id()));
        let _ = fs::remove_dir_all(&stage);
        fs::create_dir(&stage).map_err(|e| Failure::input(format!("{}: cannot create: {e}", stage.display())))?;
        servesim_workload::scratch::register(&stage);
        Ok(OutputDir { target: target.to_path_buf(), stage, created, done: false })
    }

    /// Where a staged output is written (it moves to the same name in the output directory).
    pub fn path(&self, file: &str) -> PathBuf {
        self.stage.join(file)
    }

    /// The output directory itself.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Replaces servesim's previous outputs in the directory by the staged ones. Other files,
    /// and the trial cache (which the cache itself keeps), are untouched.
    pub fn commit(mut self) -> Result<(), Failure> {
        let fail = |e: std::io::Error| Failure::run(format!("{}: cannot move into place: {e}", self.target.display()));
        for name in OWNED {
            match fs::symlink_metadata(self.target.join(name)) {
                Ok(m) if m.is_file() || m.file_type().is_symlink() => {
                    fs::remove_file(self.target.join(name)).map_err(fail)?
                }
                _ => {}
            }
        }
        remove_owned_dir(&self.target, "recommendations").map_err(fail)?;
        for e in fs::read_dir(&self.stage).map_err(fail)? {
            let e = e.map_err(fail)?;
            // Directories merge into what is there (a user's file in recommendations/ stays).
            move_merging(&e.path(), &self.target.join(e.file_name())).map_err(fail)?;
        }
        let _ = fs::remove_dir_all(&self.stage);
        servesim_workload::scratch::unregister(&self.stage);
        self.done = true;
        Ok(())
    }
}

/// Moves `src` to `dst`, merging into directories that exist already (files replaced).
fn move_merging(src: &Path, dst: &Path) -> std::io::Result<()> {
    if src.is_dir() && dst.is_dir() {
        for e in fs::read_dir(src)? {
            let e = e?;
            move_merging(&e.path(), &dst.join(e.file_name()))?;
        }
        fs::remove_dir(src)
    } else {
        fs::rename(src, dst)
    }
}

impl Drop for OutputDir {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_dir_all(&self.stage);
            servesim_workload::scratch::unregister(&self.stage);
            if self.created {
                // Only if nothing else was put there meanwhile.
                let _ = fs::remove_dir(&self.target);
            }
        }
    }
}

/// Removes the trial cache's entries in `dir` that are not in `keep` (by key), and the
/// cache's shard directories that leaves empty: the output directory's cache then holds the
/// candidates of the run it sits beside.
pub fn prune_cache(dir: &Path, keep: &std::collections::HashSet<String>) {
    let Ok(shards) = fs::read_dir(dir) else { return };
    for s in shards.flatten() {
        let name = s.file_name().to_string_lossy().into_owned();
        if !is_cache_dir(&name) || !s.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        for f in fs::read_dir(s.path()).into_iter().flatten().flatten() {
            let fname = f.file_name().to_string_lossy().into_owned();
            let key = fname.strip_suffix(".json").unwrap_or("");
            if is_cache_entry(&fname) && !keep.contains(key) && f.file_type().is_ok_and(|t| t.is_file()) {
                let _ = fs::remove_file(f.path());
            }
        }
        let _ = fs::remove_dir(s.path());
    }
}

/// Refuses report paths that would land on one of servesim's outputs in `out_dir` (a report
/// written there would be replaced by the run's own file, or replace it).
pub fn check_reports_clear_of_outputs(reports: &[(&str, &Path)], out_dir: &Path) -> Result<(), Failure> {
    for (flag, path) in reports {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let in_out = crate::output::same_place(parent, out_dir);
        let in_owned_dir = parent.file_name().and_then(|n| n.to_str()).is_some_and(|n| OWNED_DIRS.contains(&n))
            && parent.parent().is_some_and(|pp| {
                crate::output::same_place(if pp.as_os_str().is_empty() { Path::new(".") } else { pp }, out_dir)
            });
        if (in_out && (OWNED.contains(&name) || OWNED_DIRS.contains(&name) || name.starts_with(STAGE_PREFIX)))
            || in_owned_dir
        {
            return Err(Failure::input(format!(
                "--{flag} {}: servesim writes its own outputs there; name the report differently",
                path.display()
            )));
        }
    }
    Ok(())
}

/// A directory of servesim's alone (the candidate pages beside a recommend page), written under
/// a temporary name and renamed into place when complete, so an error never leaves a directory
/// that looks like a finished run. Output directories, which may hold the user's files too, are
/// [`OutputDir`]s.
pub struct Staged {
    tmp: PathBuf,
    target: PathBuf,
    done: bool,
}

impl Staged {
    pub fn new(target: &Path, overwrite: bool) -> Result<Staged, Failure> {
        if target.exists() && !overwrite {
            return Err(Failure::input(format!(
                "{}: output directory exists; pass --overwrite to replace it",
                target.display()
            )));
        }
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "output".into());
        let parent = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(|e| Failure::input(format!("{}: cannot create: {e}", parent.display())))?;
        let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir(&tmp).map_err(|e| Failure::input(format!("{}: cannot create: {e}", tmp.display())))?;
        servesim_workload::scratch::register(&tmp);
        Ok(Staged { tmp, target: target.to_path_buf(), done: false })
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.tmp.join(file)
    }

    /// Moves the finished directory into place (replacing an old one).
    pub fn commit(mut self) -> Result<(), Failure> {
        let fail = |e: std::io::Error| Failure::run(format!("{}: cannot move into place: {e}", self.target.display()));
        if self.target.exists() {
            let old = self.tmp.with_extension("old");
            fs::rename(&self.target, &old).map_err(fail)?;
            fs::rename(&self.tmp, &self.target).map_err(fail)?;
            let _ = fs::remove_dir_all(&old);
        } else {
            fs::rename(&self.tmp, &self.target).map_err(fail)?;
        }
        servesim_workload::scratch::unregister(&self.tmp);
        self.done = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_dir_all(&self.tmp);
            servesim_workload::scratch::unregister(&self.tmp);
        }
    }
}

/// Everything a `-c` run reads: the configuration file and the paths its tree names.
pub fn run_inputs(config: &Path, tree: &serde_json::Value) -> Vec<PathBuf> {
    let mut inputs = vec![config.to_path_buf()];
    inputs.extend(servesim_deploy::input_paths(tree, &servesim_deploy::config_base(config)));
    inputs
}

/// Refuses reports that would overwrite an input or land on one of servesim's outputs.
pub fn check_reports(reports: &[(&str, &Path)], inputs: &[PathBuf], output_dir: &Path) -> Result<(), Failure> {
    crate::output::check_report_paths(reports, inputs)?;
    crate::outdir::check_reports_clear_of_outputs(reports, output_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_names_are_recognised_and_nothing_else() {
        assert!(is_recommendation("0001.yaml") && is_recommendation("12345.yaml"));
        assert!(!is_recommendation("notes.yaml") && !is_recommendation("01.yaml"));
        let key = "ab".repeat(32);
        assert!(is_cache_entry(&format!("{key}.json")));
        assert!(is_cache_entry(&format!(".{key}.1234.partial")));
        assert!(!is_cache_entry("ab.json") && !is_cache_entry(&format!("{key}.yaml")));
        assert_eq!(stage_pid(".servesim-partial-42"), Some(42));
        assert_eq!(stage_pid(".servesim-partial-x"), None);
    }
}

//! Temporary paths a killed process must not leave behind.
//!
//! Spools of piped traces and half-written report files are deleted by their owners' `Drop`,
//! which a signal skips: the process ends where it is. Their owners register them here while
//! they exist; a signal handler (the `servesim` binary installs one for SIGINT and SIGTERM)
//! calls [`remove_all`] before the process exits.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Registered paths, with how many times each was registered.
static PATHS: Mutex<Vec<(PathBuf, usize)>> = Mutex::new(Vec::new());

fn paths() -> std::sync::MutexGuard<'static, Vec<(PathBuf, usize)>> {
    // A panic elsewhere while the lock was held leaves a list that is still valid.
    PATHS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers a temporary file or directory to delete if the process is stopped by a signal.
/// Registering a path twice needs two [`unregister`] calls.
pub fn register(path: &Path) {
    let mut paths = paths();
    match paths.iter_mut().find(|(p, _)| p == path) {
        Some((_, n)) => *n += 1,
        None => paths.push((path.to_path_buf(), 1)),
    }
}

/// Forgets a path (it was deleted, or moved into place as a finished file).
pub fn unregister(path: &Path) {
    let mut paths = paths();
    if let Some(i) = paths.iter().position(|(p, _)| p == path) {
        paths[i].1 -= 1;
        if paths[i].1 == 0 {
            paths.swap_remove(i);
        }
    }
}

/// The registered paths.
pub fn registered() -> Vec<PathBuf> {
    paths().iter().map(|(p, _)| p.clone()).collect()
}

/// Deletes every registered path (files, and directories with their contents) and forgets
/// them. For a signal handler: the process exits after it.
pub fn remove_all() {
    let taken = std::mem::take(&mut *paths());
    for (path, _) in taken {
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {
                let _ = std::fs::remove_dir_all(&path);
            }
            Ok(_) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(_) => {}
        }
    }
}

/// A registered path, unregistered when dropped (the owner deletes or keeps the file itself).
#[derive(Debug)]
pub struct Registered(PathBuf);

impl Registered {
    pub fn new(path: &Path) -> Registered {
        register(path);
        Registered(path.to_path_buf())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        unregister(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // `remove_all` is tested in tests/scratch.rs, alone in its process: here it would take
    // the paths other tests register.
    #[test]
    fn a_guard_unregisters_when_dropped_and_counts_repeats() {
        let p = PathBuf::from("/nonexistent/servesim-scratch-guard");
        let guard = Registered::new(&p);
        register(&p);
        assert!(registered().contains(&p));
        drop(guard);
        assert!(registered().contains(&p), "registered twice, unregistered once");
        unregister(&p);
        assert!(!registered().contains(&p));
    }
}

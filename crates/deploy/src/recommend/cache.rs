//! The content-addressed trial cache: entries keyed by a hash of the candidate's tree and the
//! contents of everything it reads ([`inputs_digest`]).

use std::path::Path;
use std::sync::Mutex;

use serde_json::{json, Value};

use super::record::{canonical, digest_holds, trial_fields, trial_json, with_digest, Trial};
use super::space::{get, Search};

/// The content-addressed trial cache: a trial's result is stored under a hash of what decides it
/// (the candidate's concrete tree, the contents of the trace files it reads, the performance
/// data, servesim's version), so a re-run, or a search that overlaps an earlier one, replays
/// only what is new. Entries are JSON files `<dir>/<2 hex>/<64 hex>.json`, floats kept as their
/// exact bits, each carrying a digest of its values: an entry edited or damaged since it was
/// written, or one whose GPU count does not match its candidate, is replayed again.
pub struct Cache {
    /// Directories looked in, in order.
    lookup: Vec<std::path::PathBuf>,
    /// Where entries are written (a hit found elsewhere is copied here too).
    write: std::path::PathBuf,
    inputs: String,
    /// The keys this run read or wrote.
    used: Mutex<std::collections::HashSet<String>>,
}

impl Cache {
    /// A cache over `lookup` writing into `write`, for the inputs of `search` (trace paths
    /// relative to `base_dir`). Fails, saying why, when an input cannot be digested (a pipe or
    /// a device, whose contents a digest would consume or never finish reading).
    pub fn new(
        search: &Search,
        base_dir: &Path,
        lookup: Vec<std::path::PathBuf>,
        write: std::path::PathBuf,
    ) -> Result<Cache, String> {
        Ok(Cache { lookup, write, inputs: inputs_digest(&search.base, base_dir)?, used: Default::default() })
    }

    /// The digest of everything outside the candidate's tree that decides its result.
    pub fn inputs(&self) -> &str {
        &self.inputs
    }

    /// The keys of the entries this run read or wrote.
    pub fn used_keys(&self) -> std::collections::HashSet<String> {
        self.used.lock().expect("used keys").clone()
    }

    pub(super) fn key(&self, tree: &Value) -> String {
        let doc = json!({
            "servesim": env!("CARGO_PKG_VERSION"),
            "candidate": crate::sorted(tree),
            "inputs": self.inputs,
        });
        blake3::hash(canonical(&doc).as_bytes()).to_hex().to_string()
    }

    fn file(dir: &Path, key: &str) -> std::path::PathBuf {
        dir.join(&key[..2]).join(format!("{key}.json"))
    }

    pub(super) fn get(&self, key: &str, tree: &Value) -> Option<Trial> {
        for dir in &self.lookup {
            let path = Cache::file(dir, key);
            let Ok(bytes) = std::fs::read(&path) else { continue };
            let Ok(v) = serde_json::from_slice::<Value>(&bytes) else { continue };
            if v.get("key").and_then(Value::as_str) != Some(key) || !digest_holds(&v) {
                continue;
            }
            let Some(t) = trial_fields(&v, tree.clone()) else { continue };
            if *dir != self.write {
                self.store(key, &bytes);
            }
            self.used.lock().expect("used keys").insert(key.to_string());
            return Some(t);
        }
        None
    }

    /// Keeps a trial that replayed (merged shards keep theirs, as one run would).
    pub fn record(&self, t: &Trial) {
        if !t.summary.is_empty() {
            self.put(&self.key(&t.tree), t);
        }
    }

    pub(super) fn put(&self, key: &str, t: &Trial) {
        let mut v = trial_json(0, t);
        let o = v.as_object_mut().expect("an object");
        o.remove("index");
        o.remove("digest");
        o.insert("key".into(), json!(key));
        let v = with_digest(v);
        self.store(key, &serde_json::to_vec(&v).expect("serialises"));
        self.used.lock().expect("used keys").insert(key.to_string());
    }

    /// Writes an entry under a temporary name and renames it into place; a cache that cannot
    /// be written only costs the re-use.
    fn store(&self, key: &str, bytes: &[u8]) {
        let path = Cache::file(&self.write, key);
        let Some(dir) = path.parent() else { return };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let tmp = dir.join(format!(".{key}.{}.partial", std::process::id()));
        if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// How deep a digest walks into a trace directory.
const MAX_INPUT_DEPTH: usize = 64;

/// The digest of everything a configuration reads: its trace paths (relative to `base_dir`; a
/// directory by every file under it) and the performance data its timing reads from. The
/// cache key's inputs beside the tree itself, and what shards of one search must agree on.
/// Symbolic links inside a directory are digested by their target's name (never followed: a
/// link to an ancestor would make the walk endless), and a pipe or device makes it fail.
pub fn inputs_digest(base: &Value, base_dir: &Path) -> Result<String, String> {
    let mut h = blake3::Hasher::new();
    let paths = get(base, &["traffic", "source", "paths"]).and_then(Value::as_array).cloned().unwrap_or_default();
    // Named as the configuration spells them (the tree holds that already) and, inside a
    // directory, by their names there: where the files sit does not change the key.
    fn add(h: &mut blake3::Hasher, p: &Path, depth: usize, top: bool) -> Result<(), String> {
        let meta = if top { std::fs::metadata(p) } else { std::fs::symlink_metadata(p) };
        let Ok(meta) = meta else {
            h.update(b"\0unreadable");
            return Ok(());
        };
        if meta.file_type().is_symlink() {
            h.update(b"\0symlink");
            let target = std::fs::read_link(p).map(|t| t.to_string_lossy().into_owned()).unwrap_or_default();
            h.update(target.as_bytes());
        } else if meta.is_dir() {
            if depth >= MAX_INPUT_DEPTH {
                return Err(format!("{}: more than {MAX_INPUT_DEPTH} directories deep", p.display()));
            }
            let mut entries: Vec<_> =
                std::fs::read_dir(p).into_iter().flatten().filter_map(|e| e.ok().map(|e| e.path())).collect();
            entries.sort();
            for e in entries {
                h.update(e.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default().as_bytes());
                add(h, &e, depth + 1, false)?;
            }
        } else if meta.is_file() {
            match std::fs::File::open(p) {
                Ok(mut f) => {
                    let _ = std::io::copy(&mut f, h);
                }
                Err(_) => {
                    h.update(b"\0unreadable");
                }
            }
        } else {
            return Err(format!("{} is not a regular file (a pipe or a device cannot be digested)", p.display()));
        }
        Ok(())
    }
    for p in paths.iter().filter_map(Value::as_str) {
        let path = Path::new(p);
        let full = if path.is_absolute() { path.to_path_buf() } else { base_dir.join(path) };
        h.update(p.as_bytes());
        add(&mut h, &full, 0, true)?;
    }
    h.update(b"\0performance data");
    h.update(servesim_perf::systems::data_fingerprint(&systems_paths(base)).as_bytes());
    Ok(h.finalize().to_hex().to_string())
}

/// The performance-data directories the configuration names (the engine's and its workers').
fn systems_paths(base: &Value) -> Vec<String> {
    crate::SYSTEMS_PATHS_POINTERS
        .iter()
        .filter_map(|p| base.pointer(p).and_then(Value::as_array))
        .flat_map(|a| a.iter().filter_map(Value::as_str).map(str::to_string))
        .collect()
}

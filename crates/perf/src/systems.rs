//! Finding the data: the `systems/` directory of an installed `aisimulate_core` or
//! `aiconfigurator_core` package, a system's hardware spec, the queryable backend versions and
//! the source files each table is read from.
//!
//! Where `systems/` is looked for, first match wins:
//! 1. the configuration's `systems_paths` (every listed directory, in order);
//! 2. `SERVESIM_AIS_SYSTEMS` (directories separated by `:`);
//! 3. `AICONFIGURATOR_SYSTEMS_PATH` (the reference's own variable);
//! 4. an installed package: `python3` (or `$SERVESIM_AIS_PYTHON`, then
//!    `$AISIM_REF_VENV/bin/python`) is asked where `aisimulate_core`, then
//!    `aiconfigurator_core`, lives, and its `systems/` is used.
//!
//! The data is never copied into servesim; it is read in place.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use serde_yaml_ng::Value;

use crate::error::{PerfError, Result};

/// The `systems/` roots to search, in order, with a description of where each came from.
pub fn systems_roots(configured: &[String]) -> Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    for p in configured {
        if p == "default" {
            out.extend(installed_roots());
            continue;
        }
        out.push((PathBuf::from(p), "the configuration's systems_paths".to_string()));
    }
    if !out.is_empty() {
        return Ok(out);
    }
    for var in ["SERVESIM_AIS_SYSTEMS", "AICONFIGURATOR_SYSTEMS_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            for p in std::env::split_paths(&v) {
                if !p.as_os_str().is_empty() {
                    out.push((p, format!("${var}")));
                }
            }
            if !out.is_empty() {
                return Ok(out);
            }
        }
    }
    out.extend(installed_roots());
    if out.is_empty() {
        return Err(PerfError::data(
            "no AIS performance data found: set systems_paths in the timing config, or \
             SERVESIM_AIS_SYSTEMS to an aisimulate_core/aiconfigurator_core `systems` directory, \
             or install one of those packages for python3 (looked at systems_paths, \
             $SERVESIM_AIS_SYSTEMS, $AICONFIGURATOR_SYSTEMS_PATH, and the aisimulate_core / \
             aiconfigurator_core packages of python3, $SERVESIM_AIS_PYTHON and $AISIM_REF_VENV/bin/python)",
        ));
    }
    Ok(out)
}

/// A fingerprint of the performance data a configuration's timing would read (the `systems/`
/// roots found as [`systems_roots`] finds them): every file's path, size and modification time
/// under each root. Installing another version of the data package, or editing one of its
/// files, changes it; reading it costs a directory walk, not the data. "none" when no data is
/// found.
pub fn data_fingerprint(configured: &[String]) -> String {
    let Ok(roots) = systems_roots(configured) else { return "none".to_string() };
    let mut h = blake3::Hasher::new();
    for (root, _) in roots {
        h.update(root.to_string_lossy().as_bytes());
        let mut stack = vec![(root, 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            let mut entries: Vec<_> = entries.flatten().collect();
            entries.sort_by_key(|e| e.file_name());
            for e in entries {
                let Ok(meta) = e.metadata() else { continue };
                h.update(e.path().to_string_lossy().as_bytes());
                // Symbolic links are not followed (a link to an ancestor has no end).
                if e.file_type().is_ok_and(|t| t.is_dir()) && depth < 32 {
                    stack.push((e.path(), depth + 1));
                } else {
                    h.update(&meta.len().to_le_bytes());
                    let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                    h.update(&mtime.map_or(0, |d| d.as_nanos()).to_le_bytes());
                }
            }
        }
    }
    h.finalize().to_hex().to_string()
}

/// `systems/` directories of installed packages, asked of each Python we can find. Starting an
/// interpreter costs tens of milliseconds (hundreds behind a pyenv shim), and one run may build
/// several estimators, so the answer is kept for the process, per the variables that choose the
/// interpreters.
fn installed_roots() -> Vec<(PathBuf, String)> {
    type Memo = Mutex<HashMap<[Option<std::ffi::OsString>; 3], Vec<(PathBuf, String)>>>;
    static MEMO: OnceLock<Memo> = OnceLock::new();
    let key = ["SERVESIM_AIS_PYTHON", "AISIM_REF_VENV", "PATH"].map(std::env::var_os);
    let memo = MEMO.get_or_init(Default::default);
    if let Some(found) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return found.clone();
    }
    let found = ask_pythons();
    memo.lock().unwrap_or_else(|e| e.into_inner()).insert(key, found.clone());
    found
}

fn ask_pythons() -> Vec<(PathBuf, String)> {
    let mut pythons: Vec<String> = Vec::new();
    if let Ok(p) = std::env::var("SERVESIM_AIS_PYTHON") {
        pythons.push(p);
    }
    pythons.push("python3".into());
    if let Ok(v) = std::env::var("AISIM_REF_VENV") {
        pythons.push(format!("{v}/bin/python"));
    }
    let script = "import importlib.util as u, os\n\
                  for n in ('aisimulate_core', 'aiconfigurator_core'):\n\
                  \x20   s = u.find_spec(n)\n\
                  \x20   if s and s.submodule_search_locations:\n\
                  \x20       d = os.path.join(list(s.submodule_search_locations)[0], 'systems')\n\
                  \x20       if os.path.isdir(d): print(n + '\\t' + d)\n";
    let mut out: Vec<(PathBuf, String)> = Vec::new();
    for py in pythons {
        let Ok(o) = Command::new(&py).arg("-c").arg(script).output() else { continue };
        if !o.status.success() {
            continue;
        }
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            if let Some((pkg, dir)) = line.split_once('\t') {
                let p = PathBuf::from(dir);
                if !out.iter().any(|(q, _)| *q == p) {
                    out.push((p, format!("the {pkg} package of {py}")));
                }
            }
        }
        if !out.is_empty() {
            break;
        }
    }
    out
}

/// A parsed YAML file of the data package. The same few files (the reuse manifest, every
/// system's spec, version sidecars) are consulted for each table a run opens, so parses are kept
/// for the process, keyed by path, size and modification time: an edited file is read again.
fn load_yaml(path: &Path) -> Result<Arc<Value>> {
    type Stamp = (u64, Option<SystemTime>);
    type Memo = Mutex<HashMap<PathBuf, (Stamp, Arc<Value>)>>;
    static MEMO: OnceLock<Memo> = OnceLock::new();
    let cannot_read = |e: std::io::Error| PerfError::data(format!("cannot read {}: {e}", path.display()));
    let meta = std::fs::metadata(path).map_err(cannot_read)?;
    let stamp: Stamp = (meta.len(), meta.modified().ok());
    let memo = MEMO.get_or_init(Default::default);
    if let Some((s, doc)) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(path) {
        if *s == stamp {
            return Ok(doc.clone());
        }
    }
    let text = std::fs::read_to_string(path).map_err(cannot_read)?;
    let doc: Arc<Value> = Arc::new(
        serde_yaml_ng::from_str(&text)
            .map_err(|e| PerfError::data(format!("malformed YAML in {}: {e}", path.display())))?,
    );
    memo.lock().unwrap_or_else(|e| e.into_inner()).insert(path.to_path_buf(), (stamp, doc.clone()));
    Ok(doc)
}

fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_mapping()?.get(key)
}

/// A string or number scalar as text (versions such as `0.24.0` or `1.3` may be written either way).
fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn num(v: &Value, path: &Path, key: &str) -> Result<f64> {
    let mut cur = v;
    for part in key.split('.') {
        cur = get(cur, part).ok_or_else(|| PerfError::data(format!("{}: missing key {key}", path.display())))?;
    }
    cur.as_f64()
        .filter(|x| x.is_finite())
        .ok_or_else(|| PerfError::data(format!("{}: {key} must be a number", path.display())))
}

fn opt_num(v: &Value, key: &str) -> Option<f64> {
    let mut cur = v;
    for part in key.split('.') {
        cur = get(cur, part)?;
    }
    cur.as_f64()
}

/// A GPU system's hardware spec (`systems/<system>.yaml`).
#[derive(Clone, Debug)]
pub struct SystemSpec {
    pub name: String,
    pub root: PathBuf,
    pub data_dir: PathBuf,
    pub mem_bw: f64,
    pub mem_bw_scaling: f64,
    pub mem_const_latency: f64,
    pub mem_capacity: f64,
    pub bf16_flops: f64,
    pub fp8_flops: Option<f64>,
    pub int8_flops: Option<f64>,
    pub fp4_flops: Option<f64>,
    /// Scalar (non-tensor-core) fp32 FLOP/s (`gpu.fp32_flops`), where the YAML gives it.
    pub fp32_flops: Option<f64>,
    pub sm_version: Option<u32>,
    pub gpus_per_node: u32,
    pub gpus_per_rack: Option<u32>,
    pub inter_node_bw: f64,
    pub intra_node_bw: f64,
    pub inter_rack_bw: Option<f64>,
    pub p2p_latency: f64,
    /// NCCL buffer bytes per rank by GPU count.
    pub nccl_mem: Vec<(u32, f64)>,
    pub other_mem: f64,
    pub nccl_version: Option<String>,
}

impl SystemSpec {
    pub fn load(root: &Path, system: &str) -> Result<SystemSpec> {
        let path = root.join(format!("{system}.yaml"));
        let v = load_yaml(&path)?;
        let data_dir = get(&v, "data_dir")
            .and_then(Value::as_str)
            .ok_or_else(|| PerfError::data(format!("{}: missing key data_dir", path.display())))?;
        let mut nccl_mem = Vec::new();
        if let Some(m) = get(&v, "misc").and_then(|m| get(m, "nccl_mem")).and_then(Value::as_mapping) {
            for (k, val) in m {
                if let (Some(k), Some(val)) = (k.as_u64(), val.as_f64()) {
                    nccl_mem.push((k as u32, val));
                }
            }
        }
        nccl_mem.sort_by_key(|(k, _)| *k);
        let nccl_version = get(&v, "misc").and_then(|m| get(m, "nccl_version")).and_then(text);
        Ok(SystemSpec {
            name: system.to_string(),
            root: root.to_path_buf(),
            data_dir: root.join(data_dir.trim()),
            mem_bw: num(&v, &path, "gpu.mem_bw")?,
            mem_bw_scaling: num(&v, &path, "gpu.mem_bw_empirical_scaling_factor")?,
            mem_const_latency: num(&v, &path, "gpu.mem_empirical_constant_latency")?,
            mem_capacity: num(&v, &path, "gpu.mem_capacity")?,
            bf16_flops: num(&v, &path, "gpu.bfloat16_tc_flops")?,
            fp8_flops: opt_num(&v, "gpu.fp8_tc_flops").filter(|x| *x > 0.0),
            int8_flops: opt_num(&v, "gpu.int8_tc_flops").filter(|x| *x > 0.0),
            fp4_flops: opt_num(&v, "gpu.fp4_tc_flops").filter(|x| *x > 0.0),
            fp32_flops: opt_num(&v, "gpu.fp32_flops").filter(|x| x.is_finite() && *x > 0.0),
            sm_version: opt_num(&v, "gpu.sm_version").map(|x| x as u32),
            gpus_per_node: num(&v, &path, "node.num_gpus_per_node")? as u32,
            gpus_per_rack: opt_num(&v, "node.num_gpus_per_rack").map(|x| x as u32),
            inter_node_bw: num(&v, &path, "node.inter_node_bw")?,
            intra_node_bw: num(&v, &path, "node.intra_node_bw")?,
            inter_rack_bw: opt_num(&v, "node.inter_rack_bw"),
            p2p_latency: num(&v, &path, "node.p2p_latency")?,
            nccl_mem,
            other_mem: opt_num(&v, "misc.other_mem").unwrap_or(0.0),
            nccl_version,
        })
    }

    /// Per-GPU point-to-point bandwidth for a group of `gpus`.
    pub fn p2p_bandwidth(&self, gpus: u32) -> f64 {
        if gpus <= self.gpus_per_node {
            self.intra_node_bw
        } else if gpus <= self.gpus_per_rack.unwrap_or(u32::MAX) {
            self.inter_node_bw
        } else {
            self.inter_rack_bw.unwrap_or(self.inter_node_bw)
        }
    }

    /// Latency of moving `bytes` through memory, in ms (the reference's empirical memory op).
    pub fn mem_op_ms(&self, bytes: f64) -> f64 {
        (bytes / (self.mem_bw.max(1.0) * self.mem_bw_scaling.max(1e-9)) + self.mem_const_latency) * 1000.0
    }
}

/// Finds the spec of `system` in the first root that has it.
pub fn find_system(roots: &[(PathBuf, String)], system: &str) -> Result<SystemSpec> {
    for (root, _) in roots {
        if root.join(format!("{system}.yaml")).is_file() {
            return SystemSpec::load(root, system);
        }
    }
    let looked: Vec<String> = roots.iter().map(|(r, why)| format!("{} ({why})", r.display())).collect();
    let mut known = BTreeSet::new();
    for (root, _) in roots {
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if let Some(stem) = n.strip_suffix(".yaml") {
                    if !stem.contains("versions") && !stem.contains("defaults") && !stem.contains("manifest") {
                        known.insert(stem.to_string());
                    }
                }
            }
        }
    }
    Err(PerfError::data(format!(
        "unknown GPU system {system:?}: no {system}.yaml in {}; known systems: {}",
        looked.join(", "),
        known.into_iter().collect::<Vec<_>>().join(", ")
    )))
}

const KNOWN_BACKEND_DIRS: [&str; 5] = ["trtllm", "sglang", "vllm", "nccl", "oneccl"];

/// Family directories under a system's data directory, sorted.
fn families(data_dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(data_dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.') && !KNOWN_BACKEND_DIRS.contains(&n.as_str()))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn version_dir_unusable(dir: &Path) -> bool {
    !dir.join("collection_meta.yaml").is_file() && dir.join("INCOMPLETE.txt").is_file()
}

/// Versions present for a backend under any family.
fn backend_versions(data_dir: &Path, backend: &str) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for fam in families(data_dir) {
        let b = data_dir.join(&fam).join(backend);
        if let Ok(rd) = std::fs::read_dir(&b) {
            for e in rd.flatten() {
                if e.path().is_dir() {
                    out.push((e.file_name().to_string_lossy().into_owned(), e.path()));
                }
            }
        }
    }
    out
}

/// A comparable key for version strings such as `0.24.0`, `1.3.0rc20`, `0.5.6.post2`
/// (release > rc; post numbers order last).
pub fn version_key(v: &str) -> Vec<i64> {
    let lower = v.to_lowercase();
    let nums: Vec<i64> =
        lower.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).filter_map(|s| s.parse().ok()).collect();
    let mut key: Vec<i64> = nums.iter().take(3).copied().collect();
    while key.len() < 3 {
        key.push(0);
    }
    if let Some(i) = lower.find("rc") {
        let rc: i64 =
            lower[i + 2..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap_or(0);
        key.extend([0, rc]);
    } else {
        key.extend([1, 0]);
    }
    if let Some(i) = lower.find("post") {
        key.push(lower[i + 4..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap_or(0));
    } else {
        key.push(0);
    }
    key
}

fn parseable_version(v: &str) -> bool {
    let mut parts = v.split('.');
    matches!(parts.next(), Some(p) if !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// Resolves a requested backend version (`current`, `previous`, `next` or a listed version) the
/// way the reference does through `systems/query_versions.yaml`.
pub fn resolve_version(spec: &SystemSpec, backend: &str, requested: Option<&str>) -> Result<String> {
    let requested = requested.unwrap_or("current");
    let path = spec.root.join("query_versions.yaml");
    if !path.is_file() {
        if ["current", "previous", "next"].contains(&requested) {
            return Err(PerfError::config(format!(
                "backend_version {requested:?} needs {} to resolve it; name a concrete version",
                path.display()
            )));
        }
        return Ok(requested.to_string());
    }
    let doc = load_yaml(&path)?;
    let over = get(&doc, "overrides").and_then(|o| get(o, &spec.name)).and_then(|s| get(s, backend));
    let entry = over.or_else(|| get(&doc, "defaults").and_then(|d| get(d, backend)));
    let field = |e: &Value, k: &str| get(e, k).and_then(text);
    let Some(current) = entry.and_then(|e| field(e, "current")) else {
        if ["current", "previous", "next"].contains(&requested) {
            return Err(PerfError::config(format!(
                "no queryable {backend} versions for {} in {}",
                spec.name,
                path.display()
            )));
        }
        return Ok(requested.to_string());
    };
    if backend_versions(&spec.data_dir, backend).is_empty() {
        // Every database mode needs a version, SOL's rooflines included (as in the reference).
        return Err(PerfError::data(format!(
            "no {backend} data for {} under {}: no backend version is available",
            spec.name,
            spec.data_dir.display()
        )));
    }
    let mut slots: Vec<(&str, String)> = vec![("current", current.clone())];
    if let Some(p) = entry.and_then(|e| field(e, "previous")) {
        slots.push(("previous", p));
    }
    if over.is_none() {
        // next: the highest data-backed version newer than current across the fleet's
        // defaults-governed systems.
        let override_systems: BTreeSet<String> = get(&doc, "overrides")
            .and_then(Value::as_mapping)
            .map(|m| {
                m.iter()
                    .filter(|(_, per)| get(per, backend).is_some())
                    .filter_map(|(k, _)| k.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let cur_key = version_key(&current);
        let mut best: Option<String> = None;
        if let Ok(rd) = std::fs::read_dir(&spec.root) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                let Some(sys) = n.strip_suffix(".yaml") else { continue };
                if override_systems.contains(sys) {
                    continue;
                }
                let Ok(doc) = load_yaml(&e.path()) else { continue };
                let Some(dd) = get(&doc, "data_dir").and_then(Value::as_str) else { continue };
                let dd = spec.root.join(dd.trim());
                if !dd.is_dir() {
                    continue;
                }
                for (v, p) in backend_versions(&dd, backend) {
                    let has_files = std::fs::read_dir(&p)
                        .map(|rd| rd.flatten().any(|f| f.file_name().to_string_lossy().ends_with(".parquet")))
                        .unwrap_or(false);
                    if has_files
                        && version_key(&v) > cur_key
                        && best.as_ref().is_none_or(|b| version_key(&v) > version_key(b))
                    {
                        best = Some(v);
                    }
                }
            }
        }
        if let Some(n) = best {
            slots.push(("next", n));
        }
    }
    if let Some((_, v)) = slots.iter().find(|(alias, _)| *alias == requested) {
        return Ok(v.clone());
    }
    if slots.iter().any(|(_, v)| v == requested) {
        return Ok(requested.to_string());
    }
    let accepted: Vec<String> = slots.iter().map(|(a, v)| format!("{a} = {v}")).collect();
    Err(PerfError::config(format!(
        "{backend} version {requested:?} is not a queryable version on {} ({}); accepted: {}",
        spec.name,
        path.display(),
        accepted.join(", ")
    )))
}

/// One source file of a table and the `kernel_source` values it may contribute (`None`: all).
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    pub path: PathBuf,
    pub kernel_sources: Option<BTreeSet<String>>,
}

/// Where `<file>` of `<backend>/<version>` lives: the first family directory that has it.
fn op_path(data_dir: &Path, backend: &str, version: &str, file: &str) -> Option<PathBuf> {
    for fam in families(data_dir) {
        let dir = data_dir.join(&fam).join(backend).join(version);
        if dir.is_dir() && !version_dir_unusable(&dir) && dir.join(file).exists() {
            return Some(dir.join(file));
        }
    }
    None
}

/// The versions the requested version's `reuse.yaml` (in any family) lends `file` from, each
/// once, in the order declared, with the file each resolves to.
fn declared_donors(data: &Path, backend: &str, version: &str, file: &str) -> Result<Vec<(String, PathBuf)>> {
    let table = file.trim_end_matches(".parquet");
    let mut out: Vec<(String, PathBuf)> = Vec::new();
    for fam in families(data) {
        let reuse = data.join(&fam).join(backend).join(version).join("reuse.yaml");
        if !reuse.is_file() {
            continue;
        }
        let doc = load_yaml(&reuse)?;
        for e in get(&doc, "reuse").and_then(Value::as_sequence).into_iter().flatten() {
            if get(e, "table").and_then(Value::as_str) != Some(table) {
                continue;
            }
            let Some(from) = get(e, "from_version").and_then(text) else {
                continue;
            };
            if out.iter().any(|(v, _)| *v == from) {
                continue;
            }
            if let Some(p) = op_path(data, backend, &from, file) {
                out.push((from, p));
            }
        }
    }
    Ok(out)
}

/// The priority-ordered sources of one table (the reference's shared-layer resolution):
/// the requested version, then versions declared in its `reuse.yaml`, then strictly earlier
/// versions of the same backend (nearest first), then other backends' rows whose
/// `kernel_source` the `perf_data_reuse_manifest.yaml` shares with this backend. Communication
/// tables stop after the earlier same-backend versions; NCCL tables use only the primary.
/// Without the shared layer (`enable_shared_layer: false`) every table is its primary alone.
pub fn sources(spec: &SystemSpec, backend: &str, version: &str, file: &str, shared_layer: bool) -> Result<Vec<Source>> {
    let data = &spec.data_dir;
    let primary = op_path(data, backend, version, file);
    let family = match &primary {
        Some(p) => p
            .parent()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        None => families(data).into_iter().find(|fam| {
            std::fs::read_dir(data.join(fam).join(backend))
                .map(|rd| rd.flatten().any(|e| e.path().join(file).is_file()))
                .unwrap_or(false)
        }),
    };
    let mut out: Vec<Source> = Vec::new();
    if let Some(p) = &primary {
        out.push(Source { path: p.clone(), kernel_sources: None });
    }
    if !shared_layer {
        return Ok(out);
    }
    let is_comm = family.as_deref() == Some("comm");
    let mut declared: BTreeSet<String> = BTreeSet::new();
    if !is_comm {
        for (from, p) in declared_donors(data, backend, version, file)? {
            out.push(Source { path: p, kernel_sources: None });
            declared.insert(from);
        }
    }
    if parseable_version(version) {
        let req = version_key(version);
        let mut earlier: Vec<(Vec<i64>, String)> = Vec::new();
        let versions: BTreeSet<String> = if is_comm {
            std::fs::read_dir(data.join("comm").join(backend))
                .map(|rd| {
                    rd.flatten()
                        .filter(|e| e.path().is_dir())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default()
        } else {
            backend_versions(data, backend).into_iter().map(|(v, _)| v).collect()
        };
        for v in versions {
            if v == version || declared.contains(&v) || !parseable_version(&v) {
                continue;
            }
            let k = version_key(&v);
            if k < req {
                earlier.push((k, v));
            }
        }
        earlier.sort_by(|a, b| b.0.cmp(&a.0));
        for (_, v) in earlier {
            let p = if is_comm {
                let p = data.join("comm").join(backend).join(&v).join(file);
                (p.is_file() && !version_dir_unusable(p.parent().unwrap_or(data))).then_some(p)
            } else {
                op_path(data, backend, &v, file)
            };
            if let Some(p) = p {
                out.push(Source { path: p, kernel_sources: None });
            }
        }
    }
    if is_comm {
        return Ok(out);
    }
    // Cross-backend fill, gated by the reuse manifest.
    let manifest = spec.root.join("perf_data_reuse_manifest.yaml");
    if manifest.is_file() {
        let doc = load_yaml(&manifest)?;
        let mut per_fw: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
        for g in get(&doc, "groups").and_then(Value::as_sequence).into_iter().flatten() {
            if get(g, "op_file").and_then(Value::as_str) != Some(file) {
                continue;
            }
            let tier = get(g, "tier").and_then(Value::as_str);
            if !matches!(tier, Some("shared") | Some("shared_fallback")) {
                continue;
            }
            let fws: Vec<String> = get(g, "frameworks")
                .and_then(Value::as_sequence)
                .map(|s| s.iter().filter_map(Value::as_str).map(str::to_lowercase).collect())
                .unwrap_or_default();
            if !fws.iter().any(|f| f == backend) {
                continue;
            }
            let Some(ks) = get(g, "kernel_source").and_then(text) else {
                continue;
            };
            for f in fws {
                per_fw.entry(f).or_default().insert(ks.clone());
            }
        }
        for (fw, ks) in per_fw {
            if fw == backend {
                continue;
            }
            let mut vs: Vec<String> =
                backend_versions(data, &fw).into_iter().map(|(v, _)| v).collect::<BTreeSet<_>>().into_iter().collect();
            vs.sort_by_key(|v| std::cmp::Reverse(version_key(v)));
            for v in vs {
                if let Some(p) = op_path(data, &fw, &v, file) {
                    out.push(Source { path: p, kernel_sources: Some(ks.clone()) });
                }
            }
        }
    }
    Ok(out)
}

/// Sidecars and markers of a version directory, which are not data tables.
const DIR_MARKERS: [&str; 4] = ["reuse.yaml", "collection_meta.yaml", "INCOMPLETE.txt", "SHARED_LAYER_REUSE.txt"];

/// The reference's `strict_provenance` check of the data behind one backend version: every
/// version directory a table is read from first (the requested version's, in the family
/// layout) must have a `collection_meta.yaml` whose `tables:` mapping names every data file in
/// the directory (by stem); a directory a table is borrowed from through `reuse.yaml` must name
/// that table. A `provenance: legacy` sidecar is excused for the tables it leaves out, as the
/// reference graces it. Earlier-version and cross-backend fills are not checked (nor does the
/// reference check them). `tables` are the files the estimator reads (`gemm_perf.parquet`, ...).
pub fn check_provenance(spec: &SystemSpec, backend: &str, version: &str, tables: &[&str]) -> Result<()> {
    let data = &spec.data_dir;
    let mut checked: BTreeSet<PathBuf> = BTreeSet::new();
    for &file in tables {
        let mut dirs: Vec<(PathBuf, Option<String>)> = Vec::new();
        let primary = op_path(data, backend, version, file);
        let is_comm = primary.as_deref().and_then(family_of).is_some_and(|f| f == "comm");
        if let Some(p) = &primary {
            dirs.push((p.parent().unwrap_or(data).to_path_buf(), None));
        }
        // Communication tables borrow from no declared donor (as in `sources`).
        if !is_comm {
            let table = file.trim_end_matches(".parquet");
            for (_, p) in declared_donors(data, backend, version, file)? {
                dirs.push((p.parent().unwrap_or(data).to_path_buf(), Some(table.to_string())));
            }
        }
        for (dir, only) in dirs {
            if only.is_none() && !checked.insert(dir.clone()) {
                continue;
            }
            coverage(&dir, only.as_deref())?;
        }
    }
    if let Some(nccl) = nccl_source(spec) {
        // The legacy layout (`nccl/<version>`) has no family and the reference checks it not.
        if family_of(&nccl).is_some_and(|f| f == "comm") && checked.insert(nccl.parent().unwrap_or(data).into()) {
            coverage(nccl.parent().unwrap_or(data), None)?;
        }
    }
    Ok(())
}

/// The family of a table file in the family layout (`<family>/<backend>/<version>/<file>`).
fn family_of(file: &Path) -> Option<String> {
    Some(file.parent()?.parent()?.parent()?.file_name()?.to_string_lossy().into_owned())
}

/// One directory's sidecar coverage: of all its data tables, or only of `only`.
fn coverage(dir: &Path, only: Option<&str>) -> Result<()> {
    let refuse = |why: String| PerfError::data(format!("strict_provenance: {why}"));
    let stems: BTreeSet<String> = match only {
        Some(t) => BTreeSet::from([t.to_string()]),
        None => std::fs::read_dir(dir)
            .map_err(|e| refuse(format!("cannot list {} to check its tables: {e}", dir.display())))?
            .flatten()
            .filter(|e| e.path().is_file())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') || DIR_MARKERS.contains(&name.as_str()) {
                    return None;
                }
                Path::new(&name).file_stem().map(|s| s.to_string_lossy().into_owned())
            })
            .collect(),
    };
    if stems.is_empty() {
        return Ok(());
    }
    let meta = dir.join("collection_meta.yaml");
    if !meta.is_file() {
        return Err(refuse(format!(
            "{} holds table(s) {stems:?} but no collection_meta.yaml says where they were collected",
            dir.display()
        )));
    }
    let doc = load_yaml(&meta).map_err(|e| refuse(e.message))?;
    if !matches!(*doc, Value::Mapping(_)) {
        return Err(refuse(format!("{}: the top level is not a mapping", meta.display())));
    }
    let named: BTreeSet<String> = get(&doc, "tables")
        .and_then(Value::as_mapping)
        .map(|m| m.keys().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    let missing: Vec<&String> = stems.iter().filter(|s| !named.contains(*s)).collect();
    if missing.is_empty() || get(&doc, "provenance").and_then(Value::as_str) == Some("legacy") {
        return Ok(());
    }
    Err(refuse(format!("{}: its 'tables' mapping does not cover table(s) {missing:?}", meta.display())))
}

/// The NCCL table of a system (`comm/nccl/<misc.nccl_version>/nccl_perf.parquet`).
pub fn nccl_source(spec: &SystemSpec) -> Option<PathBuf> {
    let v = spec.nccl_version.as_ref()?;
    let fam = spec.data_dir.join("comm").join("nccl").join(v).join("nccl_perf.parquet");
    if fam.is_file() {
        return Some(fam);
    }
    let legacy = spec.data_dir.join("nccl").join(v).join("nccl_perf.parquet");
    legacy.is_file().then_some(legacy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_order() {
        assert!(version_key("0.24.0") > version_key("0.19.0"));
        assert!(version_key("1.3.0rc20") > version_key("1.3.0rc10"));
        assert!(version_key("1.3.0") > version_key("1.3.0rc20"));
        assert!(version_key("0.5.6.post2") > version_key("0.5.6"));
        assert!(version_key("0.5.10") > version_key("0.5.6.post2"));
    }
}

//! The measured tables of one `(system, backend, version)`, read lazily, and their queries.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::empirical::{self, DeltaLookup, UtilGrid};
use crate::error::{PerfError, Result};
use crate::interp::{Curve, Grid, GridSpec, Node, Sites, SitesSpec};
use crate::parquet_table::{key_u32, Table};
use crate::systems::{nccl_source, sources, Source, SystemSpec};

/// A number format: bytes per element and the tensor-core rate it computes at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    Bfloat16,
    Fp8,
    /// Per-tensor FP8 with static (calibrated) activation scales: GEMMs only. Timed from the
    /// dynamic-FP8 tables minus the scale work a static scheme does not do.
    Fp8Static,
    Fp8Block,
    Int8,
    /// MXFP4 weights with 16-bit activations (gpt-oss experts): half a byte per weight, bf16
    /// tensor-core rate.
    W4a16Mxfp4,
    /// INT4 weights with 16-bit activations (compressed-tensors W4A16 experts, Kimi-K2.5): half a
    /// byte per weight, bf16 tensor-core rate.
    Int4Wo,
    /// NVFP4 weights and activations (ModelOpt checkpoints): 4-bit values plus one fp8 scale per
    /// 16, so 9/16 of a byte per weight, at the fp4 tensor-core rate.
    Nvfp4,
    /// MXFP4 weights with MXFP8 activations (DeepSeek-V4's native routed experts): half a byte
    /// per weight, at the fp8 tensor-core rate.
    W4a8Mxfp4Mxfp8,
    /// The same format on SGLang's trtllm-gen fused MoE kernel (DeepSeek-V4's fp4 experts on
    /// Blackwell), whose rows the tables file under their own name.
    W4a8Mxfp4Mxfp8Trtllm,
    /// MXFP4 weights with bf16 activations on SGLang's FlashInfer CUTLASS SM90 kernel
    /// (DeepSeek-V4's fp4 experts on Hopper).
    W4a16Mxfp4Cutlass,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Fp8 => "fp8",
            Dtype::Fp8Static => "fp8_static",
            Dtype::Fp8Block => "fp8_block",
            Dtype::Int8 => "int8",
            Dtype::W4a16Mxfp4 => "w4a16_mxfp4",
            Dtype::Int4Wo => "int4_wo",
            Dtype::Nvfp4 => "nvfp4",
            Dtype::W4a8Mxfp4Mxfp8 => "w4a8_mxfp4_mxfp8",
            Dtype::W4a8Mxfp4Mxfp8Trtllm => "w4a8_mxfp4_mxfp8_trtllm",
            Dtype::W4a16Mxfp4Cutlass => "w4a16_mxfp4_cutlass",
        }
    }
    pub fn bytes(self) -> f64 {
        match self {
            Dtype::Bfloat16 => 2.0,
            Dtype::W4a16Mxfp4 | Dtype::Int4Wo | Dtype::W4a8Mxfp4Mxfp8 => 0.5,
            Dtype::W4a8Mxfp4Mxfp8Trtllm | Dtype::W4a16Mxfp4Cutlass => 0.5,
            Dtype::Nvfp4 => 9.0 / 16.0,
            _ => 1.0,
        }
    }
    pub fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "bfloat16" | "bf16" | "float16" | "half" => Dtype::Bfloat16,
            "fp8" => Dtype::Fp8,
            "fp8_static" => Dtype::Fp8Static,
            "fp8_block" => Dtype::Fp8Block,
            "int8" => Dtype::Int8,
            "w4a16_mxfp4" => Dtype::W4a16Mxfp4,
            "int4_wo" => Dtype::Int4Wo,
            "nvfp4" => Dtype::Nvfp4,
            "w4a8_mxfp4_mxfp8" => Dtype::W4a8Mxfp4Mxfp8,
            "w4a8_mxfp4_mxfp8_trtllm" => Dtype::W4a8Mxfp4Mxfp8Trtllm,
            "w4a16_mxfp4_cutlass" => Dtype::W4a16Mxfp4Cutlass,
            _ => return None,
        })
    }
    /// Tensor-core FLOP/s for this format on `spec`.
    pub fn flops(self, spec: &SystemSpec) -> Result<f64> {
        let (v, key) = match self {
            Dtype::Bfloat16 | Dtype::W4a16Mxfp4 | Dtype::Int4Wo => (Some(spec.bf16_flops), "bfloat16_tc_flops"),
            Dtype::Fp8 | Dtype::Fp8Static | Dtype::Fp8Block | Dtype::W4a8Mxfp4Mxfp8 => (spec.fp8_flops, "fp8_tc_flops"),
            Dtype::Int8 => (spec.int8_flops, "int8_tc_flops"),
            Dtype::Nvfp4 => (spec.fp4_flops, "fp4_tc_flops"),
            Dtype::W4a8Mxfp4Mxfp8Trtllm => (spec.fp8_flops, "fp8_tc_flops"),
            Dtype::W4a16Mxfp4Cutlass => (Some(spec.bf16_flops), "bfloat16_tc_flops"),
        };
        v.filter(|x| x.is_finite() && *x > 0.0).ok_or_else(|| {
            PerfError::unsupported(format!(
                "{} compute needs gpu.{key} in {}.yaml, which is missing",
                self.name(),
                spec.name
            ))
        })
    }
}

/// GEMM speed of light in ms.
pub fn gemm_sol(spec: &SystemSpec, dt: Dtype, flops: f64, m: f64, n: f64, k: f64) -> f64 {
    let math = 2.0 * m * n * k / flops * 1000.0;
    let mem = dt.bytes() * (m * n + m * k + n * k) / spec.mem_bw * 1000.0;
    math.max(mem)
}

/// Context attention SOL (full attention, no prefix) in ms; `n_kv_lookup == 0` means MHA.
#[allow(clippy::too_many_arguments)]
pub fn ctx_attn_sol(
    spec: &SystemSpec,
    n_kv_lookup: u32,
    head: u32,
    window: u32,
    kv: Dtype,
    flops: f64,
    n: f64,
    s: f64,
    b: f64,
) -> f64 {
    let h = head as f64;
    let w = window as f64;
    let n_kv = if n_kv_lookup == 0 { n } else { n_kv_lookup as f64 };
    let ops = if window > 0 && s > w { 2.0 * b * s * w * n * h * 2.0 } else { 2.0 * b * (s * s) * n * h * 2.0 / 2.0 };
    let mem = 2.0 * b * (n * s * h + n * s * h) + kv.bytes() * b * (2.0 * n_kv * s * h);
    (ops / flops * 1000.0).max(mem / spec.mem_bw * 1000.0)
}

/// Context attention SOL of `s` new tokens after `prefix` cached ones, ms: the prefix's share
/// of the causal work and of the query / output traffic taken out, the KV written for the whole
/// sequence. `n_kv` is the real KV head count.
#[allow(clippy::too_many_arguments)]
pub fn ctx_attn_sol_prefix(
    spec: &SystemSpec,
    head: u32,
    window: u32,
    kv: Dtype,
    flops: f64,
    b: f64,
    s: f64,
    prefix: f64,
    n: f64,
    n_kv: f64,
) -> f64 {
    let (h, w) = (head as f64, window as f64);
    let full = s + prefix;
    let ops = if window > 0 && full > w {
        2.0 * b * (full - prefix) * w * n * h * 2.0
    } else {
        2.0 * b * (full * full - prefix * prefix) * n * h * 2.0 / 2.0
    };
    let mem = 2.0 * b * (n * (full - prefix) * h + n * (full - prefix) * h) + kv.bytes() * b * (2.0 * n_kv * full * h);
    (ops / flops * 1000.0).max(mem / spec.mem_bw * 1000.0)
}

/// Generation attention SOL in ms (`s` = KV length including the new token).
#[allow(clippy::too_many_arguments)]
pub fn gen_attn_sol(
    spec: &SystemSpec,
    n_kv_lookup: u32,
    head: u32,
    window: u32,
    kv: Dtype,
    flops: f64,
    n: f64,
    b: f64,
    s: f64,
) -> f64 {
    let (math, mem) = gen_attn_sol_parts(spec, n_kv_lookup, head, window, kv, flops, n, b, s);
    math.max(mem)
}

/// The two terms of [`gen_attn_sol`]: `(math, memory)` time, ms.
#[allow(clippy::too_many_arguments)]
pub fn gen_attn_sol_parts(
    spec: &SystemSpec,
    n_kv_lookup: u32,
    head: u32,
    window: u32,
    kv: Dtype,
    flops: f64,
    n: f64,
    b: f64,
    s: f64,
) -> (f64, f64) {
    let n_kv = if n_kv_lookup == 0 { n } else { n_kv_lookup as f64 };
    let kv_len = if window > 0 { (s - 1.0).min(window as f64) } else { s - 1.0 };
    let h = head as f64;
    let ops = 2.0 * b * n * h * 2.0 * kv_len;
    let mem = b * (n * h * 2.0 + 2.0 * n_kv * kv_len * h * kv.bytes() + n * h * 2.0);
    (ops / flops * 1000.0, mem / spec.mem_bw * 1000.0)
}

/// The decode kernel's compute format: fp8 KV computes in fp8 where the GPU has fp8 MMA.
pub fn gen_attn_dtype(spec: &SystemSpec, kv: Dtype) -> Dtype {
    if kv == Dtype::Fp8 && spec.sm_version.is_some_and(|sm| sm >= 89) {
        Dtype::Fp8
    } else {
        Dtype::Bfloat16
    }
}

fn mha_lookup(n: u32, n_kv: u32) -> u32 {
    if n == n_kv {
        0
    } else {
        n_kv
    }
}

const GEMM_SPEC: SitesSpec = SitesSpec {
    axes: &["m", "n", "k"],
    site_axes: &[1, 2],
    curve_axis: 0,
    nn_sites: 4,
    max_site_distance: 2.0,
    k_tail: 3,
    own_curve_fallback: false,
    raw_admission: None,
};
const CTX_SPEC: GridSpec = GridSpec::sqrt_along(&["num_heads", "seq_len", "batch"], 1);
const GEN_SPEC: GridSpec = GridSpec::raw(&["num_heads", "batch", "seq_len"]);

/// A GEMM format's measured points `([m, n, k], ms)` (raised to their SOL), in key order.
type GemmPoints = Vec<(Vec<f64>, f64)>;

/// NCCL curves by (dtype, collective, GPUs).
type NcclCurves = BTreeMap<(String, String, u32), Curve>;

/// Attention rows as read: lane → (fmha, kv, n_kv, head, window) → grid nodes.
type RawLanes = BTreeMap<String, BTreeMap<(String, String, u32, u32, u32), Node>>;

/// Attention slices of one kernel lane: key → grid.
type Lanes<K> = (BTreeMap<String, BTreeMap<K, Grid>>, Vec<String>);

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct CtxKey {
    fmha: String,
    kv: String,
    n_kv: u32,
    head: u32,
    window: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct GenKey {
    kv: String,
    n_kv: u32,
    head: u32,
    window: u32,
}

/// As an error names a missing context attention slice.
impl fmt::Display for CtxKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let CtxKey { fmha, kv, n_kv, head, window } = self;
        write!(f, "fmha={fmha} kv={kv} n_kv={n_kv} head_dim={head} window={window}")
    }
}

/// As an error names a missing generation attention slice.
impl fmt::Display for GenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let GenKey { kv, n_kv, head, window } = self;
        write!(f, "kv={kv} n_kv={n_kv} head_dim={head} window={window}")
    }
}

/// The two activation-scaling kernels of dynamic FP8 that static FP8 does without.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ScaleKernel {
    ComputeScale,
    ScaleMatrix,
}

/// Where op latencies come from (the reference's `database_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DatabaseMode {
    /// The measured kernel tables, interpolated (`SILICON`).
    #[default]
    Silicon,
    /// Every op's pure speed-of-light roofline from the system YAML; no table is read (`SOL`).
    Sol,
    /// Every table-backed op's SOL over a utilisation read off its measured points
    /// (`EMPIRICAL`, `empirical.rs`); the memory and P2P formulas are SILICON's.
    Empirical,
    /// The tables where they have the slice, the empirical estimate where they miss (`HYBRID`).
    Hybrid,
}

impl DatabaseMode {
    /// The mode named by a `database_mode` value (case-insensitive, as the reference reads it).
    pub fn parse(s: &str) -> std::result::Result<DatabaseMode, String> {
        match s.to_ascii_uppercase().as_str() {
            "SILICON" => Ok(DatabaseMode::Silicon),
            "SOL" => Ok(DatabaseMode::Sol),
            "EMPIRICAL" => Ok(DatabaseMode::Empirical),
            "HYBRID" => Ok(DatabaseMode::Hybrid),
            _ => Err(format!("{s:?} is not a database mode (SILICON, SOL, HYBRID or EMPIRICAL)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DatabaseMode::Silicon => "SILICON",
            DatabaseMode::Sol => "SOL",
            DatabaseMode::Empirical => "EMPIRICAL",
            DatabaseMode::Hybrid => "HYBRID",
        }
    }

    pub fn is_sol(self) -> bool {
        self == DatabaseMode::Sol
    }

    /// Whether ops are (or may be) priced by the empirical estimate.
    pub fn is_empirical(self) -> bool {
        matches!(self, DatabaseMode::Empirical | DatabaseMode::Hybrid)
    }

    /// Whether sibling versions' rows load by default: the modes that read the tables as
    /// measurements (SILICON, HYBRID), as the reference derives it.
    pub fn shared_layer_default(self) -> bool {
        self != DatabaseMode::Empirical
    }
}

/// Whether a HYBRID table query missed its slice (and the empirical estimate takes over).
fn missed(e: &PerfError) -> bool {
    e.kind == crate::error::ErrorKind::Data
}

/// What the reference would borrow where the own slice has no points; servesim refuses instead.
fn no_transfer(mode: DatabaseMode, what: &str, borrow: &str) -> PerfError {
    PerfError::unsupported(format!(
        "database_mode {}: {what} has no measured points of its own; the reference would borrow {borrow}, \
         which servesim does not model",
        mode.name()
    ))
}

/// The measured tables of one `(system, backend, version)`.
pub struct Database {
    pub spec: SystemSpec,
    /// Tables or rooflines; set once, before the first query.
    pub mode: DatabaseMode,
    pub backend: String,
    pub version: String,
    /// Whether tables borrow rows beyond the requested version (`enable_shared_layer`).
    pub shared_layer: bool,
    gemm_sources: Vec<Source>,
    ctx_sources: Vec<Source>,
    gen_sources: Vec<Source>,
    ar_sources: Vec<Source>,
    moe_sources: Vec<Source>,
    compute_scale_sources: Vec<Source>,
    scale_matrix_sources: Vec<Source>,
    /// Per format: the site table and every measured point `([m, n, k], ms)` in key order.
    gemm: OnceLock<Result<BTreeMap<String, (Sites, GemmPoints)>>>,
    compute_scale: OnceLock<Result<BTreeMap<String, Grid>>>,
    scale_matrix: OnceLock<Result<BTreeMap<String, Grid>>>,
    ctx: OnceLock<Result<Lanes<CtxKey>>>,
    gen: OnceLock<Result<Lanes<GenKey>>>,
    ar: OnceLock<Result<BTreeMap<u32, Curve>>>,
    nccl: OnceLock<Result<NcclCurves>>,
    pub(crate) moe: OnceLock<Result<MoeTable>>,
    /// The large-EP all-to-all table (`moe_a2a_perf`), sources resolved and read on first use.
    a2a: OnceLock<Result<crate::moe_a2a::A2aTable>>,
    /// SGLang's wide-EP expert-compute tables, read on first use.
    wide_moe: OnceLock<Result<crate::moe_a2a::WideEpMoeTable>>,
    /// SGLang's wide-EP MLA module tables, read on first use.
    pub(crate) wide_mla: crate::wideep_mla::WideMlaTables,
    /// The MLA tables, each read (sources resolved) on first use.
    pub(crate) mla: crate::mla::MlaTables,
    /// The DSA sparse-attention tables, each read on first use.
    pub(crate) dsa: crate::dsa::DsaTables,
    /// DeepSeek-V4's module and mHC tables, each read on first use.
    pub(crate) dsv4: crate::dsv4::Dsv4Tables,
    pub(crate) dsv41: crate::dsv41::Dsv41Tables,
    /// Qwen3.5's GDN kernel table, read on first use.
    pub(crate) gdn: crate::gdn::GdnTables,
    /// Kimi-K3's KDA kernel table, read on first use.
    pub(crate) kda: crate::kimi_k3::KdaTables,
    gemm_cache: Mutex<HashMap<(Dtype, u32, u32, u32), f64>>,
    /// EMPIRICAL / HYBRID utilisation grids, each built on first use.
    util: crate::empirical::Grids,
}

pub(crate) type ShapeKey = (u32, u32, u32, u32, u32, u32); // topk, experts, hidden, inter, moe_tp, moe_ep

/// quant → distribution → shape → `V`.
pub(crate) type ByQuant<V> = BTreeMap<String, BTreeMap<String, BTreeMap<ShapeKey, V>>>;

/// The default-eligible rows of a system's `moe_perf` tables: quant → distribution → shape →
/// token curve (sorted, first source wins per point). Loaded once per database, on first use
/// (`moe.rs`).
#[derive(Debug, Default)]
pub struct MoeTable {
    pub(crate) grids: ByQuant<Vec<(u32, f64)>>,
    /// TRT-LLM's low-latency NVFP4 kernel rows (`moe_torch_flow_min_latency`), which the
    /// reference keeps apart and prefers for small gated NVFP4 batches.
    pub(crate) low_latency: ByQuant<Vec<(u32, f64)>>,
    pub(crate) looked: Vec<String>,
    /// The standard table's quant names in the order their first rows were read (the order
    /// the empirical estimate's cross-format borrows break ties in).
    pub(crate) quant_order: Vec<String>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Database({} {} {})", self.spec.name, self.backend, self.version)
    }
}

pub(crate) fn keep_row(src: &Source, ks: &Option<String>) -> bool {
    match &src.kernel_sources {
        None => true,
        Some(allow) => ks.as_ref().is_some_and(|k| allow.contains(k)),
    }
}

/// `map[key]`, inserted empty on first use; the key is copied only then (the table loaders
/// look one up per row, and most rows share a few keys).
pub(crate) fn slot<'m, V: Default>(map: &'m mut BTreeMap<String, V>, key: &str) -> &'m mut V {
    if !map.contains_key(key) {
        map.insert(key.to_owned(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

pub(crate) fn no_rows(what: &str, srcs: &[Source], spec: &SystemSpec, backend: &str, version: &str) -> PerfError {
    let listed: Vec<String> = srcs.iter().map(|s| s.path.display().to_string()).collect();
    PerfError::data(format!(
        "no {what} data for {} / {backend} {version}: looked in {}",
        spec.name,
        if listed.is_empty() { format!("{} (no file found)", spec.data_dir.display()) } else { listed.join(", ") }
    ))
}

impl Database {
    /// The table files every database reads (the MLA tables are `mla::Layout::ALL`'s).
    pub const TABLES: [&'static str; 7] = [
        "gemm_perf.parquet",
        "context_attention_perf.parquet",
        "generation_attention_perf.parquet",
        "custom_allreduce_perf.parquet",
        "moe_perf.parquet",
        "computescale_perf.parquet",
        "scale_matrix_perf.parquet",
    ];

    pub fn open(spec: SystemSpec, backend: &str, version: &str, shared_layer: bool) -> Result<Database> {
        let [gemm, ctx, gen, ar, moe, compute_scale, scale_matrix] =
            Database::TABLES.map(|file| sources(&spec, backend, version, file, shared_layer));
        Ok(Database {
            gemm_sources: gemm?,
            ctx_sources: ctx?,
            gen_sources: gen?,
            ar_sources: ar?,
            moe_sources: moe?,
            compute_scale_sources: compute_scale?,
            scale_matrix_sources: scale_matrix?,
            spec,
            mode: DatabaseMode::Silicon,
            backend: backend.to_string(),
            version: version.to_string(),
            shared_layer,
            gemm: OnceLock::new(),
            compute_scale: OnceLock::new(),
            scale_matrix: OnceLock::new(),
            ctx: OnceLock::new(),
            gen: OnceLock::new(),
            ar: OnceLock::new(),
            nccl: OnceLock::new(),
            moe: OnceLock::new(),
            a2a: OnceLock::new(),
            wide_moe: OnceLock::new(),
            wide_mla: Default::default(),
            mla: Default::default(),
            dsa: Default::default(),
            dsv4: Default::default(),
            dsv41: Default::default(),
            gdn: Default::default(),
            kda: Default::default(),
            gemm_cache: Mutex::new(HashMap::new()),
            util: Default::default(),
        })
    }

    /// The EMPIRICAL / HYBRID utilisation grids built so far.
    pub(crate) fn util_grids(&self) -> &crate::empirical::Grids {
        &self.util
    }

    /// The same database answering in `mode`.
    pub fn with_mode(mut self, mode: DatabaseMode) -> Database {
        self.mode = mode;
        self
    }

    /// A memory-bound elementwise pass over `bytes`, ms: the reference's empirical memory op
    /// (scaled bandwidth plus a constant) under SILICON, the pure `bytes / bandwidth` under SOL.
    pub fn mem_op_ms(&self, bytes: f64) -> f64 {
        match self.mode {
            DatabaseMode::Silicon | DatabaseMode::Empirical | DatabaseMode::Hybrid => self.spec.mem_op_ms(bytes),
            DatabaseMode::Sol => bytes / self.spec.mem_bw.max(1.0) * 1000.0,
        }
    }

    pub fn moe_sources(&self) -> &[Source] {
        &self.moe_sources
    }

    /// The `moe_a2a_perf` sources (same backend only, like every communication table).
    pub fn a2a_sources(&self) -> Result<Vec<Source>> {
        sources(&self.spec, &self.backend, &self.version, "moe_a2a_perf.parquet", self.shared_layer)
    }

    /// The large-EP all-to-all table, read on first use.
    pub fn a2a_table(&self) -> Result<&crate::moe_a2a::A2aTable> {
        self.a2a.get_or_init(|| crate::moe_a2a::A2aTable::load(self)).as_ref().map_err(Clone::clone)
    }

    /// SGLang's wide-EP expert-compute table, read on first use.
    pub fn wide_moe_table(&self) -> Result<&crate::moe_a2a::WideEpMoeTable> {
        self.wide_moe.get_or_init(|| crate::moe_a2a::WideEpMoeTable::load(self)).as_ref().map_err(Clone::clone)
    }

    /// Every source file this database reads, per table.
    pub fn source_report(&self) -> Vec<(&'static str, Vec<PathBuf>)> {
        let p = |s: &[Source]| s.iter().map(|x| x.path.clone()).collect();
        vec![
            ("gemm", p(&self.gemm_sources)),
            ("context_attention", p(&self.ctx_sources)),
            ("generation_attention", p(&self.gen_sources)),
            ("custom_allreduce", p(&self.ar_sources)),
            ("moe", p(&self.moe_sources)),
        ]
    }

    fn load_gemm(&self) -> Result<BTreeMap<String, (Sites, GemmPoints)>> {
        // Per dtype: m → n → k first-wins, plus the insertion order of the nested dict walk.
        #[derive(Default)]
        struct Acc {
            grid: BTreeMap<(u32, u32, u32), f64>,
            m_order: Vec<u32>,
            n_order: HashMap<u32, Vec<u32>>,
            k_order: HashMap<(u32, u32), Vec<u32>>,
        }
        let mut by: BTreeMap<String, Acc> = BTreeMap::new();
        for src in &self.gemm_sources {
            if !src.path.exists() {
                continue;
            }
            let t = Table::read(&src.path, &["gemm_dtype", "m", "n", "k", "latency", "kernel_source"])?;
            let (dt, m, n, k, lat, ks) = (
                t.text("gemm_dtype")?,
                t.int("m")?,
                t.int("n")?,
                t.int("k")?,
                t.float("latency")?,
                t.text_or_none("kernel_source")?,
            );
            for i in 0..t.rows {
                if !keep_row(src, &ks[i]) {
                    continue;
                }
                let Some(d) = dt[i].as_deref() else { continue };
                if d == "awq" || d == "gptq" {
                    continue;
                }
                let (m, n, k) =
                    (key_u32(&t.path, "m", i, m[i])?, key_u32(&t.path, "n", i, n[i])?, key_u32(&t.path, "k", i, k[i])?);
                let acc = slot(&mut by, d);
                if acc.grid.contains_key(&(m, n, k)) {
                    continue;
                }
                if !acc.n_order.contains_key(&m) {
                    acc.m_order.push(m);
                }
                let ns = acc.n_order.entry(m).or_default();
                if !acc.k_order.contains_key(&(m, n)) {
                    ns.push(n);
                }
                acc.k_order.entry((m, n)).or_default().push(k);
                acc.grid.insert((m, n, k), lat[i]);
            }
        }
        if by.is_empty() {
            return Err(no_rows("GEMM", &self.gemm_sources, &self.spec, &self.backend, &self.version));
        }
        let mut out = BTreeMap::new();
        for (d, acc) in by {
            // Raise every point to at least its speed of light (the reference's load-time clamp).
            let dtype = Dtype::parse(&d);
            let flops = dtype.and_then(|x| x.flops(&self.spec).ok());
            let mut order: Vec<(u32, u32)> = Vec::new();
            let mut seen = BTreeSet::new();
            for m in &acc.m_order {
                for n in &acc.n_order[m] {
                    for k in &acc.k_order[&(*m, *n)] {
                        if seen.insert((*n, *k)) {
                            order.push((*n, *k));
                        }
                    }
                }
            }
            let index: HashMap<(u32, u32), usize> = order.iter().enumerate().map(|(i, s)| (*s, i)).collect();
            let mut curves: Vec<Vec<(u32, f64)>> = vec![Vec::new(); order.len()];
            let mut points = Vec::with_capacity(acc.grid.len());
            for (&(m, n, k), &lat) in &acc.grid {
                let lat = match (dtype, flops) {
                    (Some(dt), Some(fl)) => lat.max(gemm_sol(&self.spec, dt, fl, m as f64, n as f64, k as f64)),
                    _ => lat,
                };
                curves[index[&(n, k)]].push((m, lat));
                points.push((vec![m as f64, n as f64, k as f64], lat));
            }
            out.insert(d, (Sites::new(order.into_iter().map(|(n, k)| vec![n, k]).collect(), curves), points));
        }
        Ok(out)
    }

    /// GEMM latency in ms for `m × k · k × n` in `dt`.
    /// A GEMM's latency in ms; `fp8_input` says its input is already FP8 (the output of an FP8
    /// producer), which matters to static FP8 only.
    pub fn gemm_op(&self, dt: Dtype, m: u32, n: u32, k: u32, fp8_input: bool) -> Result<f64> {
        if self.mode.is_sol() {
            // The roofline at the GEMM's own format (static FP8 included: the scaling kernels it
            // saves are rooflines taken off this one, so the floor below always holds).
            let flops = dt.flops(&self.spec)?;
            return Ok(gemm_sol(&self.spec, dt, flops, m as f64, n as f64, k as f64));
        }
        if dt != Dtype::Fp8Static {
            return self.gemm_by_mode(dt, m, n, k);
        }
        // Static scales skip the per-call scale computation, and on an FP8 input the scaling
        // pass too: the dynamic-FP8 time minus those kernels, never below the speed of light.
        let flops = dt.flops(&self.spec)?;
        let mut v = self.gemm_by_mode(dt, m, n, k)?;
        v -= self.scale_kernel_by_mode(ScaleKernel::ComputeScale, m, k)?;
        if fp8_input {
            v -= self.scale_kernel_by_mode(ScaleKernel::ScaleMatrix, m, k)?;
        }
        Ok(v.max(gemm_sol(&self.spec, dt, flops, m as f64, n as f64, k as f64)))
    }

    /// The GEMM kernel (static FP8 read from the dynamic-FP8 table) under the database mode.
    fn gemm_by_mode(&self, dt: Dtype, m: u32, n: u32, k: u32) -> Result<f64> {
        let table = if dt == Dtype::Fp8Static { Dtype::Fp8 } else { dt };
        match self.mode {
            DatabaseMode::Empirical => self.gemm_empirical(dt, m, n, k),
            DatabaseMode::Hybrid => match self.gemm(table, m, n, k) {
                Err(e) if missed(&e) => self.gemm_empirical(dt, m, n, k),
                r => r,
            },
            _ => self.gemm(table, m, n, k),
        }
    }

    /// The GEMM's SOL over the utilisation of its format's measured `(m, n, k)` points.
    fn gemm_empirical(&self, dt: Dtype, m: u32, n: u32, k: u32) -> Result<f64> {
        let table = if dt == Dtype::Fp8Static { Dtype::Fp8 } else { dt };
        let flops = dt.flops(&self.spec)?;
        let spec = &self.spec;
        let sol = move |c: &[f64]| gemm_sol(spec, dt, flops, c[0], c[1], c[2]);
        let grid = self.util.grid(&format!("gemm:{}", table.name()), || {
            match self.gemm.get_or_init(|| self.load_gemm()).as_ref() {
                Ok(t) => Ok(t.get(table.name()).map(|(_, pts)| UtilGrid::new(pts.iter().cloned(), sol))),
                Err(e) if missed(e) => Ok(None),
                Err(e) => Err(e.clone()),
            }
        })?;
        if grid.as_deref().is_none_or(UtilGrid::is_empty) {
            return Err(no_transfer(
                self.mode,
                &format!("the {} GEMM on {}", dt.name(), self.which()),
                "another format's utilisation (the cross-quant / cross-profile ladder)",
            ));
        }
        let q = [m as f64, n as f64, k as f64];
        empirical::estimate(sol(&q), &q, grid.as_deref(), 1.0, "GEMM")
    }

    /// A static-FP8 scaling kernel under the database mode.
    fn scale_kernel_by_mode(&self, which: ScaleKernel, m: u32, k: u32) -> Result<f64> {
        match self.mode {
            DatabaseMode::Empirical => self.scale_kernel_empirical(which, m, k),
            DatabaseMode::Hybrid => match self.scale_kernel(which, m, k) {
                Err(e) if missed(&e) => self.scale_kernel_empirical(which, m, k),
                r => r,
            },
            _ => self.scale_kernel(which, m, k),
        }
    }

    /// The empirical scaling kernel: the scale computation is a measured saving, taken from its
    /// nearest point (a zero stays zero); the scaling pass is a memory kernel, SOL over utilisation.
    fn scale_kernel_empirical(&self, which: ScaleKernel, m: u32, k: u32) -> Result<f64> {
        let (cell, srcs, name, passes) = match which {
            ScaleKernel::ComputeScale => (&self.compute_scale, &self.compute_scale_sources, "computescale", 2.0),
            ScaleKernel::ScaleMatrix => (&self.scale_matrix, &self.scale_matrix_sources, "scale_matrix", 3.0),
        };
        let points = || -> Result<Vec<(Vec<f64>, f64)>> {
            let tables = cell.get_or_init(|| self.load_scale_table(srcs, name)).as_ref().map_err(Clone::clone)?;
            let grid = tables
                .get(Dtype::Fp8.name())
                .ok_or_else(|| PerfError::data(format!("no fp8 {name} data for {}", self.which())))?;
            Ok(grid.node.leaves().into_iter().map(|(c, v)| (c.iter().map(|&x| x as f64).collect(), v)).collect())
        };
        let bw = self.spec.mem_bw;
        let sol = move |c: &[f64]| passes * c[0] * c[1] / bw * 1000.0;
        let q = [m as f64, k as f64];
        match which {
            ScaleKernel::ComputeScale => {
                let lookup = self.util.delta(name, || Ok(DeltaLookup::new(points()?)))?;
                lookup.estimate(&q, sol, name)
            }
            ScaleKernel::ScaleMatrix => {
                let grid = self.util.grid(name, || match points() {
                    Ok(p) => Ok(Some(UtilGrid::new(p, sol))),
                    Err(e) if missed(&e) => Ok(None),
                    Err(e) => Err(e),
                })?;
                empirical::estimate(sol(&q), &q, grid.as_deref(), 1.0, name)
            }
        }
    }

    /// One of the activation-scaling kernels static FP8 saves, at `m` tokens of width `k`, ms.
    /// The table is read at the nearest measured `(m, k)`; beyond it, `computescale` (an
    /// overhead) holds its boundary value and `scale_matrix` (a memory pass) grows with its
    /// speed of light.
    fn scale_kernel(&self, which: ScaleKernel, m: u32, k: u32) -> Result<f64> {
        let (cell, srcs, name) = match which {
            ScaleKernel::ComputeScale => (&self.compute_scale, &self.compute_scale_sources, "computescale"),
            ScaleKernel::ScaleMatrix => (&self.scale_matrix, &self.scale_matrix_sources, "scale_matrix"),
        };
        let tables = cell.get_or_init(|| self.load_scale_table(srcs, name)).as_ref().map_err(Clone::clone)?;
        let grid = tables.get(Dtype::Fp8.name()).ok_or_else(|| {
            PerfError::data(format!(
                "no fp8 {name} data for {} (have: {})",
                self.which(),
                tables.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let Node::Branch(rows) = &grid.node else {
            return Err(PerfError::data(format!("{name} table for {} is empty", self.which())));
        };
        let (Some((m_lo, _)), Some((m_hi, _))) = (rows.first(), rows.last()) else {
            return Err(PerfError::data(format!("{name} table for {} is empty", self.which())));
        };
        let mut k_range: Option<(u32, u32)> = None;
        for (_, row) in rows {
            if let Node::Branch(cols) = row {
                if let (Some((lo, _)), Some((hi, _))) = (cols.first(), cols.last()) {
                    k_range = Some(k_range.map_or((*lo, *hi), |(a, b)| (a.min(*lo), b.max(*hi))));
                }
            }
        }
        let (k_lo, k_hi) = k_range.unwrap_or((k, k));
        let (mc, kc) = (m.clamp(*m_lo, *m_hi), k.clamp(k_lo, k_hi));
        let passes = match which {
            ScaleKernel::ComputeScale => 2.0,
            ScaleKernel::ScaleMatrix => 3.0,
        };
        let bw = self.spec.mem_bw;
        let sol = move |c: &[f64]| passes * c[0] * c[1] / bw * 1000.0;
        let v = grid
            .query(&GridSpec::raw(&["m", "k"]), &sol, &[mc as f64, kc as f64])
            .map_err(|e| e.context(format!("{name} on {}", self.which())))?;
        if which == ScaleKernel::ComputeScale || (mc, kc) == (m, k) {
            return Ok(v);
        }
        let (edge, want) = (sol(&[mc as f64, kc as f64]), sol(&[m as f64, k as f64]));
        Ok(if edge > 0.0 && want > 0.0 { v * want / edge } else { v })
    }

    /// quant → `(m, k)` grid of one scaling-kernel table (first source wins per point).
    fn load_scale_table(&self, srcs: &[Source], name: &str) -> Result<BTreeMap<String, Grid>> {
        let mut by: BTreeMap<String, Node> = BTreeMap::new();
        for src in srcs {
            if !src.path.exists() {
                continue;
            }
            let t = Table::read(&src.path, &["quant_dtype", "m", "k", "latency", "kernel_source"])?;
            let (dt, m, k, lat, ks) = (
                t.text("quant_dtype")?,
                t.int("m")?,
                t.int("k")?,
                t.float("latency")?,
                t.text_or_none("kernel_source")?,
            );
            for i in 0..t.rows {
                if !keep_row(src, &ks[i]) {
                    continue;
                }
                let Some(d) = dt[i].as_deref() else { continue };
                let at = [key_u32(&t.path, "m", i, m[i])?, key_u32(&t.path, "k", i, k[i])?];
                slot(&mut by, d).insert_first_wins(&at, lat[i]);
            }
        }
        if by.is_empty() {
            return Err(no_rows(name, srcs, &self.spec, &self.backend, &self.version));
        }
        Ok(by.into_iter().map(|(d, node)| (d, Grid::new(node))).collect())
    }

    pub fn gemm(&self, dt: Dtype, m: u32, n: u32, k: u32) -> Result<f64> {
        let flops = dt.flops(&self.spec)?;
        if let Some(v) = self.gemm_cache.lock().expect("gemm cache").get(&(dt, m, n, k)) {
            return Ok(*v);
        }
        let tables = self.gemm.get_or_init(|| self.load_gemm()).as_ref().map_err(Clone::clone)?;
        let (sites, _) = tables.get(dt.name()).ok_or_else(|| {
            PerfError::data(format!(
                "no {} GEMM data for {} (have: {})",
                dt.name(),
                self.which(),
                tables.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let spec = &self.spec;
        let sol = move |c: &[f64]| gemm_sol(spec, dt, flops, c[0], c[1], c[2]);
        let v = sites
            .query(&GEMM_SPEC, &sol, &[m as f64, n as f64, k as f64])
            .map_err(|e| e.context(format!("GEMM {} on {}", dt.name(), self.which())))?;
        if v.is_finite() {
            self.gemm_cache.lock().expect("gemm cache").insert((dt, m, n, k), v);
        }
        Ok(v)
    }

    fn load_attention(&self, generation: bool) -> Result<(RawLanes, Vec<String>)> {
        let srcs = if generation { &self.gen_sources } else { &self.ctx_sources };
        let mut by_lane: RawLanes = BTreeMap::new();
        let mut lane_order: Vec<String> = Vec::new();
        for src in srcs {
            if !src.path.exists() {
                continue;
            }
            let t = Table::read(
                &src.path,
                &[
                    "batch_size",
                    "isl",
                    "num_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "attn_dtype",
                    "kv_cache_dtype",
                    "step",
                    "window_size",
                    "latency",
                    "kernel_source",
                ],
            )?;
            let (b, isl, nh, nkv, hd) = (
                t.int("batch_size")?,
                t.int("isl")?,
                t.int("num_heads")?,
                t.int("num_key_value_heads")?,
                t.int("head_dim")?,
            );
            let no_fmha = vec![None; if generation { t.rows } else { 0 }];
            let fmha = if generation { &no_fmha[..] } else { t.text("attn_dtype")? };
            let kvd = t.text("kv_cache_dtype")?;
            let step = if generation { t.int("step")? } else { vec![0; t.rows] };
            let win = t.int_or_none("window_size")?;
            let lat = t.float("latency")?;
            let ks = t.text_or_none("kernel_source")?;
            // Rows are grouped by (lane, shape key) borrowing the table's text, so that a row
            // costs a hash lookup (none while the key repeats) instead of copying its key; each
            // group's rows then go into their grid in table order (first wins, as before).
            type RowKey<'t> = (&'t str, &'t str, &'t str, u32, u32, u32);
            type Rows = Vec<([u32; 3], f64)>;
            let mut groups: HashMap<RowKey, usize> = HashMap::new();
            let mut grouped: Vec<(RowKey, Rows)> = Vec::new();
            let mut last: Option<(RowKey, usize)> = None;
            for i in 0..t.rows {
                if !keep_row(src, &ks[i]) {
                    continue;
                }
                let lane = ks[i].as_deref().filter(|s| !s.is_empty()).unwrap_or("default");
                if !lane_order.iter().any(|l| l == lane) {
                    lane_order.push(lane.to_owned());
                }
                let n = key_u32(&t.path, "num_heads", i, nh[i])?;
                let nk = key_u32(&t.path, "num_key_value_heads", i, nkv[i])?;
                let key: RowKey = (
                    lane,
                    fmha[i].as_deref().unwrap_or_default(),
                    kvd[i].as_deref().unwrap_or_default(),
                    mha_lookup(n, nk),
                    key_u32(&t.path, "head_dim", i, hd[i])?,
                    key_u32(&t.path, "window_size", i, win[i].unwrap_or(0))?,
                );
                let bb = key_u32(&t.path, "batch_size", i, b[i])?;
                let s = key_u32(&t.path, "isl", i, isl[i] + step[i])?;
                let path = if generation { [n, bb, s] } else { [n, s, bb] };
                let g = match last {
                    Some((k, g)) if k == key => g,
                    _ => *groups.entry(key).or_insert_with(|| {
                        grouped.push((key, Vec::new()));
                        grouped.len() - 1
                    }),
                };
                last = Some((key, g));
                grouped[g].1.push((path, lat[i]));
            }
            for ((lane, fmha, kv, n_kv, head, window), rows) in grouped {
                let node =
                    slot(&mut by_lane, lane).entry((fmha.to_owned(), kv.to_owned(), n_kv, head, window)).or_default();
                for (path, lat) in rows {
                    node.insert_first_wins(&path, lat);
                }
            }
        }
        if by_lane.is_empty() {
            let what = if generation { "generation attention" } else { "context attention" };
            return Err(no_rows(what, srcs, &self.spec, &self.backend, &self.version));
        }
        Ok((by_lane, lane_order))
    }

    fn ctx_tables(&self) -> Result<&Lanes<CtxKey>> {
        self.ctx
            .get_or_init(|| {
                let (raw, order) = self.load_attention(false)?;
                let lanes = raw
                    .into_iter()
                    .map(|(lane, m)| {
                        let m = m
                            .into_iter()
                            .map(|((fmha, kv, n_kv, head, window), node)| {
                                (CtxKey { fmha, kv, n_kv, head, window }, Grid::new(node))
                            })
                            .collect();
                        (lane, m)
                    })
                    .collect();
                Ok((lanes, order))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn gen_tables(&self) -> Result<&Lanes<GenKey>> {
        self.gen
            .get_or_init(|| {
                let (raw, order) = self.load_attention(true)?;
                let spec = &self.spec;
                let mut lanes = BTreeMap::new();
                for (lane, m) in raw {
                    let mut slices = BTreeMap::new();
                    for ((_, kv, n_kv, head, window), node) in m {
                        // Raise every point to at least its speed of light (load-time clamp).
                        let node = match Dtype::parse(&kv) {
                            Some(kvd) => match gen_attn_dtype(spec, kvd).flops(spec) {
                                Ok(fl) => {
                                    let mut clamped = Node::new();
                                    for (c, v) in node.leaves() {
                                        let s = gen_attn_sol(
                                            spec,
                                            n_kv,
                                            head,
                                            window,
                                            kvd,
                                            fl,
                                            c[0] as f64,
                                            c[1] as f64,
                                            c[2] as f64,
                                        );
                                        clamped.insert_first_wins(&c, v.max(s));
                                    }
                                    clamped
                                }
                                Err(_) => node,
                            },
                            None => node,
                        };
                        slices.insert(GenKey { kv, n_kv, head, window }, Grid::new(node));
                    }
                    lanes.insert(lane, slices);
                }
                Ok((lanes, order))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn lane_slice<'a, K: Ord>(lanes: &'a Lanes<K>, lane_order: &[String], key: &K) -> Option<(String, &'a Grid)> {
        for lane in lane_order {
            if let Some(g) = lanes.0.get(lane).and_then(|m| m.get(key)) {
                return Some((lane.clone(), g));
            }
        }
        for lane in &lanes.1 {
            if lane_order.contains(lane) {
                continue;
            }
            if let Some(g) = lanes.0.get(lane).and_then(|m| m.get(key)) {
                return Some((lane.clone(), g));
            }
        }
        None
    }

    /// The attention grid of `key` (`what`: "context attention", "generation attention") from
    /// the first lane that has it, as [`Database::lane_slice`] orders them; an error names the
    /// key and the kernel lanes there are.
    fn attention_grid<'a, K: Ord + fmt::Display>(
        &self,
        tables: &'a Lanes<K>,
        lanes: &[String],
        key: &K,
        what: &str,
    ) -> Result<&'a Grid> {
        let (_, grid) = Self::lane_slice(tables, lanes, key).ok_or_else(|| {
            PerfError::data(format!(
                "no {what} data for {key} on {} (kernel lanes {})",
                self.which(),
                tables.1.join(", ")
            ))
        })?;
        Ok(grid)
    }

    /// This database as messages name it: `system / backend version`.
    pub(crate) fn which(&self) -> String {
        format!("{} / {} {}", self.spec.name, self.backend, self.version)
    }

    /// Context attention table value (full attention over `full_s` tokens), ms.
    #[allow(clippy::too_many_arguments)]
    pub fn context_attention(
        &self,
        lanes: &[String],
        b: u32,
        full_s: u32,
        n: u32,
        n_kv: u32,
        head: u32,
        window: u32,
        kv: Dtype,
        fmha: Dtype,
    ) -> Result<f64> {
        let flops = fmha.flops(&self.spec)?;
        let tables = self.ctx_tables()?;
        let key = CtxKey { fmha: fmha.name().into(), kv: kv.name().into(), n_kv: mha_lookup(n, n_kv), head, window };
        let grid = self.attention_grid(tables, lanes, &key, "context attention")?;
        let spec = &self.spec;
        let n_kv_l = key.n_kv;
        let sol = move |c: &[f64]| ctx_attn_sol(spec, n_kv_l, head, window, kv, flops, c[0], c[1], c[2]);
        grid.query(&CTX_SPEC, &sol, &[n as f64, full_s as f64, b as f64])
            .map_err(|e| e.context(format!("context attention on {}", self.which())))
    }

    /// Generation attention table value, averaged over 5 KV lengths within ±10 % of `s`, ms.
    #[allow(clippy::too_many_arguments)]
    pub fn generation_attention(
        &self,
        lanes: &[String],
        b: u32,
        s: u32,
        n: u32,
        n_kv: u32,
        head: u32,
        window: u32,
        kv: Dtype,
    ) -> Result<f64> {
        let flops = gen_attn_dtype(&self.spec, kv).flops(&self.spec)?;
        let tables = self.gen_tables()?;
        let key = GenKey { kv: kv.name().into(), n_kv: mha_lookup(n, n_kv), head, window };
        let grid = self.attention_grid(tables, lanes, &key, "generation attention")?;
        let spec = &self.spec;
        let n_kv_l = key.n_kv;
        let sol = move |c: &[f64]| gen_attn_sol(spec, n_kv_l, head, window, kv, flops, c[0], c[1], c[2]);
        let s_min = ((s as f64 * 0.9) as u32).max(1);
        let s_max = ((s as f64 * 1.1) as u32).max(s_min);
        let mut sum = 0.0;
        for i in 0..5u64 {
            let si = s_min + ((u64::from(s_max - s_min) * i) / 4) as u32;
            sum += grid
                .query(&GEN_SPEC, &sol, &[n as f64, b as f64, si as f64])
                .map_err(|e| e.context(format!("generation attention on {}", self.which())))?;
        }
        Ok(sum / 5.0)
    }

    /// The math term of the generation attention SOL for `b` requests of one query token
    /// each over `s` KV tokens, ms: the floor a block-verify pass of `w` query tokens per
    /// request scales by `w`.
    #[allow(clippy::too_many_arguments)]
    pub fn generation_attention_math_ms(
        &self,
        b: u32,
        s: u32,
        n: u32,
        n_kv: u32,
        head: u32,
        window: u32,
        kv: Dtype,
    ) -> Result<f64> {
        let flops = gen_attn_dtype(&self.spec, kv).flops(&self.spec)?;
        Ok(gen_attn_sol_parts(&self.spec, n_kv, head, window, kv, flops, n as f64, b as f64, s as f64).0)
    }

    /// Whether some lane has a context (`generation`: decode) attention slice like `key` at
    /// another head size: the reference would then borrow that head size's utilisation.
    fn other_head_size<K: Ord>(lanes: &Lanes<K>, same: impl Fn(&K) -> bool) -> bool {
        lanes.0.values().any(|m| m.keys().any(&same))
    }

    /// Context attention under EMPIRICAL: the SOL of `s` new tokens after `prefix` cached ones
    /// over the utilisation of the slice's measured full-attention points (a sliding window's
    /// own slice first, then full attention's), ms.
    #[allow(clippy::too_many_arguments)]
    pub fn context_attention_empirical(
        &self,
        lanes: &[String],
        b: u32,
        s: u32,
        prefix: u32,
        n: u32,
        n_kv: u32,
        head: u32,
        window: u32,
        kv: Dtype,
        fmha: Dtype,
    ) -> Result<f64> {
        let spec = &self.spec;
        let flops = fmha.flops(spec)?;
        let (fb, fs, fp) = (b as f64, s as f64, prefix as f64);
        let sol_q = ctx_attn_sol_prefix(spec, head, window, kv, flops, fb, fs, fp, n as f64, n_kv as f64);
        let q = [n as f64, fs + fp, fb];
        let n_kv_l = mha_lookup(n, n_kv);
        let tables = self.ctx_tables();
        self.attention_empirical(
            "context attention",
            tables,
            lanes,
            window,
            |w| CtxKey { fmha: fmha.name().into(), kv: kv.name().into(), n_kv: n_kv_l, head, window: w },
            |k, key| {
                k.fmha == key.fmha
                    && k.kv == key.kv
                    && k.n_kv == key.n_kv
                    && k.window == key.window
                    && k.head != key.head
                    && k.head != 0
            },
            |w, c| ctx_attn_sol(spec, n_kv_l, head, w, kv, flops, c[0], c[1], c[2]),
            sol_q,
            &q,
        )
    }

    /// Generation attention under EMPIRICAL: the SOL of `b` requests over `s` KV tokens over the
    /// utilisation of the slice's measured (SOL-raised) points, ms.
    #[allow(clippy::too_many_arguments)]
    pub fn generation_attention_empirical(
        &self,
        lanes: &[String],
        b: u32,
        s: u32,
        n: u32,
        n_kv: u32,
        head: u32,
        window: u32,
        kv: Dtype,
    ) -> Result<f64> {
        let spec = &self.spec;
        let flops = gen_attn_dtype(spec, kv).flops(spec)?;
        let n_kv_l = mha_lookup(n, n_kv);
        let q = [n as f64, b as f64, s as f64];
        let sol_q = gen_attn_sol(spec, n_kv_l, head, window, kv, flops, q[0], q[1], q[2]);
        let tables = self.gen_tables();
        self.attention_empirical(
            "generation attention",
            tables,
            lanes,
            window,
            |w| GenKey { kv: kv.name().into(), n_kv: n_kv_l, head, window: w },
            |k, key| {
                k.kv == key.kv && k.n_kv == key.n_kv && k.window == key.window && k.head != key.head && k.head != 0
            },
            |w, c| gen_attn_sol(spec, n_kv_l, head, w, kv, flops, c[0], c[1], c[2]),
            sol_q,
            &q,
        )
    }

    /// An attention slice under EMPIRICAL (`what` names it): for the query's window, then (a
    /// windowed query) full attention, the utilisation of the first lane holding the slice
    /// (`key_at(window)`) applied to the query's SOL `sol_q`. A slice without points where
    /// another head size has them (`same_but_head`: the slice's key but for its head size, not 0)
    /// is refused: the reference would borrow that utilisation. With no points anywhere, the SOL
    /// alone.
    #[allow(clippy::too_many_arguments)]
    fn attention_empirical<K: Ord + std::fmt::Display>(
        &self,
        what: &str,
        tables: Result<&Lanes<K>>,
        lanes: &[String],
        window: u32,
        key_at: impl Fn(u32) -> K,
        same_but_head: impl Fn(&K, &K) -> bool,
        sol_at: impl Fn(u32, &[f64]) -> f64,
        sol_q: f64,
        q: &[f64],
    ) -> Result<f64> {
        let tables = match tables {
            Ok(t) => Some(t),
            Err(e) if missed(&e) => None,
            Err(e) => return Err(e),
        };
        let lane_key = lanes.join(">");
        let windows: &[u32] = if window > 0 { &[window, 0] } else { &[0] };
        for &w in windows {
            let key = key_at(w);
            let grid = self.util.grid(&format!("{what}:{lane_key}:{key}"), || {
                Ok(tables.and_then(|t| Self::lane_slice(t, lanes, &key)).map(|(_, g)| {
                    let pts = g.node.leaves().into_iter().map(|(c, v)| (c.iter().map(|&x| x as f64).collect(), v));
                    UtilGrid::new(pts, |c: &[f64]| sol_at(w, c))
                }))
            })?;
            if grid.as_deref().is_some_and(|g| !g.is_empty()) {
                return empirical::estimate(sol_q, q, grid.as_deref(), 1.0, what);
            }
            if tables.is_some_and(|t| Self::other_head_size(t, |k| same_but_head(k, &key))) {
                return Err(no_transfer(
                    self.mode,
                    &format!("{what} {key} on {}", self.which()),
                    "another head size's utilisation (the cross-shape transfer)",
                ));
            }
        }
        empirical::estimate(sol_q, q, None, 1.0, &format!("{what} on {}", self.which()))
    }

    fn ar_table(&self) -> Result<&BTreeMap<u32, Curve>> {
        self.ar
            .get_or_init(|| {
                let mut by: BTreeMap<u32, BTreeMap<u64, f64>> = BTreeMap::new();
                let b60 = self.spec.name == "b60";
                for src in &self.ar_sources {
                    if !src.path.exists() {
                        continue;
                    }
                    let t =
                        Table::read(&src.path, &["num_gpus", "message_size", "latency", "kernel_source", "backend"])?;
                    let (g, sz, lat) = (t.int("num_gpus")?, t.int("message_size")?, t.float("latency")?);
                    let (ks, be) = (t.text_or_none("kernel_source")?, t.text_or_none("backend")?);
                    for i in 0..t.rows {
                        if !keep_row(src, &ks[i]) {
                            continue;
                        }
                        let eager = |x: &Option<String>| x.as_deref().is_some_and(|s| s.ends_with("_eager"));
                        if !b60 && (eager(&ks[i]) || eager(&be[i])) {
                            continue;
                        }
                        let size = u64::try_from(sz[i])
                            .map_err(|_| PerfError::data(format!("{}: bad message_size in row {i}", t.path)))?;
                        by.entry(key_u32(&t.path, "num_gpus", i, g[i])?).or_default().entry(size).or_insert(lat[i]);
                    }
                }
                if by.is_empty() {
                    return Err(no_rows(
                        "custom all-reduce",
                        &self.ar_sources,
                        &self.spec,
                        &self.backend,
                        &self.version,
                    ));
                }
                Ok(by.into_iter().map(|(g, m)| (g, Curve { points: m.into_iter().collect() })).collect())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Custom all-reduce of `elements` half-precision elements over `tp` GPUs, ms.
    pub fn custom_allreduce(&self, tp: u32, elements: f64) -> Result<f64> {
        if tp <= 1 {
            return Ok(0.0);
        }
        if self.mode.is_sol() {
            // A ring all-reduce of half-precision elements at the group's link bandwidth (no
            // NVL72 NCCL reroute: that is the measured path's).
            let n = tp as f64;
            return Ok(2.0 * elements * 2.0 / n * (n - 1.0) / self.spec.p2p_bandwidth(tp) * 1000.0);
        }
        let per_node = self.spec.gpus_per_node;
        // NVL72 reroutes to NCCL in the modes that read the table first (EMPIRICAL never does).
        if per_node == 72 && tp > 4 && self.mode != DatabaseMode::Empirical {
            return self.nccl("half", "all_reduce", tp, elements);
        }
        match self.mode {
            DatabaseMode::Empirical => self.custom_allreduce_empirical(tp, elements),
            DatabaseMode::Hybrid => match self.custom_allreduce_table(tp, elements) {
                Err(e) if missed(&e) => self.custom_allreduce_empirical(tp, elements),
                r => r,
            },
            _ => self.custom_allreduce_table(tp, elements),
        }
    }

    /// The ring all-reduce bound of `elements` half-precision elements over `tp` GPUs, ms.
    fn ring_allreduce_sol(&self, tp: u32, elements: f64) -> f64 {
        let n = tp as f64;
        2.0 * elements * 2.0 / n * (n - 1.0) / self.spec.p2p_bandwidth(tp) * 1000.0
    }

    /// The all-reduce bound over the utilisation of the measured curve of the largest fan-out
    /// slice that applies (the SOL carries the fan-out beyond it), ms.
    fn custom_allreduce_empirical(&self, tp: u32, elements: f64) -> Result<f64> {
        let sol_q = self.ring_allreduce_sol(tp, elements);
        if sol_q <= 0.0 {
            return Ok(sol_q);
        }
        let per_node = self.spec.gpus_per_node;
        let table = match self.ar_table() {
            Ok(t) => Some(t),
            Err(e) if missed(&e) => None,
            Err(e) => return Err(e),
        };
        let eff = table.and_then(|t| fanout_slice(t.keys().copied(), tp, per_node)).unwrap_or(tp.min(per_node));
        let grid = self.util.grid(&format!("custom_allreduce:{eff}"), || {
            Ok(table.and_then(|t| t.get(&eff)).filter(|c| !c.points.is_empty()).map(|c| {
                let pts = c.points.iter().map(|&(x, v)| (vec![x as f64], v));
                UtilGrid::new(pts, |c: &[f64]| self.ring_allreduce_sol(eff, c[0]))
            }))
        })?;
        empirical::estimate(sol_q, &[elements], grid.as_deref(), 1.0, &format!("custom all-reduce over {eff} GPUs"))
    }

    fn custom_allreduce_table(&self, tp: u32, elements: f64) -> Result<f64> {
        let per_node = self.spec.gpus_per_node;
        let table = self.ar_table()?;
        let eff = fanout_slice(table.keys().copied(), tp, per_node).unwrap_or(tp.min(per_node));
        let curve = table.get(&eff).ok_or_else(|| {
            PerfError::data(format!(
                "no custom all-reduce data for {eff} GPUs on {} (have {:?})",
                self.which(),
                table.keys().collect::<Vec<_>>()
            ))
        })?;
        let mut v = curve.query(elements, "custom all-reduce")?;
        if eff < tp {
            v *= scale_beyond(&self.spec, tp, eff);
        }
        Ok(v)
    }

    fn nccl_table(&self) -> Result<&NcclCurves> {
        self.nccl
            .get_or_init(|| {
                let path = nccl_source(&self.spec).ok_or_else(|| {
                    PerfError::data(format!(
                        "no NCCL data for {} (misc.nccl_version {:?} under {})",
                        self.spec.name,
                        self.spec.nccl_version,
                        self.spec.data_dir.display()
                    ))
                })?;
                let t = Table::read(&path, &["nccl_dtype", "op_name", "num_gpus", "message_size", "latency"])?;
                let (dt, op, g, sz, lat) = (
                    t.text("nccl_dtype")?,
                    t.text("op_name")?,
                    t.int("num_gpus")?,
                    t.int("message_size")?,
                    t.float("latency")?,
                );
                let mut by: BTreeMap<(String, String, u32), BTreeMap<u64, f64>> = BTreeMap::new();
                for i in 0..t.rows {
                    let key = (
                        dt[i].clone().unwrap_or_default(),
                        op[i].clone().unwrap_or_default(),
                        key_u32(&t.path, "num_gpus", i, g[i])?,
                    );
                    by.entry(key).or_default().entry(sz[i].max(0) as u64).or_insert(lat[i]);
                }
                Ok(by.into_iter().map(|(k, m)| (k, Curve { points: m.into_iter().collect() })).collect())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// An NCCL collective over `gpus` GPUs of `size` elements, ms.
    pub fn nccl(&self, dtype: &str, op: &str, gpus: u32, size: f64) -> Result<f64> {
        if gpus <= 1 {
            return Ok(0.0);
        }
        match self.mode {
            DatabaseMode::Sol => nccl_sol(&self.spec, dtype, op, gpus, size),
            DatabaseMode::Empirical => self.nccl_empirical(dtype, op, gpus, size),
            DatabaseMode::Hybrid => match self.nccl_measured(dtype, op, gpus, size) {
                Err(e) if missed(&e) => self.nccl_empirical(dtype, op, gpus, size),
                r => r,
            },
            DatabaseMode::Silicon => self.nccl_measured(dtype, op, gpus, size),
        }
    }

    /// The collective's bound over the utilisation of the measured curve at `gpus`, or at the
    /// largest fan-out measured (the SOL carrying the rest), ms.
    fn nccl_empirical(&self, dtype: &str, op: &str, gpus: u32, size: f64) -> Result<f64> {
        let sol_q = nccl_sol(&self.spec, dtype, op, gpus, size)?;
        if sol_q <= 0.0 {
            return Ok(sol_q);
        }
        let table = self.nccl_table()?;
        let max = table.keys().filter(|(d, o, _)| d == dtype && o == op).map(|(_, _, g)| *g).max();
        let max = max.ok_or_else(|| {
            PerfError::data(format!("no NCCL {op} {dtype} data on {} for the empirical estimate", self.spec.name))
        })?;
        let eff = gpus.min(max);
        let grid = self.util.grid(&format!("nccl:{dtype}:{op}:{eff}"), || {
            Ok(table.get(&(dtype.to_string(), op.to_string(), eff)).filter(|c| !c.points.is_empty()).map(|c| {
                let pts = c.points.iter().map(|&(x, v)| (vec![x as f64], v));
                UtilGrid::new(pts, |c: &[f64]| nccl_sol(&self.spec, dtype, op, eff, c[0]).unwrap_or(0.0))
            }))
        })?;
        empirical::estimate(sol_q, &[size], grid.as_deref(), 1.0, &format!("NCCL {op} over {eff} GPUs"))
    }

    fn nccl_measured(&self, dtype: &str, op: &str, gpus: u32, size: f64) -> Result<f64> {
        let table = self.nccl_table()?;
        let fanouts = table.keys().filter(|(d, o, _)| d == dtype && o == op).map(|(_, _, g)| *g);
        let eff = fanout_slice(fanouts, gpus, self.spec.gpus_per_node).unwrap_or(gpus);
        let curve = table.get(&(dtype.to_string(), op.to_string(), eff)).ok_or_else(|| {
            PerfError::data(format!("no NCCL {op} {dtype} data for {eff} GPUs on {}", self.spec.name))
        })?;
        let mut v = curve.query(size, "NCCL")?;
        if gpus > eff {
            v *= scale_beyond(&self.spec, gpus, eff);
        }
        Ok(v)
    }
}

/// An NCCL collective's bandwidth bound, ms: `size` elements of `dtype` over `gpus` GPUs' links.
fn nccl_sol(spec: &SystemSpec, dtype: &str, op: &str, gpus: u32, size: f64) -> Result<f64> {
    let bytes = match dtype {
        "half" => 2.0,
        other => return Err(PerfError::unsupported(format!("NCCL {op}: no SOL model for {other:?} elements"))),
    };
    let n = gpus as f64;
    let passes = match op {
        "all_gather" | "alltoall" | "reduce_scatter" => 1.0,
        "all_reduce" => 2.0,
        other => return Err(PerfError::unsupported(format!("no SOL model for the NCCL collective {other:?}"))),
    };
    Ok(passes * bytes * size * (n - 1.0) / n / spec.p2p_bandwidth(gpus) * 1000.0)
}

fn fanout_slice(fanouts: impl Iterator<Item = u32>, requested: u32, per_node: u32) -> Option<u32> {
    let mut max = None;
    let mut below = None;
    for f in fanouts {
        max = Some(max.map_or(f, |m: u32| m.max(f)));
        if f <= requested {
            below = Some(below.map_or(f, |m: u32| m.max(f)));
        }
    }
    max.map(|max| if requested <= per_node { requested.min(max) } else { below.unwrap_or(per_node) })
}

fn scale_beyond(spec: &SystemSpec, n: u32, m: u32) -> f64 {
    let (fnn, fm) = (n as f64, m as f64);
    (fnn - 1.0) / fnn * fm / (fm - 1.0).max(1.0) * spec.p2p_bandwidth(m) / spec.p2p_bandwidth(n)
}

impl Database {
    /// Kernel lanes of an attention table with their density `(lane, slices, points)`, in the
    /// order rows were first seen.
    pub fn attention_lanes(&self, generation: bool) -> Result<Vec<(String, usize, usize)>> {
        fn density<K>(lanes: &Lanes<K>) -> Vec<(String, usize, usize)> {
            lanes
                .1
                .iter()
                .filter_map(|l| {
                    lanes.0.get(l).map(|m| (l.clone(), m.len(), m.values().map(|g| g.node.leaves().len()).sum()))
                })
                .collect()
        }
        Ok(if generation { density(self.gen_tables()?) } else { density(self.ctx_tables()?) })
    }
}

//! Nemotron-H (NVIDIA Nemotron-3 Nano / Super / Ultra): Mamba2, attention, MoE and MLP layers
//! in one stack, as the reference's `NemotronHModel` (family `NEMOTRONH`) times it, and the
//! Mamba2 kernel op it adds.
//!
//! The config's layer string (`hybrid_override_pattern`, or `layers_block_type` spelled out)
//! gives each layer a kind: `M` Mamba2, `*` attention, `E` MoE (relu² experts beside one relu²
//! shared expert; Super and Ultra route in a `moe_latent_size` projection), `-` a relu² MLP.
//! The op list carries one chain per kind present, scaled by its layer count.
//!
//! A Mamba2 layer's two kernels (the causal conv1d and the SSM scan) are looked up at the
//! model's whole widths (the collector's shapes do not split by tensor parallelism) in
//! `mamba2_perf` (context: a `(batch, seq_len)` grid of the exact shape, else of the first
//! shape of the same kernel and `d_model`) and otherwise priced by their memory roofline. The
//! reference never reads the table's decode rows (its loader leaves them empty), so decode
//! kernels are always the roofline; so are the kernels of systems / backends without the table.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::db::{keep_row, Database, Dtype};
use crate::error::{ErrorKind, PerfError, Result};
use crate::interp::{Grid, GridSpec, Node};
use crate::model::{attention_op, logits_gemm, AttentionHeads, Layout, ModelSpec, Op};
use crate::moe_ops::{DispatchOp, MoeOp, MLA_DISTRIBUTION};
use crate::parquet_table::{key_u32, Table};

/// The architecture this module builds.
pub const ARCH: &str = "NemotronHForCausalLM";
/// The Mamba2 kernel table.
pub const TABLE_FILE: &str = "mamba2_perf.parquet";
const CONTEXT_SPEC: GridSpec = GridSpec::raw(&["batch", "seq_len"]);

/// What the layer string and the Mamba2 / MoE widths add to a model's facts.
#[derive(Clone, Debug, PartialEq)]
pub struct NemotronHSpec {
    /// Layers per kind: `[Mamba2 (M), MoE (E), attention (*), MLP (-)]`.
    pub counts: [u32; 4],
    pub mamba_heads: u32,
    pub mamba_head_dim: u32,
    pub d_state: u32,
    pub d_conv: u32,
    pub n_groups: u32,
    pub chunk_size: u32,
    /// Intermediate width of the MoE layers' shared expert (0: none).
    pub shared_inter: u32,
    /// Width the routed experts run in (0: the hidden size).
    pub latent: u32,
}

const MAMBA: usize = 0;
const MOE: usize = 1;
const ATTENTION: usize = 2;
const MLP: usize = 3;

/// The layer kinds of a Nemotron-H config: `hybrid_override_pattern`, else `layers_block_type`
/// (names such as `mamba`, `moe`, `attention`, `mlp`, or the pattern letters).
pub fn layer_pattern(cfg: &Value, shown: &str) -> Result<String> {
    if let Some(p) = cfg.get("hybrid_override_pattern").and_then(Value::as_str) {
        return Ok(p.to_string());
    }
    let blocks = cfg.get("layers_block_type").and_then(Value::as_array).ok_or_else(|| {
        PerfError::config(format!("{shown}: {ARCH} needs hybrid_override_pattern or layers_block_type"))
    })?;
    blocks
        .iter()
        .map(|b| {
            let name = b.as_str().unwrap_or_default();
            match name {
                "mamba" | "linear_attention" | "M" => Ok('M'),
                "moe" | "E" => Ok('E'),
                "attention" | "full_attention" | "*" => Ok('*'),
                "mlp" | "dense" | "ffn" | "-" => Ok('-'),
                _ => Err(PerfError::config(format!(
                    "{shown}: layers_block_type entry {b} is not a Nemotron-H layer kind (mamba, linear_attention, \
                     moe, attention, full_attention, mlp, dense, ffn)"
                ))),
            }
        })
        .collect()
}

/// The Nemotron-H facts of a config (its layer string checked for unknown kinds, its Mamba2
/// widths required; the shared expert and latent width optional).
pub fn spec_from_config(cfg: &Value, shown: &str) -> Result<NemotronHSpec> {
    let pattern = layer_pattern(cfg, shown)?;
    let mut counts = [0u32; 4];
    for (i, c) in pattern.chars().enumerate() {
        let kind = match c {
            'M' => MAMBA,
            'E' => MOE,
            '*' => ATTENTION,
            '-' => MLP,
            _ => {
                return Err(PerfError::config(format!(
                    "{shown}: hybrid_override_pattern layer {i} is {c:?}; expected M (Mamba2), E (MoE), * (attention) \
                     or - (MLP)"
                )))
            }
        };
        counts[kind] += 1;
    }
    let need = |k: &str| {
        cfg.get(k)
            .and_then(Value::as_u64)
            .filter(|&v| v > 0 && v <= u32::MAX as u64)
            .map(|v| v as u32)
            .ok_or_else(|| PerfError::config(format!("{shown}: {ARCH} needs a positive integer {k}")))
    };
    let optional = |k: &str| cfg.get(k).and_then(Value::as_u64).map(|v| v as u32).unwrap_or(0);
    Ok(NemotronHSpec {
        counts,
        mamba_heads: need("mamba_num_heads")?,
        mamba_head_dim: need("mamba_head_dim")?,
        d_state: need("ssm_state_size")?,
        d_conv: need("conv_kernel")?,
        n_groups: need("n_groups")?,
        chunk_size: need("chunk_size")?,
        shared_inter: optional("moe_shared_expert_intermediate_size"),
        latent: optional("moe_latent_size"),
    })
}

/// The number of layers: `num_hidden_layers`, else the layer string's length (Ultra gives only
/// `layers_block_type`).
pub fn layer_count(cfg: &Value, shown: &str) -> Result<u32> {
    match cfg.get("num_hidden_layers").and_then(Value::as_u64) {
        Some(n) => Ok(n as u32),
        None => Ok(layer_pattern(cfg, shown)?.chars().count() as u32),
    }
}

/// One of a Mamba2 layer's two kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// The causal depthwise conv1d over the x / B / C channels.
    Conv,
    /// The selective-scan (SSM) kernel.
    Ssm,
}

/// A Mamba2 kernel of `scale` layers, at the model's whole widths.
#[derive(Clone, Debug, PartialEq)]
pub struct Mamba2Op {
    pub name: String,
    pub scale: f64,
    pub kernel: Kernel,
    /// Prefill (else decode).
    pub context: bool,
    pub d_model: u32,
    pub d_state: u32,
    pub d_conv: u32,
    pub nheads: u32,
    pub head_dim: u32,
    pub n_groups: u32,
    pub chunk_size: u32,
}

impl Mamba2Op {
    /// The kernel's name in `mamba2_perf` (the collector's routine per phase).
    pub fn kernel_source(&self) -> &'static str {
        match (self.kernel, self.context) {
            (Kernel::Conv, true) => "causal_conv1d_fn",
            (Kernel::Conv, false) => "causal_conv1d_update",
            (Kernel::Ssm, true) => "mamba_chunk_scan_combined",
            (Kernel::Ssm, false) => "selective_state_update",
        }
    }

    /// The memory roofline of one layer at `batch` requests of `seq` new tokens (decode: one
    /// token each), ms: bf16 reads and writes of the kernel's channels over the GPU's bandwidth.
    pub fn sol_ms(&self, mem_bw: f64, batch: f64, seq: f64) -> f64 {
        let (heads, n_groups, d_state) = (self.nheads as f64, self.n_groups as f64, self.d_state as f64);
        let d_inner = heads * self.head_dim as f64;
        let x = if self.context && seq > 0.0 { batch * seq } else { batch };
        let bytes = match self.kernel {
            Kernel::Conv => {
                let channels = d_inner + 2.0 * n_groups * d_state;
                x * channels * (self.d_conv as f64 + 1.0) * 2.0 + x * channels * 2.0
            }
            Kernel::Ssm => x * (d_inner + 2.0 * n_groups * d_state + heads) * 2.0 + x * d_inner * 2.0,
        };
        bytes / mem_bw.max(1.0) * 1000.0
    }

    fn key(&self) -> ShapeKey {
        (
            self.kernel_source().to_string(),
            if self.context { "context" } else { "generation" }.to_string(),
            [self.d_model, self.d_state, self.d_conv, self.nheads, self.head_dim, self.n_groups, self.chunk_size],
        )
    }
}

/// kernel source, phase, `[d_model, d_state, d_conv, nheads, head_dim, n_groups, chunk_size]`.
type ShapeKey = (String, String, [u32; 7]);

/// The context rows of one `mamba2_perf` source set: shape → `(batch, seq_len)` grid.
#[derive(Debug, Default)]
pub struct Mamba2Table {
    grids: BTreeMap<ShapeKey, Grid>,
}

/// Tables by the source files they were read from (a database's resolved sources), read once.
type Cache = Mutex<HashMap<Vec<PathBuf>, Arc<Mamba2Table>>>;
static TABLES: OnceLock<Cache> = OnceLock::new();

/// The `mamba2_perf` context rows a database resolves (first source wins per point; no file:
/// an empty table, which every query misses).
fn table(db: &Database) -> Result<Arc<Mamba2Table>> {
    let srcs = crate::systems::sources(&db.spec, &db.backend, &db.version, TABLE_FILE, db.shared_layer)?;
    let paths: Vec<PathBuf> = srcs.iter().map(|s| s.path.clone()).collect();
    let cache = TABLES.get_or_init(Default::default);
    if let Some(t) = cache.lock().expect("mamba2 tables").get(&paths) {
        return Ok(t.clone());
    }
    let mut nodes: BTreeMap<ShapeKey, Node> = BTreeMap::new();
    for src in &srcs {
        if !src.path.is_file() {
            continue;
        }
        let cols = [
            "kernel_source",
            "phase",
            "batch_size",
            "seq_len",
            "d_model",
            "d_state",
            "d_conv",
            "nheads",
            "head_dim",
            "n_groups",
            "chunk_size",
            "latency",
        ];
        let t = Table::read(&src.path, &cols)?;
        let p = t.path.clone();
        let ks = t.text("kernel_source")?;
        let phase = t.text("phase")?;
        let ints: Vec<Vec<i64>> = cols[2..11].iter().map(|c| t.int(c)).collect::<Result<_>>()?;
        let latency = t.float("latency")?;
        for i in 0..t.rows {
            if !keep_row(src, &ks[i]) || phase[i].as_deref() != Some("context") {
                continue;
            }
            let mut v = [0u32; 9];
            for (j, col) in cols[2..11].iter().enumerate() {
                v[j] = key_u32(&p, col, i, ints[j][i])?;
            }
            let key =
                (ks[i].clone().unwrap_or_default(), "context".to_string(), [v[2], v[3], v[4], v[5], v[6], v[7], v[8]]);
            nodes.entry(key).or_default().insert_first_wins(&[v[0], v[1]], latency[i]);
        }
    }
    let t = Arc::new(Mamba2Table { grids: nodes.into_iter().map(|(k, n)| (k, Grid::new(n))).collect() });
    cache.lock().expect("mamba2 tables").insert(paths, t.clone());
    Ok(t)
}

/// `op`'s latency at `batch` requests of `s` new tokens each (decode: `batch` tokens), ms.
pub fn eval_mamba2(db: &Database, op: &Mamba2Op, batch: u32, s: u32) -> Result<f64> {
    if db.mode.is_empirical() {
        return Err(PerfError::unsupported(format!(
            "database_mode {} is not modelled for the Mamba2 kernels (op {}): servesim lacks their empirical \
             estimate (use database_mode SILICON or SOL)",
            db.mode.name(),
            op.name
        )));
    }
    let mem_bw = db.spec.mem_bw;
    let sol = |b: f64, s: f64| op.sol_ms(mem_bw, b, s);
    let (b, sf) = (batch as f64, s as f64);
    // Decode rows are never read (see the module docs); a prefill of no new tokens, a SOL
    // database and a table miss all take the roofline.
    if db.mode.is_sol() || !op.context || s == 0 {
        return Ok(sol(b, sf).max(0.0) * op.scale);
    }
    let t = table(db)?;
    let key = op.key();
    let grid = t
        .grids
        .get(&key)
        .or_else(|| t.grids.iter().find(|(k, _)| k.0 == key.0 && k.1 == key.1 && k.2[0] == key.2[0]).map(|(_, g)| g));
    let v = match grid {
        Some(g) => match g.query(&CONTEXT_SPEC, &|q: &[f64]| sol(q[0], q[1]), &[b, sf]) {
            Ok(v) => v,
            Err(e) if matches!(e.kind, ErrorKind::Data | ErrorKind::NoAnchor) => sol(b, sf),
            Err(e) => return Err(e),
        },
        None => sol(b, sf),
    };
    Ok(v.max(0.0) * op.scale)
}

/// `(context ops, generation ops)`: the embedding, then per layer kind present, scaled by its
/// layer count (generation also by MTP's `(L + nextn) / L`):
///
/// ```text
/// M: norm, in_proj GEMM, conv1d, SSM, out_proj GEMM, all-reduce
/// *: norm, qkv GEMM, attention, proj GEMM, all-reduce
/// E: norm, shared up GEMM, relu², shared down GEMM, router GEMM, [fc1 latent GEMM],
///    dispatch, experts (not gated), combine, [fc2 latent GEMM], all-reduce
/// -: norm, up GEMM, relu², down GEMM, all-reduce
/// ```
///
/// then the pipeline hand-off and the logits GEMM (in both phases).
pub fn build_nemotron_h_ops(m: &ModelSpec, nh: &NemotronHSpec, l: &Layout) -> Result<(Vec<Op>, Vec<Op>)> {
    let (tp, h) = (l.tp, m.hidden);
    if l.ngram > 0 {
        return Err(PerfError::unsupported(format!(
            "{}: ngram verification of Nemotron-H (Mamba2 state across draft tokens) is not modelled",
            m.name
        )));
    }
    // (Prefill CP never gets here: the reference's Nemotron-H class claims none, and the
    // estimator refuses it in those words first, `dcp::prefill_cp_refusal`.)
    if l.moe_comm.is_large_ep() {
        return Err(PerfError::unsupported(format!(
            "{}: the large-EP MoE graph (moe_comm_backend) is not modelled for Nemotron-H",
            m.name
        )));
    }
    if nh.counts[MOE] > 0 && (m.topk == 0 || m.experts == 0 || m.moe_inter == 0) {
        return Err(PerfError::config(format!(
            "{}: MoE layers (E) need num_experts_per_tok, n_routed_experts and moe_intermediate_size",
            m.name
        )));
    }
    if nh.counts[MLP] > 0 && m.inter == 0 {
        return Err(PerfError::config(format!("{}: MLP layers (-) need intermediate_size", m.name)));
    }
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let act = 2.0;
    let kv_per_gpu = m.kv_heads.div_ceil(tp);
    let heads = m.heads / tp;
    let m_heads = nh.mamba_heads / tp;
    let d_inner = m_heads * nh.mamba_head_dim;
    let groups = (nh.n_groups / tp).max(1);
    let in_proj = 2 * d_inner + 2 * groups * nh.d_state + m_heads;
    let moe_h = if nh.latent > 0 { nh.latent } else { h };
    let (shared, inter) = (nh.shared_inter / tp, m.inter / tp);
    let mut out = (Vec::new(), Vec::new());
    for (ctx, list) in [(true, &mut out.0), (false, &mut out.1)] {
        let phase = if ctx { "context" } else { "generation" };
        let s = if ctx { 1.0 } else { mtp };
        let nm = |x: &str| format!("{phase}_{x}");
        list.push(Op::Embedding { name: nm("embedding"), scale: s, bytes_per_token: h as f64 * 2.0 });
        for kind in [MAMBA, ATTENTION, MOE, MLP] {
            if nh.counts[kind] == 0 {
                continue;
            }
            let c = nh.counts[kind] as f64 * s;
            let elementwise = |x: &str, width: u32| Op::Elementwise {
                name: nm(x),
                scale: c,
                bytes_per_token: (2 * width) as f64 * act,
            };
            let gemm = |x: &str, n: u32, k: u32, fp8_input: bool| Op::gemm(nm(x), c, n, k, l.gemm, fp8_input);
            let ar = |x: &str| Op::AllReduce { name: nm(x), scale: c, hidden: h, tp };
            match kind {
                MAMBA => {
                    let kernel = |x: &str, kernel: Kernel| {
                        Op::Mamba2(Mamba2Op {
                            name: nm(x),
                            scale: c,
                            kernel,
                            context: ctx,
                            d_model: h,
                            d_state: nh.d_state,
                            d_conv: nh.d_conv,
                            nheads: nh.mamba_heads,
                            head_dim: nh.mamba_head_dim,
                            n_groups: nh.n_groups,
                            chunk_size: nh.chunk_size,
                        })
                    };
                    list.extend([
                        elementwise("mamba_norm", 2 * h),
                        gemm("mamba_in_proj_gemm", in_proj, h, false),
                        kernel("mamba_conv1d", Kernel::Conv),
                        kernel("mamba_ssm", Kernel::Ssm),
                        gemm("mamba_out_proj_gemm", h, d_inner, false),
                        ar("mamba_ar"),
                    ]);
                }
                ATTENTION => {
                    let heads_at =
                        AttentionHeads { n: heads, n_kv: kv_per_gpu, head: m.head_dim, window: 0, qk_norm: false };
                    list.extend([
                        elementwise("attn_norm", 2 * h),
                        gemm("qkv_gemm", m.heads * m.head_dim / tp + m.head_dim * kv_per_gpu * 2, h, false),
                        attention_op(ctx, nm("attention"), c, heads_at, l),
                        gemm("proj_gemm", h, m.heads * m.head_dim / tp, true),
                        ar("attn_ar"),
                    ]);
                }
                MOE => {
                    list.extend([
                        elementwise("moe_norm", 2 * h),
                        gemm("shared_up_gemm", shared, h, false),
                        elementwise("shared_relu2", shared),
                        gemm("shared_down_gemm", h, shared, true),
                        Op::gemm(nm("router_gemm"), c, m.experts, h, Dtype::Bfloat16, false),
                    ]);
                    if nh.latent > 0 {
                        list.push(gemm("fc1_latent_proj_gemm", nh.latent / tp, h, false));
                    }
                    let dispatch = |pre: bool| {
                        let name = nm(if pre { "moe_pre_dispatch" } else { "moe_post_dispatch" });
                        Op::MoeDispatch(DispatchOp::at(name, c, moe_h, l, pre))
                    };
                    list.push(dispatch(true));
                    list.push(Op::Moe(MoeOp::routed(nm("moe"), c, moe_h, (m, l), MLA_DISTRIBUTION, false)));
                    list.push(dispatch(false));
                    if nh.latent > 0 {
                        list.push(gemm("fc2_latent_proj_gemm", h, nh.latent / tp, true));
                    }
                    list.push(ar("moe_ar"));
                }
                _ => list.extend([
                    elementwise("mlp_norm", 2 * h),
                    gemm("mlp_up_gemm", inter, h, false),
                    elementwise("mlp_relu2", inter),
                    gemm("mlp_down_gemm", h, inter, false),
                    ar("mlp_ar"),
                ]),
            }
        }
        list.push(Op::pipeline_p2p(nm("p2p"), s, h, l));
        list.push(logits_gemm(nm("logits_gemm"), s, m, tp));
    }
    Ok(out)
}

/// KV-cache bytes per token per GPU: only the attention layers keep KV (the Mamba2 state is a
/// fixed per-request size the reference's capacity estimate leaves out).
pub fn kv_bytes_per_token(nh: &NemotronHSpec, m: &ModelSpec, tp: u32, kv: Dtype) -> f64 {
    2.0 * m.kv_heads.div_ceil(tp) as f64 * m.head_dim as f64 * nh.counts[ATTENTION] as f64 * kv.bytes()
}

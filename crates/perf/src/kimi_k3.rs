//! Kimi-K3 (`KimiK3ForConditionalGeneration`, the reference's `KIMIK3` family): Kimi Delta
//! Attention (KDA) linear-attention layers beside multi-head latent attention (MLA) layers, a
//! dense first FFN and LatentMoE on every other layer, as the reference times it.
//!
//! ```text
//! kda_perf.parquet   (kernel_source, phase, d_model, d_conv, num_k_heads, head_k_dim,
//!                     num_v_heads, head_v_dim) → context [batch][seq_len] | generation [batch]
//! ```
//!
//! A KDA layer projects q / k / v / gate in one GEMM, runs the forget-gate GEMV pair, a short
//! causal convolution over q, k and v and the delta-rule scan (decode: the packed recurrence),
//! a gated norm and the output GEMM. Its kernels come from the KDA table at the layer's
//! tensor-parallel head count: a shard the table lacks takes the nearest shard of the same
//! kernel and `d_model`, and a table without the kernel, or a query outside every anchor, the
//! kernel's memory roofline. Where the table measures decode as one fused kernel
//! (`kda_fused_decode`) for the shard and not the Triton pair, the recurrence reads that row
//! and the convolution costs nothing.
//!
//! The MLA layers carry an output gate (GEMM and multiply) beside DeepSeek's MLA chain at
//! Kimi-K3's own head count. The MoE layers route in the hidden space, project down into the
//! latent width (`routed_expert_hidden_size`), run the routed experts and dispatch there, and
//! project back; two shared experts run in the hidden space.
//!
//! DSPARK speculation (`nextn`) verifies `nextn + 1` tokens per request through the KDA verify
//! kernels (a `[requests][draft_tokens]` table) and adds a small dense draft model's ops and KV.
//!
//! Memory: only the MLA layers keep a (tensor-replicated) latent KV cache; every request also
//! holds KDA state (the fp32 delta-rule state and the bf16 convolution window of every KDA
//! layer, split over tensor parallelism) in five radix-cache slots, charged in the KV budget.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::Value;

use crate::db::{Database, Dtype};
use crate::error::{ErrorKind, PerfError, Result};
use crate::interp::{Grid, GridSpec, Node};
use crate::mla_ops::{MlaBmmOp, MlaKind, MlaOp};
use crate::model::{logits_gemm, Layout, MlaDims, ModelSpec, Op};
use crate::moe_ops::{DispatchOp, MoeOp, MLA_DISTRIBUTION};
use crate::systems::sources;

/// The architecture (its language model under `text_config`).
pub const ARCH: &str = "KimiK3ForConditionalGeneration";
/// The KDA kernel table.
pub const FILE: &str = "kda_perf.parquet";
/// KDA state slots one request holds (the reference's flat proxy for SGLang's radix cache).
pub const STATE_SLOTS: u64 = 5;

/// What Kimi-K3's hybrid layout adds to a model's facts.
#[derive(Clone, Debug, PartialEq)]
pub struct KimiK3Spec {
    pub kda_layers: u32,
    pub mla_layers: u32,
    /// KDA heads and head width (`linear_attn_config.num_heads`, `head_dim`).
    pub kda_heads: u32,
    pub kda_head_dim: u32,
    pub conv_kernel: u32,
    /// Width of the routed experts (`routed_expert_hidden_size`; the hidden size when 0).
    pub latent: u32,
    /// The dense layers' FFN width (`intermediate_size`) and how many lead the stack.
    pub dense_inter: u32,
    pub dense_layers: u32,
    pub shared_experts: u32,
    /// AttnRes aggregation (`attn_res_block_size` > 0): two element-wise passes per layer.
    pub attn_res: bool,
}

fn uint(cfg: &Value, key: &str) -> Option<u32> {
    cfg.get(key).and_then(Value::as_u64).map(|v| v as u32)
}

/// The Kimi-K3 facts of a text config. `linear_attn_config.kda_layers` (1-based layer ids) is
/// required, as are the KDA widths; every other layer is MLA.
pub fn spec_from_config(cfg: &Value, layers: u32, hidden: u32, shown: &str) -> Result<KimiK3Spec> {
    let lin = cfg
        .get("linear_attn_config")
        .filter(|v| v.is_object())
        .ok_or_else(|| PerfError::config(format!("{shown}: Kimi-K3 needs text_config.linear_attn_config")))?;
    let ids = lin.get("kda_layers").and_then(Value::as_array).filter(|a| !a.is_empty()).ok_or_else(|| {
        PerfError::config(format!("{shown}: Kimi-K3 needs linear_attn_config.kda_layers (1-based layer ids)"))
    })?;
    let mut kda = std::collections::BTreeSet::new();
    for v in ids {
        match v.as_u64() {
            Some(i) if (1..=layers as u64).contains(&i) => {
                kda.insert(i);
            }
            _ => {
                return Err(PerfError::config(format!(
                    "{shown}: linear_attn_config.kda_layers entry {v} is not a layer id in 1..={layers}"
                )))
            }
        }
    }
    let need = |k: &str| {
        uint(lin, k).filter(|&v| v > 0).ok_or_else(|| {
            PerfError::config(format!("{shown}: Kimi-K3 needs a positive integer linear_attn_config.{k}"))
        })
    };
    let kda_layers = kda.len() as u32;
    Ok(KimiK3Spec {
        kda_layers,
        mla_layers: layers - kda_layers,
        kda_heads: need("num_heads")?,
        kda_head_dim: need("head_dim")?,
        conv_kernel: uint(lin, "short_conv_kernel_size").unwrap_or(4),
        latent: uint(cfg, "routed_expert_hidden_size").filter(|&v| v > 0).unwrap_or(hidden),
        dense_inter: uint(cfg, "intermediate_size").unwrap_or(0),
        dense_layers: uint(cfg, "first_k_dense_replace").unwrap_or(0).min(layers),
        shared_experts: uint(cfg, "num_shared_experts").unwrap_or(0),
        attn_res: uint(cfg, "attn_res_block_size").unwrap_or(0) > 0,
    })
}

/// The routed experts' format when none is given: the reference serves the published Kimi-K3
/// checkpoint's MXFP4 experts on SGLang on Blackwell (compute capability 10 and up) with MXFP8
/// activations, under their own table rows; elsewhere the checkpoint's label stands.
pub fn moe_format(model: &str, backend: &str, sm_version: Option<u32>, checkpoint: Dtype) -> Dtype {
    if backend == "sglang" && model == "moonshotai/Kimi-K3" && sm_version.is_some_and(|v| v >= 100) {
        Dtype::W4a8Mxfp4Mxfp8
    } else {
        checkpoint
    }
}

/// One KDA kernel of a layer, `scale` × its latency.
#[derive(Clone, Debug, PartialEq)]
pub struct KdaOp {
    pub name: String,
    pub scale: f64,
    /// `causal_conv1d_fn_qkv3` / `chunk_kda` (prefill), `causal_conv1d_update` /
    /// `fused_recurrent_kda_packed_decode` (decode).
    pub kernel: &'static str,
    pub context: bool,
    /// Verify (DSPARK speculation): the tokens one request verifies per step (`nextn + 1`);
    /// 0 for an ordinary decode step or a prefill.
    pub draft_tokens: u32,
    pub hidden: u32,
    pub conv_kernel: u32,
    /// Heads per GPU (keys and values alike).
    pub heads: u32,
    pub head_dim: u32,
}

impl KdaOp {
    /// The kernel's memory roofline (ms) for `b` sequences of `s` tokens (decode: `b` tokens),
    /// as `kernel` moves bytes.
    fn sol_ms(&self, kernel: &str, mem_bw: f64, b: f64, s: f64) -> f64 {
        let x = if (self.context || self.draft_tokens > 0) && s > 0.0 { b * s } else { b };
        let p = self.heads as f64 * self.head_dim as f64;
        let state = self.heads as f64 * self.head_dim as f64 * self.head_dim as f64 * 4.0;
        let d_conv = self.conv_kernel as f64;
        let conv = (x * 3.0 * p * (d_conv + 1.0) * 2.0, x * 3.0 * p * 2.0);
        let recurrence = (x * 4.0 * p * 2.0 + state * b, x * p * 2.0 + state * b);
        // The verify scan reads the committed state once and writes one state per draft token.
        let verify = (x * 4.0 * p * 2.0 + state * b, x * p * 2.0 + state * x);
        let (read, write) = match kernel {
            "causal_conv1d_fn_qkv3" | "causal_conv1d_update" => conv,
            // vLLM's FlashKDA prefill moves the chunked scan's bytes.
            "chunk_kda" | "flashkda_fwd" => {
                let chunks = if s > 0.0 { (s / 64.0).floor() } else { 0.0 };
                let h = chunks * state * b;
                (x * 4.0 * p * 2.0 + state * b + h, x * p * 2.0 + state * b + h)
            }
            // vLLM's fused decode is priced, without a row, by the packed recurrence's bytes.
            "fused_recurrent_kda_packed_decode" | "fused_kda_decode" => recurrence,
            "kda_fused_decode" => (conv.0 + recurrence.0, conv.1 + recurrence.1),
            // SGLang's Triton verify scan and vLLM's chain-verify kernel move the same bytes.
            "fused_sigmoid_gating_delta_rule_update" | "fused_recurrent_kda" => verify,
            // SGLang's fused CuTeDSL verify on SM100: convolution update and verify scan.
            "fused_kda_decode_mtp_dspark" => (conv.0 + verify.0, conv.1 + verify.1),
            _ => (x * self.hidden as f64 * 2.0, x * self.hidden as f64 * 2.0),
        };
        (read + write) / mem_bw.max(1.0) * 1000.0
    }

    fn phase(&self) -> &'static str {
        match (self.context, self.draft_tokens) {
            (true, _) => "context",
            (false, 0) => "generation",
            (false, _) => "verify",
        }
    }

    /// The table coordinates of a query for `b` sequences (decode: `b` tokens) of `s` new
    /// tokens: a prefill as asked; a decode step at `b` and no length; a verify step at the
    /// requests behind its `b` tokens (`b / draft_tokens`, ties to even, at least one) and
    /// `draft_tokens` long.
    fn coords(&self, b: u32, s: u32) -> (u32, u32) {
        match self.phase() {
            "context" => (b, s),
            "verify" => {
                let d = self.draft_tokens;
                ((b as f64 / d as f64).round_ties_even().max(1.0) as u32, d)
            }
            _ => (b, 0),
        }
    }

    fn key(&self, kernel: &str) -> KdaKey {
        KdaKey {
            kernel: kernel.to_string(),
            phase: self.phase().to_string(),
            shape: [self.hidden, self.conv_kernel, self.heads, self.head_dim, self.heads, self.head_dim],
        }
    }
}

/// `(kernel, phase, [d_model, d_conv, num_k_heads, head_k_dim, num_v_heads, head_v_dim])`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct KdaKey {
    kernel: String,
    phase: String,
    shape: [u32; 6],
}

/// The KDA rows of one database, per key a `[batch][seq_len]` or `[batch]` grid (first source
/// wins per point).
#[derive(Debug, Default)]
pub struct KdaTable {
    grids: BTreeMap<KdaKey, Grid>,
}

/// The KDA table of a database, read on first use.
#[derive(Debug, Default)]
pub struct KdaTables {
    table: OnceLock<Result<KdaTable>>,
}

const CONTEXT_SPEC: GridSpec = GridSpec::raw(&["batch", "seq_len"]);
const GENERATION_SPEC: GridSpec = GridSpec::raw(&["batch"]);

fn load(db: &Database) -> Result<KdaTable> {
    let srcs = sources(&db.spec, &db.backend, &db.version, FILE, db.shared_layer)?;
    let mut nodes: BTreeMap<KdaKey, Node> = BTreeMap::new();
    for src in &srcs {
        if !src.path.exists() {
            continue;
        }
        crate::gdn::for_each_state_row(src, |row| {
            let d = row.dims;
            let key = KdaKey {
                kernel: row.kernel.to_string(),
                phase: row.phase.to_string(),
                shape: [d[2], d[3], d[4], d[5], d[6], d[7]],
            };
            let path: Vec<u32> = if row.phase == "generation" { vec![d[0]] } else { vec![d[0], d[1]] };
            nodes.entry(key).or_default().insert_first_wins(&path, row.latency);
        })?;
    }
    Ok(KdaTable { grids: nodes.into_iter().map(|(k, n)| (k, Grid::new(n))).collect() })
}

/// The grid answering `key`: its own, else the nearest shard (least `num_v_heads` distance, the
/// first in key order on a tie) of the same kernel, phase and `d_model`.
fn grid_for<'a>(table: &'a KdaTable, key: &KdaKey) -> Option<&'a Grid> {
    if let Some(g) = table.grids.get(key) {
        return Some(g);
    }
    table
        .grids
        .iter()
        .filter(|(k, _)| k.kernel == key.kernel && k.phase == key.phase && k.shape[0] == key.shape[0])
        .min_by_key(|(k, _)| (k.shape[4] as i64 - key.shape[4] as i64).abs())
        .map(|(_, g)| g)
}

/// `eval` of a KDA op for `b` sequences of `s` new tokens (decode: `b` requests):
/// `scale × max(0, latency)`.
pub fn eval_kda(db: &Database, op: &KdaOp, b: u32, s: u32) -> Result<f64> {
    if db.mode.is_empirical() {
        return Err(PerfError::unsupported(format!(
            "database_mode {} is not modelled for Kimi-K3's KDA kernels (use SILICON or SOL)",
            db.mode.name()
        )));
    }
    let bw = db.spec.mem_bw;
    let (b, s) = op.coords(b, s);
    if db.mode.is_sol() {
        return Ok(op.sol_ms(op.kernel, bw, b as f64, s as f64).max(0.0) * op.scale);
    }
    let table = db.kda.table.get_or_init(|| load(db)).as_ref().map_err(Clone::clone)?;
    let mut kernel = op.kernel;
    // A table that verifies only through SGLang's fused SM100 kernel (no Triton verify rows)
    // prices the verify scan there and the convolution inside it.
    let has_verify = |k: &str| table.grids.keys().any(|key| key.kernel == k && key.phase == "verify");
    if op.draft_tokens > 0
        && !op.context
        && matches!(kernel, "fused_sigmoid_gating_delta_rule_update" | "causal_conv1d_update")
        && !has_verify(kernel)
        && has_verify("fused_kda_decode_mtp_dspark")
    {
        if kernel == "causal_conv1d_update" {
            return Ok(0.0);
        }
        kernel = "fused_kda_decode_mtp_dspark";
    }
    if op.draft_tokens == 0
        && !op.context
        && matches!(kernel, "fused_recurrent_kda_packed_decode" | "causal_conv1d_update")
        && !table.grids.contains_key(&op.key(kernel))
        && table.grids.contains_key(&op.key("kda_fused_decode"))
    {
        if kernel == "causal_conv1d_update" {
            return Ok(0.0);
        }
        kernel = "kda_fused_decode";
    }
    let sol = |b: f64, s: f64| op.sol_ms(kernel, bw, b, s);
    let v = match grid_for(table, &op.key(kernel)) {
        None => sol(b as f64, s as f64),
        Some(_) if op.context && s == 0 => sol(b as f64, 0.0),
        Some(grid) => {
            let r = if op.context || op.draft_tokens > 0 {
                grid.query(&CONTEXT_SPEC, &|c: &[f64]| sol(c[0], c[1]), &[b as f64, s as f64])
            } else {
                grid.query(&GENERATION_SPEC, &|c: &[f64]| sol(c[0], 0.0), &[b as f64])
            };
            match r {
                Err(e) if e.kind == ErrorKind::NoAnchor => sol(b as f64, s as f64),
                r => r?,
            }
        }
    };
    Ok(v.max(0.0) * op.scale)
}

/// Bytes of KDA state one request holds on one GPU: per KDA layer the fp32 delta-rule state
/// and the bf16 window of the three convolutions, over its five slots.
pub fn state_bytes_per_request(k: &KimiK3Spec, tp: u32) -> f64 {
    let heads = (k.kda_heads / tp.max(1)).max(1) as u64;
    let hd = k.kda_head_dim as u64;
    let ssm = heads * hd * hd * 4;
    let conv = (k.conv_kernel as u64).saturating_sub(1) * 3 * heads * hd * 2;
    (k.kda_layers as u64 * (ssm + conv) * STATE_SLOTS) as f64
}

/// KV-cache bytes per token on one GPU: the latent KV of the MLA layers (not split) and, under
/// DSPARK speculation (`nextn`), the draft model's KV.
pub fn kv_bytes_per_token(k: &KimiK3Spec, d: &MlaDims, l: &Layout) -> f64 {
    let draft = if l.nextn > 0 { draft_kv_elements(l) } else { 0 };
    (k.mla_layers as f64 * (d.kv_lora_rank + d.qk_rope_head_dim) as f64 + draft as f64) * l.kv.bytes()
}

/// `(context ops, generation ops)` of Kimi-K3 on SGLang and vLLM:
///
/// ```text
/// embedding, embedding all-reduce,
/// KDA layers: norm, qkvg GEMM, beta/f_a GEMM, f_b GEMM, conv1d, scan (decode: conv update and
///   packed recurrence; DSPARK verify: conv update and chain-verify scan), gated norm, o GEMM,
///   all-reduce
///   (vLLM: the FlashKDA scan in prefill; in a plain decode one fused kernel replaces conv
///   update, recurrence and gated norm)
/// MLA layers: norm, downscale GEMM, q_b GEMM, (context) kv_b GEMM and the context MLA kernel,
///   (decode) absorption BMM, decode MLA kernel, BMM, o GEMM, gate GEMM, gate multiply, all-reduce
///   (vLLM: the MLA module table prices q_b … o; where it has no row, the chain with plain
///   attention over v_head_dim heads in place of the MLA kernels and BMMs)
/// AttnRes (two element-wise passes per layer)
/// FFN norm (every layer); dense layers: gate_up GEMM, act, down GEMM, all-reduce;
/// MoE layers: router GEMM, latent down GEMM, latent norm, dispatch, experts, combine, latent up
///   GEMM, shared gate_up GEMM, act, shared down GEMM
/// logits GEMM, pipeline hand-off
/// DSPARK speculation (`nextn`): the draft model's ops (`push_draft_ops`)
/// ```
///
/// Other backends, attention DP, context parallelism, ngram drafts and the large-EP path are
/// refused by name.
pub fn build_ops(m: &ModelSpec, k: &KimiK3Spec, l: &Layout) -> Result<(Vec<Op>, Vec<Op>)> {
    let (tp, h) = (l.tp, m.hidden);
    let vllm = l.backend == "vllm";
    if !vllm && l.backend != "sglang" {
        return Err(PerfError::unsupported(format!(
            "{}: Kimi-K3 (KDA + MLA) is timed on backends sglang and vllm only; not {}",
            m.name, l.backend
        )));
    }
    // (Prefill CP never gets here: the reference's Kimi-K3 class claims none, and the estimator
    // refuses it in those words first, `dcp::prefill_cp_refusal`.)
    if l.ngram > 0 || l.attention_dp > 1 || l.moe_comm.is_large_ep() {
        return Err(PerfError::unsupported(format!(
            "{}: Kimi-K3 is modelled without ngram drafts (ngram {}), attention_dp (got {}) and the large-EP MoE \
             path",
            m.name, l.ngram, l.attention_dp
        )));
    }
    let spec = l.nextn > 0;
    let draft_tokens = if spec { l.nextn + 1 } else { 0 };
    if !k.kda_heads.is_multiple_of(tp) {
        return Err(PerfError::config(format!(
            "{}: Kimi-K3 KDA heads ({}) are not divisible by tp={tp}",
            m.name, k.kda_heads
        )));
    }
    let d = m.mla.ok_or_else(|| PerfError::config(format!("{}: Kimi-K3 needs its MLA widths", m.name)))?;
    let (nk, hk) = (k.kda_heads / tp, k.kda_head_dim);
    let p = nk * hk;
    let heads = m.heads / tp;
    let o_in = m.heads * d.v_head_dim;
    let bmm = if l.gemm == Dtype::Bfloat16 { Dtype::Bfloat16 } else { Dtype::Fp8 };
    let bf = Dtype::Bfloat16;
    let mut out = (Vec::new(), Vec::new());
    for (ctx, list) in [(true, &mut out.0), (false, &mut out.1)] {
        let phase = if ctx { "context" } else { "generation" };
        let nm = |x: &str| format!("{phase}_{x}");
        let ew = |name: &str, c: f64, input: u32, output: u32| Op::Elementwise {
            name: nm(name),
            scale: c,
            bytes_per_token: (input + output) as f64 * 2.0,
        };
        let gemm = |name: &str, c: f64, n: u32, k: u32, dtype: Dtype| Op::gemm(nm(name), c, n, k, dtype, false);
        let ar = |name: &str, c: f64| Op::AllReduce { name: nm(name), scale: c, hidden: h, tp };
        list.push(Op::Embedding { name: nm("embedding"), scale: 1.0, bytes_per_token: h as f64 * 2.0 });
        list.push(ar("embedding_ar", 1.0));
        if k.kda_layers > 0 {
            let c = k.kda_layers as f64;
            let kernel = |name: &str, kernel: &'static str| {
                Op::Kda(KdaOp {
                    name: nm(name),
                    scale: c,
                    kernel,
                    context: ctx,
                    draft_tokens: if ctx { 0 } else { draft_tokens },
                    hidden: h,
                    conv_kernel: k.conv_kernel,
                    heads: nk,
                    head_dim: hk,
                })
            };
            list.push(ew("kda_norm", c, 2 * h, 2 * h));
            list.push(gemm("kda_qkvg_gemm", c, 4 * p, h, l.gemm));
            list.push(gemm("kda_bfa_gemm", c, k.kda_heads + hk, h, l.gemm));
            list.push(gemm("kda_fb_gemm", c, p, hk, l.gemm));
            if ctx {
                list.push(kernel("kda_conv1d", "causal_conv1d_fn_qkv3"));
                // vLLM prefills with the FlashKDA CUDA kernel, SGLang with the Triton chunk scan.
                list.push(kernel("kda_scan", if vllm { "flashkda_fwd" } else { "chunk_kda" }));
            } else if spec {
                // DSPARK verify: the convolution update and the chain-verify scan over the
                // request's draft tokens (vLLM's Triton kernel, SGLang's sigmoid-gated rule).
                list.push(kernel("kda_conv1d", "causal_conv1d_update"));
                let scan = if vllm { "fused_recurrent_kda" } else { "fused_sigmoid_gating_delta_rule_update" };
                list.push(kernel("kda_verify", scan));
            } else if vllm {
                // One fused CUDA kernel: convolution update, recurrence and the gated norm.
                list.push(kernel("kda_fused_decode", "fused_kda_decode"));
            } else {
                list.push(kernel("kda_conv1d", "causal_conv1d_update"));
                list.push(kernel("kda_recurrent", "fused_recurrent_kda_packed_decode"));
            }
            if ctx || spec || !vllm {
                list.push(ew("kda_onorm", c, 2 * p, p));
            }
            list.push(Op::gemm(nm("kda_o_gemm"), c, h, p, l.gemm, true));
            list.push(ar("kda_ar", c));
        }
        if k.mla_layers > 0 {
            let c = k.mla_layers as f64;
            let mla_op = |name: &str, kind: MlaKind| MlaOp {
                name: nm(name),
                scale: c,
                kind,
                heads,
                kv: l.kv,
                fmha: l.fmha,
                gemm: l.gemm,
                native_heads: m.heads,
                cp: 1,
            };
            let mla = |kind: MlaKind| Op::Mla(mla_op("attention", kind));
            let bmm_op = |pre: bool| {
                Op::MlaBmm(MlaBmmOp {
                    name: nm(if pre { "bmm_pre" } else { "bmm_post" }),
                    scale: c,
                    heads,
                    dtype: bmm,
                    pre,
                })
            };
            list.push(ew("mla_norm", c, 2 * h, 2 * h));
            list.push(gemm("mla_downscale_gemm", c, d.q_lora_rank + d.kv_lora_rank + d.qk_rope_head_dim, h, l.gemm));
            let mut block = vec![gemm(
                "mla_q_b_gemm",
                c,
                m.heads * (d.qk_nope_head_dim + d.qk_rope_head_dim) / tp,
                d.q_lora_rank,
                l.gemm,
            )];
            if ctx {
                block.push(gemm(
                    "mla_kv_b_gemm",
                    c,
                    m.heads * (d.qk_nope_head_dim + d.v_head_dim) / tp,
                    d.kv_lora_rank,
                    l.gemm,
                ));
            }
            match (vllm, ctx) {
                // vLLM's attention core, when its MLA module table has no row.
                (true, _) => block.push(crate::model::mla_stand_in_attention(nm("attention"), c, ctx, (m, &d), l)),
                (false, true) => block.push(mla(MlaKind::Context)),
                (false, false) => block.extend([bmm_op(true), mla(MlaKind::Generation), bmm_op(false)]),
            }
            block.push(Op::gemm(nm("mla_o_gemm"), c, h, o_in / tp, l.gemm, true));
            if vllm {
                // vLLM runs Kimi-K3's own MultiHeadLatentAttention: the module table prices the
                // block, the chain above where it has no row.
                let kind = if ctx { MlaKind::ContextModule } else { MlaKind::GenerationModule };
                let module = Op::Mla(mla_op("mla_module", kind));
                list.push(Op::Fallback { name: nm("mla_block"), primary: Box::new(module), fallback: block });
            } else {
                list.extend(block);
            }
            list.push(gemm("mla_gate_gemm", c, o_in / tp, h, l.gemm));
            list.push(ew("mla_gate_mul", c, 2 * o_in / tp, o_in / tp));
            list.push(ar("mla_ar", c));
        }
        let layers = m.layers as f64;
        if k.attn_res {
            list.push(ew("attn_res", 2.0 * layers, 4 * h, 2 * h));
        }
        list.push(ew("ffn_norm", layers, 2 * h, 2 * h));
        if k.dense_layers > 0 {
            let c = k.dense_layers as f64;
            let inter = k.dense_inter / tp;
            list.push(gemm("dense_gate_up_gemm", c, 2 * inter, h, l.gemm));
            list.push(ew("dense_act_gate", c, 2 * inter, inter));
            list.push(Op::gemm(nm("dense_down_gemm"), c, h, inter, l.gemm, true));
            list.push(ar("dense_ffn_ar", c));
        }
        let moe_layers = m.layers - k.dense_layers;
        if moe_layers > 0 && m.experts > 0 {
            let c = moe_layers as f64;
            let lat = k.latent;
            let dispatch = |pre: bool| {
                let name = nm(if pre { "moe_pre_dispatch" } else { "moe_post_dispatch" });
                Op::MoeDispatch(DispatchOp::at(name, c, lat, l, pre))
            };
            list.push(gemm("router_gemm", c, m.experts, h, bf));
            list.push(gemm("latent_down_gemm", c, lat, h, bf));
            list.push(ew("latent_norm", c, 2 * lat, 2 * lat));
            list.push(dispatch(true));
            list.push(Op::Moe(MoeOp::routed(nm("moe"), c, lat, (m, l), MLA_DISTRIBUTION, true)));
            list.push(dispatch(false));
            list.push(gemm("latent_up_gemm", c, h, lat, bf));
            let shared = k.shared_experts * m.moe_inter;
            if shared > 0 {
                list.push(gemm("shared_gate_up_gemm", c, 2 * shared / tp, h, bf));
                list.push(ew("shared_act_gate", c, 2 * shared / tp, shared / tp));
                list.push(gemm("shared_down_gemm", c, h, shared / tp, bf));
            }
        }
        list.push(logits_gemm(nm("logits_gemm"), 1.0, m, tp));
        list.push(Op::pipeline_p2p(nm("p2p"), 1.0, h, l));
        if spec && !ctx {
            push_draft_ops(list, m, l);
        }
    }
    Ok(out)
}

/// The DSPARK draft model's layers, FFN width and attention geometry: SGLang serves a GQA draft
/// (64 query, 16 KV heads of 64), vLLM an MLA-style one (64 heads, q / kv LoRA ranks 1536 /
/// 512, rope 64, nope and value heads 128, no output gate).
const DRAFT_LAYERS: u32 = 5;
const DRAFT_INTER: u32 = 14336;
const DRAFT_HEADS: u32 = 64;
const DRAFT_KV_HEADS: u32 = 16;
const DRAFT_HEAD_DIM: u32 = 64;
const DRAFT_Q_LORA: u32 = 1536;
const DRAFT_KV_LORA: u32 = 512;
const DRAFT_ROPE: u32 = 64;
const DRAFT_NOPE: u32 = 128;
const DRAFT_V: u32 = 128;

/// KV elements the DSPARK draft keeps per token on one GPU: vLLM's latent KV (replicated over
/// tensor parallelism), SGLang's GQA keys and values (split).
fn draft_kv_elements(l: &Layout) -> u32 {
    if l.backend == "vllm" {
        DRAFT_LAYERS * (DRAFT_KV_LORA + DRAFT_ROPE)
    } else {
        DRAFT_LAYERS * 2 * (DRAFT_KV_HEADS / l.tp.max(1)).max(1) * DRAFT_HEAD_DIM
    }
}

/// The DSPARK draft's generation ops. The step's ops run at `batch × (nextn + 1)` tokens while
/// the draft forwards `nextn` of them (its layers scale by `nextn / (nextn + 1)`) and projects
/// the committed token's KV and draws its base logits once per request (`1 / (nextn + 1)`):
///
/// ```text
/// embedding, norm (×2 per layer), attention block, gate_up GEMM, act, down GEMM,
/// all-reduce (×2 per layer), KV projection, logits GEMM
/// vLLM attention block: latent downscale GEMM, q_b GEMM, attention over v-width heads, o GEMM
/// SGLang attention block: qkv GEMM, GQA attention, o GEMM
/// ```
fn push_draft_ops(list: &mut Vec<Op>, m: &ModelSpec, l: &Layout) {
    let (tp, h, g) = (l.tp, m.hidden, l.gemm);
    let width = (l.nextn + 1) as f64;
    let per_step = 1.0 / width;
    let forwarded = l.nextn as f64 / width;
    let c = DRAFT_LAYERS as f64 * forwarded;
    let gemm = |name: &str, scale: f64, n: u32, k: u32| Op::gemm(format!("draft_{name}"), scale, n, k, g, false);
    let attention = |n: u32, n_kv: u32, head: u32| Op::GenerationAttention {
        name: "draft_attention".into(),
        scale: c,
        n,
        n_kv,
        head,
        window: 0,
        kv: l.kv,
        qk_norm: false,
        verify: 1,
    };
    let ew = |name: &str, scale: f64, input: u32, output: u32| Op::Elementwise {
        name: format!("draft_{name}"),
        scale,
        bytes_per_token: (input + output) as f64 * 2.0,
    };
    list.push(Op::Embedding { name: "draft_embedding".into(), scale: forwarded, bytes_per_token: h as f64 * 2.0 });
    list.push(ew("norm", 2.0 * c, 2 * h, 2 * h));
    let n_q = DRAFT_HEADS;
    let kv_proj = if l.backend == "vllm" {
        let latent = DRAFT_KV_LORA + DRAFT_ROPE;
        list.push(gemm("downscale_gemm", c, DRAFT_Q_LORA + latent, h));
        list.push(gemm("q_b_gemm", c, n_q * (DRAFT_NOPE + DRAFT_ROPE) / tp, DRAFT_Q_LORA));
        list.push(attention(n_q / tp, n_q / tp, DRAFT_V));
        list.push(Op::gemm("draft_proj_gemm".into(), c, h, n_q * DRAFT_V / tp, g, true));
        gemm("kv_proj_gemm", DRAFT_LAYERS as f64 * per_step, latent, h)
    } else {
        let hd = DRAFT_HEAD_DIM;
        list.push(gemm("qkv_gemm", c, (n_q * hd + 2 * DRAFT_KV_HEADS * hd) / tp, h));
        list.push(attention(n_q / tp, (DRAFT_KV_HEADS / tp).max(1), hd));
        list.push(Op::gemm("draft_proj_gemm".into(), c, h, n_q * hd / tp, g, true));
        gemm("kv_proj_gemm", DRAFT_LAYERS as f64 * per_step, 2 * DRAFT_KV_HEADS * hd / tp, h)
    };
    let inter = DRAFT_INTER / tp;
    list.push(gemm("gate_up_gemm", c, 2 * inter, h));
    list.push(ew("act_gate", c, 2 * inter, inter));
    list.push(Op::gemm("draft_down_gemm".into(), c, h, inter, g, true));
    list.push(Op::AllReduce { name: "draft_ar".into(), scale: 2.0 * c, hidden: h, tp });
    list.push(kv_proj);
    list.push(Op::gemm("draft_logits_gemm".into(), per_step, m.vocab / tp, h, Dtype::Bfloat16, false));
}

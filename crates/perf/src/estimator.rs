//! Op evaluation and phase composition: static prefill / decode steps (what the engine's timing
//! provider asks) and `forward_pass_time_ms` over per-attention-DP-rank batch statistics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::db::{ctx_attn_sol_prefix, gen_attn_dtype, gen_attn_sol, Database, DatabaseMode, Dtype};
use crate::error::{ErrorKind, PerfError, Result};
use crate::model::{build_ops, Family, Layout, ModelSpec, Op};

/// What one op is evaluated at.
#[derive(Clone, Copy, Debug)]
struct At {
    batch: u32,
    s: u32,
    prefix: u32,
    /// Tokens the token-major ops process.
    x: u32,
}

/// A model on a system, ready to time passes.
#[derive(Debug)]
pub struct Estimator {
    pub db: Arc<Database>,
    pub model: ModelSpec,
    pub layout: Layout,
    pub context_ops: Vec<Op>,
    pub generation_ops: Vec<Op>,
    lanes: LaneOrders,
    memo: Mutex<HashMap<(u8, u32, u32, u32), f64>>,
}

/// The order the attention tables' kernel lanes are tried in, per phase (context, generation).
/// Working it out reads the whole attention table of the phase, which families that time no
/// GQA attention (MLA, DeepSeek-V4, a roofline) never need: it is done on the first lookup.
#[derive(Debug)]
struct LaneOrders {
    architecture: String,
    /// The user's `attention_backend`, tried first.
    pin: Option<String>,
    phases: [OnceLock<Result<Vec<String>>>; 2],
}

/// Batch statistics of one attention-DP rank for one forward pass (Dynamo's
/// `ForwardPassMetrics.scheduled_requests`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankMetrics {
    pub num_prefill_requests: u32,
    pub sum_prefill_tokens: u32,
    pub sum_prefill_kv_tokens: u32,
    pub num_decode_requests: u32,
    pub sum_decode_kv_tokens: u32,
}

const MEMO_LIMIT: usize = 1 << 20;

fn tokens(a: u32, b: u32, what: &str) -> Result<u32> {
    a.checked_mul(b).ok_or_else(|| PerfError::config(format!("{what}: {a} × {b} tokens exceeds 2^32")))
}

/// Calls `f` with the number format of every GEMM and expert op in `op`.
fn compute_formats(op: &Op, f: &mut dyn FnMut(Dtype) -> Result<()>) -> Result<()> {
    match op {
        Op::Gemm { dtype, .. } => f(*dtype),
        Op::SmallGemm(g) => f(g.dtype),
        Op::Moe(m) => f(m.dtype),
        Op::ExpertCompute(e) => f(e.moe.dtype),
        Op::Fallback { primary, fallback, .. } => {
            compute_formats(primary, f)?;
            fallback.iter().try_for_each(|o| compute_formats(o, f))
        }
        Op::Overlap { a, b, .. } => a.iter().chain(b).try_for_each(|o| compute_formats(o, f)),
        Op::TokenScale { op, .. } | Op::TpShare { op, .. } => compute_formats(op, f),
        Op::Striped(st) => compute_formats(&st.op, f),
        _ => Ok(()),
    }
}

/// Whether `op` is attention, whose cost depends on each request's sequence rather than only
/// on the number of tokens.
fn attends(op: &Op) -> bool {
    match op {
        Op::ContextAttention { .. }
        | Op::GenerationAttention { .. }
        | Op::Mla(_)
        | Op::MlaBmm(_)
        | Op::Dsa(_)
        | Op::Msa(_)
        | Op::Dsv4Attn(_)
        | Op::WideEpMla(_) => true,
        Op::Dsv41(d) => d.is_attention(true) || d.is_attention(false),
        Op::Fallback { primary, .. } => attends(primary),
        Op::Striped(st) => attends(&st.op),
        _ => false,
    }
}

/// Whether `op` (or an op it holds) is looked up in the GQA attention tables.
fn reads_attention_tables(op: &Op) -> bool {
    match op {
        Op::ContextAttention { .. } | Op::GenerationAttention { .. } => true,
        Op::Fallback { primary, fallback, .. } => {
            reads_attention_tables(primary) || fallback.iter().any(reads_attention_tables)
        }
        Op::Overlap { a, b, .. } => a.iter().chain(b).any(reads_attention_tables),
        Op::TokenScale { op, .. } => reads_attention_tables(op),
        Op::Striped(st) => reads_attention_tables(&st.op),
        _ => false,
    }
}

/// The op family whose SOL servesim does not model, if `op` is one.
fn sol_refused(op: &Op) -> Option<&'static str> {
    match op {
        Op::Dsa(_) => Some("DSA sparse attention (DeepSeek-V3.2, GLM-5)"),
        Op::Msa(_) => Some("MiniMax sparse attention (MiniMax-M3)"),
        Op::Dsv4Attn(_) | Op::Mhc(_) => Some("DeepSeek-V4 compressed attention and mHC"),
        Op::MoeA2a(_) | Op::ExpertCompute(_) | Op::WideEpMla(_) => Some("the large-EP MoE graph (moe_comm_backend)"),
        _ => None,
    }
}

/// The op families the EMPIRICAL / HYBRID estimate is not modelled for (their reference
/// empirical paths carry per-family utilisation grids and transfers servesim lacks).
fn empirical_refused(op: &Op) -> Option<&'static str> {
    match op {
        Op::ExpertCompute(_) => Some("the large-EP MoE expert compute"),
        Op::MoeA2a(_) => Some("the large-EP MoE all-to-all"),
        Op::WideEpMla(_) => Some("the wide-EP MLA module"),
        Op::Dsa(_) => Some("DSA sparse attention"),
        Op::Msa(_) => Some("MiniMax sparse attention"),
        Op::Dsv4Attn(_) | Op::Mhc(_) => Some("DeepSeek-V4 compressed attention and mHC"),
        _ => None,
    }
}

impl Estimator {
    /// `attention_backend` is the user's pin of the attention kernel lane (`None` or
    /// "default": the framework's default for the GPU, then the densest lanes).
    pub fn new(
        db: Arc<Database>,
        model: ModelSpec,
        layout: Layout,
        attention_backend: Option<&str>,
    ) -> Result<Estimator> {
        let (context_ops, generation_ops) = build_ops(&model, &layout)?;
        // A format the GPU has no tensor cores for (NVFP4 before Blackwell) fails every pass
        // that reaches its ops; say so before the first one.
        for op in context_ops.iter().chain(&generation_ops) {
            compute_formats(op, &mut |dt| dt.flops(&db.spec).map(|_| ()))?;
        }
        let lanes = LaneOrders {
            architecture: model.architecture.clone(),
            pin: attention_backend.map(str::to_string),
            phases: Default::default(),
        };
        Ok(Estimator { db, model, layout, context_ops, generation_ops, lanes, memo: Mutex::new(HashMap::new()) })
    }

    /// The attention kernel lanes of a phase, in lookup order.
    fn attention_lanes(&self, generation: bool) -> Result<&[String]> {
        let l = &self.lanes;
        l.phases[usize::from(generation)]
            .get_or_init(|| crate::provider::lane_order(&self.db, &l.architecture, generation, l.pin.as_deref()))
            .as_deref()
            .map_err(Clone::clone)
    }

    /// Works out the lane orders now when this model's passes will need them or the user pinned
    /// a lane, so that a pin without measurements (or a table without rows) is refused before
    /// the first pass rather than in the middle of a run.
    pub(crate) fn check_attention_lanes(&self) -> Result<()> {
        if self.db.mode.is_sol() {
            return Ok(()); // rooflines read no table
        }
        let ops = || self.context_ops.iter().chain(&self.generation_ops);
        // DSA's attention reads its own module tables, which have no kernel lanes: the reference
        // ignores a pin there (GLM-5-FP8 on H200 SGLang times the same with `flashinfer`, a lane
        // the GQA tables lack, as without it), so the pin is only checked elsewhere.
        let pinned =
            self.lanes.pin.as_deref().is_some_and(|p| p != "default") && !ops().any(|op| matches!(op, Op::Dsa(_)));
        if pinned || ops().any(reads_attention_tables) {
            self.attention_lanes(false)?;
            self.attention_lanes(true)?;
        }
        Ok(())
    }

    fn mem(&self, bytes: f64) -> f64 {
        self.db.mem_op_ms(bytes)
    }

    fn eval(&self, op: &Op, at: At) -> Result<f64> {
        let db = &self.db;
        if db.mode.is_sol() {
            if let Some(family) = sol_refused(op) {
                return Err(PerfError::unsupported(format!(
                    "database_mode SOL is not modelled for {family}: servesim lacks that family's speed-of-light \
                     roofline (use database_mode SILICON, the measured tables)"
                )));
            }
        }
        if db.mode.is_empirical() {
            if let Some(family) = empirical_refused(op) {
                return Err(PerfError::unsupported(format!(
                    "database_mode {} is not modelled for {family}: servesim lacks that family's empirical \
                     estimate (use database_mode SILICON or SOL)",
                    db.mode.name()
                )));
            }
        }
        Ok(match op {
            Op::Embedding { scale, bytes_per_token, .. } | Op::Elementwise { scale, bytes_per_token, .. } => {
                self.mem(bytes_per_token * at.x as f64) * scale
            }
            Op::Gemm { scale, n, k, dtype, fp8_input, .. } => {
                db.gemm_op(*dtype, at.x, *n, *k, *fp8_input)?.max(0.0) * scale
            }
            Op::ContextAttention { scale, n, n_kv, head, window, kv, fmha, qk_norm, cp, rope, .. } => {
                // `s` new tokens after `prefix` cached ones: the table at the full length with
                // the prefix's share of the causal work taken out.
                let kernel = |s: u32, prefix: u32| -> Result<f64> {
                    if db.mode.is_sol() {
                        let flops = fmha.flops(&db.spec)?;
                        let (n, n_kv) = (*n as f64, *n_kv as f64);
                        let (b, s, p) = (at.batch as f64, s as f64, prefix as f64);
                        return Ok(ctx_attn_sol_prefix(&db.spec, *head, *window, *kv, flops, b, s, p, n, n_kv));
                    }
                    let lanes = self.attention_lanes(false)?;
                    let empirical = || {
                        db.context_attention_empirical(
                            lanes, at.batch, s, prefix, *n, *n_kv, *head, *window, *kv, *fmha,
                        )
                    };
                    if db.mode == DatabaseMode::Empirical {
                        return empirical();
                    }
                    let full =
                        s.checked_add(prefix).ok_or_else(|| PerfError::config("sequence length exceeds 2^32"))?;
                    let table = db.context_attention(lanes, at.batch, full, *n, *n_kv, *head, *window, *kv, *fmha);
                    let table = match table {
                        Err(e) if db.mode == DatabaseMode::Hybrid && e.kind == ErrorKind::Data => return empirical(),
                        r => r?,
                    };
                    let (f, p) = (full as f64, prefix as f64);
                    Ok(if full == 0 { 0.0 } else { table * ((f * f - p * p) / (f * f)) })
                };
                let table = if *cp > 1 {
                    // Zigzag split into 2·cp chunks: the busiest rank (0) holds the first chunk
                    // and the last, which attends to almost the whole prompt.
                    let c = at.s.div_ceil(2 * cp).max(1);
                    kernel(c, at.prefix)? + kernel(c, at.prefix + at.s - c)?
                } else {
                    kernel(at.s, at.prefix)?
                };
                (table + self.context_attention_extras(*n, *n_kv, *head, *qk_norm, *rope, *fmha)).max(0.0) * scale
            }
            Op::GenerationAttention { .. } => self.generation_attention(op, at, 1)?,
            Op::AllReduce { scale, hidden, tp, .. } => {
                if *tp <= 1 {
                    0.0
                } else {
                    db.custom_allreduce(*tp, at.x as f64 * *hidden as f64)?.max(0.0) * scale
                }
            }
            Op::P2P { scale, hidden, pp, .. } => {
                if *pp <= 1 {
                    0.0
                } else {
                    let spec = &db.spec;
                    let bytes = at.x as f64 * *hidden as f64 * 2.0;
                    // The roofline drops the link's fixed latency.
                    let latency = if db.mode.is_sol() { 0.0 } else { spec.p2p_latency };
                    ((bytes / spec.inter_node_bw.max(1.0) + latency) * 1000.0).max(0.0) * scale
                }
            }
            Op::Nccl { scale, kind, dtype, elements, gpus, .. } => {
                db.nccl(dtype, kind, *gpus, at.x as f64 * elements)?.max(0.0) * scale
            }
            Op::Striped(st) => match (&*st.op, st.gather) {
                // Decode: the rank's stripe (a decode MLA op already holds the gathered heads).
                (Op::GenerationAttention { .. }, None) => self.generation_attention(&st.op, at, st.dcp)?,
                (inner, None) => self.eval(inner, At { s: at.s.div_ceil(st.dcp.max(1)), ..at })?,
                // Context: the cached context's stripes gathered before the attention.
                (inner, Some((elements, scale))) => {
                    let cached = at.batch as f64 * at.prefix as f64;
                    let gather = if cached > 0.0 {
                        db.nccl("half", "all_gather", st.dcp, cached * elements)?.max(0.0) * scale
                    } else {
                        0.0
                    };
                    self.eval(inner, at)? + gather
                }
            },
            Op::CpAllGather { scale, elements, gpus, .. } => {
                if *gpus <= 1 {
                    0.0
                } else {
                    db.nccl("half", "all_gather", *gpus, at.x as f64 * elements)?.max(0.0) * scale
                }
            }
            Op::Moe(m) => crate::moe::eval_moe(db, m, at.x)?,
            Op::MoeDispatch(d) => crate::moe::eval_dispatch(db, d, at.x)?,
            Op::MoeA2a(a) => crate::moe_a2a::eval_a2a(db, a, at.x)?,
            Op::ExpertCompute(e) => crate::moe_a2a::eval_expert_compute(db, e, at.x)?,
            Op::Mla(m) => crate::mla::eval_mla(db, m, at.batch, at.s, at.prefix)?,
            // The BMM table's token axis is the request count (decode: one token each).
            Op::MlaBmm(b) => crate::mla::eval_bmm(db, b, at.batch)?,
            Op::Dsa(d) => crate::dsa::eval_dsa(db, d, at.batch, at.s, at.prefix)?,
            Op::Msa(a) => crate::msa::eval_msa(db, a, at.batch, at.s, at.prefix)?,
            Op::Dsv4Attn(a) => crate::dsv4::eval_dsv4_attention(db, a, at.batch, at.s, at.prefix)?,
            Op::Mhc(h) => crate::dsv4::eval_mhc(db, h, at.x)?,
            // Attention's work axis is its own (new tokens, or the decode KV length).
            Op::Dsv41(d) => {
                let x = if d.is_attention(true) || d.is_attention(false) { at.s } else { at.x };
                crate::dsv41::eval_dsv41(db, d, at.batch, at.prefix, x)?
            }
            Op::Mamba2(k) => crate::mamba2::eval_mamba2(db, k, at.batch, at.s)?,
            Op::Gdn(g) => crate::gdn::eval_gdn(db, g, at.batch, at.s)?,
            Op::Kda(k) => crate::kimi_k3::eval_kda(db, k, at.batch, at.s)?,
            Op::SmallGemm(g) => crate::gdn::eval_small_gemm(db, g, at.x)?,
            Op::Fallback { primary, fallback, .. } => match self.eval(primary, at) {
                Ok(v) => v,
                Err(e) if crate::mla::falls_back(&e) => {
                    let mut total = 0.0;
                    for op in fallback {
                        total += self.eval(op, at).map_err(|e| e.context(format!("op {}", op.name())))?;
                    }
                    total.max(0.0)
                }
                Err(e) => return Err(e),
            },
            Op::WideEpMla(w) => crate::wideep_mla::eval(db, w, at.batch, at.s, at.prefix)?,
            Op::TpShare { op, tp } => self.eval(op, At { x: at.x / (*tp).max(1), ..at })?,
            Op::TokenScale { op, num, den } => {
                let scaled = |v: u32| -> Result<u32> {
                    u32::try_from(u64::from(v) * u64::from(*num) / u64::from((*den).max(1)))
                        .map_err(|_| PerfError::config("draft query token count exceeds 2^32"))
                };
                self.eval(op, At { batch: scaled(at.batch)?, x: scaled(at.x)?, ..at })?
            }
            Op::Overlap { a, b, .. } => {
                let mut sums = [0.0f64; 2];
                for (sum, chain) in sums.iter_mut().zip([a, b]) {
                    for op in chain {
                        *sum += self.eval(op, at).map_err(|e| e.context(format!("op {}", op.name())))?;
                    }
                }
                sums[0].max(sums[1]).max(0.0)
            }
        })
    }

    /// A decode attention op read for `dcp` ranks of decode context parallelism (1: none): the
    /// kernel runs the group's `n · dcp` gathered query heads over the rank's `⌈s / dcp⌉` KV
    /// stripe (a window of `w` positions holding `⌈w / dcp⌉` of them); the Q/K norm stays on
    /// the rank's own heads.
    fn generation_attention(&self, op: &Op, at: At, dcp: u32) -> Result<f64> {
        let db = &self.db;
        let Op::GenerationAttention { scale, n: own, n_kv, head, window, kv, qk_norm, verify, .. } = *op else {
            unreachable!("generation_attention reads a GenerationAttention op")
        };
        let dcp = dcp.max(1);
        let n = own * dcp;
        let window = if window > 0 && dcp > 1 { window.div_ceil(dcp) } else { window };
        let s = at.s.div_ceil(dcp);
        // A block-verify pass reads each request's KV once for its `verify` query
        // tokens: the table at the request batch, at least the whole block's math.
        let requests = if verify > 1 {
            if !at.batch.is_multiple_of(verify) {
                return Err(PerfError::config(format!(
                    "a verify pass of {verify} tokens per request cannot hold {} tokens",
                    at.batch
                )));
            }
            at.batch / verify
        } else {
            at.batch
        };
        let mut v = if db.mode.is_sol() {
            let flops = gen_attn_dtype(&db.spec, kv).flops(&db.spec)?;
            gen_attn_sol(&db.spec, n_kv, head, window, kv, flops, n as f64, requests as f64, s as f64)
        } else {
            let lanes = self.attention_lanes(true)?;
            let empirical = || db.generation_attention_empirical(lanes, requests, s, n, n_kv, head, window, kv);
            match db.mode {
                DatabaseMode::Empirical => empirical()?,
                _ => match db.generation_attention(lanes, requests, s, n, n_kv, head, window, kv) {
                    Err(e) if db.mode == DatabaseMode::Hybrid && e.kind == ErrorKind::Data => empirical()?,
                    r => r?,
                },
            }
        };
        if verify > 1 {
            let math = db.generation_attention_math_ms(requests, s, n, n_kv, head, window, kv)?;
            v = v.max(math * f64::from(verify));
        }
        if qk_norm {
            v += self.qk_norm_ms(own, n_kv, head) * 1.1;
        }
        Ok(v.max(0.0) * scale)
    }

    /// The fused Q/K RMSNorm over one token's heads (both read and written), ms.
    fn qk_norm_ms(&self, n: u32, n_kv: u32, head: u32) -> f64 {
        let (q, kvn) = (f64::from(n * head), f64::from(n_kv * head));
        (self.mem(q * 2.0) * 2.0 + self.mem(kvn * 2.0) * 2.0) * 2.0
    }

    /// What a context attention op adds to its kernel: the fused Q/K norm and rotary passes and
    /// the K and V cache writes, with the reference's 10% margin, ms.
    fn context_attention_extras(&self, n: u32, n_kv: u32, head: u32, qk_norm: bool, rope: bool, fmha: Dtype) -> f64 {
        let (q, kvn) = (f64::from(n * head), f64::from(n_kv * head));
        let mut extra = 0.0;
        if qk_norm {
            extra += self.qk_norm_ms(n, n_kv, head);
        }
        if rope {
            extra += self.mem(q * 2.0 + kvn * 2.0) * 2.0;
        }
        extra += self.mem(kvn * fmha.bytes()) + self.mem(kvn * fmha.bytes()); // K and V writes
        extra * 1.1
    }

    /// The whole model's speed-of-light time of one pass at a collected FPM table's iteration
    /// totals (`fpm_interp`'s utilisation transfer), ms: a prefill at `[batch, new tokens, KV
    /// read]` or a decode step at `[batch, KV read]`, every op of the phase at its SOL (the
    /// database must answer SOL). The totals are whole numbers; a request's share of them
    /// (new tokens `s`, cached `prefix`) is kept fractional through the attention rooflines
    /// as the reference keeps it; the token-major ops see the step's total tokens (the logits
    /// GEMM one row per request). The families the reference has no such roofline for, DSA under
    /// prefill context parallelism and any graph under decode context parallelism are refused by
    /// name.
    pub fn fpm_sol_ms(&self, decode: bool, coords: &[f64]) -> Result<f64> {
        if !self.db.mode.is_sol() {
            return Err(PerfError::config("the FPM roofline reads a database answering SOL"));
        }
        if self.layout.dcp > 1 {
            return Err(PerfError::unsupported(format!(
                "dcp={}: DCP FPM supports measured interpolation, not op-level SOL transfer (as in the reference)",
                self.layout.dcp
            )));
        }
        let batch = coords[0];
        let (s, prefix, x, ops) = if decode {
            ((coords[1] / batch).max(1.0), 0.0, batch, &self.generation_ops)
        } else {
            ((coords[1] / batch).max(1.0), coords[2] / batch, coords[1], &self.context_ops)
        };
        // The graph's first refusal is the DSA block's, ahead of the CP norms' wrappers, as the
        // reference's is.
        if let Some(e) = ops.iter().find_map(|op| if let Op::Dsa(d) = op { crate::dsa::fpm_refusal(d) } else { None }) {
            return Err(e);
        }
        let mut total = 0.0;
        for op in ops {
            let logits = matches!(op, Op::Gemm { logits: true, .. });
            // Whole numbers by construction (the query's or a collected site's totals).
            let x = if logits { batch } else { x } as u32;
            let x = if decode { x } else { self.cp_share(op, x) };
            total += self.fpm_sol_op(op, x, batch, s, prefix).map_err(|e| e.context(format!("op {}", op.name())))?;
        }
        Ok(total)
    }

    fn fpm_sol_op(&self, op: &Op, x: u32, batch: f64, s: f64, prefix: f64) -> Result<f64> {
        let db = &self.db;
        Ok(match op {
            Op::ContextAttention { scale, n, n_kv, head, window, kv, fmha, qk_norm, cp, rope, .. } => {
                let flops = fmha.flops(&db.spec)?;
                let kernel = |s: f64, p: f64| {
                    ctx_attn_sol_prefix(&db.spec, *head, *window, *kv, flops, batch, s, p, *n as f64, *n_kv as f64)
                };
                let table = if *cp > 1 {
                    let c = (s / f64::from(2 * cp)).ceil().max(1.0);
                    kernel(c, prefix) + kernel(c, prefix + s - c)
                } else {
                    kernel(s, prefix)
                };
                (table + self.context_attention_extras(*n, *n_kv, *head, *qk_norm, *rope, *fmha)) * scale
            }
            Op::GenerationAttention { scale, n, n_kv, head, window, kv, qk_norm, .. } => {
                let flops = gen_attn_dtype(&db.spec, *kv).flops(&db.spec)?;
                let mut v = gen_attn_sol(&db.spec, *n_kv, *head, *window, *kv, flops, *n as f64, batch, s);
                if *qk_norm {
                    v += self.qk_norm_ms(*n, *n_kv, *head) * 1.1;
                }
                v * scale
            }
            Op::Overlap { a, b, .. } => {
                let mut sums = [0.0f64; 2];
                for (sum, chain) in sums.iter_mut().zip([a, b]) {
                    for op in chain {
                        *sum += self.fpm_sol_op(op, x, batch, s, prefix)?;
                    }
                }
                sums[0].max(sums[1])
            }
            // A roofline answers without tables, so the primary always does.
            Op::Fallback { primary, .. } => self.fpm_sol_op(primary, x, batch, s, prefix)?,
            Op::Dsa(d) => crate::dsa::fpm_sol(db, d, batch, s, prefix)?,
            Op::Mla(_)
            | Op::MlaBmm(_)
            | Op::Msa(_)
            | Op::Dsv4Attn(_)
            | Op::Dsv41(_)
            | Op::Mhc(_)
            | Op::Mamba2(_)
            | Op::Gdn(_)
            | Op::Kda(_)
            | Op::MoeA2a(_)
            | Op::WideEpMla(_)
            | Op::TpShare { .. }
            | Op::ExpertCompute(_) => {
                return Err(PerfError::unsupported(format!(
                    "forward_model='fpm' SOL roofline has no implementation for op {} (as in the reference)",
                    op.name()
                )))
            }
            // Unreachable by a valid deployment, in servesim as in the installed reference: the
            // drafts of a speculative scheme are the reference's only token-scaled ops, and every
            // FPM mode refuses speculation before a table is read ("... speculation requires
            // op_level timing", `fpm::select`); servesim's other wrapper, DSA prefill CP's norms,
            // sits in a graph refused first at its attention block. Kept as a refusal rather than
            // a guess at fractional token counts.
            Op::TokenScale { .. } => {
                return Err(PerfError::unsupported(format!(
                    "servesim's forward_model='fpm' SOL roofline does not time the token-scaled op {}",
                    op.name()
                )))
            }
            // Token-major: their SOL depends on the step's tokens only.
            _ => self.eval(op, At { batch: batch as u32, s: s as u32, prefix: prefix as u32, x })?,
        })
    }

    /// The tokens a context op processes on the busiest prefill context-parallel rank: its
    /// share of the prompt's `x`, except for the KV all-gather, which moves every token, and
    /// the MoE dispatch and experts, which see every rank's tokens (the dispatch gathers them).
    /// The MLA graph's pipeline hand-off moves the whole prompt too, as the reference sizes it.
    /// A DSA graph splits nothing here: its attention block times the split itself and its
    /// norms carry their own share (`dsa.rs`).
    fn cp_share(&self, op: &Op, x: u32) -> u32 {
        let cp = self.layout.cp.max(1);
        let whole = match op {
            // (The all-to-all divides the rank's tokens by tp × cp itself.)
            Op::CpAllGather { .. } | Op::Moe(_) | Op::MoeDispatch(_) | Op::MoeA2a(_) | Op::ExpertCompute(_) => true,
            Op::P2P { .. } => self.model.family == Family::Mla,
            // DSA's wide-EP graph splits its shared expert's tokens like the MLA graph.
            _ => self.model.dsa.is_some() && !self.layout.moe_comm.is_large_ep(),
        };
        if cp == 1 || whole {
            x
        } else {
            x.div_ceil(cp)
        }
    }

    fn context_at(&self, op: &Op, batch: u32, s: u32, prefix: u32) -> Result<f64> {
        let logits = matches!(op, Op::Gemm { logits: true, .. });
        let x = self.cp_share(op, if logits { batch } else { tokens(batch, s, "prefill")? });
        self.eval(op, At { batch, s, prefix, x }).map_err(|e| e.context(format!("op {}", op.name())))
    }

    fn generation_at(&self, op: &Op, batch: u32, s: u32) -> Result<f64> {
        self.eval(op, At { batch, s, prefix: 0, x: batch }).map_err(|e| e.context(format!("op {}", op.name())))
    }

    /// One context op of a prefill of `batch` requests of `s` new tokens each, every op
    /// (the logits GEMM too) at the `batch · s` tokens of the whole step: the shape the
    /// attention/FFN-disaggregated model (`afd.rs`) reads each pool's ops at.
    pub fn context_op_at_tokens(&self, op: &Op, batch: u32, s: u32, prefix: u32) -> Result<f64> {
        let x = tokens(batch, s, "prefill")?;
        self.eval(op, At { batch, s, prefix, x }).map_err(|e| e.context(format!("op {}", op.name())))
    }

    /// One generation op of a decode step of `batch` tokens over `context` tokens of KV each.
    pub fn generation_op_ms(&self, op: &Op, batch: u32, context: u32) -> Result<f64> {
        self.generation_at(op, batch, context)
    }

    /// Every context op of a prefill of `batch` requests reaching `isl` tokens with `prefix` of
    /// them cached: `(name, ms)`.
    pub fn prefill_ops(&self, batch: u32, isl: u32, prefix: u32) -> Result<Vec<(String, f64)>> {
        if batch == 0 || isl <= prefix {
            return Ok(Vec::new());
        }
        let s = isl - prefix;
        tokens(batch, s, "prefill")?;
        self.context_ops.iter().map(|op| Ok((op.name().to_string(), self.context_at(op, batch, s, prefix)?))).collect()
    }

    /// Every generation op of one decode step of `batch` requests whose KV (current token
    /// included) is `context` tokens long: `(name, ms)`.
    pub fn decode_ops(&self, batch: u32, context: u32) -> Result<Vec<(String, f64)>> {
        if batch == 0 {
            return Ok(Vec::new());
        }
        if context == 0 {
            return Err(PerfError::config("a decode step needs a context of at least one token"));
        }
        let bs = tokens(batch, self.layout.verify_width(), "decode")?;
        self.generation_ops.iter().map(|op| Ok((op.name().to_string(), self.generation_at(op, bs, context)?))).collect()
    }

    fn memoised(&self, key: (u8, u32, u32, u32), f: impl FnOnce() -> Result<f64>) -> Result<f64> {
        if let Some(v) = self.memo.lock().expect("memo").get(&key) {
            return Ok(*v);
        }
        let v = f()?;
        let mut memo = self.memo.lock().expect("memo");
        if memo.len() >= MEMO_LIMIT {
            memo.clear();
        }
        memo.insert(key, v);
        Ok(v)
    }

    /// Prefill step time (the reference's `predict_prefill_latency(batch, isl, prefix)`), ms.
    pub fn prefill_ms(&self, batch: u32, isl: u32, prefix: u32) -> Result<f64> {
        if batch == 0 || isl <= prefix {
            return Ok(0.0);
        }
        self.memoised((0, batch, isl, prefix), || {
            Ok(self.prefill_ops(batch, isl, prefix)?.iter().map(|(_, v)| v).sum())
        })
    }

    /// One decode step (the reference's `predict_decode_latency(batch, context − 1, 2)`), ms.
    pub fn decode_ms(&self, batch: u32, context: u32) -> Result<f64> {
        if batch == 0 {
            return Ok(0.0);
        }
        self.memoised((1, batch, context, 0), || Ok(self.decode_ops(batch, context)?.iter().map(|(_, v)| v).sum()))
    }

    /// A vLLM-style mixed pass timed as one forward (`pass_model: fused`; the reference and
    /// Dynamo time a prefill step plus a decode step): the prefill requests' new tokens and the
    /// decode requests' tokens go through every token-major op (GEMMs, experts, norms,
    /// communication) together, context attention runs at the prefill shape (`batch`
    /// requests reaching `isl` tokens, `prefix` of them cached), generation attention at the
    /// decode shape (`decode_batch` requests reading `context` tokens of KV each), and the
    /// logits GEMM reads one row per sequence. ms.
    pub fn fused_ms(&self, batch: u32, isl: u32, prefix: u32, decode_batch: u32, context: u32) -> Result<f64> {
        if batch == 0 || isl <= prefix {
            return self.decode_ms(decode_batch, context);
        }
        if decode_batch == 0 {
            return self.prefill_ms(batch, isl, prefix);
        }
        if self.layout.verify_width() > 1 {
            return Err(PerfError::unsupported(
                "fused mixed passes are not modelled with speculative decoding (nextn or ngram); use pass_model: additive",
            ));
        }
        let s = isl - prefix;
        let new_tokens = tokens(batch, s, "prefill")?;
        let all = new_tokens.checked_add(decode_batch).ok_or_else(|| PerfError::config("token count exceeds 2^32"))?;
        let sequences = batch + decode_batch;
        let mut total = 0.0;
        for op in &self.context_ops {
            total += if attends(op) {
                self.context_at(op, batch, s, prefix)?
            } else if matches!(op, Op::Gemm { logits: true, .. }) {
                continue;
            } else {
                let x = self.cp_share(op, all);
                self.eval(op, At { batch, s, prefix, x }).map_err(|e| e.context(format!("op {}", op.name())))?
            };
        }
        for op in &self.generation_ops {
            if attends(op) {
                total += self.generation_at(op, decode_batch, context)?;
            } else if matches!(op, Op::Gemm { logits: true, .. }) {
                total += self.generation_at(op, sequences, context)?;
            }
        }
        Ok(total)
    }

    /// Time of one rank's share of a forward pass, ms.
    pub fn rank_latency_ms(&self, r: &RankMetrics) -> Result<f64> {
        if self.model.dsv41.is_some() {
            let has_prefill = r.sum_prefill_tokens > 0;
            let pass = crate::dsv41::Dsv41Pass::from_totals(
                if has_prefill { r.num_prefill_requests.max(1) } else { 0 },
                r.sum_prefill_tokens,
                r.sum_prefill_kv_tokens,
                r.num_decode_requests,
                r.sum_decode_kv_tokens,
            );
            return self.dsv41_pass_ms(&pass);
        }
        let has_prefill = r.sum_prefill_tokens > 0;
        let has_decode = r.num_decode_requests > 0 || r.sum_decode_kv_tokens > 0;
        let p = r.num_prefill_requests.max(1);
        let d = r.num_decode_requests.max(1);
        if has_prefill && has_decode {
            // Mixed: non-attention work on all tokens as one sequence, context attention at the
            // prefill shape, decode attention at the decode shape. Attention is picked out by
            // name, as the reference does, so a DSA / MSA block (or an MLA kernel) named
            // `context_attention` is not timed as if the whole pass were one long prompt.
            let (t, c) = (r.sum_prefill_tokens, r.sum_prefill_kv_tokens);
            let combined = t
                .checked_add(r.num_decode_requests)
                .ok_or_else(|| PerfError::config("token count exceeds 2^32"))?
                .max(1);
            let mut total = 0.0;
            for op in &self.context_ops {
                // The draft's prefill runs over the prompt alone, with the context attention.
                if op.is_context_attention() || op.is_draft() {
                    continue;
                }
                let x = self.cp_share(op, if matches!(op, Op::Gemm { logits: true, .. }) { 1 } else { combined });
                total += self
                    .eval(op, At { batch: 1, s: combined, prefix: c, x })
                    .map_err(|e| e.context(format!("op {}", op.name())))?;
            }
            let per_req = (t / p).max(1);
            let attn_batch = t.div_ceil(per_req).max(1);
            let div = per_req.div_ceil(t.max(1)).max(1) as f64;
            for op in &self.context_ops {
                if op.is_context_attention() {
                    total += self
                        .eval(op, At { batch: attn_batch, s: per_req, prefix: c / p, x: t })
                        .map_err(|e| e.context(format!("op {}", op.name())))?
                        / div;
                } else if op.is_draft() {
                    total += self.context_at(op, attn_batch, per_req, c / p)? / div;
                }
            }
            let s = (r.sum_decode_kv_tokens / d).max(1);
            let verify_batch = tokens(d, self.layout.ngram + 1, "decode")?;
            for op in &self.generation_ops {
                if op.is_generation_attention() {
                    total += self
                        .eval(op, At { batch: verify_batch, s, prefix: 0, x: d })
                        .map_err(|e| e.context(format!("op {}", op.name())))?;
                } else if op.is_draft() && self.layout.nextn == 0 {
                    // The draft's decode work at the verify batch, which its TokenScale maps back.
                    // (A draft folded into the op lists by `nextn`, Kimi-K3's DSPARK, stays out of
                    // the mixed pass, as the reference's mix step keeps attention alone.)
                    total += self.generation_at(op, verify_batch, s)?;
                }
            }
            return Ok(total);
        }
        let mut total = 0.0;
        if has_prefill {
            let s = r.sum_prefill_tokens / p;
            let prefix = r.sum_prefill_kv_tokens / p;
            for op in &self.context_ops {
                total += self.context_at(op, p, s, prefix)?;
            }
        }
        if has_decode {
            let s = r.sum_decode_kv_tokens / d;
            for op in &self.generation_ops {
                // ngram's verify width (this path has never applied an MTP depth).
                total += self.generation_at(op, tokens(d, self.layout.ngram + 1, "decode")?, s)?;
            }
        }
        Ok(total)
    }

    /// One DeepSeek-V4.1 forward pass (`dsv41.rs`), ms: every prefill group's tokens and the
    /// decode tokens go through the prefill op list's token-major ops together (the logits GEMM
    /// at one row per request), each group's attention at its own shape, and the decode
    /// attention of the decode op list at the decode shape. A decode-only pass is the decode
    /// op list.
    pub fn dsv41_pass_ms(&self, pass: &crate::dsv41::Dsv41Pass) -> Result<f64> {
        let at_op = |op: &Op, at: At| self.eval(op, at).map_err(|e| e.context(format!("op {}", op.name())));
        let is_attention = |op: &Op, context: bool| matches!(op, Op::Dsv41(d) if d.is_attention(context));
        let mut total = 0.0;
        if pass.prefills.is_empty() {
            if pass.decode > 0 {
                for op in &self.generation_ops {
                    total += at_op(op, At { batch: pass.decode, s: pass.decode_kv, prefix: 0, x: pass.decode })?;
                }
            }
            return Ok(total);
        }
        let mut tokens = pass.decode;
        let mut requests = pass.decode;
        for &(batch, s, _) in &pass.prefills {
            tokens = batch
                .checked_mul(s)
                .and_then(|t| tokens.checked_add(t))
                .ok_or_else(|| PerfError::config("token count exceeds 2^32"))?;
            requests += batch;
        }
        for op in &self.context_ops {
            if is_attention(op, true) {
                for &(batch, s, prefix) in &pass.prefills {
                    total += at_op(op, At { batch, s, prefix, x: batch * s })?;
                }
            } else {
                let x = if matches!(op, Op::Gemm { logits: true, .. }) { requests } else { tokens };
                total += at_op(op, At { batch: 1, s: tokens, prefix: 0, x })?;
            }
        }
        if pass.decode > 0 {
            for op in self.generation_ops.iter().filter(|op| is_attention(op, false)) {
                total += at_op(op, At { batch: pass.decode, s: pass.decode_kv, prefix: 0, x: pass.decode })?;
            }
        }
        Ok(total)
    }

    /// Forward-pass time over attention-DP ranks: the slowest rank, ms.
    pub fn forward_pass_time_ms(&self, ranks: &[RankMetrics]) -> Result<f64> {
        if ranks.is_empty() {
            return Err(PerfError::config("at least one attention-DP rank metric required"));
        }
        let mut max = 0.0f64;
        for r in ranks {
            max = max.max(self.rank_latency_ms(r)?);
        }
        Ok(max)
    }

    /// KV-cache bytes per token per GPU. Every layer counts whatever the pipeline depth, as the
    /// reference counts it (its KV capacity and transfer sizes do not split the KV by stage).
    /// MLA models keep one latent vector (`kv_lora_rank + qk_rope_head_dim` elements) per layer
    /// and token, shared by every head and not split by tensor parallelism; DSA models add the
    /// indexer's key cache.
    pub fn kv_bytes_per_token(&self) -> f64 {
        let m = &self.model;
        if let Some(d) = &m.dsv41 {
            // A one-token sequence's cache (window row, published entries and compressor state).
            return d.kv_bytes(1, &self.layout.backend).unwrap_or(f64::NAN);
        }
        if let Some(nh) = &m.nemotron_h {
            return crate::mamba2::kv_bytes_per_token(nh, m, self.layout.tp, self.layout.kv);
        }
        if let Some(d) = &m.dsa {
            // DSA: the latent (rope part kept in bf16) and the fp8 indexer key of every layer.
            let [kv_lora, rope, index] = d.kv_dims.map(f64::from);
            let entry = f64::from(crate::dsa::indexer_cache_entry_bytes(index as u32));
            return m.layers as f64 * (kv_lora * self.layout.kv.bytes() + rope * 2.0 + entry);
        }
        if let Some(g) = &m.gemma4 {
            return crate::gemma4::kv_bytes_per_token(g, self.layout.tp, self.layout.kv);
        }
        if let (Some(k), Some(d)) = (&m.kimi_k3, &m.mla) {
            return crate::kimi_k3::kv_bytes_per_token(k, d, &self.layout);
        }
        if let Some(q) = &m.qwen35 {
            return crate::gdn::kv_bytes_per_token(m, q, self.layout.tp, self.layout.kv);
        }
        if let Some(d) = m.mla {
            let latent = (d.kv_lora_rank + d.qk_rope_head_dim) as f64;
            return m.layers as f64 * latent * self.layout.kv.bytes();
        }
        let kv_per_gpu = m.kv_heads.div_ceil(self.layout.tp) as f64;
        2.0 * kv_per_gpu * m.head_dim as f64 * m.layers as f64 * self.layout.kv.bytes()
    }

    pub fn gemm_dtype(&self) -> Dtype {
        self.layout.gemm
    }
}

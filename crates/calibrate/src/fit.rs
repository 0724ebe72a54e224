//! The fit: a Nelder–Mead search of the free parameters minimising the mean squared log error
//! of the chosen metrics over the stages, and its cross-validation (leave one experiment out, or
//! one stage out when all stages come from one experiment).
//!
//! Log errors weigh a 10 % miss on a 20 ms TTFT like one on a 5 s E2E, and a prediction 2× too
//! high like one 2× too low. A stage the simulation cannot finish, or one it predicts without a
//! metric that was measured, costs a fixed penalty, so that the search moves away from it.

use crate::{Metric, Metrics, Param, Params};

/// Runs the measured deployment with `params` and returns the metrics of the stages asked for
/// (by index, in that order; `None` for a stage that did not complete).
pub trait Simulator {
    fn predict(&mut self, params: &Params, stages: &[usize]) -> Vec<Option<Metrics>>;
}

/// One measured stage.
#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    pub name: String,
    /// Its cross-validation group (the experiment it belongs to).
    pub group: String,
    pub measured: Metrics,
}

/// What to fit.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub free: Vec<Param>,
    /// The metrics the loss counts (those a stage did not measure are skipped).
    pub metrics: Vec<Metric>,
    /// Where the search starts; the parameters not freed keep these values.
    pub start: Params,
    /// Simulations per fit, at most.
    pub max_evaluations: usize,
}

/// A squared log error this large counts a stage that failed to predict.
const PENALTY: f64 = 25.0;

/// The loss of predictions against stages.
pub fn loss(stages: &[&Stage], predicted: &[Option<Metrics>], metrics: &[Metric]) -> f64 {
    let mut total = 0.0;
    let mut n = 0usize;
    for (stage, pred) in stages.iter().zip(predicted) {
        for m in metrics {
            let Some(&meas) = stage.measured.get(m) else { continue };
            n += 1;
            total += match pred.as_ref().and_then(|p| p.get(m)) {
                Some(&p) if p > 0.0 && p.is_finite() => (p / meas).ln().powi(2).min(PENALTY),
                _ => PENALTY,
            };
        }
    }
    if n == 0 {
        0.0
    } else {
        total / n as f64
    }
}

/// The search coordinates of a parameter vector: log for scales, ms for costs.
fn to_coords(p: &Params, free: &[Param]) -> Vec<f64> {
    free.iter().map(|&f| if f.is_scale() { p.get(f).ln() } else { p.get(f) }).collect()
}

fn from_coords(x: &[f64], free: &[Param], base: &Params) -> Params {
    let mut p = *base;
    for (&f, &v) in free.iter().zip(x) {
        p.set(f, if f.is_scale() { v.exp() } else { v });
    }
    p
}

/// A fitted parameter vector and what it took.
#[derive(Clone, Debug, PartialEq)]
pub struct Fitted {
    pub params: Params,
    pub loss: f64,
    pub evaluations: usize,
}

/// Fits `opts.free` on the stages `which`.
pub fn fit(sim: &mut dyn Simulator, stages: &[Stage], which: &[usize], opts: &Options) -> Fitted {
    let chosen: Vec<&Stage> = which.iter().map(|&i| &stages[i]).collect();
    let mut evaluations = 0usize;
    let mut eval = |x: &[f64]| {
        evaluations += 1;
        let p = from_coords(x, &opts.free, &opts.start);
        loss(&chosen, &sim.predict(&p, which), &opts.metrics)
    };
    let x0 = to_coords(&opts.start, &opts.free);
    if opts.free.is_empty() {
        let l = eval(&x0);
        return Fitted { params: opts.start, loss: l, evaluations };
    }
    // Initial steps: 15 % on a scale, 1 ms of pass overhead, 5 ms of frontend.
    let steps: Vec<f64> = opts
        .free
        .iter()
        .map(|f| match f {
            Param::PrefillScale | Param::DecodeScale => 0.15,
            Param::PassOverheadMs => 1.0,
            Param::FrontendMs => 5.0,
        })
        .collect();
    let (x, l) = nelder_mead(&mut eval, &x0, &steps, opts.max_evaluations);
    Fitted { params: from_coords(&x, &opts.free, &opts.start), loss: l, evaluations }
}

/// Nelder–Mead with the standard coefficients; stops when the simplex's losses agree to 1e-7 or
/// after `budget` evaluations.
fn nelder_mead(f: &mut dyn FnMut(&[f64]) -> f64, x0: &[f64], steps: &[f64], budget: usize) -> (Vec<f64>, f64) {
    let n = x0.len();
    let mut simplex: Vec<(Vec<f64>, f64)> = Vec::with_capacity(n + 1);
    simplex.push((x0.to_vec(), f(x0)));
    for i in 0..n {
        let mut x = x0.to_vec();
        x[i] += steps[i];
        let l = f(&x);
        simplex.push((x, l));
    }
    let mut used = n + 1;
    let point = |a: &[f64], b: &[f64], t: f64| -> Vec<f64> { a.iter().zip(b).map(|(a, b)| a + t * (b - a)).collect() };
    while used < budget {
        simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
        if simplex[n].1 - simplex[0].1 <= 1e-7 * (1.0 + simplex[0].1.abs()) {
            break;
        }
        let centroid: Vec<f64> =
            (0..n).map(|j| simplex[..n].iter().map(|(x, _)| x[j]).sum::<f64>() / n as f64).collect();
        let worst = simplex[n].clone();
        // Reflect through the centroid of the others.
        let r = point(&centroid, &worst.0, -1.0);
        let lr = f(&r);
        used += 1;
        if lr < simplex[0].1 {
            let e = point(&centroid, &worst.0, -2.0);
            let le = f(&e);
            used += 1;
            simplex[n] = if le < lr { (e, le) } else { (r, lr) };
        } else if lr < simplex[n - 1].1 {
            simplex[n] = (r, lr);
        } else {
            let c = if lr < worst.1 { point(&centroid, &r, 0.5) } else { point(&centroid, &worst.0, 0.5) };
            let lc = f(&c);
            used += 1;
            if lc < worst.1.min(lr) {
                simplex[n] = (c, lc);
            } else {
                // Shrink towards the best.
                let best = simplex[0].0.clone();
                for s in simplex.iter_mut().skip(1) {
                    s.0 = point(&best, &s.0, 0.5);
                    s.1 = f(&s.0);
                    used += 1;
                }
            }
        }
    }
    simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
    simplex.swap_remove(0)
}

/// How the fit was cross-validated.
#[derive(Clone, Debug, PartialEq)]
pub enum Scheme {
    /// Fewer than two stages: nothing to hold out.
    None,
    LeaveOneStageOut,
    LeaveOneExperimentOut,
}

impl Scheme {
    pub fn describe(&self) -> &'static str {
        match self {
            Scheme::None => "none (a single stage)",
            Scheme::LeaveOneStageOut => "leave one stage out (one experiment)",
            Scheme::LeaveOneExperimentOut => "leave one experiment out",
        }
    }
}

/// The calibration: fitted on every stage, with each stage's in-sample prediction and, where
/// cross-validated, its prediction by a fit that did not see it.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub fitted: Fitted,
    pub scheme: Scheme,
    pub folds: usize,
    pub in_sample: Vec<Option<Metrics>>,
    pub held_out: Vec<Option<Metrics>>,
    pub uncalibrated: Vec<Option<Metrics>>,
}

/// Fits on all stages, predicts them calibrated, and cross-validates. `uncalibrated` is the
/// caller's prediction of every stage at `opts.start` (the run that checks the deployment runs
/// at all), kept for the account.
pub fn calibrate(
    sim: &mut dyn Simulator,
    stages: &[Stage],
    opts: &Options,
    uncalibrated: Vec<Option<Metrics>>,
) -> Outcome {
    let all: Vec<usize> = (0..stages.len()).collect();
    let fitted = fit(sim, stages, &all, opts);
    let in_sample = sim.predict(&fitted.params, &all);
    let mut groups: Vec<&str> = stages.iter().map(|s| s.group.as_str()).collect();
    groups.sort_unstable();
    groups.dedup();
    let (scheme, folds): (Scheme, Vec<Vec<usize>>) = if groups.len() >= 2 {
        let folds = groups.iter().map(|g| all.iter().copied().filter(|&i| stages[i].group == *g).collect()).collect();
        (Scheme::LeaveOneExperimentOut, folds)
    } else if stages.len() >= 2 {
        (Scheme::LeaveOneStageOut, all.iter().map(|&i| vec![i]).collect())
    } else {
        (Scheme::None, Vec::new())
    };
    let mut held_out = vec![None; stages.len()];
    for fold in &folds {
        let train: Vec<usize> = all.iter().copied().filter(|i| !fold.contains(i)).collect();
        // Each fold starts from the full fit, with a smaller budget: it only has to move as far
        // as leaving its stages out moves the optimum.
        let fold_opts = Options { start: fitted.params, max_evaluations: opts.max_evaluations / 2, ..opts.clone() };
        let f = fit(sim, stages, &train, &fold_opts);
        for (i, pred) in fold.iter().zip(sim.predict(&f.params, fold)) {
            held_out[*i] = pred;
        }
    }
    Outcome { fitted, scheme, folds: folds.len(), in_sample, held_out, uncalibrated }
}

/// Signed relative error of a prediction, in %.
pub fn error_pct(pred: f64, meas: f64) -> f64 {
    (pred / meas - 1.0) * 100.0
}

/// Median and mean absolute error (%) of `metric` over the stages predicted.
pub fn summary(stages: &[Stage], predicted: &[Option<Metrics>], metric: Metric) -> Option<(f64, f64, usize)> {
    let mut abs: Vec<f64> = stages
        .iter()
        .zip(predicted)
        .filter_map(|(s, p)| Some(error_pct(*p.as_ref()?.get(&metric)?, *s.measured.get(&metric)?).abs()))
        .collect();
    if abs.is_empty() {
        return None;
    }
    abs.sort_by(f64::total_cmp);
    let median = crate::stage::percentile(&abs, 50.0);
    Some((median, abs.iter().sum::<f64>() / abs.len() as f64, abs.len()))
}

/// The model error of `metric`: the root mean square of the log errors (a stage that did not
/// predict is left out), the spread an interval must add to cover it, and how many stages it
/// was measured on.
pub fn model_error(stages: &[Stage], predicted: &[Option<Metrics>], metric: Metric) -> Option<crate::file::ModelError> {
    let logs: Vec<f64> = stages
        .iter()
        .zip(predicted)
        .filter_map(|(s, p)| Some((p.as_ref()?.get(&metric)? / s.measured.get(&metric)?).ln()))
        .filter(|x| x.is_finite())
        .collect();
    (!logs.is_empty()).then(|| crate::file::ModelError {
        log_rms: (logs.iter().map(|x| x * x).sum::<f64>() / logs.len() as f64).sqrt(),
        stages: logs.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deployment whose TTFT is frontend + 20 ms × prefill scale × load and whose TPOT is
    /// overhead + 8 ms × decode scale × load, at loads 1, 2 and 3.
    struct Analytic {
        calls: usize,
    }

    fn truth(p: &Params, load: f64) -> Metrics {
        let ttft = p.frontend_ms + 20.0 * p.prefill_scale * load;
        let tpot = p.pass_overhead_ms + 8.0 * p.decode_scale * load;
        Metrics::from([(Metric::TtftMean, ttft), (Metric::TpotMean, tpot), (Metric::E2eMean, ttft + 99.0 * tpot)])
    }

    impl Simulator for Analytic {
        fn predict(&mut self, params: &Params, stages: &[usize]) -> Vec<Option<Metrics>> {
            self.calls += 1;
            stages.iter().map(|&i| Some(truth(params, 1.0 + (i % 3) as f64))).collect()
        }
    }

    fn measured(real: &Params, groups: &[&str]) -> Vec<Stage> {
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| Stage {
                name: format!("s{i}"),
                group: g.to_string(),
                measured: truth(real, 1.0 + (i % 3) as f64),
            })
            .collect()
    }

    fn options(free: &[Param]) -> Options {
        Options {
            free: free.to_vec(),
            metrics: vec![Metric::TtftMean, Metric::TpotMean, Metric::E2eMean],
            start: Params::default(),
            max_evaluations: 400,
        }
    }

    #[test]
    fn the_fit_recovers_the_parameters_that_made_the_measurements() {
        let real = Params { prefill_scale: 1.3, decode_scale: 0.9, pass_overhead_ms: 0.0, frontend_ms: 9.5 };
        let stages = measured(&real, &["a", "a", "a"]);
        let mut sim = Analytic { calls: 0 };
        let free = [Param::PrefillScale, Param::DecodeScale, Param::FrontendMs];
        let start = sim.predict(&Params::default(), &[0, 1, 2]);
        let out = calibrate(&mut sim, &stages, &options(&free), start);
        let p = out.fitted.params;
        assert!((p.prefill_scale - 1.3).abs() < 1e-3, "{p:?}");
        assert!((p.decode_scale - 0.9).abs() < 1e-3, "{p:?}");
        assert!((p.frontend_ms - 9.5).abs() < 0.05, "{p:?}");
        assert_eq!(p.pass_overhead_ms, 0.0);
        assert_eq!((out.scheme, out.folds), (Scheme::LeaveOneStageOut, 3));
        // The model is exact, so held-out stages are predicted as well as in-sample ones.
        let (median, _, n) = summary(&stages, &out.held_out, Metric::TtftMean).unwrap();
        assert_eq!(n, 3);
        assert!(median < 0.5, "held-out TTFT error {median} %");
        let (uncal, _, _) = summary(&stages, &out.uncalibrated, Metric::TtftMean).unwrap();
        assert!(uncal > 10.0, "uncalibrated TTFT error {uncal} %");
    }

    #[test]
    fn experiments_are_held_out_whole_and_parameters_stay_in_bounds() {
        // A real decode 40× slower than the model: the scale stops at its bound.
        let real = Params { decode_scale: 40.0, ..Params::default() };
        let stages = measured(&real, &["x", "x", "y", "y"]);
        let mut sim = Analytic { calls: 0 };
        let start = sim.predict(&Params::default(), &[0, 1, 2, 3]);
        let out = calibrate(&mut sim, &stages, &options(&[Param::DecodeScale]), start);
        assert_eq!(out.fitted.params.decode_scale, 20.0);
        assert_eq!((out.scheme, out.folds), (Scheme::LeaveOneExperimentOut, 2));
        assert!(out.held_out.iter().all(Option::is_some));
    }

    #[test]
    fn a_stage_that_does_not_predict_costs_the_penalty() {
        let stage = Stage { name: "s".into(), group: "g".into(), measured: Metrics::from([(Metric::TtftMean, 10.0)]) };
        assert_eq!(loss(&[&stage], &[None], &[Metric::TtftMean]), PENALTY);
        let doubled = Some(Metrics::from([(Metric::TtftMean, 20.0)]));
        assert!((loss(&[&stage], &[doubled], &[Metric::TtftMean]) - 2f64.ln().powi(2)).abs() < 1e-12);
        // A metric the stage did not measure does not count.
        assert_eq!(loss(&[&stage], &[None], &[Metric::TpotMean]), 0.0);
    }
}

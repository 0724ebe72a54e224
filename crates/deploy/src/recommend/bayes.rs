//! The surrogate model of the bayesian recommend search: a Gaussian process over points in
//! [0, 1]^d (Matérn 5/2 kernel, unit signal variance, small noise, the length scale picked from a
//! fixed ladder by log marginal likelihood) and expected improvement over a finite set of
//! proposals. Batches are chosen one point at a time: each pick is "believed" at the model's mean
//! (the mean elsewhere does not change) and the variance is conditioned on it, so the next pick
//! looks elsewhere. Plain loops in a fixed order: the same inputs give the same picks, bit for bit.

/// Observation noise (the targets are standardised), and the jitter added on a failed Cholesky.
const NOISE: f64 = 1e-6;
const LENGTH_SCALES: [f64; 7] = [0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 2.0];
/// Expected improvement over the best observation plus this margin (standardised units).
const XI: f64 = 0.01;

fn matern52(a: &[f64], b: &[f64], ls: f64) -> f64 {
    let d2: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let r = (5.0 * d2).sqrt() / ls;
    (1.0 + r + r * r / 3.0) * (-r).exp()
}

/// The lower Cholesky factor of a symmetric positive definite matrix (row-major n×n).
fn cholesky(k: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            let mut s = k[i * n + j];
            for p in 0..j {
                s -= l[i * n + p] * l[j * n + p];
            }
            if i == j {
                if s <= 0.0 || !s.is_finite() {
                    return None;
                }
                l[i * n + i] = s.sqrt();
            } else {
                l[i * n + j] = s / l[j * n + j];
            }
        }
    }
    Some(l)
}

/// Solves L x = b (forward substitution).
fn forward(l: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut x = vec![0.0; n];
    for i in 0..n {
        let mut s = b[i];
        for p in 0..i {
            s -= l[i * n + p] * x[p];
        }
        x[i] = s / l[i * n + i];
    }
    x
}

/// Solves Lᵀ x = b (back substitution).
fn backward(l: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        let mut s = b[i];
        for p in i + 1..n {
            s -= l[p * n + i] * x[p];
        }
        x[i] = s / l[i * n + i];
    }
    x
}

/// A fitted model: the factor, the weights and the length scale.
struct Fit {
    l: Vec<f64>,
    alpha: Vec<f64>,
    ls: f64,
    lml: f64,
}

fn fit(xs: &[&[f64]], y: &[f64], ls: f64) -> Option<Fit> {
    let n = xs.len();
    let mut k = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            k[i * n + j] = matern52(xs[i], xs[j], ls);
        }
    }
    let mut jitter = NOISE;
    let l = loop {
        let mut kk = k.clone();
        for i in 0..n {
            kk[i * n + i] += jitter;
        }
        if let Some(l) = cholesky(&kk, n) {
            break l;
        }
        jitter *= 10.0;
        if jitter > 1.0 {
            return None;
        }
    };
    let alpha = backward(&l, n, &forward(&l, n, y));
    let lml =
        -0.5 * y.iter().zip(&alpha).map(|(a, b)| a * b).sum::<f64>() - (0..n).map(|i| l[i * n + i].ln()).sum::<f64>();
    Some(Fit { l, alpha, ls, lml })
}

/// The standard normal density and distribution function (erfc after W. J. Cody's rational
/// approximation as given in Numerical Recipes, |error| < 1.2e-7).
fn pdf(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

fn cdf(z: f64) -> f64 {
    let x = -z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let y = t
        * (-x * x - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    let erfc = if x >= 0.0 { y } else { 2.0 - y };
    0.5 * erfc
}

fn expected_improvement(mu: f64, var: f64, best: f64) -> f64 {
    let sigma = var.max(0.0).sqrt();
    let gain = mu - best - XI;
    if sigma < 1e-12 {
        return gain.max(0.0);
    }
    let z = gain / sigma;
    gain * cdf(z) + sigma * pdf(z)
}

/// Picks `want` of `cands` (by index, each at most once) to evaluate next, given the points seen
/// (`xs`) and their values (`ys`, higher is better).
pub(super) fn propose(xs: &[&[f64]], ys: &[f64], cands: &[&[f64]], want: usize) -> Vec<usize> {
    let want = want.min(cands.len());
    if want == 0 {
        return Vec::new();
    }
    let n = xs.len();
    let mean = ys.iter().sum::<f64>() / n.max(1) as f64;
    let sd = (ys.iter().map(|y| (y - mean) * (y - mean)).sum::<f64>() / n.max(1) as f64).sqrt();
    let sd = if sd > 0.0 && sd.is_finite() { sd } else { 1.0 };
    let y: Vec<f64> = ys.iter().map(|v| (v - mean) / sd).collect();
    let best = y.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut chosen: Option<Fit> = None;
    for ls in LENGTH_SCALES {
        if let Some(f) = fit(xs, &y, ls) {
            if chosen.as_ref().is_none_or(|c| f.lml > c.lml) {
                chosen = Some(f);
            }
        }
    }
    let m = cands.len();
    // Without a model (it never happens with distinct points), fall back to the proposals' order.
    let Some(f) = chosen else { return (0..want).collect() };
    // Each proposal's posterior mean and variance, and L⁻¹k(x) for the batch conditioning.
    let mut mu = vec![0.0; m];
    let mut var = vec![0.0; m];
    let mut v: Vec<Vec<f64>> = Vec::with_capacity(m);
    for (c, x) in cands.iter().enumerate() {
        let k: Vec<f64> = xs.iter().map(|o| matern52(x, o, f.ls)).collect();
        mu[c] = k.iter().zip(&f.alpha).map(|(a, b)| a * b).sum();
        let vc = forward(&f.l, n, &k);
        var[c] = (1.0 - vc.iter().map(|a| a * a).sum::<f64>()).max(0.0);
        v.push(vc);
    }
    let mut taken = vec![false; m];
    let mut picks = Vec::with_capacity(want);
    // The earlier picks' posterior covariance with every proposal, and their variances.
    let mut covs: Vec<(Vec<f64>, f64)> = Vec::new();
    for _ in 0..want {
        let mut pick = None;
        let mut top = f64::NEG_INFINITY;
        for c in 0..m {
            if taken[c] {
                continue;
            }
            let ei = expected_improvement(mu[c], var[c], best);
            if ei > top {
                top = ei;
                pick = Some(c);
            }
        }
        let Some(b) = pick.or_else(|| (0..m).find(|&c| !taken[c])) else { break };
        taken[b] = true;
        picks.push(b);
        // Condition on b believed at its mean: cov(x, b) under the data and the earlier picks.
        let s = var[b] + NOISE;
        let mut cov = vec![0.0; m];
        for c in 0..m {
            if taken[c] {
                continue;
            }
            let mut k = matern52(cands[c], cands[b], f.ls) - v[c].iter().zip(&v[b]).map(|(a, b)| a * b).sum::<f64>();
            for (prev, sp) in &covs {
                k -= prev[c] * prev[b] / sp;
            }
            cov[c] = k;
            var[c] = (var[c] - k * k / s).max(0.0);
        }
        cov[b] = s - NOISE;
        covs.push((cov, s));
    }
    picks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_normal_distribution_function_is_accurate() {
        for (z, want) in [(0.0, 0.5), (1.0, 0.841344746), (-1.96, 0.024997895), (3.0, 0.998650102)] {
            assert!((cdf(z) - want).abs() < 1e-6, "{z}: {}", cdf(z));
        }
    }

    #[test]
    fn proposals_head_for_the_better_region_and_spread_out() {
        // y = -(x - 0.8)^2 observed at 0, 0.25, 0.5; proposals on a grid.
        let obs = [[0.0], [0.25], [0.5]];
        let xs: Vec<&[f64]> = obs.iter().map(|p| p.as_slice()).collect();
        let ys: Vec<f64> = obs.iter().map(|p| -(p[0] - 0.8) * (p[0] - 0.8)).collect();
        let grid: Vec<[f64; 1]> = (0..=20).map(|i| [i as f64 / 20.0]).collect();
        let cands: Vec<&[f64]> = grid.iter().map(|p| p.as_slice()).collect();
        let picks = propose(&xs, &ys, &cands, 3);
        assert_eq!(picks.len(), 3);
        assert!(grid[picks[0]][0] > 0.5, "{picks:?}");
        let mut sorted = picks.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 3, "no proposal twice");
        assert_eq!(picks, propose(&xs, &ys, &cands, 3), "deterministic");
    }
}

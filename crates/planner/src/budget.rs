//! The GPU budget (`dynamo/planner/core/budget.py`): a band `[min − tol, max]` on the total
//! GPUs of the deployment, proportional clamps, and direction-preserving guards. A negative
//! bound is off.

/// Does `total` fit `[min − tol, max]`?
pub fn in_band(total: i64, min: i64, max: i64, tol: i64) -> bool {
    let over = max >= 0 && total > max;
    let under = min >= 0 && total < min - tol;
    !over && !under
}

fn tolerance(p_gpu: i64, d_gpu: i64) -> i64 {
    [p_gpu, d_gpu].into_iter().filter(|g| *g > 0).max().unwrap_or(0)
}

fn floor_div(a: i64, b: i64) -> i64 {
    a.div_euclid(b)
}

fn ceil_div(a: i64, b: i64) -> i64 {
    -(-a).div_euclid(b)
}

/// `proportional_clamp_pair`: brings `(p, d)` into the band, shrinking under the ceiling or
/// growing toward the floor proportionally; `(0, 0)` when the minimum footprint exceeds `max`.
#[allow(clippy::too_many_arguments)]
pub fn clamp_pair(p: i64, d: i64, p_gpu: i64, d_gpu: i64, min: i64, max: i64, p_min: i64, d_min: i64) -> (i64, i64) {
    if (min < 0 && max < 0) || p_gpu <= 0 || d_gpu <= 0 {
        return (p, d);
    }
    let total = p * p_gpu + d * d_gpu;
    let tol = if min >= 0 && max >= 0 { tolerance(p_gpu, d_gpu) } else { 0 };
    if in_band(total, min, max, tol) {
        return (p, d);
    }
    if max >= 0 && total > max {
        if max < p_min * p_gpu + d_min * d_gpu {
            return (0, 0);
        }
        let scale = max as f64 / total as f64;
        let max_p = floor_div(max - d_min * d_gpu, p_gpu);
        let new_p = p_min.max(max_p.min((p as f64 * scale).floor() as i64));
        let new_d = d_min.max(floor_div(max - new_p * p_gpu, d_gpu));
        return (new_p, new_d);
    }
    let (new_p, new_d) = if total <= 0 {
        let new_p = p_min.max((min as f64 / 2.0 / p_gpu as f64).ceil() as i64);
        (new_p, d_min.max(ceil_div((min - new_p * p_gpu).max(0), d_gpu)))
    } else {
        let scale = min as f64 / total as f64;
        let new_p = p_min.max((p as f64 * scale).ceil() as i64);
        (new_p, d_min.max(ceil_div((min - new_p * p_gpu).max(0), d_gpu)))
    };
    let decode_would_shrink = new_d < d;
    let new_d = new_d.max(d);
    if max >= 0 && new_p * p_gpu + new_d * d_gpu > max {
        if !decode_would_shrink {
            return (p, d);
        }
        return fit_directional_pair(p, d, new_p, d, p_gpu, d_gpu, min, max, p_min, d_min);
    }
    (new_p, new_d)
}

/// `proportional_clamp_single` (aggregated): the count of `gpu`-wide replicas in the band.
pub fn clamp_single(desired: i64, gpu: i64, min: i64, max: i64, min_endpoint: i64) -> i64 {
    if (min < 0 && max < 0) || gpu <= 0 {
        return desired;
    }
    let total = desired * gpu;
    let tol = if min >= 0 && max >= 0 { gpu } else { 0 };
    if in_band(total, min, max, tol) {
        return desired;
    }
    if max >= 0 && total > max {
        if max < min_endpoint * gpu {
            return 0;
        }
        return min_endpoint.max(floor_div(max, gpu));
    }
    min_endpoint.max(ceil_div(min, gpu))
}

/// `fit_directional_budget_pair`: the in-band pair nearest the proposal with each component
/// between its current and proposed counts (an opposing rebalance moves both legs or neither).
#[allow(clippy::too_many_arguments)]
pub fn fit_directional_pair(
    cur_p: i64,
    cur_d: i64,
    prop_p: i64,
    prop_d: i64,
    p_gpu: i64,
    d_gpu: i64,
    min: i64,
    max: i64,
    p_min: i64,
    d_min: i64,
) -> (i64, i64) {
    if p_gpu <= 0 || d_gpu <= 0 {
        return (prop_p, prop_d);
    }
    let tol = if min >= 0 && max >= 0 { tolerance(p_gpu, d_gpu) } else { 0 };
    let opposing = (prop_p < cur_p && prop_d > cur_d) || (prop_p > cur_p && prop_d < cur_d);
    let req_p = (prop_p - cur_p).abs();
    let req_d = (prop_d - cur_d).abs();
    let mut p_low = cur_p.min(prop_p).max(p_min);
    let mut p_high = cur_p.max(prop_p);
    let mut d_low = cur_d.min(prop_d).max(d_min);
    let mut d_high = cur_d.max(prop_d);
    if max >= 0 {
        p_high = p_high.min(floor_div(max - d_low * d_gpu, p_gpu));
        d_high = d_high.min(floor_div(max - p_low * p_gpu, d_gpu));
    }
    if min >= 0 {
        let lower = min - tol;
        p_low = p_low.max(ceil_div(lower - d_high * d_gpu, p_gpu));
        d_low = d_low.max(ceil_div(lower - p_high * p_gpu, d_gpu));
    }
    if p_low > p_high || d_low > d_high {
        return (cur_p, cur_d);
    }
    if prop_p >= p_min && prop_d >= d_min && in_band(prop_p * p_gpu + prop_d * d_gpu, min, max, tol) {
        return (prop_p, prop_d);
    }
    // (distance, skew, −progress, p, d) → the pair.
    type Scored = ((i64, i64, i64, i64, i64), (i64, i64));
    let mut best: Option<Scored> = None;
    let mut consider = |cp: i64, cd: i64| {
        if !in_band(cp * p_gpu + cd * d_gpu, min, max, tol) {
            return;
        }
        let distance = (prop_p - cp).abs() + (prop_d - cd).abs();
        let prog_p = (cp - cur_p).abs();
        let prog_d = (cd - cur_d).abs();
        let skew = (prog_p * req_d - prog_d * req_p).abs();
        let score = (distance, skew, -(prog_p + prog_d), cp, cd);
        if best.is_none_or(|(s, _)| score < s) {
            best = Some((score, (cp, cd)));
        }
    };
    let eff_min = (min >= 0).then_some(min - tol);
    // Walk the shorter range; the other component's best value is the proposal clamped into
    // the interval the band leaves it.
    let walk_p = p_high - p_low <= d_high - d_low;
    let (lo, hi) = if walk_p { (p_low, p_high) } else { (d_low, d_high) };
    for c in lo..=hi {
        let (gpu_c, gpu_o, cur_c, cur_o, prop_o) =
            if walk_p { (p_gpu, d_gpu, cur_p, cur_d, prop_d) } else { (d_gpu, p_gpu, cur_d, cur_p, prop_p) };
        let (mut o_low, mut o_high) = if walk_p { (d_low, d_high) } else { (p_low, p_high) };
        let cost = c * gpu_c;
        if let Some(m) = eff_min {
            o_low = o_low.max(ceil_div(m - cost, gpu_o));
        }
        if max >= 0 {
            o_high = o_high.min(floor_div(max - cost, gpu_o));
        }
        if opposing {
            if c == cur_c {
                if o_low <= cur_o && cur_o <= o_high {
                    if walk_p {
                        consider(c, cur_o)
                    } else {
                        consider(cur_o, c)
                    }
                }
                continue;
            }
            if prop_o > cur_o {
                o_low = o_low.max(cur_o + 1);
            } else {
                o_high = o_high.min(cur_o - 1);
            }
        }
        if o_low <= o_high {
            let o = prop_o.max(o_low).min(o_high);
            if walk_p {
                consider(c, o)
            } else {
                consider(o, c)
            }
        }
    }
    best.map_or((cur_p, cur_d), |(_, pair)| pair)
}

/// Why a guard changed or held a proposal.
pub const GUARD_HOLD: &str = "gpu_budget_guard_hold";
pub const RECONCILE: &str = "gpu_budget_reconcile";

/// `guard_single_scaling_budget`: the band applied to one proposal without reversing it.
pub fn guard_single(
    current: i64,
    proposed: i64,
    gpu: i64,
    min: i64,
    max: i64,
    min_endpoint: i64,
) -> (i64, Option<&'static str>) {
    if gpu <= 0 {
        return (proposed, None);
    }
    let tol = if min >= 0 && max >= 0 { gpu } else { 0 };
    let cur_total = current * gpu;
    if !in_band(cur_total, min, max, tol) {
        return (clamp_single(current, gpu, min, max, min_endpoint), Some(RECONCILE));
    }
    if (min >= 0 && cur_total <= min && proposed < current) || (max >= 0 && cur_total >= max && proposed > current) {
        return (current, Some(GUARD_HOLD));
    }
    let fin = clamp_single(proposed, gpu, min, max, min_endpoint);
    if !(current.min(proposed) <= fin && fin <= current.max(proposed)) {
        return (current, Some(GUARD_HOLD));
    }
    (fin, None)
}

/// `guard_disagg_scaling_budget`: the band applied to a (prefill, decode) proposal.
#[allow(clippy::too_many_arguments)]
pub fn guard_pair(
    cur_p: i64,
    cur_d: i64,
    prop_p: i64,
    prop_d: i64,
    p_gpu: i64,
    d_gpu: i64,
    min: i64,
    max: i64,
    p_min: i64,
    d_min: i64,
) -> (i64, i64, Option<&'static str>) {
    if p_gpu <= 0 || d_gpu <= 0 {
        let (p, d) = clamp_pair(prop_p, prop_d, p_gpu, d_gpu, min, max, p_min, d_min);
        return (p, d, None);
    }
    let tol = if max >= 0 { tolerance(p_gpu, d_gpu) } else { 0 };
    let cur_total = cur_p * p_gpu + cur_d * d_gpu;
    if !in_band(cur_total, min, max, tol) {
        let (p, d) = clamp_pair(cur_p, cur_d, p_gpu, d_gpu, min, max, p_min, d_min);
        return (p, d, Some(RECONCILE));
    }
    let any_down = prop_p < cur_p || prop_d < cur_d;
    let any_up = prop_p > cur_p || prop_d > cur_d;
    let opposing = (prop_p < cur_p && prop_d > cur_d) || (prop_p > cur_p && prop_d < cur_d);
    let fit = || fit_directional_pair(cur_p, cur_d, prop_p, prop_d, p_gpu, d_gpu, min, max, p_min, d_min);
    if cur_total <= min && any_down && !any_up {
        return (cur_p, cur_d, Some(GUARD_HOLD));
    }
    if (cur_total <= min && opposing) || (max >= 0 && cur_total >= max && any_up) {
        if !opposing {
            return (cur_p, cur_d, Some(GUARD_HOLD));
        }
        let (p, d) = fit();
        if (p, d) == (cur_p, cur_d) {
            return (cur_p, cur_d, Some(GUARD_HOLD));
        }
        return (p, d, None);
    }
    let (p, d) = clamp_pair(prop_p, prop_d, p_gpu, d_gpu, min, max, p_min, d_min);
    let within = |c: i64, pr: i64, f: i64| c.min(pr) <= f && f <= c.max(pr);
    if !within(cur_p, prop_p, p) || !within(cur_d, prop_d, d) || !in_band(p * p_gpu + d * d_gpu, min, max, tol) {
        return (cur_p, cur_d, Some(GUARD_HOLD));
    }
    (p, d, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_band_relaxes_only_the_floor() {
        assert!(in_band(16, 8, 16, 2));
        assert!(!in_band(17, 8, 16, 2));
        assert!(in_band(6, 8, 16, 2), "8 − tol 2");
        assert!(!in_band(5, 8, 16, 2));
        assert!(in_band(1000, -1, -1, 0));
    }

    #[test]
    fn clamp_pair_shrinks_proportionally_under_the_ceiling() {
        // 6P×2 + 6D×2 = 24 GPUs > 16. scale = 16/24; max_p = ⌊(16 − 1·2)/2⌋ = 7;
        // new_p = max(1, min(7, ⌊6·0.667⌋ = 4)) = 4; new_d = ⌊(16 − 8)/2⌋ = 4.
        assert_eq!(clamp_pair(6, 6, 2, 2, -1, 16, 1, 1), (4, 4));
        // Uneven widths: 3P×4 + 5D×2 = 22 > 12: scale 12/22, max_p = ⌊(12−2)/4⌋ = 2,
        // new_p = max(1, min(2, ⌊3·0.545⌋ = 1)) = 1, new_d = ⌊(12 − 4)/2⌋ = 4.
        assert_eq!(clamp_pair(3, 5, 4, 2, -1, 12, 1, 1), (1, 4));
        // Minimum footprint over the ceiling: infeasible.
        assert_eq!(clamp_pair(3, 3, 4, 4, -1, 6, 1, 1), (0, 0));
        // In band: unchanged.
        assert_eq!(clamp_pair(2, 2, 2, 2, -1, 16, 1, 1), (2, 2));
    }

    #[test]
    fn clamp_pair_grows_toward_the_floor_rounding_up() {
        // 1P×2 + 1D×2 = 4 < 12 − 2. scale 3: new_p = ⌈3⌉ = 3; remaining 12 − 6 = 6 → new_d = 3.
        assert_eq!(clamp_pair(1, 1, 2, 2, 12, 16, 1, 1), (3, 3));
    }

    #[test]
    fn clamp_single_fits_the_band() {
        // 10 × TP2 = 20 > 16 → ⌊16/2⌋ = 8.
        assert_eq!(clamp_single(10, 2, -1, 16, 1), 8);
        assert_eq!(clamp_single(3, 2, -1, 16, 1), 3);
        // Below the floor 8 − tol 2: ⌈8/2⌉ = 4.
        assert_eq!(clamp_single(2, 2, 8, 16, 1), 4);
        assert_eq!(clamp_single(5, 4, -1, 3, 1), 0, "one replica does not fit");
    }

    #[test]
    fn guards_never_reverse_a_proposal() {
        // At the ceiling (8 × 2 = 16), a scale-up is held.
        assert_eq!(guard_single(8, 9, 2, -1, 16, 1), (8, Some(GUARD_HOLD)));
        // A scale-up past the ceiling stops at it.
        assert_eq!(guard_single(6, 10, 2, -1, 16, 1), (8, None));
        // Scale-down at the floor is held.
        assert_eq!(guard_single(4, 3, 2, 8, 16, 1), (4, Some(GUARD_HOLD)));
        // Disagg: at the ceiling, an up/hold is held; an opposing rebalance moves both legs.
        assert_eq!(guard_pair(4, 4, 5, 4, 2, 2, -1, 16, 1, 1), (4, 4, Some(GUARD_HOLD)));
        assert_eq!(guard_pair(4, 4, 5, 3, 2, 2, -1, 16, 1, 1), (5, 3, None));
        // Both up, over the ceiling: the proportional clamp of (6, 6) under 14 GPUs is
        // p = max(1, min(⌊12/2⌋, ⌊6·14/24⌋ = 3)) = 3, d = ⌊(14 − 6)/2⌋ = 4; both lie between
        // current and proposed, so it stands.
        assert_eq!(guard_pair(3, 3, 6, 6, 2, 2, -1, 14, 1, 1), (3, 4, None));
        // A clamp that would take decode below its current count is held instead: from (1, 5)
        // toward (7, 5) under 14: clamp → p = max(1, min(⌊12/2⌋, ⌊7·14/24⌋ = 4)) = 4,
        // d = ⌊(14 − 8)/2⌋ = 3 < 5 → hold.
        assert_eq!(guard_pair(1, 5, 7, 5, 2, 2, -1, 14, 1, 1), (1, 5, Some(GUARD_HOLD)));
    }

    #[test]
    fn the_directional_fit_stays_between_current_and_proposed() {
        // From (2, 2) toward (6, 6) under a 14-GPU ceiling (width 2): the nearest in-band pair
        // with equal progress on both legs is (4, 3) or (3, 4); ties go to the smaller skew and
        // then the smaller prefill count: distance 5 for both, skew |2·4 − 1·4| = 4 vs 4,
        // progress equal → (3, 4).
        assert_eq!(fit_directional_pair(2, 2, 6, 6, 2, 2, -1, 14, 1, 1), (3, 4));
        // A proposal already in the band is returned as is.
        assert_eq!(fit_directional_pair(2, 2, 3, 3, 2, 2, -1, 14, 1, 1), (3, 3));
    }
}

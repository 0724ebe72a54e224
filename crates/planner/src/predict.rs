//! Load predictors (`dynamo/planner/core/load/predictors.py`): `constant` and `kalman`, exactly.
//! ARIMA and Prophet run outside servesim when the driver supplies an [`ExternalSeries`] (the
//! reference's own predictors through Python); otherwise they are refused by name (see the crate
//! README).

use crate::config::{PlannerConfig, PredictorKind};

/// One observed series (number of requests, ISL or OSL per throughput window).
#[derive(Clone, Debug)]
pub struct Predictor {
    /// Observed values after the leading idle zeros.
    data: Vec<f64>,
    seen_nonzero: bool,
    min_points: usize,
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    Constant,
    Kalman(Box<Kalman>),
    External(External),
}

/// A forecaster servesim does not implement itself (pmdarima's `auto_arima`), run by the
/// driver: it receives every observation as the reference's predictor would (raw, before the
/// idle zeros are skipped, which it does itself) and answers each forecast.
pub trait ExternalSeries: Send {
    fn add(&mut self, value: f64);
    fn predict_next(&mut self) -> f64;
}

#[derive(Clone)]
struct External(std::sync::Arc<std::sync::Mutex<Box<dyn ExternalSeries>>>);

impl std::fmt::Debug for External {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("External")
    }
}

impl External {
    fn with<T>(&self, f: impl FnOnce(&mut dyn ExternalSeries) -> T) -> T {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(guard.as_mut())
    }
}

/// A local linear trend filter: state `[level, trend]`, `F = [[1,1],[0,1]]`, `H = [1,0]`.
#[derive(Clone, Debug)]
struct Kalman {
    x: [f64; 2],
    p: [[f64; 2]; 2],
    q: [f64; 2],
    r: f64,
    log1p: bool,
    initialized: bool,
    /// The forecast of this step, once made (the filter advances once per step).
    cached: Option<f64>,
}

impl Kalman {
    fn predict(&mut self) {
        let [l, t] = self.x;
        self.x = [l + t, t];
        let p = self.p;
        // F P Fᵀ + Q.
        let a = p[0][0] + p[0][1] + p[1][0] + p[1][1];
        let b = p[0][1] + p[1][1];
        let c = p[1][0] + p[1][1];
        let d = p[1][1];
        self.p = [[a + self.q[0], b], [c, d + self.q[1]]];
    }

    /// The measurement update in filterpy's form (Joseph-form covariance).
    fn update(&mut self, z: f64) {
        let p = self.p;
        let y = z - self.x[0];
        let s = p[0][0] + self.r;
        let k = [p[0][0] / s, p[1][0] / s];
        self.x = [self.x[0] + k[0] * y, self.x[1] + k[1] * y];
        // (I − K H) P (I − K H)ᵀ + K R Kᵀ with I − K H = [[1 − k0, 0], [−k1, 1]].
        let m = [[1.0 - k[0], 0.0], [-k[1], 1.0]];
        let mp = [
            [m[0][0] * p[0][0] + m[0][1] * p[1][0], m[0][0] * p[0][1] + m[0][1] * p[1][1]],
            [m[1][0] * p[0][0] + m[1][1] * p[1][0], m[1][0] * p[0][1] + m[1][1] * p[1][1]],
        ];
        let mut out = [[0.0; 2]; 2];
        for (i, row) in out.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                *cell = mp[i][0] * m[j][0] + mp[i][1] * m[j][1] + k[i] * self.r * k[j];
            }
        }
        self.p = out;
    }
}

/// Why a predictor cannot be built.
#[derive(Clone, Debug, PartialEq)]
pub struct Unsupported(pub &'static str);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "load_predictor '{}' is not supported by servesim: its forecasts come from a statistics library \
             (pmdarima / prophet) that cannot be reproduced exactly; use load_predictor 'constant' or 'kalman'",
            self.0
        )
    }
}

impl Predictor {
    pub fn new(config: &PlannerConfig) -> Result<Predictor, Unsupported> {
        Predictor::with_external(config, None)
    }

    /// As [`Predictor::new`], with `external` running the ARIMA forecasts.
    pub fn with_external(
        config: &PlannerConfig,
        external: Option<Box<dyn ExternalSeries>>,
    ) -> Result<Predictor, Unsupported> {
        let (kind, min_points) = match (config.load_predictor, external) {
            (PredictorKind::Arima | PredictorKind::Prophet, Some(e)) => {
                (Kind::External(External(std::sync::Arc::new(std::sync::Mutex::new(e)))), 0)
            }
            (PredictorKind::Constant, _) => (Kind::Constant, 1),
            (PredictorKind::Kalman, _) => (
                Kind::Kalman(Box::new(Kalman {
                    x: [0.0, 0.0],
                    p: [[1000.0, 0.0], [0.0, 1000.0]],
                    q: [config.kalman_q_level.max(1e-12), config.kalman_q_trend.max(1e-12)],
                    r: config.kalman_r.max(1e-9),
                    log1p: config.load_predictor_log1p,
                    initialized: false,
                    cached: None,
                })),
                config.kalman_min_points.max(0) as usize,
            ),
            (PredictorKind::Arima, None) => return Err(Unsupported("arima")),
            (PredictorKind::Prophet, None) => return Err(Unsupported("prophet")),
        };
        Ok(Predictor { data: Vec::new(), seen_nonzero: false, min_points, kind })
    }

    /// Adds an observation. Leading zeros (the idle start) are skipped; NaN counts as 0.
    pub fn add(&mut self, value: f64) {
        if let Kind::External(e) = &self.kind {
            e.with(|e| e.add(value));
        }
        let value = if value.is_nan() { 0.0 } else { value };
        if value == 0.0 && !self.seen_nonzero {
            return;
        }
        if value != 0.0 {
            self.seen_nonzero = true;
        }
        self.data.push(value);
        if let Kind::Kalman(k) = &mut self.kind {
            let z = if k.log1p { value.max(0.0).ln_1p() } else { value };
            if !k.initialized {
                k.x = [z, 0.0];
                k.initialized = true;
            } else {
                if k.cached.is_none() {
                    k.predict();
                }
                k.update(z);
            }
            k.cached = None;
        }
    }

    pub fn last(&self) -> f64 {
        self.data.last().copied().unwrap_or(0.0)
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The forecast of the next value.
    pub fn predict_next(&mut self) -> f64 {
        let enough = self.data.len() >= self.min_points;
        match &mut self.kind {
            Kind::Constant => self.data.last().copied().unwrap_or(0.0),
            Kind::External(e) => e.with(|e| e.predict_next()),
            Kind::Kalman(k) => {
                if !k.initialized || !enough {
                    return self.data.last().copied().unwrap_or(0.0);
                }
                let level = match k.cached {
                    Some(v) => v,
                    None => {
                        k.predict();
                        k.cached = Some(k.x[0]);
                        k.x[0]
                    }
                };
                if k.log1p {
                    level.exp_m1().max(0.0)
                } else {
                    level.max(0.0)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn predictor(v: serde_json::Value) -> Predictor {
        Predictor::new(&PlannerConfig::from_json(&v).unwrap()).unwrap()
    }

    #[test]
    fn constant_skips_leading_zeros_and_returns_the_last_value() {
        let mut p = predictor(json!({"load_predictor": "constant"}));
        p.add(0.0);
        p.add(0.0);
        assert!(p.is_empty());
        assert_eq!(p.predict_next(), 0.0);
        p.add(7.0);
        p.add(0.0);
        assert_eq!(p.len(), 2, "a zero after traffic is kept");
        assert_eq!(p.predict_next(), 0.0);
        p.add(12.0);
        assert_eq!(p.predict_next(), 12.0);
    }

    #[test]
    fn kalman_follows_the_local_linear_trend_equations() {
        // q_level 1, q_trend 0.1, r 10, min points 2 (so the filter forecasts early).
        let mut p = predictor(json!({"load_predictor": "kalman", "kalman_min_points": 2}));
        p.add(10.0);
        // One point: the last value until min_points.
        assert_eq!(p.predict_next(), 10.0);
        p.add(20.0);
        // By hand: x0 = [10, 0], P0 = 1000 I.
        // predict: x = [10, 0]; P = [[2000+1, 1000], [1000, 1000+0.1]] = [[2001, 1000], [1000, 1000.1]].
        // update z = 20: y = 10, S = 2011, K = [2001/2011, 1000/2011].
        let k0 = 2001.0 / 2011.0;
        let k1 = 1000.0 / 2011.0;
        let level = 10.0 + k0 * 10.0;
        let trend = k1 * 10.0;
        // Forecast: the predicted level, level + trend.
        let f = p.predict_next();
        assert!((f - (level + trend)).abs() < 1e-12, "{f} vs {}", level + trend);
        // Asking again does not advance the filter.
        assert_eq!(p.predict_next(), f);
        // The next observation uses the cached prediction: no second predict step.
        // P after update (Joseph form equals (I-KH)P for the optimal gain):
        // P00 = (1-k0)*2001, P01 = (1-k0)*1000, P10 = 1000 - k1*2001, P11 = 1000.1 - k1*1000.
        let p00 = (1.0 - k0) * 2001.0;
        let p01 = (1.0 - k0) * 1000.0;
        let p11 = 1000.1 - k1 * 1000.0;
        // Predicted covariance: [[p00+2p01+p11+1, p01+p11], ...].
        let pp00 = p00 + 2.0 * p01 + p11 + 1.0;
        let s = pp00 + 10.0;
        let kk0 = pp00 / s;
        p.add(30.0);
        let lvl_pred = level + trend;
        let expected_level = lvl_pred + kk0 * (30.0 - lvl_pred);
        let expected_trend = trend + (p01 + p11) / s * (30.0 - lvl_pred);
        let f2 = p.predict_next();
        assert!((f2 - (expected_level + expected_trend)).abs() < 1e-9, "{f2}");
    }

    #[test]
    fn kalman_waits_for_min_points_and_clamps_at_zero() {
        let mut p = predictor(json!({"load_predictor": "kalman"}));
        for v in [50.0, 40.0, 30.0, 20.0] {
            p.add(v);
            assert_eq!(p.predict_next(), v, "fewer than 5 points: the last value");
        }
        p.add(0.5);
        let f = p.predict_next();
        assert!((0.0..20.0).contains(&f), "a falling series forecasts below its last values: {f}");
        let mut steep = predictor(json!({"load_predictor": "kalman", "kalman_min_points": 1}));
        for v in [1000.0, 10.0, 0.1] {
            steep.add(v);
        }
        assert_eq!(steep.predict_next(), 0.0, "a negative level is clamped to 0");
    }

    #[test]
    fn arima_and_prophet_are_refused_by_name() {
        let c = PlannerConfig::from_json(&json!({"optimization_target": "sla"})).unwrap();
        let e = Predictor::new(&c).unwrap_err();
        assert!(e.to_string().contains("'arima' is not supported"), "{e}");
        let c = PlannerConfig::from_json(&json!({"optimization_target": "sla", "load_predictor": "prophet"})).unwrap();
        assert!(Predictor::new(&c).unwrap_err().to_string().contains("'prophet'"));
    }
}

//! Charts drawn as inline SVG: line charts, histograms, heatmaps, a stacked bar and a scatter.
//!
//! Every chart is an `<svg data-chart="ID">`; each series it draws carries `data-series="NAME"`
//! (a heatmap's rows carry `data-row`), so a test can count what a browser rendered. Numbers
//! are written with fixed precision, so the same data gives the same bytes.

use std::fmt::Write as _;

pub const WIDTH: f64 = 760.0;
pub const HEIGHT: f64 = 300.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 46.0;
const BOTTOM: f64 = 46.0;

/// Colour-blind-safe palette (Okabe–Ito).
pub const PALETTE: [&str; 8] = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"];

pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A named series of (x, y) points.
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Round tick positions covering `[lo, hi]`, about `n` of them.
pub fn ticks(lo: f64, hi: f64, n: usize) -> (Vec<f64>, f64) {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        return (vec![lo], 1.0);
    }
    let raw = (hi - lo) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        let v = first + i as f64 * step;
        if v > hi + step * 1e-9 {
            break;
        }
        out.push(if v.abs() < step * 1e-9 { 0.0 } else { v });
        i += 1;
    }
    (out, step)
}

/// A tick label with as many decimals as the step needs.
pub fn label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 || step <= 0.0 || !step.is_finite() {
        0
    } else {
        let d = (-step.log10()).ceil() as i32;
        let scaled = step * 10f64.powi(d);
        (d + i32::from((scaled - scaled.round()).abs() > 1e-9)).clamp(0, 9) as usize
    };
    let s = format!("{v:.decimals$}");
    if v.abs() >= 10_000.0 && decimals == 0 {
        // Thousands separators for long integers.
        let (sign, digits) = if let Some(d) = s.strip_prefix('-') { ("-", d) } else { ("", s.as_str()) };
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        return format!("{sign}{out}");
    }
    s
}

/// Plot area and the data ranges it maps.
struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
    w: f64,
    h: f64,
}

impl Frame {
    fn new(x: (f64, f64), y: (f64, f64), h: f64) -> Frame {
        let (mut x0, mut x1) = x;
        let (mut y0, mut y1) = y;
        if x1.partial_cmp(&x0) != Some(std::cmp::Ordering::Greater) {
            x0 -= 0.5;
            x1 = x0 + 1.0;
        }
        if y1.partial_cmp(&y0) != Some(std::cmp::Ordering::Greater) {
            y1 = y0 + 1.0;
        }
        if !x0.is_finite() || !x1.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if !y0.is_finite() || !y1.is_finite() {
            (y0, y1) = (0.0, 1.0);
        }
        Frame { x0, x1, y0, y1, w: WIDTH - LEFT - RIGHT, h: h - TOP - BOTTOM }
    }

    fn px(&self, x: f64) -> f64 {
        LEFT + (x - self.x0) / (self.x1 - self.x0) * self.w
    }

    fn py(&self, y: f64) -> f64 {
        TOP + self.h - (y - self.y0) / (self.y1 - self.y0) * self.h
    }
}

fn open(out: &mut String, id: &str, title: &str, h: f64) {
    let _ = write!(
        out,
        r#"<svg data-chart="{id}" viewBox="0 0 {WIDTH} {h}" width="{WIDTH}" height="{h}" role="img" aria-label="{t}"><text x="{LEFT}" y="20" class="title">{t}</text>"#,
        id = escape(id),
        t = escape(title),
    );
}

fn axes(out: &mut String, f: &Frame, xlabel: &str, ylabel: &str, h: f64) {
    let (xt, xs) = ticks(f.x0, f.x1, 6);
    let (yt, ys) = ticks(f.y0, f.y1, 5);
    let bottom = TOP + f.h;
    for &y in &yt {
        let py = f.py(y);
        let _ = write!(
            out,
            r#"<line class="grid" x1="{LEFT}" x2="{:.1}" y1="{py:.1}" y2="{py:.1}"/><text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT + f.w,
            LEFT - 6.0,
            py + 4.0,
            label(y, ys)
        );
    }
    for &x in &xt {
        let px = f.px(x);
        let _ = write!(
            out,
            r#"<line class="axis" x1="{px:.1}" x2="{px:.1}" y1="{bottom:.1}" y2="{:.1}"/><text class="tick" x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            bottom + 4.0,
            bottom + 17.0,
            label(x, xs)
        );
    }
    let _ = write!(
        out,
        r#"<line class="axis" x1="{LEFT}" x2="{:.1}" y1="{bottom:.1}" y2="{bottom:.1}"/><text class="label" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text class="label" transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        LEFT + f.w,
        LEFT + f.w / 2.0,
        h - 8.0,
        escape(xlabel),
        TOP + f.h / 2.0,
        escape(ylabel)
    );
}

fn legend(out: &mut String, names: &[&str]) {
    let mut x = WIDTH - RIGHT;
    // Right-aligned, last name rightmost.
    let widths: Vec<f64> = names.iter().map(|n| 22.0 + 6.5 * n.chars().count() as f64).collect();
    for (i, name) in names.iter().enumerate().rev() {
        x -= widths[i];
        let _ = write!(
            out,
            r#"<rect x="{x:.1}" y="27" width="10" height="10" fill="{c}"/><text class="legend" x="{:.1}" y="36">{}</text>"#,
            x + 14.0,
            escape(name),
            c = PALETTE[i % PALETTE.len()]
        );
    }
}

fn extent(series: &[Series]) -> ((f64, f64), (f64, f64)) {
    let mut x = (f64::INFINITY, f64::NEG_INFINITY);
    let mut y = (0.0f64, f64::NEG_INFINITY);
    for p in series.iter().flat_map(|s| &s.points) {
        if p.0.is_finite() && p.1.is_finite() {
            x = (x.0.min(p.0), x.1.max(p.0));
            y = (y.0.min(p.1), y.1.max(p.1));
        }
    }
    (x, y)
}

/// Lines through each series' points (`step`: a staircase, as for a CDF).
pub fn line_chart(id: &str, title: &str, xlabel: &str, ylabel: &str, series: &[Series], step: bool) -> String {
    let mut out = String::new();
    open(&mut out, id, title, HEIGHT);
    let (x, mut y) = extent(series);
    y.1 *= 1.05;
    let f = Frame::new(x, y, HEIGHT);
    axes(&mut out, &f, xlabel, ylabel, HEIGHT);
    for (i, s) in series.iter().enumerate() {
        let mut d = String::new();
        let mut last: Option<(f64, f64)> = None;
        for &(x, y) in s.points.iter().filter(|p| p.0.is_finite() && p.1.is_finite()) {
            let (px, py) = (f.px(x), f.py(y));
            match last {
                None => {
                    let _ = write!(d, "M{px:.1},{py:.1}");
                }
                Some((_, ly)) if step => {
                    let _ = write!(d, "H{px:.1}V{py:.1}");
                    let _ = ly;
                }
                Some(_) => {
                    let _ = write!(d, "L{px:.1},{py:.1}");
                }
            }
            last = Some((px, py));
        }
        let _ = write!(
            out,
            r#"<path data-series="{}" d="{d}" fill="none" stroke="{}" stroke-width="1.8"/>"#,
            escape(&s.name),
            PALETTE[i % PALETTE.len()]
        );
    }
    legend(&mut out, &series.iter().map(|s| s.name.as_str()).collect::<Vec<_>>());
    out.push_str("</svg>");
    out
}

/// A histogram of `values` in `bins` equal bins (counts as a fraction of all values).
pub fn histogram(
    id: &str,
    title: &str,
    xlabel: &str,
    name: &str,
    values: &[f64],
    bins: usize,
    colour: usize,
) -> String {
    let mut out = String::new();
    open(&mut out, id, title, HEIGHT);
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if finite.is_empty() {
        (0.0, 1.0)
    } else if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, lo + 0.5)
    };
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0u64; bins];
    for v in &finite {
        let b = (((v - lo) / width) as usize).min(bins - 1);
        counts[b] += 1;
    }
    let n = finite.len().max(1) as f64;
    let top = counts.iter().copied().max().unwrap_or(0) as f64 / n * 1.05;
    let f = Frame::new((lo, hi), (0.0, top.max(1e-9)), HEIGHT);
    axes(&mut out, &f, xlabel, "fraction of requests", HEIGHT);
    let _ = write!(out, r#"<g data-series="{}" fill="{}">"#, escape(name), PALETTE[colour % PALETTE.len()]);
    for (i, &c) in counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let (x0, x1) = (f.px(lo + i as f64 * width), f.px(lo + (i + 1) as f64 * width));
        let y = f.py(c as f64 / n);
        let _ = write!(
            out,
            r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{:.1}"><title>{}–{}: {c}</title></rect>"#,
            (x1 - x0 - 1.0).max(0.5),
            (TOP + f.h - y).max(0.0),
            label(lo + i as f64 * width, width / 10.0),
            label(lo + (i + 1) as f64 * width, width / 10.0)
        );
    }
    out.push_str("</g>");
    legend(&mut out, &[name]);
    out.push_str("</svg>");
    out
}

/// One row of cells per label over time; `values[row][column]` in `[0, vmax]` (NaN: no data).
pub fn heatmap(
    id: &str,
    title: &str,
    rows: &[String],
    times: &[f64],
    values: &[Vec<f64>],
    vmax: f64,
    unit: &str,
) -> String {
    let row_h = if rows.len() > 32 { 6.0 } else { 16.0 };
    let h = TOP + BOTTOM + row_h * rows.len().max(1) as f64;
    let mut out = String::new();
    open(&mut out, id, title, h);
    let w = WIDTH - LEFT - RIGHT;
    let cols = times.len().max(1);
    let cell = w / cols as f64;
    let vmax = if vmax > 0.0 && vmax.is_finite() { vmax } else { 1.0 };
    for (r, name) in rows.iter().enumerate() {
        let y = TOP + r as f64 * row_h;
        let _ = write!(out, r#"<g data-row="{}">"#, escape(name));
        if row_h >= 10.0 {
            let _ = write!(
                out,
                r#"<text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                LEFT - 6.0,
                y + row_h - 4.0,
                escape(name)
            );
        }
        for (c, v) in values.get(r).map(Vec::as_slice).unwrap_or(&[]).iter().enumerate() {
            if !v.is_finite() {
                continue;
            }
            // White to deep blue.
            let t = (v / vmax).clamp(0.0, 1.0);
            let (r0, g0, b0) = (255.0 - 255.0 * t, 255.0 - 141.0 * t, 255.0 - 77.0 * t);
            let _ = write!(
                out,
                r##"<rect x="{:.1}" y="{y:.1}" width="{:.2}" height="{:.1}" fill="#{:02x}{:02x}{:02x}"/>"##,
                LEFT + c as f64 * cell,
                cell + 0.05,
                row_h - 1.0,
                r0 as u8,
                g0 as u8,
                b0 as u8
            );
        }
        out.push_str("</g>");
    }
    // The time axis.
    let bottom = TOP + row_h * rows.len().max(1) as f64;
    let (t0, t1) = (times.first().copied().unwrap_or(0.0), times.last().copied().unwrap_or(1.0));
    let f = Frame::new((t0, t1), (0.0, 1.0), h);
    let (xt, xs) = ticks(f.x0, f.x1, 6);
    for &x in &xt {
        let px = f.px(x);
        let _ = write!(
            out,
            r#"<text class="tick" x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            bottom + 16.0,
            label(x, xs)
        );
    }
    let _ = write!(
        out,
        r#"<text class="label" x="{:.1}" y="{:.1}" text-anchor="middle">time (s)</text><text class="legend" x="{:.1}" y="36" text-anchor="end">darkest = {} {}</text>"#,
        LEFT + w / 2.0,
        h - 8.0,
        WIDTH - RIGHT,
        label(vmax, vmax / 100.0),
        escape(unit)
    );
    out.push_str("</svg>");
    out
}

/// One horizontal bar split into named parts (e.g. the mean TTFT's components).
pub fn stacked_bar(id: &str, title: &str, parts: &[(&str, f64)], unit: &str) -> String {
    let h = 120.0;
    let mut out = String::new();
    open(&mut out, id, title, h);
    let total: f64 = parts.iter().map(|p| p.1.max(0.0)).sum();
    let w = WIDTH - LEFT - RIGHT;
    let mut x = LEFT;
    for (i, (name, v)) in parts.iter().enumerate() {
        let pw = if total > 0.0 { v.max(0.0) / total * w } else { 0.0 };
        let _ = write!(
            out,
            r#"<rect data-series="{n}" x="{x:.1}" y="40" width="{pw:.1}" height="30" fill="{c}"><title>{n}: {v:.3} {u}</title></rect>"#,
            n = escape(name),
            c = PALETTE[i % PALETTE.len()],
            u = escape(unit)
        );
        x += pw;
    }
    let mut lx = LEFT;
    for (i, (name, v)) in parts.iter().enumerate() {
        let text = format!("{name} {v:.1} {unit}");
        let _ = write!(
            out,
            r#"<rect x="{lx:.1}" y="86" width="10" height="10" fill="{}"/><text class="legend" x="{:.1}" y="95">{}</text>"#,
            PALETTE[i % PALETTE.len()],
            lx + 14.0,
            escape(&text)
        );
        lx += 24.0 + 6.2 * text.chars().count() as f64;
    }
    out.push_str("</svg>");
    out
}

/// Points per series (a Pareto front drawn as a line through its points).
pub fn scatter(id: &str, title: &str, xlabel: &str, ylabel: &str, series: &[(Series, bool)]) -> String {
    let mut out = String::new();
    open(&mut out, id, title, HEIGHT + 60.0);
    let all: Vec<Series> = series.iter().map(|(s, _)| s.clone()).collect();
    let (x, mut y) = extent(&all);
    let pad = (x.1 - x.0).abs() * 0.05;
    y.1 *= 1.08;
    let f = Frame::new((x.0 - pad, x.1 + pad), y, HEIGHT + 60.0);
    axes(&mut out, &f, xlabel, ylabel, HEIGHT + 60.0);
    for (i, (s, line)) in series.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let _ = write!(out, r#"<g data-series="{}" fill="{c}" stroke="{c}">"#, escape(&s.name));
        if *line && s.points.len() > 1 {
            let mut pts = s.points.clone();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let d: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", f.px(x), f.py(y))).collect();
            let _ = write!(out, r#"<polyline points="{}" fill="none" stroke-width="1.5"/>"#, d.join(" "));
        }
        for &(x, y) in &s.points {
            let _ = write!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="{}"/>"#,
                f.px(x),
                f.py(y),
                if *line { 4.5 } else { 3.0 }
            );
        }
        out.push_str("</g>");
    }
    legend(&mut out, &series.iter().map(|(s, _)| s.name.as_str()).collect::<Vec<_>>());
    out.push_str("</svg>");
    out
}

/// One row per metric: a bar from its low to its high value with a tick at the middle one
/// (an ensemble's p05, median and p95), on a shared axis from zero.
pub fn interval_bars(id: &str, title: &str, unit: &str, rows: &[(&str, f64, f64, f64)]) -> String {
    let left = 190.0;
    let row_h = 26.0;
    let h = TOP + BOTTOM + row_h * rows.len().max(1) as f64;
    let mut out = String::new();
    open(&mut out, id, title, h);
    let hi = rows.iter().map(|r| r.3).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let hi = if hi > 0.0 { hi * 1.05 } else { 1.0 };
    let w = WIDTH - left - RIGHT;
    let px = |v: f64| left + v.clamp(0.0, hi) / hi * w;
    let bottom = TOP + row_h * rows.len().max(1) as f64;
    let (xt, xs) = ticks(0.0, hi, 6);
    for &x in &xt {
        let _ = write!(
            out,
            r#"<line class="grid" x1="{p:.1}" x2="{p:.1}" y1="{TOP}" y2="{bottom:.1}"/><text class="tick" x="{p:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            bottom + 17.0,
            label(x, xs),
            p = px(x)
        );
    }
    let _ = write!(
        out,
        r#"<text class="label" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        left + w / 2.0,
        h - 8.0,
        escape(unit)
    );
    for (i, &(name, lo, mid, high)) in rows.iter().enumerate() {
        let y = TOP + row_h * (i as f64 + 0.5);
        let c = PALETTE[i % PALETTE.len()];
        let _ = write!(
            out,
            r#"<text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{n}</text><g data-series="{n}"><title>{n}: median {mid:.3}, 90 % interval {lo:.3} – {high:.3} {u}</title><rect x="{:.1}" y="{:.1}" width="{:.1}" height="10" fill="{c}" fill-opacity="0.35" stroke="{c}"/><line x1="{m:.1}" x2="{m:.1}" y1="{:.1}" y2="{:.1}" stroke="{c}" stroke-width="2.5"/></g>"#,
            left - 8.0,
            y + 4.0,
            px(lo),
            y - 5.0,
            (px(high) - px(lo)).max(1.0),
            y - 9.0,
            y + 9.0,
            n = escape(name),
            u = escape(unit),
            m = px(mid),
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        let (t, step) = ticks(0.0, 97.0, 5);
        assert_eq!(step, 20.0);
        assert_eq!(t, [0.0, 20.0, 40.0, 60.0, 80.0]);
        let (t, step) = ticks(0.013, 0.061, 5);
        assert_eq!(step, 0.01);
        assert_eq!(t.len(), 5);
        assert_eq!(label(t[0], step), "0.02");
        assert_eq!(label(12_345.0, 1000.0), "12,345");
    }

    #[test]
    fn charts_mark_their_series() {
        let s = |n: &str| Series { name: n.into(), points: vec![(0.0, 1.0), (1.0, 2.0)] };
        let svg = line_chart("c", "T <x>", "x", "y", &[s("a"), s("b")], true);
        assert_eq!(svg.matches("data-series=").count(), 2);
        assert!(svg.contains("T &lt;x&gt;"));
        let hm = heatmap(
            "h",
            "H",
            &["w0".into(), "w1".into()],
            &[1.0, 2.0],
            &[vec![0.0, 1.0], vec![0.5, f64::NAN]],
            1.0,
            "",
        );
        assert_eq!(hm.matches("data-row=").count(), 2);
        assert_eq!(hm.matches("<rect").count(), 3);
    }
}

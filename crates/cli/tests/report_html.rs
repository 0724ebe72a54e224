//! The HTML reports in a real browser: Chromium (headless) loads each page from disk, and the
//! test checks that nothing was logged to the console (script errors included) and that every
//! chart drew the series the run should give it. Needs `chromium` on the PATH (`.ci/run`
//! installs Debian's package); set SERVESIM_CHROMIUM to use another binary.

use std::path::{Path, PathBuf};
use std::process::Command;

fn servesim(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_servesim")).args(args).output().expect("run servesim");
    assert!(out.status.success(), "servesim {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("servesim-html-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Loads `page` headless; returns the DOM after scripts ran and the console messages.
fn browse(page: &Path) -> (String, Vec<String>) {
    let chromium = std::env::var("SERVESIM_CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(&chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", "--dump-dom"])
        // No background connections: CI machines have no route to Google's services.
        .args(["--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {chromium} ({e}); install Debian's chromium package (see .ci/run)"));
    assert!(out.status.success(), "{chromium} failed: {}", String::from_utf8_lossy(&out.stderr));
    let console =
        String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.contains(":CONSOLE")).map(String::from).collect();
    (String::from_utf8(out.stdout).unwrap(), console)
}

/// The number of `marker` attributes inside the `<svg data-chart="id">` element.
fn count_in_chart(dom: &str, id: &str, marker: &str) -> usize {
    let start = dom.find(&format!("data-chart=\"{id}\"")).unwrap_or_else(|| panic!("no chart {id}"));
    let end = start + dom[start..].find("</svg>").expect("chart closes");
    dom[start..end].matches(marker).count()
}

/// A disaggregated run (two prefill, two decode workers) with telemetry, its page at `page`.
fn disaggregated_page(page: &str) {
    servesim(&[
        "predict",
        "--input-tokens",
        "800",
        "--output-tokens",
        "50",
        "--request-count",
        "300",
        "--request-rate",
        "15",
        "--num-prefill-workers",
        "2",
        "--num-decode-workers",
        "2",
        "--prefill-engine-args",
        r#"{"kv_transfer_bandwidth": 4.0, "kv_bytes_per_token": 100000}"#,
        "--telemetry-interval-ms",
        "250",
        "--report-html",
        page,
        "--format",
        "json",
    ]);
}

#[test]
fn the_console_check_sees_script_errors() {
    // The check below would pass vacuously if console messages were not captured.
    let page = dir().join("broken.html");
    std::fs::write(&page, "<html><body><script>throw new Error('deliberate')</script></body></html>").unwrap();
    let (_, console) = browse(&page);
    assert!(console.iter().any(|l| l.contains("deliberate")), "{console:?}");
}

#[test]
fn predict_page_renders_every_chart() {
    let d = dir();
    let page = d.join("predict.html");
    let p = page.to_str().unwrap();
    disaggregated_page(p);
    let (dom, console) = browse(&page);
    assert!(console.is_empty(), "console messages: {console:?}");
    assert_eq!(dom.matches("data-chart=").count(), 13);
    for (chart, series) in [
        ("ttft-cdf", 1),
        ("itl-cdf", 1),
        ("e2e-cdf", 1),
        ("ttft-hist", 1),
        ("itl-hist", 1),
        ("e2e-hist", 1),
        ("ttft-over-time", 2),
        ("e2e-over-time", 2),
        ("ttft-breakdown", 5),
        ("cluster-load", 4),
        ("throughput", 1),
    ] {
        assert_eq!(count_in_chart(&dom, chart, "data-series="), series, "{chart}");
    }
    // One heatmap row per worker rank.
    for chart in ["heatmap-running", "heatmap-kv"] {
        assert_eq!(count_in_chart(&dom, chart, "data-row="), 4, "{chart}");
    }
    // Self-contained: nothing is loaded from anywhere.
    let html = std::fs::read_to_string(&page).unwrap();
    // Deterministic: the same run writes the same bytes.
    let again = d.join("predict-again.html");
    disaggregated_page(again.to_str().unwrap());
    let second = std::fs::read_to_string(&again).unwrap().replace(again.to_str().unwrap(), p);
    assert!(second == html, "two runs of the same inputs wrote different pages");
    assert!(!html.contains("http") && !html.contains(" src=") && !html.contains("<link"));
}

#[test]
fn recommend_page_renders_and_its_table_script_runs() {
    let d = dir();
    let page = d.join("recommend.html");
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/deploy/recommend_grid_fixed.yaml");
    let out_dir = d.join("rec");
    servesim(&[
        "recommend",
        "-c",
        config,
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--overwrite",
        "--report-html",
        page.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let (dom, console) = browse(&page);
    assert!(console.is_empty(), "console messages: {console:?}");
    assert_eq!(count_in_chart(&dom, "pareto", "data-series="), 3);
    // 54 candidates, one row each, plus the header.
    let table = &dom[dom.find("data-table=\"candidates\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert_eq!(table.matches("<tr").count(), 55);
}

#[test]
fn predict_config_page_renders_with_its_configuration() {
    let d = dir();
    let page = d.join("config.html");
    let telemetry = d.join("config-telemetry.csv");
    // Fixed timing and a fixed KV cache: no performance data needed.
    let config = d.join("fixed.yaml");
    std::fs::write(
        &config,
        "traffic:\n  source: {type: synthetic, input_tokens: 512, output_tokens: 64}\n  load: {type: concurrency, concurrency: 8}\n  stop: {requests: 60}\nengine:\n  model: Qwen/Qwen3-32B\n  hardware: h200_sxm\n  context_length: 4096\n  workers:\n    aggregated:\n      parallelism: {replicas: 1, tensor: 1}\n      kv_cache: {capacity: {type: fixed, blocks: 2000}}\n      timing: {type: fixed, prefill_ms: 30, decode_ms: 8}\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    servesim(&[
        "predict",
        "-c",
        config,
        "--output-dir",
        d.join("out").to_str().unwrap(),
        "--overwrite",
        "--report-html",
        page.to_str().unwrap(),
        "--telemetry",
        telemetry.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let (dom, console) = browse(&page);
    assert!(console.is_empty(), "console messages: {console:?}");
    assert_eq!(dom.matches("data-chart=").count(), 13);
    assert_eq!(count_in_chart(&dom, "heatmap-kv", "data-row="), 1);
    // The configuration section shows the YAML as read.
    assert!(dom.contains("Qwen/Qwen3-32B"));
    // The telemetry file is CSV with its header.
    let csv = std::fs::read_to_string(&telemetry).unwrap();
    assert!(csv.starts_with("t_ms,scope,pool,worker,dp_rank,"));
}

#[test]
fn planner_page_shows_the_worker_count_and_every_scaling_decision() {
    let page = dir().join("planner.html");
    let out = Command::new(env!("CARGO_BIN_EXE_servesim"))
        .args([
            "predict",
            "--input-tokens",
            "2000",
            "--output-tokens",
            "200",
            "--request-count",
            "1500",
            "--request-rate",
            "12",
            "--num-workers",
            "1",
            "--extra-engine-args",
            r#"{"num_gpu_blocks": 8192}"#,
            "--planner-config",
            r#"{"mode": "agg", "optimization_target": "latency", "max_gpu_budget": 4}"#,
            "--report-html",
            page.to_str().unwrap(),
            "--format",
            "json",
        ])
        .output()
        .expect("run servesim");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let events = doc["planner"]["scaling_events"].as_array().unwrap().len();
    assert!(events > 0, "the load should make the planner scale");
    let (dom, console) = browse(&page);
    assert!(console.is_empty(), "console messages: {console:?}");
    // Aggregated: one worker-count series; one table row per scaling decision (plus the header).
    assert_eq!(count_in_chart(&dom, "planner-workers", "data-series="), 1);
    let table = &dom[dom.find("data-table=\"scaling-events\"").expect("events table")..];
    let table = &table[..table.find("</table>").unwrap()];
    assert_eq!(table.matches("<tr>").count(), events + 1);
}

/// An ensemble of 20 jittered runs, its page at `page`.
fn ensemble_page(page: &str) {
    servesim(&[
        "predict",
        "--input-tokens",
        "512",
        "--output-tokens",
        "40",
        "--request-count",
        "60",
        "--request-rate",
        "10",
        "--num-workers",
        "2",
        "--ensemble",
        "20",
        "--timing-jitter-cv",
        "0.1",
        "--report-html",
        page,
        "--format",
        "json",
    ]);
}

#[test]
fn ensemble_page_shows_every_interval() {
    let d = dir();
    let page = d.join("ensemble.html");
    let p = page.to_str().unwrap();
    ensemble_page(p);
    let (dom, console) = browse(&page);
    assert!(console.is_empty(), "console messages: {console:?}");
    assert_eq!(dom.matches("data-chart=").count(), 4);
    for (chart, series) in
        [("ensemble-latency", 8), ("ensemble-throughput", 2), ("members-ttft", 2), ("members-e2e", 2)]
    {
        assert_eq!(count_in_chart(&dom, chart, "data-series="), series, "{chart}");
    }
    assert!(dom.contains("20 runs of the same configuration"), "the page names the members");
    assert!(dom.contains("mean_ttft_ms"), "the table lists every metric");
    let html = std::fs::read_to_string(&page).unwrap();
    let again = d.join("ensemble-again.html");
    ensemble_page(again.to_str().unwrap());
    let second = std::fs::read_to_string(&again).unwrap().replace(again.to_str().unwrap(), p);
    assert!(second == html, "two runs of the same inputs wrote different pages");
    assert!(!html.contains("http") && !html.contains(" src=") && !html.contains("<link"));
}

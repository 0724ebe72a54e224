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

/// The series each chart of a predict page draws, for the runs these tests make (the
/// per-worker charts are checked where they are drawn).
const PREDICT_PAGE_SERIES: [(&str, usize); 11] = [
    ("ttft-cdf", 1),
    ("itl-cdf", 1),
    ("e2e-cdf", 1),
    ("ttft-hist", 1),
    ("itl-hist", 1),
    ("e2e-hist", 1),
    ("ttft-over-time", 2),
    ("e2e-over-time", 2),
    ("ttft-breakdown", 6),
    ("cluster-load", 4),
    ("throughput", 1),
];

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
    for (chart, series) in PREDICT_PAGE_SERIES {
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

/// `servesim recommend` on the 54-candidate fixed-timing grid with `--report-html DIR/rec.html`
/// and `extra` flags; returns the output's stdout and stderr.
fn recommend_pages(d: &Path, extra: &[&str]) -> (String, String) {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/deploy/recommend_grid_fixed.yaml");
    let (out_dir, page) = (d.join("out"), d.join("rec.html"));
    let mut args = vec!["recommend", "-c", config, "--output-dir", out_dir.to_str().unwrap(), "--overwrite"];
    args.extend(["--report-html", page.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_servesim")).args(&args).output().expect("run servesim");
    assert!(out.status.success(), "servesim {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The `href`s of the candidate table's links.
fn candidate_links(html: &str) -> Vec<String> {
    let table = &html[html.find("data-table=\"candidates\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    table.split("<a href=\"").skip(1).map(|s| s[..s.find('"').unwrap()].to_string()).collect()
}

fn page_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// The value the page's "every summary value" table shows for `key`.
fn summary_cell(html: &str, key: &str) -> String {
    let table = &html[html.find("data-table=\"summary\"").unwrap()..];
    let row = &table[table.find(&format!("<tr><td>{key}</td><td>")).unwrap_or_else(|| panic!("no {key}"))..];
    let cell = &row[format!("<tr><td>{key}</td><td>").len()..];
    cell[..cell.find("</td>").unwrap()].to_string()
}

#[test]
fn recommend_links_its_ten_best_candidates_to_their_run_pages() {
    let d = dir().join("rec-pages");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let (stdout, _) = recommend_pages(&d, &[]);
    let pages = d.join("rec");
    assert!(stdout.contains(&format!("Saved 10 candidate pages to: {}", pages.display())), "{stdout}");
    let html = std::fs::read_to_string(d.join("rec.html")).unwrap();
    let links = candidate_links(&html);
    // The ten best of the ranked view, each page a file that exists, and nothing else there.
    assert_eq!(links.len(), 10, "{links:?}");
    let mut linked: Vec<String> =
        links.iter().map(|l| l.strip_prefix("rec/").expect("beside the page").to_string()).collect();
    linked.sort();
    assert_eq!(linked, page_files(&pages));
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("out/recommendation.json")).unwrap()).unwrap();
    let top: Vec<String> = rec["views"]["top_n"].as_array().unwrap()[..10]
        .iter()
        .map(|v| format!("{}.html", v.as_str().unwrap()))
        .collect();
    let mut top_sorted = top.clone();
    top_sorted.sort();
    assert_eq!(linked, top_sorted, "the pages are the ten best");
    assert_eq!(links[0], format!("rec/{}", top[0]), "the table lists the best first");

    let (dom, console) = browse(&d.join("rec.html"));
    assert!(console.is_empty(), "console messages: {console:?}");
    assert_eq!(candidate_links(&dom).len(), 10);

    // The best and the tenth: every chart of a predict page, one heatmap row per worker.
    for (rank, name) in [(1, &top[0]), (10, &top[9])] {
        let page = pages.join(name);
        let (dom, console) = browse(&page);
        assert!(console.is_empty(), "{name}: console messages: {console:?}");
        assert_eq!(dom.matches("data-chart=").count(), 13, "{name}");
        for (chart, series) in PREDICT_PAGE_SERIES {
            assert_eq!(count_in_chart(&dom, chart, "data-series="), series, "{name} {chart}");
        }
        let id = name.trim_end_matches(".html");
        let c = rec["candidates"].as_array().unwrap().iter().find(|c| c["candidate_id"] == id).unwrap();
        let replicas = c["prediction_config"]["engine"]["workers"]["aggregated"]["parallelism"]["replicas"]
            .as_u64()
            .unwrap() as usize;
        for chart in ["heatmap-running", "heatmap-kv"] {
            assert_eq!(count_in_chart(&dom, chart, "data-row="), replicas, "{name} {chart}");
        }
        assert!(dom.contains(&format!("rank {rank}, feasible")), "{name}");
        assert!(dom.contains("the replay gave the summary the search ranked"), "{name}");
        // The summary is the one the search ranked.
        for key in ["completed_requests", "mean_ttft_ms", "output_throughput_tok_s"] {
            let v = &c["metrics"][key];
            let shown = match v.as_u64() {
                Some(n) => n.to_string(),
                None => format!("{:.3}", v.as_f64().unwrap()),
            };
            assert_eq!(summary_cell(&dom, key), shown, "{name} {key}");
        }
        // Its link back resolves to the recommend page.
        let back = dom.split("<a href=\"").nth(1).map(|s| s[..s.find('"').unwrap()].to_string()).unwrap();
        assert_eq!(back, "../rec.html");
        assert!(pages.join(&back).exists());
    }

    // Deterministic: a second search writes the same pages.
    let again = dir().join("rec-pages-again");
    let _ = std::fs::remove_dir_all(&again);
    std::fs::create_dir_all(&again).unwrap();
    recommend_pages(&again, &["--no-cache"]);
    assert_eq!(page_files(&again.join("rec")), page_files(&pages));
    for f in page_files(&pages) {
        assert!(std::fs::read(pages.join(&f)).unwrap() == std::fs::read(again.join("rec").join(&f)).unwrap(), "{f}");
    }
    assert!(std::fs::read(d.join("rec.html")).unwrap() == std::fs::read(again.join("rec.html")).unwrap());

    // `0`: no pages, no links; the old pages are left alone.
    recommend_pages(&d, &["--report-candidates", "0"]);
    assert!(candidate_links(&std::fs::read_to_string(d.join("rec.html")).unwrap()).is_empty());
}

#[test]
fn every_replayed_candidate_gets_a_page_with_all_including_infeasible_ones() {
    let d = dir().join("rec-all");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    // Every candidate's TTFT is 30 ms: a strict 20 ms SLA makes all 54 infeasible after replaying.
    let sla = ["--set", "optimization.strict_sla=true", "--set", "evaluation.sla.ttft_ms=20"];
    let mut args = sla.to_vec();
    args.extend(["--report-candidates", "all"]);
    recommend_pages(&d, &args);
    let files = page_files(&d.join("rec"));
    assert_eq!(files.len(), 54);
    let html = std::fs::read_to_string(d.join("rec.html")).unwrap();
    assert_eq!(candidate_links(&html).len(), 54);
    for f in &files {
        let page = std::fs::read_to_string(d.join("rec").join(f)).unwrap();
        assert!(page.contains("not ranked, infeasible (strict aggregate SLA violation: ttft "), "{f}");
    }
    let (dom, console) = browse(&d.join("rec").join(&files[0]));
    assert!(console.is_empty(), "console messages: {console:?}");
    assert_eq!(dom.matches("data-chart=").count(), 13);
    // By default only ranked candidates get one: none here, and the old pages stay.
    let (stdout, _) = recommend_pages(&d, &sla);
    assert!(!stdout.contains("candidate pages"), "{stdout}");
    assert!(candidate_links(&std::fs::read_to_string(d.join("rec.html")).unwrap()).is_empty());
    assert_eq!(page_files(&d.join("rec")).len(), 54);
}

#[test]
fn a_stale_cache_entry_is_named_on_the_page_it_differs_from() {
    let d = dir().join("rec-stale");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    recommend_pages(&d, &["--report-candidates", "0"]);
    // Every cached trial now claims one more output token than its replay makes. `redigest`
    // says whether the entry's own digest is brought up to date, as an entry written by another
    // build of the same version would be; an entry edited without it is not trusted at all.
    let make_stale = |redigest: bool| {
        let mut changed = 0;
        for shard in std::fs::read_dir(d.join("out/cache")).unwrap() {
            for entry in std::fs::read_dir(shard.unwrap().path()).unwrap() {
                let p = entry.unwrap().path();
                let text = std::fs::read_to_string(&p).unwrap();
                let stale = text.replace("\"total_output_tokens\":3200,", "\"total_output_tokens\":3201,");
                assert_ne!(stale, text, "{}", p.display());
                let mut v: serde_json::Value = serde_json::from_str(&stale).unwrap();
                if redigest {
                    v.as_object_mut().unwrap().remove("digest");
                    v = servesim_deploy::recommend::with_digest(v);
                }
                std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
                changed += 1;
            }
        }
        assert_eq!(changed, 54);
    };
    make_stale(false);
    let (_, stderr) = recommend_pages(&d, &["--report-candidates", "3"]);
    assert!(!stderr.contains("differs from the result the search ranked"), "{stderr}");
    make_stale(true);
    let (_, stderr) = recommend_pages(&d, &["--report-candidates", "3"]);
    assert_eq!(stderr.matches("a fresh replay differs from the result the search ranked").count(), 3, "{stderr}");
    for f in page_files(&d.join("rec")) {
        let page = std::fs::read_to_string(d.join("rec").join(&f)).unwrap();
        assert!(page.contains("the replay differs from the result the search ranked"), "{f}");
        assert_eq!(summary_cell(&page, "total_output_tokens"), "3200", "{f}: the page shows the replay");
    }
}

#[test]
fn candidate_pages_refuse_a_directory_they_would_clobber() {
    let d = dir().join("rec-refuse");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("rec")).unwrap();
    std::fs::write(d.join("rec/notes.txt"), "mine").unwrap();
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/deploy/recommend_grid_fixed.yaml");
    let out_dir = d.join("out");
    let run = |page: &Path, extra: &[&str]| {
        let mut args = vec!["recommend", "-c", config, "--output-dir", out_dir.to_str().unwrap()];
        args.extend(["--report-html", page.to_str().unwrap()]);
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_servesim")).args(&args).output().expect("run servesim")
    };
    let out = run(&d.join("rec.html"), &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("writes its candidate pages into {}, which holds notes.txt", d.join("rec").display())),
        "{stderr}"
    );
    assert!(!d.join("out").exists(), "refused before the search ran");
    assert_eq!(std::fs::read_to_string(d.join("rec/notes.txt")).unwrap(), "mine");
    // With no pages asked for, the directory is not touched and the search runs.
    assert!(run(&d.join("rec.html"), &["--report-candidates", "0"]).status.success());
    // A page whose pages directory would be the output directory.
    let out = run(&d.join("out.html"), &["--overwrite"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("which is the output directory"));
    let out = run(&d.join("x.html"), &["--report-candidates", "best"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected a number of candidates or `all`, got \"best\""));
    // It applies to --report-html only.
    let out = Command::new(env!("CARGO_BIN_EXE_servesim"))
        .args(["recommend", "-c", config, "--output-dir", out_dir.to_str().unwrap(), "--report-candidates", "3"])
        .output()
        .expect("run servesim");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--report-html <PATH>"));
}

#[test]
fn a_planner_candidates_page_replays_it_with_its_planner() {
    let d = dir().join("rec-planner-pages");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/deploy/recommend_planner_fixed.yaml");
    let (out_dir, page) = (d.join("out"), d.join("rec.html"));
    let out = Command::new(env!("CARGO_BIN_EXE_servesim"))
        .args(["recommend", "-c", config, "--output-dir", out_dir.to_str().unwrap(), "--overwrite"])
        .args(["--report-html", page.to_str().unwrap(), "--report-candidates", "all"])
        .output()
        .expect("run servesim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Every page's replay is the one the search ranked (a page replayed without its planner
    // would differ, and say so).
    assert!(!stderr.contains("differs"), "{stderr}");
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("recommendation.json")).unwrap()).unwrap();
    let enabled: Vec<&serde_json::Value> = rec["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["prediction_config"]["planner"]["policy"] == "enabled")
        .collect();
    assert!(!enabled.is_empty(), "the space has planner-enabled candidates");
    for c in enabled {
        let id = c["candidate_id"].as_str().unwrap();
        let (dom, console) = browse(&d.join("rec").join(format!("{id}.html")));
        assert!(console.is_empty(), "{id}: console messages: {console:?}");
        assert!(dom.contains("the replay gave the summary the search ranked"), "{id}");
        assert_eq!(count_in_chart(&dom, "planner-workers", "data-series="), 1, "{id}");
    }
}

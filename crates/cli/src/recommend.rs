//! `servesim recommend -c FILE`: evaluate the search space of a deployment YAML
//! (servesim-deploy's `recommend`) on every core and write the ranked result.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;

use crate::failure::Failure;
use crate::flags::Stack;
use crate::outdir::OutputDir;
use crate::outdir::Staged;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RecommendArgs {
    #[command(subcommand)]
    pub merge: Option<MergeCommand>,
    /// A unified deployment YAML with `optimization` / `optimizer` sections and search domains.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Evaluate only shard K of N (0-based; candidate i belongs to shard i mod N) and write
    /// shard-K-of-N.json into the output directory; `recommend merge` combines the shards.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// Override a configuration value: a dotted key path and a YAML value (repeatable).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    /// A calibration file from `servesim calibrate`: its fitted timing corrections apply to
    /// every candidate (a warning names each way the search leaves the measured deployment).
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    #[arg(long, value_name = "DIR", default_value = "aisimulate-output")]
    pub output_dir: PathBuf,
    /// Replace an existing output directory.
    #[arg(long)]
    pub overwrite: bool,
    /// `table` prints the best candidates; `json` prints recommendation.json.
    #[arg(long, value_enum, default_value = "table")]
    pub format: crate::flags::Format,
    /// Accepted for compatibility: servesim has one stack.
    #[arg(long, value_enum, value_name = "NAME")]
    pub stack: Option<Stack>,
    /// Threads evaluating candidates (0: every core).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub threads: usize,
    #[command(flatten)]
    pub pages: PageArgs,
    /// The content-addressed trial cache: a candidate already evaluated with the same inputs is
    /// read from here instead of replayed, and new results are added. Default: `cache/` in the
    /// output directory (the previous run's entries are re-used, this run's are kept).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Evaluate every candidate afresh and keep no cache.
    #[arg(long, conflicts_with = "cache_dir")]
    pub no_cache: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum MergeCommand {
    /// Combine the shard files of `recommend --shard K/N` runs into the files one run writes.
    Merge {
        /// Directories (or shard files) written by the shards.
        #[arg(required = true, value_name = "DIR")]
        dirs: Vec<PathBuf>,
        #[arg(long, value_name = "DIR", default_value = "aisimulate-output")]
        output_dir: PathBuf,
        #[arg(long)]
        overwrite: bool,
        #[command(flatten)]
        pages: PageArgs,
    },
}

/// The HTML report of a search (or of merged shards) and its candidates' run pages.
#[derive(Args, Debug)]
pub struct PageArgs {
    /// Also write a self-contained HTML page: the candidates against the Pareto front and a
    /// table sortable by any column, linking the chosen candidates (--report-candidates) to
    /// their own run pages in a directory beside it (`rec.html` → `rec/candidate-NNNNNN.html`).
    #[arg(long, value_name = "PATH")]
    pub report_html: Option<PathBuf>,
    /// Which candidates of --report-html get a run page, each replayed again after the search
    /// with telemetry on: N (the first N of the ranked view, as the table prints them; for
    /// target pareto the front; 0 for none) or `all` (every candidate that replayed, feasible
    /// or not: one more replay and about 50 KB to 0.3 MB each).
    #[arg(
        long,
        value_name = "N|all",
        default_value = "10",
        value_parser = crate::candidate_pages::parse_choice,
        requires = "report_html"
    )]
    pub report_candidates: crate::candidate_pages::Choice,
}

fn parse_shard(s: &str) -> Result<(usize, usize), Failure> {
    let bad = || Failure::input(format!("--shard {s:?}: expected K/N with 0 <= K < N"));
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let (k, n): (usize, usize) = (k.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
    if n == 0 || k >= n {
        return Err(bad());
    }
    Ok((k, n))
}

/// A candidate beside an encoder pool is an overlay of its language replay's aggregate means,
/// with no per-request records or telemetry a run page would draw.
fn refuse_epd_pages(
    search: &servesim_deploy::recommend::Search,
    pages: bool,
    choice: crate::candidate_pages::Choice,
    file: &str,
) -> Result<(), Failure> {
    if pages
        && choice != crate::candidate_pages::Choice::Best(0)
        && search.base.pointer("/engine/workers/encoder").is_some_and(|v| !v.is_null())
    {
        return Err(Failure::input(format!(
            "{file}: --report-candidates: run pages of candidates with an encoder pool (engine.workers.encoder, an \
             overlay of aggregate means without per-request records) are not supported by servesim yet; use \
             --report-candidates 0"
        )));
    }
    Ok(())
}

fn read_search(
    tree: &serde_json::Value,
    file: &str,
    base: &Path,
) -> Result<servesim_deploy::recommend::Search, Failure> {
    let search =
        servesim_deploy::recommend::read_search(tree, base).map_err(|e| Failure::input(format!("{file}: {e}")))?;
    // The base configuration must be a valid predict configuration apart from its domains:
    // check the first candidate strictly before spending time on the rest.
    servesim_deploy::schema::read_predict(&search.first_tree()).map_err(|e| Failure::input(format!("{file}: {e}")))?;
    // The load-predictor backtest ran without the presets Python would have run: say so, since
    // the reference backtests them and may choose one.
    if let Some(b) = &search.planner_backtest {
        if let (Some(why), Some(skipped)) = (b["skipped_because"].as_str(), b["skipped"].as_array()) {
            let names: Vec<&str> = skipped.iter().filter_map(serde_json::Value::as_str).collect();
            eprintln!(
                "notice: planner.load_predictor: the backtest left out {} ({why}); aisimulate backtests them too, so \
                 the load predictor chosen may differ from its",
                names.join(", ")
            );
        }
    }
    Ok(search)
}

/// The HTML outputs of a search, opened before it runs so that a bad path costs nothing: the
/// recommend page, the staging directory of its candidates' pages (none with
/// `--report-candidates 0`), which candidates get one, the directory candidate trace paths are
/// relative to, and the threads that replay them.
struct Pages<'a> {
    page: &'a Path,
    file: crate::output::ReportFile,
    stage: Option<Staged>,
    choice: crate::candidate_pages::Choice,
    base: PathBuf,
    threads: usize,
}

impl<'a> Pages<'a> {
    /// The checks of [`Pages::open`] that touch nothing: run before the output directory is
    /// created, so a refused page leaves no trace.
    fn check(
        page: &Path,
        choice: crate::candidate_pages::Choice,
        output_dir: &Path,
        inputs: &[PathBuf],
    ) -> Result<(), Failure> {
        crate::outdir::check_reports(&[("report-html", page)], inputs, output_dir)?;
        if choice != crate::candidate_pages::Choice::Best(0) {
            crate::candidate_pages::check_pages_dir(page, output_dir)?;
        }
        Ok(())
    }

    fn open(
        page: &'a Path,
        choice: crate::candidate_pages::Choice,
        output_dir: &Path,
        inputs: &[PathBuf],
        base: PathBuf,
        threads: usize,
    ) -> Result<Pages<'a>, Failure> {
        Pages::check(page, choice, output_dir, inputs)?;
        let stage = if choice == crate::candidate_pages::Choice::Best(0) {
            None
        } else {
            Some(Staged::new(&crate::candidate_pages::pages_dir(page), true)?)
        };
        let file = crate::output::ReportFile::create(page)?;
        Ok(Pages { page, file, stage, choice, base, threads })
    }
}

fn merge(
    dirs: &[PathBuf],
    output_dir: &Path,
    overwrite: bool,
    json: bool,
    report_html: Option<&Path>,
    choice: crate::candidate_pages::Choice,
) -> Result<(), Failure> {
    let mut shards = Vec::new();
    let mut inputs: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let files: Vec<PathBuf> = if d.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(d)
                .map_err(|e| Failure::input(format!("{}: {e}", d.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("shard-") && n.ends_with(".json"))
                })
                .collect();
            v.sort();
            v
        } else {
            vec![d.clone()]
        };
        for f in files {
            inputs.push(f.clone());
            let text = std::fs::read(&f).map_err(|e| Failure::input(format!("{}: cannot read: {e}", f.display())))?;
            let v: serde_json::Value = serde_json::from_slice(&text)
                .map_err(|e| Failure::input(format!("{}: not a shard file: {e}", f.display())))?;
            shards.push((f, v));
        }
    }
    let Some((first_path, first)) = shards.first() else {
        return Err(Failure::input("no shard-K-of-N.json files found"));
    };
    let n = first["of"].as_u64().unwrap_or(0) as usize;
    let tree = first["config"].clone();
    let base = PathBuf::from(first["config_dir"].as_str().unwrap_or("."));
    let search = read_search(&tree, &first_path.display().to_string(), &base)?;
    refuse_epd_pages(&search, report_html.is_some(), choice, &first_path.display().to_string())?;
    let mut trials: Vec<Option<servesim_deploy::recommend::Trial>> = vec![None; search.candidate_count()];
    let mut seen = vec![false; n];
    for (f, v) in &shards {
        if v["config"] != tree || v["of"].as_u64() != Some(n as u64) {
            return Err(Failure::input(format!("{}: a shard of a different search", f.display())));
        }
        if !servesim_deploy::recommend::digest_holds(v) {
            return Err(Failure::input(format!(
                "{}: the shard file was changed or damaged after it was written (its digest does not match); run \
                 that shard again",
                f.display()
            )));
        }
        if v["inputs"] != first["inputs"] {
            return Err(Failure::input(format!(
                "{}: shard {} was run on other inputs than {} (the trace contents or the performance data differ); \
                 run every shard on the same inputs",
                f.display(),
                v["shard"],
                first_path.display()
            )));
        }
        let k = v["shard"].as_u64().unwrap_or(u64::MAX) as usize;
        if k >= n || seen[k] {
            return Err(Failure::input(format!("{}: shard {k} of {n} repeated or out of range", f.display())));
        }
        seen[k] = true;
        for t in v["trials"].as_array().into_iter().flatten() {
            let (i, trial) = servesim_deploy::recommend::trial_from_json(&search, t)
                .ok_or_else(|| Failure::input(format!("{}: malformed trial record", f.display())))?;
            trials[i] = Some(trial);
        }
    }
    if let Some(k) = seen.iter().position(|s| !s) {
        return Err(Failure::input(format!("shard {k} of {n} is missing")));
    }
    let trials: Vec<_> = trials
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| Failure::input(format!("candidate {i} was evaluated by no shard"))))
        .collect::<Result<_, _>>()?;
    if let Some(page) = report_html {
        Pages::check(page, choice, output_dir, &inputs)?;
    }
    let staged = OutputDir::open(output_dir, overwrite, &inputs)?;
    let pages = report_html.map(|page| Pages::open(page, choice, output_dir, &inputs, base.clone(), 0)).transpose()?;
    // The cache one run would have left beside its results (keyed by the shards' inputs).
    let cache = match servesim_deploy::recommend::Cache::new(&search, &base, Vec::new(), staged.path("cache")) {
        Ok(c) => Some(c),
        Err(why) => {
            eprintln!("notice: no trial cache is written ({why})");
            None
        }
    };
    if let Some(c) = &cache {
        if first["inputs"].as_str() == Some(c.inputs()) {
            for t in &trials {
                c.record(t);
            }
        }
    }
    let keep = cache.as_ref().map(|c| (output_dir.join("cache"), c.used_keys()));
    finish(&search, trials, 0, staged, keep, json, None, pages)
}

/// A calibration applies to the worker blocks the configuration lists: a search over modes
/// whose workers it does not list would run them uncalibrated.
fn calibrated_modes(calibration: &Path, tree: &serde_json::Value) -> Result<(), Failure> {
    let engine = &tree["engine"];
    let modes: Vec<&str> = match engine.get("mode") {
        Some(serde_json::Value::String(m)) => vec![m.as_str()],
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|m| m.as_str()).collect(),
        _ => vec!["aggregated", "disaggregated"],
    };
    let listed = |role: &str| engine.pointer(&format!("/workers/{role}")).is_some_and(|w| !w.is_null());
    for mode in modes {
        let roles: &[&str] = if mode == "disaggregated" { &["prefill", "decode"] } else { &["aggregated"] };
        if let Some(missing) = roles.iter().find(|r| !listed(r)) {
            return Err(Failure::input(format!(
                "--calibration {}: the search includes {mode} deployments, whose engine.workers.{missing} block the \
                 configuration does not list; list it (the calibration applies to the blocks listed) or restrict \
                 engine.mode",
                calibration.display()
            )));
        }
    }
    Ok(())
}

pub fn run(a: RecommendArgs) -> Result<(), Failure> {
    let json = a.format == crate::flags::Format::Json;
    if let Some(MergeCommand::Merge { dirs, output_dir, overwrite, pages }) = &a.merge {
        return merge(dirs, output_dir, *overwrite, json, pages.report_html.as_deref(), pages.report_candidates);
    }
    let started = Instant::now();
    let config = a
        .config
        .as_deref()
        .ok_or_else(|| Failure::input("recommend needs -c/--config FILE (or `recommend merge DIR...`)"))?;
    if a.pages.report_html.is_some() && a.shard.is_some() {
        return Err(Failure::input(
            "--report-html applies to a whole search; give it to `recommend merge` for sharded runs",
        ));
    }
    let mut sets = a.set.clone();
    if let Some(c) = &a.calibration {
        let tree = servesim_deploy::load_tree(config, &a.set).map_err(Failure::input)?;
        calibrated_modes(c, &tree)?;
        sets.extend(crate::calibrate::overrides(c, &tree)?.1);
    }
    let tree = servesim_deploy::load_tree(config, &sets).map_err(Failure::input)?;
    let file = config.display().to_string();
    let base = config.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let base = if base.as_os_str().is_empty() { PathBuf::from(".") } else { base };
    let search = read_search(&tree, &file, &base)?;
    refuse_epd_pages(&search, a.pages.report_html.is_some(), a.pages.report_candidates, &file)?;
    if let Some(spec) = &a.shard {
        let (k, n) = parse_shard(spec)?;
        if search.optimizer.algorithm == "bayesian" {
            return Err(Failure::input(format!(
                "{file}: optimizer.algorithm: bayesian search proposes each round from the results of the last, so it \
                 cannot be split into --shard slices; use grid"
            )));
        }
        if search.draws_in_rounds() {
            return Err(Failure::input(format!(
                "{file}: optimizer.algorithm: random search draws as the reference does, re-asking within a round \
                 for each trial that does not complete, so it cannot be split into --shard slices; use grid"
            )));
        }
        match std::fs::symlink_metadata(&a.output_dir) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(Failure::input(format!(
                    "{}: the output directory is a symbolic link; name the directory it points to",
                    a.output_dir.display()
                )))
            }
            Ok(m) if !m.is_dir() => {
                return Err(Failure::input(format!("{}: exists and is not a directory", a.output_dir.display())))
            }
            _ => {}
        }
        let inputs_digest = servesim_deploy::recommend::inputs_digest(&search.base, &base)
            .map_err(|e| Failure::input(format!("{file}: traffic.source.paths: {e}")))?;
        std::fs::create_dir_all(&a.output_dir)
            .map_err(|e| Failure::input(format!("{}: cannot create: {e}", a.output_dir.display())))?;
        let name = a.output_dir.join(format!("shard-{k}-of-{n}.json"));
        if name.exists() && !a.overwrite {
            return Err(Failure::input(format!("{}: exists; pass --overwrite to replace it", name.display())));
        }
        // Shards share a cache only when one is named.
        let cache = a
            .cache_dir
            .as_ref()
            .map(|d| servesim_deploy::recommend::Cache::new(&search, &base, vec![d.clone()], d.clone()))
            .transpose()
            .map_err(|e| Failure::input(format!("--cache-dir: {e}")))?;
        let trials = servesim_deploy::recommend::evaluate_shard(&search, &base, a.threads, k, n, cache.as_ref());
        check_not_all_failed(trials.iter().map(|(_, t)| t))?;
        // The inputs' digest lets merge refuse shards run on different traces or data; the
        // document's digest, shards edited or damaged since.
        let doc = servesim_deploy::recommend::with_digest(serde_json::json!({
            "shard": k,
            "of": n,
            "config": tree,
            "config_dir": std::fs::canonicalize(&base).unwrap_or(base.clone()),
            "inputs": inputs_digest,
            "trials": trials.iter().map(|(i, t)| servesim_deploy::recommend::trial_json(*i, t)).collect::<Vec<_>>(),
        }));
        let tmp = a.output_dir.join(format!(".shard-{k}-of-{n}.json.partial"));
        servesim_workload::scratch::register(&tmp);
        let written = std::fs::write(&tmp, serde_json::to_vec(&doc).expect("serialises"))
            .and_then(|_| std::fs::rename(&tmp, &name))
            .map_err(|e| Failure::run(format!("{}: write failed: {e}", name.display())));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        servesim_workload::scratch::unregister(&tmp);
        written?;
        println!("shard {k}/{n}: {} candidates -> {}", trials.len(), name.display());
        return Ok(());
    }
    let inputs = crate::outdir::run_inputs(config, &tree);
    if let Some(page) = &a.pages.report_html {
        Pages::check(page, a.pages.report_candidates, &a.output_dir, &inputs)?;
    }
    // The output directory first: the page may be written inside it.
    let staged = OutputDir::open(&a.output_dir, a.overwrite, &inputs)?;
    let pages = a
        .pages
        .report_html
        .as_deref()
        .map(|page| Pages::open(page, a.pages.report_candidates, &a.output_dir, &inputs, base.clone(), a.threads))
        .transpose()?;
    let cache = if a.no_cache {
        None
    } else if let Some(d) = &a.cache_dir {
        let c = servesim_deploy::recommend::Cache::new(&search, &base, vec![d.clone()], d.clone())
            .map_err(|e| Failure::input(format!("--cache-dir: {e}")))?;
        Some(c)
    } else {
        // The output directory's cache, written as trials finish: an interrupted run's trials
        // are read by the next one. After a run it holds exactly that run's candidates.
        let dir = a.output_dir.join("cache");
        match servesim_deploy::recommend::Cache::new(&search, &base, vec![dir.clone()], dir) {
            Ok(c) => Some(c),
            Err(why) => {
                eprintln!("notice: the trial cache is off for this run ({why})");
                None
            }
        }
    };
    let bar = crate::progress::SearchBar::new(servesim_deploy::recommend::trial_count(&search) as u64);
    let report = |done: usize, _total: usize, best: Option<f64>| bar.update(done, best);
    let progress = servesim_deploy::recommend::Progress::new(servesim_deploy::recommend::trial_count(&search), &report);
    let done = servesim_deploy::recommend::evaluate(&search, &base, a.threads, cache.as_ref(), &progress);
    bar.finish();
    check_not_all_failed(done.trials.iter())?;
    let keep = match (&cache, a.cache_dir.is_none()) {
        (Some(c), true) => Some((a.output_dir.join("cache"), c.used_keys())),
        _ => None,
    };
    finish(&search, done.trials, done.cache_hits, staged, keep, json, Some(started), pages)
}

/// Refuses a search whose every candidate failed for one reason outside the candidates (an
/// input error: a trace that cannot be read, data that is missing): exit 2 with that reason,
/// instead of a ranking of failures.
fn check_not_all_failed<'t>(
    trials: impl Iterator<Item = &'t servesim_deploy::recommend::Trial>,
) -> Result<(), Failure> {
    let mut reason: Option<&str> = None;
    let mut count = 0;
    for t in trials {
        match (t.status, t.reason_category, t.reason.as_deref()) {
            ("unsupported", Some("candidate_materialization"), Some(why)) if reason.is_none_or(|r| r == why) => {
                reason = Some(why);
                count += 1;
            }
            _ => return Ok(()),
        }
    }
    match reason {
        Some(why) if count > 1 => {
            Err(Failure::input(format!("every candidate ({count}) failed for the same reason, an input error: {why}")))
        }
        _ => Ok(()),
    }
}

#[allow(clippy::too_many_arguments)]
fn finish(
    search: &servesim_deploy::recommend::Search,
    trials: Vec<servesim_deploy::recommend::Trial>,
    cache_hits: usize,
    staged: OutputDir,
    prune: Option<(PathBuf, std::collections::HashSet<String>)>,
    json: bool,
    started: Option<Instant>,
    pages: Option<Pages>,
) -> Result<(), Failure> {
    let n = trials.len();
    let mut ranked = servesim_deploy::recommend::rank(search, trials);
    ranked.cache_hits = cache_hits;
    let files = servesim_deploy::recommend::outputs(search, &ranked);
    std::fs::create_dir_all(staged.path("recommendations")).map_err(|e| Failure::run(format!("cannot create: {e}")))?;
    for (name, bytes) in &files {
        let p = staged.path(name);
        std::fs::write(&p, bytes).map_err(|e| Failure::run(format!("{}: write failed: {e}", p.display())))?;
    }
    // The search's results are kept whatever happens to the pages drawn after it.
    let output_dir = staged.target().to_path_buf();
    let output_dir = output_dir.as_path();
    staged.commit()?;
    if let Some((dir, keep)) = prune {
        crate::outdir::prune_cache(&dir, &keep);
    }
    let mut pages_written = None;
    if let Some(Pages { page, mut file, stage, choice, base, threads }) = pages {
        let mut rows = candidate_rows(search, &ranked);
        let chosen = crate::candidate_pages::chosen(&ranked, &rows, choice);
        if let (false, Some(stage)) = (chosen.is_empty(), stage) {
            // Checked again: the directory is replaced whole.
            crate::candidate_pages::check_pages_dir(page, output_dir)?;
            let links =
                crate::candidate_pages::write_pages(search, &ranked, &rows, &chosen, &base, page, threads, stage)?;
            for (i, href) in links {
                rows[i].page = Some(href);
            }
            pages_written = Some((chosen.len(), crate::candidate_pages::pages_dir(page)));
        }
        let page =
            servesim_report::render_recommend("servesim recommend", search.optimization.target, &rows, &search.base);
        std::io::Write::write_all(file.writer(), page.as_bytes())
            .map_err(|e| Failure::run(format!("{}: write failed: {e}", file.path().display())))?;
        file.commit().map_err(Failure::run)?;
    }
    // Written without println! so a closed pipe (`| head`) is not a panic.
    let mut text = String::new();
    use std::fmt::Write as _;
    match json {
        true => {
            let _ = writeln!(text, "{}", String::from_utf8_lossy(&files[0].1));
        }
        false => {
            let o = &search.optimization;
            let took = started.map(|s| format!(" in {:.1} s", s.elapsed().as_secs_f64())).unwrap_or_default();
            let mut notes = String::new();
            if cache_hits > 0 {
                let _ = write!(notes, "; {cache_hits} from the cache");
            }
            if search.kv_excluded > 0 {
                let verb = if search.optimizer.algorithm == "grid" { "marked infeasible" } else { "left out" };
                let _ =
                    write!(notes, "; {} whose KV cache cannot hold one longest sequence {verb}", search.kv_excluded);
            }
            let _ = writeln!(
                text,
                "{n} candidates ({} algorithm) evaluated{took}; target {}{notes}",
                search.optimizer.algorithm, o.target
            );
            let view = if o.target == "pareto" { &ranked.pareto } else { &ranked.top_n };
            for (rank, &i) in view.iter().take(10).enumerate() {
                let t = &ranked.trials[i];
                let _ = writeln!(
                    text,
                    "{:>3}. candidate-{:06}  score {:>12.4}  gpus {:>3}  {}",
                    rank + 1,
                    i + 1,
                    ranked.scores[i],
                    t.used_gpus,
                    serde_json::to_string(&knobs(search, &t.tree)).unwrap_or_default()
                );
            }
            let _ = writeln!(text, "Saved recommendation to: {}", output_dir.join("recommendation.json").display());
            if let Some((count, dir)) = &pages_written {
                let _ = writeln!(text, "Saved {count} candidate pages to: {}", dir.display());
            }
        }
    }
    let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
    Ok(())
}

/// What the summary line shows of a candidate: its workers, and when the search varies them, its
/// mode and backend, its traffic load (a searched or KV-relative load: the concurrency or rate it
/// ran), its router and its planner.
fn knobs(search: &servesim_deploy::recommend::Search, tree: &serde_json::Value) -> serde_json::Value {
    // An AFD candidate is its topology.
    let workers = tree.pointer("/engine/afd").or_else(|| tree.pointer("/engine/workers")).cloned().unwrap_or_default();
    let (mode, backend) = search.space.searches_identity();
    let mut m = serde_json::Map::new();
    for (shown, key) in [(mode, "mode"), (backend, "backend")] {
        if let Some(v) = tree.pointer(&format!("/engine/{key}")).filter(|_| shown) {
            m.insert(key.into(), v.clone());
        }
    }
    if let Some(load) = tree.pointer("/traffic/load").filter(|_| search.searches_load()) {
        m.insert("load".into(), load.clone());
    }
    for section in ["router", "planner"] {
        if let Some(v) = tree.get(section) {
            m.insert(section.into(), v.clone());
        }
    }
    if m.is_empty() {
        return workers;
    }
    m.insert("workers".into(), workers);
    serde_json::Value::Object(m)
}

/// The rows of the recommend page, in trial order (no candidate page linked yet).
fn candidate_rows(
    search: &servesim_deploy::recommend::Search,
    ranked: &servesim_deploy::recommend::Ranked,
) -> Vec<servesim_report::Candidate> {
    use servesim_deploy::recommend::objective;
    let o = &search.optimization;
    let view = if o.target == "pareto" { &ranked.pareto } else { &ranked.top_n };
    // The front on the chart's two axes among feasible candidates, whatever the target ranks by.
    let axes: Vec<(f64, f64)> = ranked
        .trials
        .iter()
        .map(|t| (objective("throughput_per_gpu", t).0, objective("throughput_per_user", t).0))
        .collect();
    let feasible: Vec<usize> = (0..ranked.trials.len()).filter(|&i| ranked.trials[i].status == "feasible").collect();
    let on_front = |i: usize| {
        let a = axes[i];
        ranked.trials[i].status == "feasible"
            && !feasible.iter().any(|&j| {
                let b = axes[j];
                b.0 >= a.0 && b.1 >= a.1 && (b.0 > a.0 || b.1 > a.1)
            })
    };
    ranked
        .trials
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let metric = |k: &str| t.summary.get(k).and_then(serde_json::Value::as_f64);
            servesim_report::Candidate {
                id: format!("candidate-{:06}", i + 1),
                status: t.status.to_string(),
                score: ranked.scores[i],
                gpus: t.used_gpus,
                throughput_per_gpu: axes[i].0,
                throughput_per_user: axes[i].1,
                mean_ttft_ms: metric("mean_ttft_ms"),
                mean_tpot_ms: metric("mean_tpot_ms"),
                knobs: serde_json::Value::String(knob_summary(&t.tree)),
                pareto: on_front(i),
                rank: view.iter().position(|&j| j == i).map(|r| r + 1),
                page: None,
            }
        })
        .collect()
}

/// The knobs a candidate sets, in one line: `aggregated: replicas=2 tensor=1 ...`.
fn knob_summary(tree: &serde_json::Value) -> String {
    let mut parts = Vec::new();
    if let Some(workers) = tree.pointer("/engine/workers").and_then(serde_json::Value::as_object) {
        for (role, cfg) in workers {
            let mut knobs = Vec::new();
            for (section, keys) in [
                ("parallelism", &["replicas", "tensor", "attention_data"][..]),
                ("scheduler", &["max_batched_tokens", "max_sequences"][..]),
            ] {
                for k in keys {
                    if let Some(v) = cfg.get(section).and_then(|s| s.get(*k)) {
                        knobs.push(format!("{k}={v}"));
                    }
                }
            }
            parts.push(format!("{role}: {}", knobs.join(" ")));
        }
    }
    for section in ["router", "planner"] {
        if let Some(r) = tree.get(section).and_then(serde_json::Value::as_object) {
            let knobs: Vec<String> = r.iter().map(|(k, v)| format!("{k}={v}")).collect();
            parts.push(format!("{section}: {}", knobs.join(" ")));
        }
    }
    parts.join("; ")
}

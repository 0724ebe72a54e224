//! `recommend --report-html PAGE`: the run pages of chosen candidates. The search itself keeps
//! no per-request or telemetry data (a 1,000-candidate grid would hold a thousand runs' worth
//! for pages nobody opens); after it, the chosen candidates are replayed again with the report
//! collectors on, on the search's threads, and each page is written as soon as it is drawn, into
//! a directory beside PAGE that replaces the previous run's pages only when all are written.
//! The search's results, its cache and its shard files are untouched by this.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use servesim_deploy::recommend::{Ranked, Search};
use servesim_replay::{RequestRecord, WALL_CLOCK_KEYS};
use servesim_report::{CandidateContext, Requests, RunPage, TelemetrySeries};

use crate::failure::Failure;

/// Which candidates get a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The first N of the ranked view (the best by the target; for target `pareto`, the
    /// front in its order).
    Best(usize),
    /// Every candidate that was replayed (feasible or not).
    All,
}

impl Default for Choice {
    fn default() -> Self {
        Choice::Best(DEFAULT_BEST)
    }
}

/// Candidates of the ranked view with a page by default.
pub const DEFAULT_BEST: usize = 10;

/// `--report-candidates`: a count or `all`.
pub fn parse_choice(s: &str) -> Result<Choice, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(Choice::All);
    }
    s.parse::<usize>().map(Choice::Best).map_err(|_| format!("expected a number of candidates or `all`, got {s:?}"))
}

/// The directory of the candidate pages of recommend page `page`: `rec.html` → `rec/` beside
/// it (`rec.candidates/` when the page's name has no extension).
pub fn pages_dir(page: &Path) -> PathBuf {
    match (page.file_stem(), page.extension()) {
        (Some(stem), Some(_)) => page.with_file_name(stem),
        _ => {
            let mut name = page.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "recommend".into());
            name.push(".candidates");
            page.with_file_name(name)
        }
    }
}

fn is_page_name(name: &str) -> bool {
    name.strip_prefix("candidate-")
        .and_then(|n| n.strip_suffix(".html"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Refuses, before the search runs, a pages directory that is the output directory or holds
/// anything but candidate pages (it is replaced wholesale by the new pages).
pub fn check_pages_dir(page: &Path, output_dir: &Path) -> Result<(), Failure> {
    let dir = pages_dir(page);
    let why = |what: &str| {
        Failure::input(format!(
            "--report-html {} writes its candidate pages into {}, which {what}; name the page differently",
            page.display(),
            dir.display()
        ))
    };
    if crate::output::same_place(&dir, output_dir) {
        return Err(why("is the output directory"));
    }
    match std::fs::symlink_metadata(&dir) {
        Err(_) => Ok(()),
        Ok(m) if !m.is_dir() => Err(why("exists and is not a directory")),
        Ok(_) => {
            let entries = std::fs::read_dir(&dir).map_err(|e| Failure::input(format!("{}: {e}", dir.display())))?;
            for e in entries {
                let e = e.map_err(|e| Failure::input(format!("{}: {e}", dir.display())))?;
                let name = e.file_name().to_string_lossy().into_owned();
                if !is_page_name(&name) || !e.file_type().is_ok_and(|t| t.is_file()) {
                    return Err(why(&format!("holds {name}, not a candidate page")));
                }
            }
            Ok(())
        }
    }
}

/// A path segment for an `href`: unreserved characters as they are, the rest percent-encoded.
pub fn href_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The candidates (indices into the ranked trials, ascending) that get a page: of `rows` (the
/// recommend page's rows, in trial order), the first `n` ranked, or every one that replayed.
/// Not the chart's Pareto front by default: candidates whose knobs change nothing tie on it (a
/// 1,000-candidate grid put 210 there).
pub fn chosen(ranked: &Ranked, rows: &[servesim_report::Candidate], choice: Choice) -> Vec<usize> {
    (0..ranked.trials.len())
        .filter(|&i| !ranked.trials[i].summary.is_empty())
        .filter(|&i| match choice {
            Choice::All => true,
            Choice::Best(n) => rows[i].rank.is_some_and(|r| r <= n),
        })
        .collect()
}

/// A summary as the pages show it: sorted keys, no values measured on the host's clock.
fn page_summary(summary: &serde_json::Map<String, serde_json::Value>) -> serde_json::Map<String, serde_json::Value> {
    let sorted = servesim_deploy::sorted(&serde_json::Value::Object(summary.clone()));
    let mut m = sorted.as_object().cloned().unwrap_or_default();
    for key in WALL_CLOCK_KEYS {
        m.remove(key);
    }
    m
}

/// Whether a page's replay gave the summary the search ranked: the same keys, integers and
/// strings equal, floats equal but for rounding (a run with the report collectors on adds its
/// token gaps in another order than the search's split run, a last-digit difference).
fn same_summary(
    page: &serde_json::Map<String, serde_json::Value>,
    ranked: &serde_json::Map<String, serde_json::Value>,
) -> bool {
    page.len() == ranked.len()
        && page.iter().all(|(k, a)| match (a, ranked.get(k)) {
            (serde_json::Value::Number(x), Some(serde_json::Value::Number(y))) if x.is_f64() || y.is_f64() => {
                let (x, y) = (x.as_f64().unwrap_or(f64::NAN), y.as_f64().unwrap_or(f64::NAN));
                x == y || (x - y).abs() <= 1e-9 * x.abs().max(y.abs())
            }
            (a, b) => Some(a) == b,
        })
}

/// Replays candidate `i` with the report collectors on and draws its page. `Ok(false)` in the
/// second place when the fresh replay's summary differs from the one the search ranked (a
/// cached result from another build of the same version).
fn draw(
    search: &Search,
    ranked: &Ranked,
    row: &servesim_report::Candidate,
    i: usize,
    base: &Path,
    search_href: &str,
) -> Result<(String, bool), String> {
    let t = &ranked.trials[i];
    let p = servesim_deploy::recommend::prepare_candidate(&t.tree, base).map_err(|e| e.to_string())?;
    let mut requests = Requests::default();
    let mut series = TelemetrySeries::default();
    let mut sink = |r: &RequestRecord| requests.add(r);
    // A candidate with a `planner:` section replays with its planner, as the search ran it.
    let planner = servesim_deploy::planner_run(&p)?;
    let ran = p
        .run()
        .records(Some(&mut sink))
        .telemetry(crate::flags::reports::DEFAULT_INTERVAL_MS, &mut series)
        .planner(planner)
        .go(&mut ())
        .map_err(|e| e.to_string())?;
    let summary = page_summary(&servesim_deploy::planned_summary(&p, &ran));
    let view = ran
        .planner
        .as_ref()
        .map(|run| crate::flags::reports::planner_view(run, run.is_agg(), ran.report.totals.duration_ms));
    let same = same_summary(&summary, &page_summary(&t.summary));
    let context = CandidateContext {
        rank: row.rank,
        status: t.status,
        reason: t.reason.as_deref(),
        score: ranked.scores[i],
        target: search.optimization.target,
        search_href,
        matches_search: same,
    };
    let title = format!("servesim recommend: {}", row.id);
    let page = RunPage {
        title: &title,
        summary: &summary,
        config: &t.tree,
        requests: &requests,
        telemetry: Some(&series).filter(|s| s.num_samples() > 0),
        planner: view.as_ref(),
        candidate: Some(&context),
    };
    Ok((servesim_report::render_run(&page), same))
}

/// Draws the pages of `chosen` on `threads` threads (0: every core) into `staged` (the pages
/// directory of recommend page `page`, opened before the search) and moves it into place;
/// returns each chosen candidate's `href` from the recommend page. A replay that fails (it
/// replayed in the search) is an error.
#[allow(clippy::too_many_arguments)]
pub fn write_pages(
    search: &Search,
    ranked: &Ranked,
    rows: &[servesim_report::Candidate],
    chosen: &[usize],
    base: &Path,
    page: &Path,
    threads: usize,
    staged: crate::outdir::Staged,
) -> Result<Vec<(usize, String)>, Failure> {
    let dir = pages_dir(page);
    let dir_name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let page_name = page.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let search_href = format!("../{}", href_segment(&page_name));
    let bar = crate::progress::SearchBar::pages(chosen.len() as u64);
    let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads }
        .min(chosen.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let differing: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= chosen.len() || failure.lock().expect("failure").is_some() {
                    break;
                }
                let i = chosen[k];
                let id = &rows[i].id;
                let path = staged.path(&format!("{id}.html"));
                let result = draw(search, ranked, &rows[i], i, base, &search_href)
                    .map_err(|e| format!("{id}: replaying it for its page failed: {e}"))
                    .and_then(|(html, same)| {
                        if !same {
                            differing.lock().expect("differing").push(i);
                        }
                        std::fs::write(&path, html).map_err(|e| format!("{}: write failed: {e}", path.display()))
                    });
                if let Err(e) = result {
                    failure.lock().expect("failure").get_or_insert(e);
                    break;
                }
                bar.update(done.fetch_add(1, Ordering::Relaxed) + 1, None);
            });
        }
    });
    bar.finish();
    if let Some(e) = failure.into_inner().expect("failure") {
        return Err(Failure::run(e));
    }
    let mut differing = differing.into_inner().expect("differing");
    differing.sort_unstable();
    for i in differing {
        eprintln!(
            "warning: {}: a fresh replay differs from the result the search ranked (read from the trial cache); \
             its page shows the fresh replay. Run with --no-cache to rank fresh results.",
            rows[i].id
        );
    }
    staged.commit()?;
    Ok(chosen.iter().map(|&i| (i, format!("{}/{}.html", href_segment(&dir_name), rows[i].id))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_sit_beside_the_recommend_page() {
        assert_eq!(pages_dir(Path::new("out/rec.html")), Path::new("out/rec"));
        assert_eq!(pages_dir(Path::new("rec.v2.html")), Path::new("rec.v2"));
        assert_eq!(pages_dir(Path::new("/tmp/report")), Path::new("/tmp/report.candidates"));
    }

    #[test]
    fn hrefs_are_percent_encoded() {
        assert_eq!(href_segment("rec.v2-a_b~"), "rec.v2-a_b~");
        assert_eq!(href_segment("my report#1"), "my%20report%231");
        assert_eq!(href_segment("é/"), "%C3%A9%2F");
    }

    #[test]
    fn choices_are_a_count_or_all() {
        assert_eq!(parse_choice("0"), Ok(Choice::Best(0)));
        assert_eq!(parse_choice("25"), Ok(Choice::Best(25)));
        assert_eq!(parse_choice("ALL"), Ok(Choice::All));
        assert!(parse_choice("-1").is_err());
        assert!(parse_choice("ten").is_err());
        assert!(is_page_name("candidate-000001.html"));
        assert!(!is_page_name("candidate-.html") && !is_page_name("candidate-01.htm") && !is_page_name("notes.txt"));
    }
}

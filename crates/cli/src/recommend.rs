//! `servesim recommend -c FILE`: evaluate the search space of a deployment YAML
//! (servesim-deploy's `recommend`) on every core and write the ranked result.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;

use crate::deploy::{Stack, Staged};
use crate::Failure;

#[derive(Args, Debug)]
pub struct RecommendArgs {
    /// A unified deployment YAML with `optimization` / `optimizer` sections and search domains.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: PathBuf,
    /// Override a configuration value: a dotted key path and a YAML value (repeatable).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    #[arg(long, value_name = "DIR", default_value = "aisimulate-output")]
    pub output_dir: PathBuf,
    /// Replace an existing output directory.
    #[arg(long)]
    pub overwrite: bool,
    /// `table` prints the best candidates; `json` prints recommendation.json.
    #[arg(long, value_enum, default_value = "table")]
    pub format: crate::predict::Format,
    /// Accepted for compatibility: servesim has one stack.
    #[arg(long, value_enum, value_name = "NAME")]
    pub stack: Option<Stack>,
    /// Threads evaluating candidates (0: every core).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub threads: usize,
}

pub fn run(a: RecommendArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let tree = servesim_deploy::load_tree(&a.config, &a.set).map_err(Failure::input)?;
    let file = a.config.display().to_string();
    let search = servesim_deploy::recommend::read_search(&tree).map_err(|e| Failure::input(format!("{file}: {e}")))?;
    // The base configuration must be a valid predict configuration apart from its domains:
    // check the first candidate strictly before spending time on the rest.
    servesim_deploy::schema::read_predict(&search.candidates[0]).map_err(|e| Failure::input(format!("{file}: {e}")))?;
    let staged = Staged::new(&a.output_dir, a.overwrite)?;
    let base = a.config.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let n = search.candidates.len();
    let show = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let progress = |done: usize, total: usize| {
        if show {
            eprint!("\r{done}/{total} candidates");
        }
    };
    let trials = servesim_deploy::recommend::evaluate(&search, &base, a.threads, &progress);
    if show {
        eprintln!();
    }
    let ranked = servesim_deploy::recommend::rank(&search, trials);
    let files = servesim_deploy::recommend::outputs(&search, &ranked);
    std::fs::create_dir_all(staged.path("recommendations")).map_err(|e| Failure::run(format!("cannot create: {e}")))?;
    for (name, bytes) in &files {
        let p = staged.path(name);
        std::fs::write(&p, bytes).map_err(|e| Failure::run(format!("{}: write failed: {e}", p.display())))?;
    }
    staged.commit()?;
    match a.format {
        crate::predict::Format::Json => {
            println!("{}", String::from_utf8_lossy(&files[0].1));
        }
        crate::predict::Format::Table => {
            let o = &search.optimization;
            println!(
                "{n} candidates ({} algorithm) evaluated in {:.1} s; target {}",
                search.optimizer.algorithm,
                started.elapsed().as_secs_f64(),
                o.target
            );
            let view = if o.target == "pareto" { &ranked.pareto } else { &ranked.top_n };
            for (rank, &i) in view.iter().take(10).enumerate() {
                let t = &ranked.trials[i];
                println!(
                    "{:>3}. candidate-{:06}  score {:>12.4}  gpus {:>3}  {}",
                    rank + 1,
                    i + 1,
                    ranked.scores[i],
                    t.used_gpus,
                    serde_json::to_string(&knobs(&t.tree)).unwrap_or_default()
                );
            }
            println!("Saved recommendation to: {}", a.output_dir.join("recommendation.json").display());
        }
    }
    Ok(())
}

fn knobs(tree: &serde_json::Value) -> serde_json::Value {
    tree.pointer("/engine/workers").cloned().unwrap_or_default()
}

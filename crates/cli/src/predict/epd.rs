//! `predict -c` of images through an analytical encoder pool (`servesim_deploy::epd`): the
//! language side replayed as text at its visual-token prompts, the pool laid over its means,
//! written as the reference writes this mode (`{metadata, summary}`, its own table). The
//! replay's per-request, report, ensemble and pacing options have no meaning for an overlay of
//! aggregate means and are refused by name.

use servesim_deploy::epd::{overlay, table, Pool};

use super::args::ConfigFlags;
use super::file::Variation;
use crate::failure::Failure;
use crate::outdir::{run_inputs, OutputDir};
use crate::output::write_file;
use crate::progress::Bar;

pub(super) fn predict(
    f: &ConfigFlags,
    flags: &crate::flags::reports::ReportFlags,
    json: bool,
    variation: &Variation,
    tree: &serde_json::Value,
    calibrated: bool,
) -> Result<(), Failure> {
    let path = f.config.as_deref().expect("called with -c");
    super::file::refuse_replay_flags(
        f,
        flags,
        variation,
        calibrated,
        "engine.workers.encoder (the analytical encoder pool is an overlay on the language replay's aggregate means)",
    )?;
    let at = |e: servesim_deploy::DeployError| Failure::input(format!("{}: {e}", path.display()));
    let config = servesim_deploy::schema::read_predict(tree).map_err(at)?;
    let pool = Pool::resolve(&config).map_err(at)?.expect("an encoder pool with images (checked when read)");
    let base = path.parent().unwrap_or(std::path::Path::new("."));
    let mut prepared = servesim_deploy::prepare(pool.language(&config), base).map_err(at)?;
    prepared.sim.threads = variation.threads;
    let mut bar = Bar::new();
    let result = prepared.run().go(&mut bar);
    bar.finish();
    let ran = result.map_err(Failure::run)?;
    if let Some(e) = prepared.workload.take_error() {
        return Err(Failure::run(e.to_string()));
    }
    let document = overlay(&prepared, &pool, &ran.report).map_err(at)?;
    let inputs = run_inputs(path, tree);
    let staged = OutputDir::open(&f.output_dir, f.overwrite, &inputs)?;
    let compact = serde_json::to_string(&document).expect("prediction serialises");
    write_file(&staged.path("prediction.json"), compact.as_bytes())?;
    staged.commit()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&document).expect("prediction serialises"));
    } else {
        print!("{}", table(&document));
        println!("Saved full report to: {}", f.output_dir.join("prediction.json").display());
    }
    Ok(())
}

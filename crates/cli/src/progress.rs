//! A progress bar on stderr for runs that last more than a second, shown only on a terminal.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use servesim_replay::Progress;

pub struct Bar {
    enabled: bool,
    started: Instant,
    bar: Option<ProgressBar>,
}

impl Bar {
    pub fn new() -> Self {
        Bar { enabled: std::io::stderr().is_terminal(), started: Instant::now(), bar: None }
    }

    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Progress for Bar {
    fn update(&mut self, finished: u64, total: u64) {
        if !self.enabled {
            return;
        }
        if self.bar.is_none() {
            if self.started.elapsed() < Duration::from_secs(1) {
                return;
            }
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template("{spinner} simulating [{bar:40}] {pos}/{len} requests ({eta} left)")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(finished);
        }
    }
}

/// The recommend search's bar: trials done of the total and the best score so far, on stderr
/// and only on a terminal.
pub struct SearchBar {
    bar: Option<ProgressBar>,
}

impl SearchBar {
    pub fn new(total: u64) -> Self {
        SearchBar::with_template(total, "{spinner} searching [{bar:30}] {pos}/{len} trials ({eta} left) {msg}")
    }

    /// The bar of the candidate pages replayed after a search.
    pub fn pages(total: u64) -> Self {
        SearchBar::with_template(total, "{spinner} candidate pages [{bar:30}] {pos}/{len} replayed ({eta} left)")
    }

    fn with_template(total: u64, template: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
            bar
        });
        SearchBar { bar }
    }

    pub fn update(&self, done: usize, best: Option<f64>) {
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
            if let Some(b) = best {
                bar.set_message(format!("best score {b:.4}"));
            }
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

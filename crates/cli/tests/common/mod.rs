//! What the `recommend -c` golden suites (recommend_afd.rs, recommend_epd.rs) share: running
//! servesim on a tests/deploy configuration and comparing numbers.
#![allow(dead_code)] // each suite uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/deploy")
}

/// `servesim recommend -c tests/deploy/<name>.yaml` with `--set` overrides, into a fresh output
/// directory of this test process named `tag`; the output and that directory.
pub fn recommend(name: &str, tag: &str, sets: &[&str]) -> (Output, PathBuf) {
    let config = deploy_dir().join(format!("{name}.yaml"));
    let root = std::env::temp_dir().join(format!("servesim-recommend-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let dir = root.join(tag);
    let mut args = vec![
        "recommend",
        "-c",
        config.to_str().unwrap(),
        "--output-dir",
        dir.to_str().unwrap(),
        "--overwrite",
        "--no-cache",
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    (Command::new(env!("CARGO_BIN_EXE_servesim")).args(&args).output().expect("run servesim"), dir)
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The AIS data package prices every candidate; without it nothing runs.
pub fn data_missing(out: &Output) -> bool {
    stderr(out).contains("no AIS performance data found")
}

/// |x − y| / |y|, or |x| against a reference of 0.
pub fn deviation(x: f64, y: f64) -> f64 {
    if y == 0.0 {
        x.abs()
    } else {
        ((x - y) / y).abs()
    }
}

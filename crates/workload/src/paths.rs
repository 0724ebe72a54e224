//! Where a path lives, for the front ends' checks that a report or an output directory never
//! lands on an input of the run: two spellings of one place (relative, `..`, symbolic links,
//! hard links) compare equal, whether the file exists yet or not.

use std::path::{Path, PathBuf};

/// `path` made canonical: all of it when it exists, else its directory, with the file name
/// joined back on.
pub fn resolved(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    path.file_name().map_or(dir.clone(), |n| dir.join(n))
}

/// Whether `a` and `b` are one file or directory: the same resolved path, or (hard links) the
/// same device and inode.
pub fn same_file(a: &Path, b: &Path) -> bool {
    if resolved(a) == resolved(b) {
        return true;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
    }
    false
}

/// Whether `path` (existing or not) lies inside `dir`, an existing directory, or is `dir`.
pub fn inside_dir(path: &Path, dir: &Path) -> bool {
    dir.is_dir() && resolved(path).starts_with(resolved(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_links_and_hard_links_of_one_place_are_one_place() {
        let d = std::env::temp_dir().join(format!("servesim-paths-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        let f = d.join("sub/trace.jsonl");
        std::fs::write(&f, "x").unwrap();
        assert!(same_file(&f, &d.join("sub/../sub/trace.jsonl")));
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&f, d.join("link")).unwrap();
            assert!(same_file(&f, &d.join("link")));
        }
        std::fs::hard_link(&f, d.join("hard")).unwrap();
        assert!(same_file(&f, &d.join("hard")));
        assert!(!same_file(&f, &d.join("sub/other.jsonl")));
        assert!(same_file(&d.join("sub/new.html"), &d.join("sub/../sub/new.html")), "files not written yet");
        assert!(inside_dir(&d.join("sub/new.html"), &d) && inside_dir(&f, &d.join("sub")));
        assert!(!inside_dir(&d.join("hard"), &d.join("sub")) && !inside_dir(&f, &f), "a file is not a directory");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

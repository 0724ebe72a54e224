//! The registry of temporary paths a signal handler deletes (alone in this test binary, as
//! `remove_all` takes every registered path of the process).

use servesim_workload::scratch::{register, registered, remove_all, unregister};

#[test]
fn remove_all_deletes_registered_files_and_directories_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(".report.json.X.tmp");
    let sub = dir.path().join(".out.partial-1");
    let kept = dir.path().join("report.json");
    std::fs::write(&file, "x").unwrap();
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("requests.jsonl"), "y").unwrap();
    std::fs::write(&kept, "z").unwrap();
    register(&file);
    register(&sub);
    register(&kept);
    unregister(&kept);
    assert_eq!(registered(), vec![file.clone(), sub.clone()]);
    remove_all();
    assert!(!file.exists());
    assert!(!sub.exists());
    assert!(kept.exists());
    assert!(registered().is_empty());
}

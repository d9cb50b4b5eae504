//! Runs last of the test binaries (cargo runs them by name): one line saying how many tests
//! of this `cargo test` were skipped, and which variable each group waits for; and the state
//! directories of test processes that have ended are removed.

mod common;

use std::collections::BTreeMap;
use std::io::Write;

/// State directories (`leafd-test-state-<pid>`) of test processes no longer running: servers a
/// test dropped without stopping may have written into theirs after the drop removed it.
#[test]
fn state_directories_of_ended_test_processes_are_removed() {
    for base in [env!("CARGO_TARGET_TMPDIR"), "/dev/shm"] {
        let Ok(entries) = std::fs::read_dir(base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let Some(pid) = name.strip_prefix("leafd-test-state-") else {
                continue;
            };
            if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

#[test]
fn summary_of_skipped_tests() {
    let log = common::backends::skip_log();
    let Ok(text) = std::fs::read_to_string(&log) else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED 0 tests: every service variable is set"
        );
        return;
    };
    let _ = std::fs::remove_file(&log);
    let mut by_var: BTreeMap<&str, usize> = BTreeMap::new();
    for line in text.lines() {
        if let Some((var, _test)) = line.split_once('\t') {
            *by_var.entry(var).or_default() += 1;
        }
    }
    let total: usize = by_var.values().sum();
    let why: Vec<String> = by_var
        .iter()
        .map(|(var, n)| format!("{n} need {var}"))
        .collect();
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {total} tests in all ({}); the README's Tests section says how to run them",
        why.join(", ")
    );
}

//! Processes seen through /proc, for the tests that watch trial processes:
//! the children of a process and whether a process still runs.

// Each test crate compiles this module and uses only some of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// The fields of `/proc/<pid>/stat` after the command name: state first,
/// then the parent's pid. `None` once the process is gone.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces.
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Whether `pid` runs: it exists and is not a zombie (a zombie holds no
/// CPU, memory or device; only its exit status waits to be read).
pub fn alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s != "Z" && s != "X"))
}

/// The live processes whose parent is `parent`, with their command lines.
pub fn children(parent: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            stat_fields(pid).is_some_and(|f| f.get(1).is_some_and(|p| *p == parent.to_string()))
        })
        .filter(|&pid| alive(pid))
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            (pid, String::from_utf8_lossy(&cmdline).replace('\0', " "))
        })
        .collect()
}

/// The trial process of `parent` (a child whose command line holds the
/// trial flag) that has run for at least `settled`, polled until `limit`:
/// a trial process that lives that long is the slow trial, not one of the
/// quick ones before it.
pub fn settled_trial_process(parent: u32, settled: Duration, limit: Duration) -> Option<u32> {
    let started = Instant::now();
    let mut seen: Option<(u32, Instant)> = None;
    while started.elapsed() < limit {
        let now = children(parent)
            .into_iter()
            .find(|(_, cmd)| cmd.contains(falsify_core::run::CHILD_FLAG))
            .map(|(pid, _)| pid);
        seen = match (seen, now) {
            (Some((old, since)), Some(pid)) if old == pid => {
                if since.elapsed() >= settled {
                    return Some(pid);
                }
                Some((old, since))
            }
            (_, Some(pid)) => Some((pid, Instant::now())),
            (_, None) => None,
        };
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Waits until `pid` no longer runs; false if it still does after `limit`.
pub fn gone_within(pid: u32, limit: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    !alive(pid)
}

/// Kills `pid` (cleanup after a failed assertion: a trial left running
/// would hold a CPU for the rest of the test run).
pub fn kill(pid: u32) {
    // The pid is a process this test found running; an error (it is gone)
    // needs no handling.
    let _ = std::process::Command::new("kill")
        .arg("-KILL")
        .arg(pid.to_string())
        .status();
}

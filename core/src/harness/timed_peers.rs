//! The trials of the same cargo-nextest run that time a GPU, seen from
//! outside: the processes whose environment, as `/proc/<pid>/environ`
//! shows it, names this run (`NEXTEST_RUN_ID`) and the `gpu` test group.
//!
//! A trial of the `gpu-ranks` group starts a rank on every GPU of the host,
//! so it must not run beside one that times a GPU. In a whole-suite run the
//! test groups' priorities already keep them apart (a whole-host trial
//! between them waits for every running test to end); in a filtered or
//! partitioned run that holds no whole-host trial nothing does, so the
//! `gpu-ranks` trial waits here until no timed trial of its run is left.
//! The ranks trials come last, so no timed trial starts after one of them
//! has: the wait ends. The rank processes of a timed data-parallel trial
//! inherit its environment and are waited for too.

use std::path::Path;
use std::time::{Duration, Instant};

/// How often the process table is read again while timed trials run.
const POLL: Duration = Duration::from_millis(50);

/// Whether an environment block (`NAME=value` entries separated by NUL, as
/// `/proc/<pid>/environ` holds it) is that of a test of run `run_id` in
/// test group `group`.
pub(crate) fn is_in_group(environ: &[u8], run_id: &str, group: &str) -> bool {
    let mut same_run = false;
    let mut same_group = false;
    for entry in environ.split(|&b| b == 0) {
        same_run |= entry_is(entry, "NEXTEST_RUN_ID", run_id);
        same_group |= entry_is(entry, "NEXTEST_TEST_GROUP", group);
    }
    same_run && same_group
}

fn entry_is(entry: &[u8], name: &str, value: &str) -> bool {
    entry
        .strip_prefix(name.as_bytes())
        .and_then(|rest| rest.strip_prefix(b"="))
        .is_some_and(|v| v == value.as_bytes())
}

/// The processes under `proc_root` (`/proc`) other than this one that are
/// tests of run `run_id` in test group `group`. Processes whose
/// environment cannot be read (another user's, or gone) are not counted.
pub(crate) fn processes_in_group(proc_root: &Path, run_id: &str, group: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(proc_root.join(pid.to_string()).join("environ"))
                .is_ok_and(|env| is_in_group(&env, run_id, group))
        })
        .collect()
}

/// Waits until no process of run `run_id` in test group `group` is left
/// (read from `/proc`; where there is none, as off Linux, it cannot see
/// them and returns at once). Returns how long it waited and how many
/// such processes it saw first.
pub(crate) fn wait_for_group_to_end(run_id: &str, group: &str) -> (Duration, usize) {
    let started = Instant::now();
    let proc_root = Path::new("/proc");
    let first = processes_in_group(proc_root, run_id, group).len();
    if first > 0 {
        while !processes_in_group(proc_root, run_id, group).is_empty() {
            std::thread::sleep(POLL);
        }
    }
    (started.elapsed(), first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_is_in_a_group_only_with_both_the_run_and_the_group() {
        let env = b"PATH=/bin\0NEXTEST_RUN_ID=r1\0NEXTEST_TEST_GROUP=gpu\0";
        assert!(is_in_group(env, "r1", "gpu"));
        assert!(!is_in_group(env, "r2", "gpu"));
        assert!(!is_in_group(env, "r1", "gpu-ranks"));
        let other = b"NEXTEST_RUN_ID=r1\0NEXTEST_TEST_GROUP=gpu-shared\0";
        assert!(!is_in_group(other, "r1", "gpu"));
        assert!(!is_in_group(b"NEXTEST_RUN_ID=r1", "r1", "gpu"));
        assert!(!is_in_group(
            b"XNEXTEST_TEST_GROUP=gpu\0NEXTEST_RUN_ID=r1",
            "r1",
            "gpu"
        ));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_wait_lasts_while_a_process_of_the_run_and_group_lives() {
        let run_id = format!("timed-peers-test-{}", std::process::id());
        let mut child = std::process::Command::new("sleep")
            .arg("0.6")
            .env("NEXTEST_RUN_ID", &run_id)
            .env("NEXTEST_TEST_GROUP", "gpu")
            .spawn()
            .expect("sleep starts");
        // Another run's and another group's processes are not waited for.
        assert_eq!(wait_for_group_to_end("another-run", "gpu").1, 0);
        assert_eq!(wait_for_group_to_end(&run_id, "gpu-shared").1, 0);
        let waiter = std::thread::spawn({
            let run_id = run_id.clone();
            move || wait_for_group_to_end(&run_id, "gpu")
        });
        // The child is reaped here, so its /proc entry goes once it exits.
        child.wait().expect("sleep ends");
        let (waited, seen) = waiter.join().expect("the waiter returns");
        assert_eq!(seen, 1);
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
    }
}

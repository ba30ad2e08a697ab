//! What the engine does for the core's driver-observed kinds, and only for
//! them (so no other trial pays for it): decide before the trial whether
//! CUPTI can be attached here, attach the driver observer in the trial's
//! process, and start that process with the workload's environment and a
//! scratch folder of its own.

use std::sync::OnceLock;

use falsify_observer::{CuptiLibrary, DriverObserver};

use crate::core_kinds::Check;
use crate::subject::{KindSet, Subject};
use crate::{Error, Result};

/// The driver observer as the engine provides it: probed once, attached
/// once per process, each only when a trial needs it.
#[derive(Debug, Default)]
pub(super) struct DriverAccess {
    /// Whether CUPTI loads here (`Err`: the observer's reason).
    cupti: OnceLock<std::result::Result<(), String>>,
    /// The observer of this process, or why it could not attach.
    observer: OnceLock<std::result::Result<DriverObserver, String>>,
}

impl DriverAccess {
    /// Why a trial of `check` cannot be judged here: it observes the driver
    /// and CUPTI cannot be loaded (the observer's reason). `None` for every
    /// other check, which never probes.
    pub(super) fn unjudged<K: KindSet>(&self, check: &Check<K>) -> Option<String> {
        if !observes_driver(check) {
            return None;
        }
        let probed = self
            .cupti
            .get_or_init(|| CuptiLibrary::probe().map(drop).map_err(|e| e.to_string()));
        probed.as_ref().err().cloned()
    }

    /// The observer for a trial of `check` in this process: `Ok(None)` for
    /// a check that does not observe the driver.
    pub(super) fn for_check<K: KindSet>(
        &self,
        check: &Check<K>,
    ) -> Result<Option<&DriverObserver>> {
        if !observes_driver(check) {
            return Ok(None);
        }
        let attached = self
            .observer
            .get_or_init(|| DriverObserver::attach().map_err(|e| e.to_string()));
        match attached {
            Ok(observer) => Ok(Some(observer)),
            Err(why) => Err(Error::Unjudgeable(format!(
                "the driver observer could not attach: {why}"
            ))),
        }
    }
}

/// Whether `check` is one of the core's kinds that observe the driver.
pub(super) fn observes_driver<K: KindSet>(check: &Check<K>) -> bool {
    matches!(check, Check::Core(kind) if kind.observes_driver())
}

/// Variables a trial process starts with, as `(name, value)`.
pub(super) type ProcessEnv = Vec<(String, String)>;

/// The environment a trial process of `check` starts with, and the scratch
/// folder made for it (removed when the guard drops, after the process):
/// the workload's [`process_env`](crate::subject::Workload::process_env)
/// for the check's training. Nothing, and no folder, for a check that
/// trains nothing or a subject without a workload.
pub(super) fn process_env<S: Subject>(
    check: &Check<S::Kinds>,
    seed: u64,
) -> Result<(ProcessEnv, Option<tempfile::TempDir>)> {
    let (Check::Core(kind), Some(workload)) = (check, S::workload()) else {
        return Ok((Vec::new(), None));
    };
    let Some(setup) = kind.train_setup(seed) else {
        return Ok((Vec::new(), None));
    };
    let scratch = tempfile::Builder::new()
        .prefix("falsify-trial-")
        .tempdir()
        .map_err(|e| Error::io(std::env::temp_dir(), e))?;
    let env = workload.process_env(&setup, scratch.path());
    Ok((env, Some(scratch)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{contract, Toy};

    fn checks() -> Vec<Check<crate::testing::ToyKinds>> {
        let tests = "  - id: T-1\n    rule: r\n    prediction: p\n    if_fails: f\n    mutant: driver_older_target_module\n    check: {kind: driver_target_parity, model: toy-model, steps: 2}\n  - id: T-2\n    rule: r\n    prediction: p\n    if_fails: f\n    mutant: inflated\n    check: {kind: compare, value: 1, at_most: 2}\n";
        let c = contract("obs", true, tests);
        c.falsification_tests.into_iter().map(|t| t.check).collect()
    }

    /// Only a driver-observed check probes CUPTI; where it is absent (as on
    /// a machine without a CUDA toolkit) the reason is the observer's.
    #[test]
    fn only_driver_checks_need_the_observer() {
        let checks = checks();
        let access = DriverAccess::default();
        assert_eq!(access.unjudged(&checks[1]), None);
        assert!(access.for_check(&checks[1]).unwrap().is_none());
        assert!(access.cupti.get().is_none(), "a subject kind never probes");
        assert!(observes_driver(&checks[0]) && !observes_driver(&checks[1]));
        if let Some(why) = access.unjudged(&checks[0]) {
            assert!(why.contains("CUPTI"), "{why}");
            assert!(access.for_check(&checks[0]).is_err());
        }
    }

    /// The toy's workload names no environment; the scratch folder exists
    /// while the guard lives and is gone after it.
    #[test]
    fn a_training_check_gets_a_scratch_folder_that_is_removed_after() {
        let checks = checks();
        let (env, scratch) = process_env::<Toy>(&checks[0], 7).unwrap();
        assert!(env.is_empty());
        let scratch = scratch.expect("a training check gets a folder");
        let path = scratch.path().to_path_buf();
        assert!(path.is_dir() && std::fs::read_dir(&path).unwrap().next().is_none());
        drop(scratch);
        assert!(!path.exists());
        let (env, scratch) = process_env::<Toy>(&checks[1], 7).unwrap();
        assert!(env.is_empty() && scratch.is_none());
    }
}

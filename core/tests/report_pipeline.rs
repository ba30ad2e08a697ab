//! The report pipeline as a whole, as a property: for any sequence of
//! complete, interrupted, filtered, per-process, merged and damaged runs into
//! one folder (of two contract trees, one of them the baseline's),
//!
//! - (a) no row of a finished trial is lost without a message: a write keeps
//!   every row that was there, or replaces it with the new run's row of the
//!   same trial; a merge that cannot read what is there refuses; `report`
//!   changes no CSV and accounts for every row it read, judged or set aside;
//! - (b) the verdict is never `clean` unless every baseline trial has a row
//!   of the current run(s) that passed (or was skipped for a recorded
//!   reason), the current run(s) finished every trial selected, and none was
//!   interrupted. The verdict is in fact exactly the one the simulator
//!   predicts from what it ran, and damaged evidence is refused (exit 2).
//!
//! Runs are written through the report API the run engine uses
//! (`ReportDir::record_run`, `merge_runs`); what depends on the write side's
//! behaviour is in the module `sim`.

use proptest::prelude::*;

use falsify_core::report::compare::{RunData, Verdict};
use falsify_core::report::evidence::Side;
use falsify_core::report::markdown::write_report;
use falsify_core::report::FalsificationRow;

mod sim {
    use std::collections::{BTreeMap, BTreeSet, HashSet};
    use std::path::{Path, PathBuf};

    use falsify_core::report::merge::merge_runs;
    use falsify_core::report::meta::RunMeta;
    use falsify_core::report::{read_rows, FalsificationRow, ReportDir, Status};

    /// Whether the write side keeps the rows of an unreadable report (renamed
    /// beside it) and of another contract tree. This branch's write side
    /// replaces the one and drops the other silently, so sequences that
    /// write into a damaged folder, or write one tree's run with only that
    /// tree's trials known, are not generated. The write side that keeps
    /// them sets this to `true`, and the property covers those too.
    pub const WRITES_KEEP_EVERY_ROW: bool = true;

    /// The contract trees; the baseline is the first one's.
    pub const TREES: [&str; 2] = ["tree-a", "tree-b"];
    /// Trials per tree.
    pub const TRIALS: usize = 4;

    pub fn key(tree: usize, trial: usize) -> String {
        format!("{}::T{trial}", TREES[tree])
    }

    /// How a trial ends.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub enum Outcome {
        Passed,
        Falsified,
        Error,
        SkippedForReason,
        SkippedNoReason,
    }

    /// One run of one tree: which trials it selects (and how each ends),
    /// how many of them finish before it is stopped (`None`: it is not), and
    /// whether each trial records in a process of its own (cargo-nextest).
    #[derive(Debug, Clone)]
    pub struct RunPlan {
        pub tree: usize,
        pub trials: Vec<Option<Outcome>>,
        pub stop_after: Option<usize>,
        pub per_process: bool,
    }

    impl RunPlan {
        fn selected(&self) -> Vec<(String, Outcome)> {
            self.trials
                .iter()
                .enumerate()
                .filter_map(|(i, o)| Some((key(self.tree, i), (*o)?)))
                .collect()
        }
    }

    /// What happens to the folder.
    #[derive(Debug, Clone)]
    pub enum Op {
        Run(RunPlan),
        /// The plan's trials split over shards (`shard_of`), each run in a
        /// folder of its own, then joined by `report --merge` into the folder.
        Merge(RunPlan, Vec<usize>),
        Damage(Damage),
    }

    /// Ways a report file is damaged by hand.
    #[derive(Debug, Clone, Copy)]
    pub enum Damage {
        Empty,
        HeaderOnly,
        TornLastLine,
        BadCell,
        DuplicateTrial,
    }

    /// What the current run(s) did, as the simulator knows it.
    #[derive(Debug, Clone, Default)]
    pub struct Truth {
        pub runs: Vec<String>,
        pub selected: BTreeSet<String>,
        /// Finished trials and how they ended.
        pub finished: BTreeMap<String, Outcome>,
        pub interrupted: bool,
    }

    /// The verdict `report` should reach, or `None` for a refusal.
    pub type Expected = Option<Verdict>;
    use falsify_core::report::compare::Verdict;

    /// What an operation did to the folder's report.
    pub struct Applied {
        /// The runs whose rows it wrote (empty: it wrote nothing).
        pub wrote: Vec<String>,
        /// The rows there before it wrote, as a write reads them; `None`
        /// when they do not read.
        pub before: Option<Vec<FalsificationRow>>,
        /// The damaged report a write met (only where the write side keeps it).
        pub met_damage: Option<Vec<u8>>,
    }

    pub struct Folder {
        pub root: PathBuf,
        pub dir: PathBuf,
        pub baseline: PathBuf,
        pub truth: Option<Truth>,
        /// The file as it was before it was damaged, if it existed.
        before_damage: Option<Option<Vec<u8>>>,
        /// The damaged file, when it still holds rows (damage to a header
        /// or an empty file loses nothing and refuses nothing but `report`).
        damaged_rows: Option<Vec<u8>>,
        runs: usize,
    }

    fn row(run_id: &str, key: &str, outcome: Outcome) -> FalsificationRow {
        let (contract, test_id) = key.split_once("::").unwrap_or_default();
        let (status, detail) = match outcome {
            Outcome::Passed => (Status::Passed, "seed 1"),
            Outcome::Falsified => (Status::Falsified, "seed 1; too far"),
            Outcome::Error => (Status::Error, "the op refused its input"),
            Outcome::SkippedForReason => (Status::Skipped, "no target for this machine"),
            Outcome::SkippedNoReason => (Status::Skipped, ""),
        };
        FalsificationRow {
            run_id: run_id.into(),
            timestamp: "2026-01-01T00:00:00Z".into(),
            git_sha: "0123456789ab".into(),
            contract: contract.into(),
            contract_version: "1.0.0".into(),
            contract_hash: format!("{contract}-hash"),
            test_id: test_id.into(),
            check_kind: "property".into(),
            backend: "cpu".into(),
            device: "cpu".into(),
            compute_capability: String::new(),
            driver_version: String::new(),
            status,
            metric: "m".into(),
            observed: Some(1.0),
            comparator: "<=".into(),
            threshold: Some(2.0),
            unit: String::new(),
            duration_ms: 1.0,
            setup_ms: Some(0.5),
            detail: detail.into(),
            known_violation: String::new(),
        }
    }

    /// The trial names a run of `tree` knows (see [`WRITES_KEEP_EVERY_ROW`]).
    fn known(tree: usize) -> HashSet<String> {
        let trees: Vec<usize> = if WRITES_KEEP_EVERY_ROW {
            vec![tree]
        } else {
            (0..TREES.len()).collect()
        };
        trees
            .into_iter()
            .flat_map(|t| (0..TRIALS).map(move |i| key(t, i)))
            .collect()
    }

    fn record(dir: &Path, tree: usize, rows: Vec<FalsificationRow>, meta: RunMeta) {
        ReportDir::new(dir)
            .record_run((rows, &HashSet::new()), Vec::new(), &known(tree), &meta)
            .expect("the run records");
    }

    fn meta(run_id: &str) -> RunMeta {
        let mut meta = RunMeta::detect();
        meta.run_id = run_id.into();
        meta.git_sha = "0123456789ab".into();
        meta
    }

    /// Runs `plan` into `dir` as run `run_id`; returns what it did.
    fn run(dir: &Path, run_id: &str, plan: &RunPlan) -> Truth {
        let selected = plan.selected();
        let finish = plan
            .stop_after
            .unwrap_or(selected.len())
            .min(selected.len());
        // Stopped after its last trial, a run in one process still records
        // the interruption; one process per trial has no process left to.
        let mut truth = Truth {
            runs: vec![run_id.into()],
            interrupted: plan.stop_after.is_some()
                && (!plan.per_process || finish < selected.len()),
            ..Truth::default()
        };
        for (key, outcome) in &selected[..finish] {
            truth.finished.insert(key.clone(), *outcome);
        }
        if !plan.per_process {
            let mut meta = meta(run_id);
            meta.selected = selected.iter().map(|(k, _)| k.clone()).collect();
            if truth.interrupted {
                meta.incomplete = Some("interrupted by SIGINT".into());
            }
            let rows = selected[..finish]
                .iter()
                .map(|(k, o)| row(run_id, k, *o))
                .collect();
            record(dir, plan.tree, rows, meta);
            truth.selected = selected.into_iter().map(|(k, _)| k).collect();
            return truth;
        }
        // One process per trial: each records its own trial; a stopped run's
        // next process records that it was killed, and no later one starts.
        for (i, (key, outcome)) in selected.iter().enumerate() {
            let mut meta = meta(run_id);
            meta.selected = vec![key.clone()];
            truth.selected.insert(key.clone());
            if i < finish {
                record(dir, plan.tree, vec![row(run_id, key, *outcome)], meta);
            } else {
                meta.incomplete = Some("killed".into());
                record(dir, plan.tree, Vec::new(), meta);
                break;
            }
        }
        truth
    }

    impl Folder {
        /// A folder to write runs into, beside a baseline: a complete run of
        /// the first tree, every trial passed.
        pub fn new(root: &Path) -> Folder {
            let baseline = root.join("baseline");
            let all = RunPlan {
                tree: 0,
                trials: vec![Some(Outcome::Passed); TRIALS],
                stop_after: None,
                per_process: false,
            };
            run(&baseline, "baseline-run", &all);
            Folder {
                root: root.to_path_buf(),
                dir: root.join("latest"),
                baseline,
                truth: None,
                before_damage: None,
                damaged_rows: None,
                runs: 0,
            }
        }

        pub fn csv(&self) -> PathBuf {
            self.dir.join("falsification.csv")
        }

        fn next_run_id(&mut self) -> String {
            self.runs += 1;
            format!("run-{}", self.runs)
        }

        /// The rows of the report, or `None` when it does not read.
        pub fn rows(&self) -> Option<Vec<FalsificationRow>> {
            read_rows(&self.csv()).ok()
        }

        /// Applies `op` (see [`Applied`]).
        pub fn apply(&mut self, op: &Op) -> Applied {
            match op {
                Op::Run(plan) => {
                    if !WRITES_KEEP_EVERY_ROW {
                        self.repair();
                    }
                    let before = self.rows();
                    let met_damage = self.damaged_rows.take();
                    self.before_damage = None;
                    let id = self.next_run_id();
                    self.truth = Some(run(&self.dir, &id, plan));
                    Applied {
                        wrote: vec![id],
                        before,
                        met_damage,
                    }
                }
                Op::Merge(plan, shard_of) => {
                    let before = self.rows();
                    Applied {
                        wrote: self.merge(plan, shard_of),
                        before,
                        met_damage: None,
                    }
                }
                Op::Damage(damage) => {
                    self.damage(*damage);
                    Applied {
                        wrote: Vec::new(),
                        before: None,
                        met_damage: None,
                    }
                }
            }
        }

        fn merge(&mut self, plan: &RunPlan, shard_of: &[usize]) -> Vec<String> {
            let mut dirs = Vec::new();
            let mut truth = Truth::default();
            let mut empty_shard = false;
            for shard in 0..2 {
                let trials: Vec<Option<Outcome>> = plan
                    .trials
                    .iter()
                    .zip(shard_of)
                    .map(|(o, s)| o.filter(|_| *s == shard))
                    .collect();
                if trials.iter().all(Option::is_none) {
                    continue;
                }
                let id = self.next_run_id();
                let dir = self.root.join(format!("shard-{id}"));
                // The second shard is the one that may be stopped.
                let shard_plan = RunPlan {
                    trials,
                    stop_after: plan.stop_after.filter(|_| shard == 1),
                    ..plan.clone()
                };
                let done = run(&dir, &id, &shard_plan);
                empty_shard |= done.finished.is_empty();
                truth.runs.push(id);
                truth.selected.extend(done.selected);
                truth.finished.extend(done.finished);
                truth.interrupted |= done.interrupted;
                dirs.push(dir);
            }
            let before = std::fs::read(self.csv()).ok();
            let merged = merge_runs(&dirs, &self.dir);
            // A shard without rows is no evidence, and damaged rows here are
            // never replaced: both refuse, writing nothing.
            if empty_shard || self.damaged_rows.is_some() {
                assert!(merged.is_err(), "the merge should refuse: {merged:?}");
                assert_eq!(
                    std::fs::read(self.csv()).ok(),
                    before,
                    "merge wrote on refusal"
                );
                return Vec::new();
            }
            merged.expect("the merge succeeds");
            self.before_damage = None;
            self.truth = Some(truth.clone());
            truth.runs
        }

        /// Puts the report back as it was before it was damaged.
        fn repair(&mut self) {
            self.damaged_rows = None;
            if let Some(before) = self.before_damage.take() {
                match before {
                    Some(bytes) => std::fs::write(self.csv(), bytes).expect("repair"),
                    None => std::fs::remove_file(self.csv()).expect("repair"),
                }
            }
        }

        fn damage(&mut self, damage: Damage) {
            let before = std::fs::read(self.csv()).ok();
            let text = String::from_utf8(before.clone().unwrap_or_default()).expect("utf-8");
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            let header = "run_id,timestamp,git_sha,contract,contract_version,contract_hash,test_id,check_kind,backend,device,compute_capability,driver_version,status,metric,observed,comparator,threshold,unit,duration_ms,setup_ms,detail";
            if lines.is_empty() {
                lines.push(header.into());
            }
            let damaged = match damage {
                Damage::Empty => String::new(),
                Damage::HeaderOnly => format!("{}\n", lines[0]),
                _ if lines.len() < 2 => String::new(),
                Damage::TornLastLine => {
                    let last = lines.pop().unwrap_or_default();
                    let cut = last.rsplitn(3, ',').last().unwrap_or_default().to_string();
                    lines.push(cut);
                    lines.join("\n")
                }
                Damage::BadCell => {
                    lines[1] = lines[1]
                        .replacen(",passed,", ",Passed,", 1)
                        .replacen(",falsified,", ",Falsified,", 1)
                        .replacen(",skipped,", ",Skipped,", 1)
                        .replacen(",error,", ",Error,", 1);
                    lines.join("\n") + "\n"
                }
                Damage::DuplicateTrial => {
                    let copy = lines[1].replacen(",passed,", ",falsified,", 1);
                    lines.push(copy);
                    lines.join("\n") + "\n"
                }
            };
            std::fs::create_dir_all(&self.dir).expect("mkdir");
            std::fs::write(self.csv(), damaged.as_bytes()).expect("damage");
            self.before_damage.get_or_insert(before);
            self.damaged_rows = (damaged.lines().count() > 1).then(|| damaged.into_bytes());
        }

        /// Whether the report was damaged since the last write.
        pub fn damaged(&self) -> bool {
            self.before_damage.is_some()
        }

        /// The verdict `report` must reach, from what was run; `None` where
        /// it must refuse (damaged, or no rows at all).
        pub fn expected(&self) -> Expected {
            if self.damaged() || self.rows().is_none_or(|r| r.is_empty()) {
                return None;
            }
            let truth = self.truth.as_ref()?;
            let baseline: Vec<String> = (0..TRIALS).map(|i| key(0, i)).collect();
            // A falsified trial regresses whether the baseline has it or
            // not (none here is a known violation); an error only where the
            // baseline passed.
            let regressed = truth.finished.values().any(|o| *o == Outcome::Falsified)
                || baseline
                    .iter()
                    .any(|k| truth.finished.get(k) == Some(&Outcome::Error));
            let gap = truth.interrupted
                || truth
                    .selected
                    .iter()
                    .any(|k| !truth.finished.contains_key(k))
                || baseline.iter().any(|k| {
                    !matches!(
                        truth.finished.get(k),
                        Some(Outcome::Passed | Outcome::SkippedForReason)
                    )
                });
            Some(if regressed {
                Verdict::Regressed
            } else if gap {
                Verdict::Incomplete
            } else {
                Verdict::Clean
            })
        }
    }
}

use sim::{Damage, Folder, Op, Outcome, RunPlan, TREES, TRIALS};

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        5 => Just(Outcome::Passed),
        1 => Just(Outcome::Falsified),
        1 => Just(Outcome::Error),
        1 => Just(Outcome::SkippedForReason),
        1 => Just(Outcome::SkippedNoReason),
    ]
}

fn plan() -> impl Strategy<Value = RunPlan> {
    (
        0..TREES.len(),
        proptest::collection::vec(proptest::option::weighted(0.8, outcome()), TRIALS),
        proptest::option::weighted(0.3, 0..=TRIALS),
        proptest::bool::weighted(0.3),
    )
        .prop_filter("a run selects a trial", |(_, trials, _, _)| {
            trials.iter().any(Option::is_some)
        })
        .prop_map(|(tree, trials, stop_after, per_process)| RunPlan {
            tree,
            trials,
            stop_after,
            per_process,
        })
}

fn op() -> impl Strategy<Value = Op> {
    let damage = prop_oneof![
        Just(Damage::Empty),
        Just(Damage::HeaderOnly),
        Just(Damage::TornLastLine),
        Just(Damage::BadCell),
        Just(Damage::DuplicateTrial),
    ];
    prop_oneof![
        6 => plan().prop_map(Op::Run),
        2 => (plan(), proptest::collection::vec(0..2usize, TRIALS))
            .prop_map(|(plan, shards)| Op::Merge(plan, shards)),
        2 => damage.prop_map(Op::Damage),
    ]
}

/// (a) for a write: every row there before is still there, or replaced by
/// a row of the same trial from a run the write made; a damaged report the
/// write met is kept beside it.
fn assert_nothing_lost(folder: &Folder, before: &Option<Vec<FalsificationRow>>, wrote: &[String]) {
    let after = folder.rows().expect("a write leaves a report that reads");
    for old in before.iter().flatten() {
        let kept = after.iter().any(|r| r == old);
        let replaced = after.iter().any(|r| {
            r.contract == old.contract && r.test_id == old.test_id && wrote.contains(&r.run_id)
        });
        assert!(kept || replaced, "row lost without a message: {old:?}");
    }
}

/// A damaged report a write met is still there, beside the new one.
fn assert_damage_kept_beside(folder: &Folder, damaged: &[u8]) {
    let kept = std::fs::read_dir(&folder.dir)
        .expect("folder")
        .flatten()
        .filter(|e| e.path() != folder.csv())
        .any(|e| std::fs::read(e.path()).is_ok_and(|b| b == damaged));
    assert!(kept, "the damaged report was replaced without being kept");
}

/// `report` on the folder: the verdict the simulator predicts, (b), and an
/// account of every row read; the CSV is left as it was.
fn assert_judged(folder: &Folder) {
    let csv = std::fs::read(folder.csv()).ok();
    let got = write_report(&folder.baseline, &folder.dir);
    assert_eq!(
        std::fs::read(folder.csv()).ok(),
        csv,
        "report changed the CSV"
    );
    let expected = folder.expected();
    let verdict = got.as_ref().ok().map(|o| o.verdict);
    assert_eq!(verdict, expected, "{:?}", got.as_ref().map(|o| &o.evidence));
    if verdict == Some(Verdict::Clean) {
        let truth = folder.truth.as_ref().expect("a clean verdict judged a run");
        assert!(!truth.interrupted);
        assert!(truth
            .selected
            .iter()
            .all(|k| truth.finished.contains_key(k)));
        for i in 0..TRIALS {
            assert!(
                matches!(
                    truth.finished.get(&sim::key(0, i)),
                    Some(Outcome::Passed | Outcome::SkippedForReason)
                ),
                "clean, but baseline trial {} did not pass in the current run",
                sim::key(0, i)
            );
        }
    }
    if let Ok(data) = RunData::load(&folder.dir, Side::Current) {
        let rows = folder.rows().map_or(0, |r| r.len());
        let account = &data.account;
        let aside: usize = account.set_aside().iter().map(|(_, n)| n).sum();
        assert_eq!((account.read(), account.judged() + aside), (rows, rows));
    }
}

proptest! {
    // Failing cases are printed, shrunk; none is saved into the source tree.
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_row_is_lost_and_no_verdict_is_clean_without_complete_evidence(
        ops in proptest::collection::vec(op(), 1..8)
    ) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut folder = Folder::new(tmp.path());
        for op in &ops {
            let applied = folder.apply(op);
            match &applied.met_damage {
                Some(bytes) => assert_damage_kept_beside(&folder, bytes),
                None if !applied.wrote.is_empty() => {
                    assert_nothing_lost(&folder, &applied.before, &applied.wrote)
                }
                None => {}
            }
            assert_judged(&folder);
        }
    }
}

//! One report from several runs of the same suite: the shards of a
//! `cargo nextest run --partition hash:K/N` on different runners, each with
//! its own `falsification.csv`, `speedups.csv` and `run.json`.
//!
//! Every trial keeps the row of the shard that ran it. A trial that is
//! `skipped` in one shard and ran in another keeps the row that ran (a
//! nextest shard records the trials it cannot judge here, whichever shard
//! they hash to); a trial that ran in two shards means the shards overlap,
//! and is an error naming both.
//!
//! Each shard contributes its evidence only (see [`super::evidence`]): the
//! rows of its own run, never rows an earlier run left in its folder, which
//! are counted and left out. A shard needs its `run.json`, which says which
//! run it is, what it selected and whether it finished. The merged
//! `run.json` names every shard's run (`runs`), so the merged folder is
//! judged on exactly their rows, now or later. Rows already in the target
//! folder of trials no shard ran are kept, as rows of their own runs (not
//! evidence for the merged verdict), so a merge loses nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::artifacts::ARTIFACTS_DIR;
use super::evidence::{self, Account, Side};
use super::meta::{RunMeta, RUN_JSON};
use super::{
    read_rows, read_rows_located, sort_rows, trial_key, write_rows_atomic, FalsificationRow,
    ReportDir, SpeedupRow, Status, FALSIFICATION_CSV,
};
use crate::error::{Error, Result};

/// What a merge wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// Trials in the merged `falsification.csv`.
    pub trials: usize,
    /// Rows in the merged `speedups.csv`.
    pub speedups: usize,
    /// For each shard, what was read from it and merged.
    pub shards: Vec<String>,
    /// Rows the target folder already held, of trials no shard has: kept,
    /// as rows of their own runs.
    pub kept: usize,
}

/// One shard's evidence, as read.
struct Shard {
    dir: PathBuf,
    rows: Vec<FalsificationRow>,
    speedups: Vec<SpeedupRow>,
    meta: RunMeta,
    account: Account,
}

impl Shard {
    fn load(dir: &Path) -> Result<Shard> {
        let csv = dir.join(FALSIFICATION_CSV);
        if !csv.is_file() {
            return Err(merge_error(&csv, "no falsification report here".into()));
        }
        let evidence = evidence::load(dir, Side::Current)?;
        let Some(meta) = evidence.meta else {
            return Err(merge_error(
                &dir.join(RUN_JSON),
                "no run record here: nothing says which run the shard's rows are, what it selected or whether it finished".into(),
            ));
        };
        Ok(Shard {
            dir: dir.to_path_buf(),
            rows: evidence.rows,
            speedups: evidence.speedups,
            meta,
            account: evidence.account,
        })
    }
}

fn merge_error(path: &Path, message: String) -> Error {
    Error::Merge {
        path: path.to_path_buf(),
        message,
    }
}

/// Merges the evidence of the run directories `shards` into `into`, whose
/// rows of trials no shard has are kept. Everything is read and checked
/// before anything is written; each file is written atomically, under
/// `into`'s writer lock.
pub fn merge_runs(shards: &[PathBuf], into: &Path) -> Result<Merged> {
    let loaded: Vec<Shard> = shards
        .iter()
        .map(|d| Shard::load(d))
        .collect::<Result<_>>()?;
    let chosen = choose_rows(&loaded)?;
    let meta = joined_meta(&loaded)?;
    let mut rows: Vec<FalsificationRow> = chosen.values().map(|(_, r)| (*r).clone()).collect();
    let mut speedups: Vec<SpeedupRow> = loaded
        .iter()
        .enumerate()
        .flat_map(|(i, shard)| {
            let chosen = &chosen;
            shard.speedups.iter().filter(move |s| {
                chosen
                    .get(&trial_key(&s.contract, &s.test_id))
                    .is_some_and(|(from, _)| *from == i)
            })
        })
        .cloned()
        .collect();
    let trials = rows.len();
    let report = ReportDir::new(into);
    let kept = report.locked(|| {
        let kept = keep_earlier_rows(&report, &mut rows, &mut speedups)?;
        sort_rows(&mut rows);
        write_rows_atomic(&report.falsification_path(), &rows)?;
        write_rows_atomic(&report.speedups_path(), &speedups)?;
        meta.write_json(into)?;
        copy_artifacts(&loaded, into)?;
        Ok(kept)
    })?;
    Ok(Merged {
        trials,
        speedups: speedups.len(),
        shards: loaded
            .iter()
            .map(|s| format!("{}: {}", s.dir.display(), s.account.summary()))
            .collect(),
        kept,
    })
}

/// Adds to `rows` and `speedups` what `into` already holds of trials they
/// do not have, and returns how many rows that is. A report there that does
/// not read, or holds a trial twice, stops the merge: it is never replaced
/// unread, and which of two rows to keep cannot be told.
fn keep_earlier_rows(
    report: &ReportDir,
    rows: &mut Vec<FalsificationRow>,
    speedups: &mut Vec<SpeedupRow>,
) -> Result<usize> {
    let merged: std::collections::HashSet<String> = rows
        .iter()
        .map(|r| trial_key(&r.contract, &r.test_id))
        .collect();
    let path = report.falsification_path();
    let earlier: Vec<(u64, FalsificationRow)> = read_rows_located(&path)?;
    evidence::one_row_per_trial(&path, &earlier)?;
    let before = rows.len();
    rows.extend(
        earlier
            .into_iter()
            .map(|(_, r)| r)
            .filter(|r| !merged.contains(&trial_key(&r.contract, &r.test_id))),
    );
    let earlier: Vec<SpeedupRow> = read_rows(&report.speedups_path())?;
    speedups.extend(
        earlier
            .into_iter()
            .filter(|s| !merged.contains(&trial_key(&s.contract, &s.test_id))),
    );
    Ok(rows.len() - before)
}

/// For every trial, the shard whose row is kept and the row.
fn choose_rows(shards: &[Shard]) -> Result<BTreeMap<String, (usize, &FalsificationRow)>> {
    let mut chosen: BTreeMap<String, (usize, &FalsificationRow)> = BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        for row in &shard.rows {
            let key = trial_key(&row.contract, &row.test_id);
            match chosen.get(&key) {
                None => {}
                Some(_) if row.status == Status::Skipped => continue,
                Some((_, kept)) if kept.status == Status::Skipped => {}
                Some((j, _)) => {
                    return Err(merge_error(
                        &shard.dir.join(FALSIFICATION_CSV),
                        format!(
                            "trial {key} ran here and in {}: the shards overlap",
                            shards[*j].dir.display()
                        ),
                    ))
                }
            }
            chosen.insert(key, (i, row));
        }
    }
    Ok(chosen)
}

/// The shards' run records as one, naming every shard's run (`runs`); they
/// must come from one commit and, if they used a GPU, the same kind of GPU
/// (a report compares one GPU kind with its baseline).
fn joined_meta(shards: &[Shard]) -> Result<RunMeta> {
    let Some((first, rest)) = shards.split_first() else {
        return Err(merge_error(Path::new("."), "no shard to merge".into()));
    };
    let mut joined = first.meta.clone();
    for shard in rest {
        let meta = &shard.meta;
        let here = shard.dir.join(RUN_JSON);
        let from = first.dir.display();
        if meta.git_sha != first.meta.git_sha {
            return Err(merge_error(
                &here,
                format!(
                    "built from commit {}, but {from} from {}: shards of one report come from one build",
                    meta.git_sha, first.meta.git_sha
                ),
            ));
        }
        if let (Some(a), Some(b)) = (&meta.gpu, &first.meta.gpu) {
            if a.name != b.name {
                return Err(merge_error(
                    &here,
                    format!(
                        "ran on {}, but {from} on {}: a report judges one GPU kind",
                        a.name, b.name
                    ),
                ));
            }
        }
        joined = joined.joined(meta);
    }
    joined.runs = Vec::new();
    for run in shards.iter().flat_map(|s| &s.account.judged_runs) {
        if !joined.runs.contains(run) {
            joined.runs.push(run.clone());
        }
    }
    Ok(joined)
}

/// Copies the shards' failure artifacts into `into/artifacts`.
fn copy_artifacts(shards: &[Shard], into: &Path) -> Result<()> {
    for shard in shards {
        let from = shard.dir.join(ARTIFACTS_DIR);
        let Ok(entries) = std::fs::read_dir(&from) else {
            continue;
        };
        let to = into.join(ARTIFACTS_DIR);
        if from == to {
            continue;
        }
        std::fs::create_dir_all(&to).map_err(|e| Error::io(&to, e))?;
        for entry in entries.flatten().filter(|e| e.path().is_file()) {
            let target = to.join(entry.file_name());
            std::fs::copy(entry.path(), &target).map_err(|e| Error::io(&target, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(test: &str, status: Status) -> FalsificationRow {
        crate::report::test_row("c", test, status)
    }

    /// A shard folder: `rows` as run `run_id`, which selected them.
    fn shard(dir: &Path, run_id: &str, rows: &[FalsificationRow]) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let rows: Vec<FalsificationRow> = rows
            .iter()
            .map(|r| FalsificationRow {
                run_id: run_id.into(),
                ..r.clone()
            })
            .collect();
        write_rows_atomic(&dir.join(FALSIFICATION_CSV), &rows).unwrap();
        let mut meta = RunMeta::detect();
        meta.run_id = run_id.into();
        meta.git_sha = "g".into();
        meta.selected = rows
            .iter()
            .map(|r| trial_key(&r.contract, &r.test_id))
            .collect();
        meta.write_json(dir).unwrap();
        dir.to_path_buf()
    }

    #[test]
    fn a_trial_that_ran_wins_over_its_skipped_row_and_overlaps_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let a = shard(
            &tmp.path().join("a"),
            "run-a",
            &[row("A", Status::Passed), row("G", Status::Skipped)],
        );
        let b = shard(
            &tmp.path().join("b"),
            "run-b",
            &[row("G", Status::Falsified), row("A", Status::Skipped)],
        );
        let into = tmp.path().join("merged");
        let merged = merge_runs(&[a.clone(), b], &into).unwrap();
        assert_eq!(merged.trials, 2);
        let rows: Vec<FalsificationRow> = read_rows(&into.join(FALSIFICATION_CSV)).unwrap();
        let got: Vec<(&str, Status)> = rows.iter().map(|r| (&*r.test_id, r.status)).collect();
        assert_eq!(got, [("A", Status::Passed), ("G", Status::Falsified)]);
        let meta = RunMeta::read_json(&into).unwrap().unwrap();
        assert_eq!(meta.runs, ["run-a", "run-b"]);
        assert_eq!(meta.selected, ["c::A", "c::G"]);

        let c = shard(&tmp.path().join("c"), "run-c", &[row("A", Status::Error)]);
        let err = merge_runs(&[a, c], &tmp.path().join("m2")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("c/falsification.csv") && text.contains("ran here and in"),
            "{text}"
        );
        assert!(!tmp.path().join("m2").exists(), "nothing written on error");
    }

    #[test]
    fn a_missing_shard_report_or_run_record_is_a_located_error() {
        let tmp = tempfile::tempdir().unwrap();
        let err = merge_runs(&[tmp.path().join("nope")], &tmp.path().join("m")).unwrap_err();
        assert!(err.to_string().contains("nope/falsification.csv"), "{err}");
        let bare = tmp.path().join("bare");
        std::fs::create_dir_all(&bare).unwrap();
        write_rows_atomic(&bare.join(FALSIFICATION_CSV), &[row("A", Status::Passed)]).unwrap();
        let err = merge_runs(&[bare], &tmp.path().join("m")).unwrap_err();
        assert!(
            err.to_string().contains("bare/run.json: no run record"),
            "{err}"
        );
    }

    /// A shard's folder may hold rows an earlier run left there: they are
    /// not the shard's evidence. Rows already in the target folder of
    /// trials no shard ran stay there.
    #[test]
    fn only_each_shards_own_rows_are_merged_and_the_target_keeps_its_other_rows() {
        let tmp = tempfile::tempdir().unwrap();
        let a = shard(&tmp.path().join("a"), "run-a", &[row("A", Status::Passed)]);
        let mut rows: Vec<FalsificationRow> = read_rows(&a.join(FALSIFICATION_CSV)).unwrap();
        rows.push(FalsificationRow {
            run_id: "older".into(),
            ..row("B", Status::Falsified)
        });
        write_rows_atomic(&a.join(FALSIFICATION_CSV), &rows).unwrap();
        let into = shard(
            &tmp.path().join("merged"),
            "before",
            &[row("C", Status::Passed)],
        );
        let merged = merge_runs(&[a], &into).unwrap();
        assert_eq!((merged.trials, merged.kept), (1, 1));
        assert!(
            merged.shards[0].contains("set aside 1 row(s) of 1 run (older: 1)"),
            "{:?}",
            merged.shards
        );
        let rows: Vec<FalsificationRow> = read_rows(&into.join(FALSIFICATION_CSV)).unwrap();
        let got: Vec<(&str, &str)> = rows.iter().map(|r| (&*r.test_id, &*r.run_id)).collect();
        assert_eq!(got, [("A", "run-a"), ("C", "before")]);
    }
}

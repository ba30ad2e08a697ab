//! One report from several runs of the same suite: the shards of a
//! `cargo nextest run --partition hash:K/N` on different runners, each with
//! its own `falsification.csv`, `speedups.csv` and `run.json`.
//!
//! Every trial keeps the row of the shard that ran it. A trial that is
//! `skipped` in one shard and ran in another keeps the row that ran (a
//! nextest shard records the trials it cannot judge here, whichever shard
//! they hash to); a trial that ran in two shards means the shards overlap,
//! and is an error naming both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::artifacts::ARTIFACTS_DIR;
use super::meta::RunMeta;
use super::{
    fill_from_trials, read_rows, sort_rows, trial_key, write_rows_atomic, FalsificationRow,
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
}

/// One shard's reports, as read.
struct Shard {
    dir: PathBuf,
    rows: Vec<FalsificationRow>,
    speedups: Vec<SpeedupRow>,
    meta: Option<RunMeta>,
}

impl Shard {
    fn load(dir: &Path) -> Result<Shard> {
        let csv = dir.join(FALSIFICATION_CSV);
        if !csv.is_file() {
            return Err(merge_error(&csv, "no falsification report here".into()));
        }
        let rows: Vec<FalsificationRow> = read_rows(&csv)?;
        let mut speedups: Vec<SpeedupRow> = read_rows(&ReportDir::new(dir).speedups_path())?;
        fill_from_trials(&mut speedups, &rows);
        Ok(Shard {
            dir: dir.to_path_buf(),
            rows,
            speedups,
            meta: RunMeta::read_json(dir)?,
        })
    }
}

fn merge_error(path: &Path, message: String) -> Error {
    Error::Merge {
        path: path.to_path_buf(),
        message,
    }
}

/// Merges the reports of the run directories `shards` into `into`,
/// replacing what `into` held. Everything is read and checked before
/// anything is written; each file is written atomically, under `into`'s
/// writer lock.
pub fn merge_runs(shards: &[PathBuf], into: &Path) -> Result<Merged> {
    let loaded: Vec<Shard> = shards
        .iter()
        .map(|d| Shard::load(d))
        .collect::<Result<_>>()?;
    let chosen = choose_rows(&loaded)?;
    let meta = joined_meta(&loaded)?;
    let mut rows: Vec<FalsificationRow> = chosen.values().map(|(_, r)| (*r).clone()).collect();
    sort_rows(&mut rows);
    let speedups: Vec<SpeedupRow> = loaded
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
    let report = ReportDir::new(into);
    report.locked(|| {
        write_rows_atomic(&report.falsification_path(), &rows)?;
        write_rows_atomic(&report.speedups_path(), &speedups)?;
        if let Some(meta) = &meta {
            meta.write_json(into)?;
        }
        copy_artifacts(&loaded, into)
    })?;
    Ok(Merged {
        trials: rows.len(),
        speedups: speedups.len(),
    })
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

/// The shards' run records as one; they must come from one commit and, if
/// they used a GPU, the same kind of GPU (a report compares one GPU kind
/// with its baseline).
fn joined_meta(shards: &[Shard]) -> Result<Option<RunMeta>> {
    let mut joined: Option<(RunMeta, &Path)> = None;
    for shard in shards {
        let Some(meta) = &shard.meta else { continue };
        let Some((first, from)) = &joined else {
            joined = Some((meta.clone(), &shard.dir));
            continue;
        };
        let here = shard.dir.join(super::meta::RUN_JSON);
        if meta.git_sha != first.git_sha {
            return Err(merge_error(
                &here,
                format!(
                    "built from commit {}, but {} from {}: shards of one report come from one build",
                    meta.git_sha,
                    from.display(),
                    first.git_sha
                ),
            ));
        }
        if let (Some(a), Some(b)) = (&meta.gpu, &first.gpu) {
            if a.name != b.name {
                return Err(merge_error(
                    &here,
                    format!(
                        "ran on {}, but {} on {}: a report judges one GPU kind",
                        a.name,
                        from.display(),
                        b.name
                    ),
                ));
            }
        }
        joined = Some((first.joined(meta), from));
    }
    Ok(joined.map(|(meta, _)| meta))
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

    fn shard(dir: &Path, rows: &[FalsificationRow]) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        write_rows_atomic(&dir.join(FALSIFICATION_CSV), rows).unwrap();
        dir.to_path_buf()
    }

    #[test]
    fn a_trial_that_ran_wins_over_its_skipped_row_and_overlaps_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let a = shard(
            &tmp.path().join("a"),
            &[row("A", Status::Passed), row("G", Status::Skipped)],
        );
        let b = shard(
            &tmp.path().join("b"),
            &[row("G", Status::Falsified), row("A", Status::Skipped)],
        );
        let into = tmp.path().join("merged");
        let merged = merge_runs(&[a.clone(), b], &into).unwrap();
        assert_eq!(merged.trials, 2);
        let rows: Vec<FalsificationRow> = read_rows(&into.join(FALSIFICATION_CSV)).unwrap();
        let got: Vec<(&str, Status)> = rows.iter().map(|r| (&*r.test_id, r.status)).collect();
        assert_eq!(got, [("A", Status::Passed), ("G", Status::Falsified)]);

        let c = shard(&tmp.path().join("c"), &[row("A", Status::Error)]);
        let err = merge_runs(&[a, c], &tmp.path().join("m2")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("c/falsification.csv") && text.contains("ran here and in"),
            "{text}"
        );
        assert!(!tmp.path().join("m2").exists(), "nothing written on error");
    }

    #[test]
    fn a_missing_shard_report_is_a_located_error() {
        let tmp = tempfile::tempdir().unwrap();
        let err = merge_runs(&[tmp.path().join("nope")], &tmp.path().join("m")).unwrap_err();
        assert!(err.to_string().contains("nope/falsification.csv"), "{err}");
    }
}

//! What a report folder holds as evidence, checked before anything is judged.
//!
//! A folder can hold rows of several runs: a run keeps the rows of trials it
//! did not run (a filter, an interruption, another contract tree). A verdict
//! is about one run (or the shards `report --merge` joined), so only that
//! run's rows are evidence:
//!
//! - **A run record that lists the trials it selected** (`run.json`'s
//!   `selected`): the rows of its run (or of the runs a merge joined, `runs`)
//!   are judged; rows of any other run are set aside and counted. A selected
//!   trial without a row of the run did not finish: it is *missing*.
//! - **A record written before runs listed their trials** (no `selected`),
//!   or **no record**: which rows are this run's, and whether it finished,
//!   cannot be told apart from an earlier run's leftovers. The rows are
//!   judged only when every one belongs to the run(s) the record names (with
//!   no record: to one run); otherwise the folder is refused. A *baseline* is
//!   the committed reference set, taken whole: the committed ones are
//!   nextest shards merged before merges were recorded.
//!
//! Whatever the record, the file must hold rows, each trial at most once,
//! and the judged rows must come from one build and one text of each
//! contract. A baseline must also be a run that finished.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::meta::{plain_sha, RunMeta};
use super::{read_rows_located, trial_key, FalsificationRow, SpeedupRow, FALSIFICATION_CSV};
use crate::error::{Error, Result};

/// Which side of a comparison a folder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The reference: taken whole when its record predates `selected`, and
    /// refused when it did not finish.
    Baseline,
    /// The run judged: only its own rows are evidence; trials it did not
    /// finish make it incomplete.
    Current,
}

/// What was read from a folder and which of it is judged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Account {
    /// The `falsification.csv` read.
    pub file: PathBuf,
    /// Rows per run id, every row of the file, in first-seen order.
    pub by_run: Vec<(String, usize)>,
    /// The runs whose rows are judged.
    pub judged_runs: Vec<String>,
    /// The build commits of the judged rows.
    pub builds: Vec<String>,
    /// Trials the run selected with no row of the judged runs, as
    /// `contract::test_id`: they did not finish.
    pub missing: Vec<String>,
    /// Why the run stopped before every selected trial ran, as its record says.
    pub interrupted: Option<String>,
}

impl Account {
    /// Rows in the file.
    pub fn read(&self) -> usize {
        self.by_run.iter().map(|(_, n)| n).sum()
    }

    /// Rows judged.
    pub fn judged(&self) -> usize {
        self.by_run
            .iter()
            .filter(|(id, _)| self.judged_runs.contains(id))
            .map(|(_, n)| n)
            .sum()
    }

    /// Rows of other runs, which are not evidence, per run.
    pub fn set_aside(&self) -> Vec<(&str, usize)> {
        self.by_run
            .iter()
            .filter(|(id, _)| !self.judged_runs.contains(id))
            .map(|(id, n)| (id.as_str(), *n))
            .collect()
    }

    /// One sentence: what was read, what is judged, what was set aside.
    pub fn summary(&self) -> String {
        let mut text = format!(
            "read {} row(s) of {} from {}; ",
            self.read(),
            runs_list(&self.by_run),
            self.file.display(),
        );
        let aside = self.set_aside();
        if aside.is_empty() {
            text += "judged all";
        } else {
            text += &format!(
                "judged {} row(s) of {}",
                self.judged(),
                plural("run", &self.judged_runs)
            );
        }
        if !self.builds.is_empty() {
            text += &format!(" (build {})", self.builds.join(", "));
        }
        if !aside.is_empty() {
            let aside: Vec<(String, usize)> =
                aside.iter().map(|(id, n)| (id.to_string(), *n)).collect();
            text += &format!(
                "; set aside {} row(s) of {}: rows of other runs are not evidence for this verdict",
                aside.iter().map(|(_, n)| n).sum::<usize>(),
                runs_list(&aside)
            );
        }
        text
    }
}

/// `2 runs (a: 3, b: 1)`.
fn runs_list(by_run: &[(String, usize)]) -> String {
    let items: Vec<String> = by_run.iter().map(|(id, n)| format!("{id}: {n}")).collect();
    let noun = if by_run.len() == 1 { "run" } else { "runs" };
    format!("{} {noun} ({})", by_run.len(), items.join(", "))
}

/// `run a` or `2 runs (a, b)`.
fn plural(noun: &str, items: &[String]) -> String {
    match items {
        [one] => format!("{noun} {one}"),
        _ => format!("{} {noun}s ({})", items.len(), items.join(", ")),
    }
}

/// A folder's evidence: the judged rows and speedups, its record, and the
/// account of what was read.
#[derive(Debug, Clone)]
pub struct Evidence {
    pub meta: Option<RunMeta>,
    pub rows: Vec<FalsificationRow>,
    pub speedups: Vec<SpeedupRow>,
    pub account: Account,
}

/// Reads `dir`'s reports as `side` and checks them (see the module docs).
/// Refusals are [`Error::Evidence`] (or the CSV or I/O error, with file and
/// line) and say what was read.
pub fn load(dir: &Path, side: Side) -> Result<Evidence> {
    let csv = dir.join(FALSIFICATION_CSV);
    if !csv.exists() {
        let why = "no falsification report here; run `falsify run` first";
        let not_found = std::io::Error::new(std::io::ErrorKind::NotFound, why);
        return Err(Error::io(&csv, not_found));
    }
    let located: Vec<(u64, FalsificationRow)> = read_rows_located(&csv)?;
    let meta = RunMeta::read_json(dir)?;
    let mut account = Account {
        file: csv.clone(),
        by_run: count_by_run(located.iter().map(|(_, r)| r)),
        interrupted: meta.as_ref().and_then(|m| m.incomplete.clone()),
        ..Account::default()
    };
    let refuse = |line: u64, message: String| Error::Evidence {
        path: csv.clone(),
        line: line as usize,
        message: format!("{message} — {}", what_was_read(&located)),
    };
    if located.is_empty() {
        return Err(refuse(
            0,
            "no rows (an empty file, or a header only): nothing to judge".into(),
        ));
    }
    one_row_per_trial(&csv, &located)?;
    account.judged_runs =
        judged_runs(meta.as_ref(), &account.by_run, side).map_err(|m| refuse(0, m))?;
    let judged: Vec<&(u64, FalsificationRow)> = located
        .iter()
        .filter(|(_, r)| account.judged_runs.contains(&r.run_id))
        .collect();
    account.builds = one_build(&judged).map_err(|(line, m)| refuse(line, m))?;
    one_text_per_contract(&judged).map_err(|(line, m)| refuse(line, m))?;
    account.missing = missing(meta.as_ref(), judged.iter().map(|(_, r)| r));
    if judged.is_empty() && account.missing.is_empty() {
        return Err(refuse(
            0,
            format!("no row of {}", plural("run", &account.judged_runs)),
        ));
    }
    if side == Side::Baseline {
        refuse_unfinished_baseline(&account).map_err(|m| refuse(0, m))?;
    }
    let rows: Vec<FalsificationRow> = judged.into_iter().map(|(_, r)| r.clone()).collect();
    let mut speedups: Vec<SpeedupRow> = super::read_rows(&dir.join(super::SPEEDUPS_CSV))?;
    speedups.retain(|s| account.judged_runs.contains(&s.run_id));
    super::fill_from_trials(&mut speedups, &rows);
    Ok(Evidence {
        meta,
        rows,
        speedups,
        account,
    })
}

/// Rows per run id, in first-seen order.
fn count_by_run<'a>(rows: impl Iterator<Item = &'a FalsificationRow>) -> Vec<(String, usize)> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for r in rows {
        match counts.iter_mut().find(|(id, _)| *id == r.run_id) {
            Some((_, n)) => *n += 1,
            None => counts.push((r.run_id.clone(), 1)),
        }
    }
    counts
}

/// `read 8 rows of 2 runs (a: 6, b: 2), 1 build (aaaa11112222)`.
fn what_was_read(located: &[(u64, FalsificationRow)]) -> String {
    if located.is_empty() {
        return "read 0 row(s)".into();
    }
    let builds: BTreeSet<&str> = located
        .iter()
        .map(|(_, r)| plain_sha(&r.git_sha).0)
        .collect();
    let builds: Vec<&str> = builds.into_iter().collect();
    format!(
        "read {} row(s) of {}, {} build(s) ({})",
        located.len(),
        runs_list(&count_by_run(located.iter().map(|(_, r)| r))),
        builds.len(),
        builds.join(", ")
    )
}

/// Refuses the rows of `path` when they hold a trial twice.
pub(crate) fn one_row_per_trial(path: &Path, located: &[(u64, FalsificationRow)]) -> Result<()> {
    refuse_repeated_trials(located).map_err(|(line, message)| Error::Evidence {
        path: path.to_path_buf(),
        line: line as usize,
        message: format!("{message} — {}", what_was_read(located)),
    })
}

/// A trial twice in one file: which row is the verdict would depend on the
/// order of the rows.
fn refuse_repeated_trials(located: &[(u64, FalsificationRow)]) -> Result<(), (u64, String)> {
    let mut first: BTreeMap<String, (u64, &FalsificationRow)> = BTreeMap::new();
    for (line, r) in located {
        let key = trial_key(&r.contract, &r.test_id);
        if let Some((at, earlier)) = first.get(&key) {
            return Err((
                *line,
                format!(
                    "the trial {key} twice, at lines {at} ({}, run {}) and {line} ({}, run {}): a report holds one row per trial, and which one decides must not depend on row order (shards are joined with `falsify report --merge`)",
                    earlier.status.as_str(),
                    earlier.run_id,
                    r.status.as_str(),
                    r.run_id
                ),
            ));
        }
        first.insert(key, (*line, r));
    }
    Ok(())
}

/// The runs whose rows are judged (see the module docs), or why none can be.
fn judged_runs(
    meta: Option<&RunMeta>,
    by_run: &[(String, usize)],
    side: Side,
) -> Result<Vec<String>, String> {
    let all: Vec<String> = by_run.iter().map(|(id, _)| id.clone()).collect();
    let named = match meta {
        Some(m) if !m.selected.is_empty() => return Ok(m.evidence_runs()),
        _ if side == Side::Baseline => return Ok(all),
        Some(m) => m.evidence_runs(),
        None if all.len() == 1 => return Ok(all),
        None => {
            return Err(format!(
                "rows of {} runs ({}) and no run.json to say which run is being judged: a verdict judges one run (join shards with `falsify report --merge`)",
                all.len(),
                all.join(", ")
            ))
        }
    };
    let others: Vec<&str> = all
        .iter()
        .filter(|id| !named.contains(id))
        .map(String::as_str)
        .collect();
    if others.is_empty() {
        return Ok(named);
    }
    Err(format!(
        "run.json names {} but rows of {} are here too, and it does not list the trials its run selected (written before runs recorded them): this run's rows cannot be told complete or apart from an earlier run's. Judge a run written into a fresh folder (`falsify run --out`), or join shards with `falsify report --merge`",
        plural("run", &named),
        plural("other run", &others.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    ))
}

/// The build of the judged rows, refusing rows of several.
fn one_build(judged: &[&(u64, FalsificationRow)]) -> Result<Vec<String>, (u64, String)> {
    let mut builds: Vec<(&str, u64)> = Vec::new();
    for (line, r) in judged {
        let sha = plain_sha(&r.git_sha).0;
        if !builds.iter().any(|(b, _)| *b == sha) {
            builds.push((sha, *line));
        }
    }
    if let [(_, _), (_, second), ..] = builds.as_slice() {
        let listed: Vec<String> = builds
            .iter()
            .map(|(b, line)| format!("{b} from line {line}"))
            .collect();
        return Err((
            *second,
            format!(
                "the judged rows come from {} builds ({}): one verdict judges one build",
                builds.len(),
                listed.join(", ")
            ),
        ));
    }
    Ok(builds.into_iter().map(|(b, _)| b.to_string()).collect())
}

/// Each contract's judged rows must share its version and, where recorded,
/// the hash of its file: otherwise trials were judged against different
/// texts of one contract.
fn one_text_per_contract(judged: &[&(u64, FalsificationRow)]) -> Result<(), (u64, String)> {
    let mut versions: BTreeMap<&str, (&str, u64)> = BTreeMap::new();
    let mut hashes: BTreeMap<&str, (&str, u64)> = BTreeMap::new();
    for (line, r) in judged {
        let (version, at) = *versions
            .entry(&r.contract)
            .or_insert((&r.contract_version, *line));
        let what = if version != r.contract_version {
            format!(
                "version {version} at line {at}, {} at line {line}",
                r.contract_version
            )
        } else if r.contract_hash.is_empty() {
            continue;
        } else {
            let (hash, at) = *hashes
                .entry(&r.contract)
                .or_insert((&r.contract_hash, *line));
            if hash == r.contract_hash {
                continue;
            }
            format!(
                "file hash {hash} at line {at}, {} at line {line}",
                r.contract_hash
            )
        };
        return Err((
            *line,
            format!(
                "the contract {} was judged against two texts ({what}): one verdict needs one text of each contract",
                r.contract
            ),
        ));
    }
    Ok(())
}

/// The trials the record selected that have no judged row.
fn missing<'a>(
    meta: Option<&RunMeta>,
    judged: impl Iterator<Item = &'a FalsificationRow>,
) -> Vec<String> {
    let Some(meta) = meta else {
        return Vec::new();
    };
    let finished: BTreeSet<String> = judged.map(|r| trial_key(&r.contract, &r.test_id)).collect();
    meta.selected
        .iter()
        .filter(|key| !finished.contains(*key))
        .cloned()
        .collect()
}

/// A baseline is a reference only when its run finished every trial it
/// selected.
fn refuse_unfinished_baseline(account: &Account) -> Result<(), String> {
    if let Some(why) = &account.interrupted {
        return Err(format!(
            "this baseline's run did not finish ({why}): a baseline must be a complete run"
        ));
    }
    if let Some(first) = account.missing.first() {
        return Err(format!(
            "this baseline's run selected {} trial(s) it has no row of (first: {first}): a baseline must be a complete run",
            account.missing.len()
        ));
    }
    Ok(())
}

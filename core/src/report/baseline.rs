//! Which baseline a run is judged against.
//!
//! Baselines live per subject and GPU kind,
//! `reports/baseline/<subject>/<kind>/` (`qlora/h200`, `qlora/h100`, ...),
//! because the subject is what was tested, and timings and even verdicts (a
//! bandwidth fraction, a tokens/s target) belong to one kind of GPU.
//! `--baseline` names one baseline folder (it holds `falsification.csv`),
//! one subject's folder of kinds, or the folder of subjects (it holds a
//! folder named for the run's subject, as `run.json` records it):
//!
//! - a run that used a GPU is compared with the baseline of that GPU's kind;
//! - a run that used no GPU is judged on its `cpu` trials, against the `cpu`
//!   rows of every baseline: its skipped `cuda` trials say nothing about the
//!   code, and a GPU baseline's `cuda` rows say nothing about this machine.

use std::collections::HashSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::compare::RunData;
use super::evidence::Side;
use super::meta::LEGACY_SUBJECT;
use super::{FalsificationRow, Status, FALSIFICATION_CSV};
use crate::error::{Error, Result};

/// Words of a GPU's name that say who made or sold it, not what it is.
const BRAND_WORDS: [&str; 4] = ["nvidia", "geforce", "tesla", "quadro"];

/// The GPU kind a device name belongs to, as baseline folders are named:
/// `NVIDIA H200` -> `h200`, `NVIDIA H100 80GB HBM3` -> `h100`,
/// `NVIDIA A100-SXM4-80GB` -> `a100`, `NVIDIA GeForce RTX 4090` -> `rtx-4090`.
/// The words up to the first one with a digit (the model number), without
/// brand words or the `-SXM...` variant suffix; memory size and packaging do
/// not make another kind.
pub fn gpu_kind(device: &str) -> String {
    let mut words = Vec::new();
    for word in device.split_whitespace() {
        let word = word.to_ascii_lowercase();
        if BRAND_WORDS.contains(&word.as_str()) {
            continue;
        }
        let model = word.split('-').next().unwrap_or_default().to_string();
        let has_digit = model.chars().any(|c| c.is_ascii_digit());
        words.push(model);
        if has_digit {
            break;
        }
    }
    let kind: String = words
        .join("-")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    if kind.is_empty() {
        "unknown-gpu".into()
    } else {
        kind
    }
}

/// The baseline kind of a host of `gpus` GPUs named `device`: the GPU's
/// kind on one GPU (or an unknown count), `<kind>x<gpus>` on several
/// (`h200x2`), since a host of several runs the data-parallel trials that
/// one GPU skips.
pub fn host_kind(device: &str, gpus: Option<u32>) -> String {
    match gpus {
        Some(n) if n > 1 => format!("{}x{n}", gpu_kind(device)),
        _ => gpu_kind(device),
    }
}

/// How a host of `gpus` GPUs named `device` reads in a sentence:
/// `NVIDIA H200`, `2x NVIDIA H200`.
pub fn host_description(device: &str, gpus: Option<u32>) -> String {
    match gpus {
        Some(n) if n > 1 => format!("{n}x {device}"),
        _ => device.to_string(),
    }
}

/// The baselines a run is compared with, and the run as compared.
#[derive(Debug, Clone)]
pub struct Selection {
    /// One baseline for a GPU run; every baseline for a run without a GPU.
    /// Each is restricted to what the run can be compared on.
    pub baselines: Vec<RunData>,
    /// The same baselines whole, for what the report says about their runs.
    pub whole_baselines: Vec<RunData>,
    /// The current run, restricted likewise.
    pub current: RunData,
    /// Which baseline(s) were chosen and why, as one sentence.
    pub why: String,
}

/// Picks the baseline(s) under `root` for `current` (see the module docs).
pub fn select(root: &Path, current: &RunData) -> Result<Selection> {
    let subject = subject_of(current);
    let root = &subject_root(root, subject);
    let single = root.join(FALSIFICATION_CSV).exists();
    let kinds = if single {
        Vec::new()
    } else {
        kind_dirs(root, subject)?
    };
    match current.used_gpu() {
        Some(_) if single => one_baseline(root, current, true),
        Some(device) => {
            let kind = host_kind(&device, current.gpu_count());
            match kinds.iter().find(|(name, _)| *name == kind) {
                Some((_, dir)) => one_baseline(dir, current, false),
                None => {
                    let host = host_description(&device, current.gpu_count());
                    Err(no_baseline_for(root, &host, &kind, &kinds))
                }
            }
        }
        None if single => cpu_only(&[(String::new(), root.to_path_buf())], current),
        None => cpu_only(&kinds, current),
    }
}

/// The subject `current` tested, as its run record says; a record from
/// before subjects (or none) is of [`LEGACY_SUBJECT`].
pub(crate) fn subject_of(current: &RunData) -> &str {
    current
        .meta
        .as_ref()
        .map_or(LEGACY_SUBJECT, |m| m.subject.as_str())
}

/// The folder of `subject`'s baselines: `root/<subject>` when `root` is the
/// folder of subjects (it has a `<subject>/` folder and is no baseline
/// itself), else `root` as given.
fn subject_root(root: &Path, subject: &str) -> PathBuf {
    let of_subject = root.join(subject);
    if !root.join(FALSIFICATION_CSV).exists() && of_subject.is_dir() {
        of_subject
    } else {
        root.to_path_buf()
    }
}

/// The `<kind>/` folders under `root` that hold a baseline, sorted by name;
/// `subject` (the run's) for the message when there is none.
fn kind_dirs(root: &Path, subject: &str) -> Result<Vec<(String, PathBuf)>> {
    let entries = std::fs::read_dir(root).map_err(|e| Error::io(root, e))?;
    let mut kinds: Vec<(String, PathBuf)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join(FALSIFICATION_CSV).is_file())
        .filter_map(|p| Some((p.file_name()?.to_string_lossy().into_owned(), p)))
        .collect();
    kinds.sort();
    if kinds.is_empty() {
        return Err(not_found(
            root,
            format!(
                "no baseline here: neither {FALSIFICATION_CSV}, nor a {subject}/<gpu-kind>/{FALSIFICATION_CSV} for this run's subject `{subject}`, nor a <gpu-kind>/{FALSIFICATION_CSV} (e.g. h200/{FALSIFICATION_CSV})"
            ),
        ));
    }
    Ok(kinds)
}

/// A GPU run against one baseline folder; `given` when `--baseline` named
/// the folder itself rather than the folder of kinds.
fn one_baseline(dir: &Path, current: &RunData, given: bool) -> Result<Selection> {
    let mut baseline = RunData::load(dir, Side::Baseline)?;
    let host = current.used_host().unwrap_or_default();
    let kind = current.used_host_kind().unwrap_or_default();
    let baseline_host = baseline.used_host();
    if let Some(baseline_kind) = baseline.used_host_kind() {
        baseline.name = baseline_kind;
    }
    let why = if !given {
        format!(
            "Baseline `{}` (`{}`): the baseline of the GPU this run used, {host}.",
            baseline.name,
            dir.display()
        )
    } else {
        match baseline_host {
            Some(other) if baseline.name != kind => format!(
                "Baseline `{}` (`{}`), as given. It ran on {other} (kind `{}`) and this run on {host} (kind `{kind}`): verdicts compare, timings belong to different GPUs.",
                baseline.name,
                dir.display(),
                baseline.name,
            ),
            _ => format!(
                "Baseline `{}` (`{}`), as given; this run used {host}.",
                baseline.name,
                dir.display()
            ),
        }
    };
    Ok(Selection {
        baselines: vec![baseline.clone()],
        whole_baselines: vec![baseline],
        current: current.clone(),
        why,
    })
}

/// A run without a GPU against the `cpu` rows of every baseline in `dirs`
/// (an empty name: call the baseline by its folder or GPU kind).
fn cpu_only(dirs: &[(String, PathBuf)], current: &RunData) -> Result<Selection> {
    let skipped = |r: &FalsificationRow| r.backend == "cuda" && r.status == Status::Skipped;
    let compared = current.filtered(|r| !skipped(r));
    // A `cuda` row that is not skipped (an error before any device opened)
    // is still judged, against the baseline's row for it.
    let judged_cuda: HashSet<(String, String)> = compared
        .rows
        .iter()
        .filter(|r| r.backend == "cuda")
        .map(|r| (r.contract.clone(), r.test_id.clone()))
        .collect();
    let mut baselines = Vec::new();
    let mut whole_baselines = Vec::new();
    for (name, dir) in dirs {
        let mut baseline = RunData::load(dir, Side::Baseline)?;
        if !name.is_empty() {
            baseline.name = name.clone();
        } else if let Some(kind) = baseline.used_host_kind() {
            baseline.name = kind;
        }
        baselines.push(baseline.filtered(|r| {
            r.backend == "cpu" || judged_cuda.contains(&(r.contract.clone(), r.test_id.clone()))
        }));
        whole_baselines.push(baseline);
    }
    let names: Vec<String> = baselines
        .iter()
        .map(|b| format!("`{}` (`{}`)", b.name, b.dir.display()))
        .collect();
    let n_skipped = current.rows.iter().filter(|r| skipped(r)).count();
    let reasons = skip_reasons(current.rows.iter().filter(|r| skipped(r)));
    let why = format!(
        "This run used no GPU{}, so it is judged on its `cpu` trials against the `cpu` rows of {}: {}.",
        if n_skipped == 0 {
            String::new()
        } else {
            format!(" (its {n_skipped} `cuda` trials were skipped: {reasons})")
        },
        if baselines.len() == 1 {
            "the baseline"
        } else {
            "every baseline"
        },
        names.join(", ")
    );
    Ok(Selection {
        baselines,
        whole_baselines,
        current: compared,
        why,
    })
}

/// The distinct skip reasons of `rows`, in first-seen order.
fn skip_reasons<'a>(rows: impl Iterator<Item = &'a FalsificationRow>) -> String {
    let mut reasons: Vec<&str> = Vec::new();
    for r in rows {
        let reason = if r.detail.is_empty() {
            "no reason recorded"
        } else {
            r.detail.as_str()
        };
        if !reasons.contains(&reason) {
            reasons.push(reason);
        }
    }
    reasons.join("; ")
}

fn no_baseline_for(root: &Path, device: &str, kind: &str, kinds: &[(String, PathBuf)]) -> Error {
    let have: Vec<&str> = kinds.iter().map(|(k, _)| k.as_str()).collect();
    let other = have.first().copied().unwrap_or("h200");
    not_found(
        root,
        format!(
            "this run used {device} (GPU kind `{kind}`), and there is no baseline for `{kind}` here (baselines: {}). Commit one as {}, or compare across GPU kinds on purpose with --baseline {}",
            have.join(", "),
            root.join(kind).display(),
            root.join(other).display()
        ),
    )
}

/// Refuses a report that would be written into the baseline folder `root`
/// (the report goes into `current_dir`): a baseline is committed evidence,
/// and `report` must never change it.
pub fn refuse_output_inside(root: &Path, current_dir: &Path) -> Result<()> {
    let canonical = |p: &Path| p.canonicalize().map_err(|e| Error::io(p, e));
    let (root_abs, current_abs) = (canonical(root)?, canonical(current_dir)?);
    if !current_abs.starts_with(&root_abs) {
        return Ok(());
    }
    Err(Error::io(
        current_dir,
        std::io::Error::new(
            ErrorKind::InvalidInput,
            format!(
                "the report would be written into the baseline folder {}; `report` never writes there. Copy the run elsewhere first (e.g. `cp -r {} /tmp/run`) and pass --current /tmp/run",
                root.display(),
                current_dir.display()
            ),
        ),
    ))
}

fn not_found(path: &Path, message: String) -> Error {
    Error::io(path, std::io::Error::new(ErrorKind::NotFound, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_of_several_gpus_is_a_kind_of_its_own() {
        assert_eq!(host_kind("NVIDIA H200", Some(2)), "h200x2");
        assert_eq!(host_kind("NVIDIA H100 80GB HBM3", Some(4)), "h100x4");
        assert_eq!(host_kind("NVIDIA H200", Some(1)), "h200");
        assert_eq!(host_kind("NVIDIA H200", None), "h200");
        assert_eq!(host_description("NVIDIA H200", Some(2)), "2x NVIDIA H200");
        assert_eq!(host_description("NVIDIA H200", None), "NVIDIA H200");
    }

    #[test]
    fn gpu_kinds_are_model_numbers() {
        for (name, kind) in [
            ("NVIDIA H200", "h200"),
            ("NVIDIA H100 80GB HBM3", "h100"),
            ("NVIDIA H100 PCIe", "h100"),
            ("NVIDIA A100-SXM4-80GB", "a100"),
            ("Tesla V100-SXM2-16GB", "v100"),
            ("NVIDIA GeForce RTX 4090", "rtx-4090"),
            ("NVIDIA RTX A6000", "rtx-a6000"),
            ("NVIDIA L40S", "l40s"),
            ("", "unknown-gpu"),
        ] {
            assert_eq!(gpu_kind(name), kind, "{name}");
        }
    }
}

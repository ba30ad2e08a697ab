//! Facts about a run that every report row records, and the run record
//! (`run.json`) written beside the CSVs for the regression report.

use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::error::{Error, Result};

/// What a report row and `run.json` record about a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFacts {
    /// As the driver reports it, e.g. "NVIDIA H200".
    pub name: String,
    /// (major, minor), e.g. (9, 0) for Hopper.
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub total_memory_bytes: usize,
    /// The CUDA version the driver supports, e.g. "13.0".
    pub driver_version: String,
}

/// Name of the run record beside the CSVs.
pub const RUN_JSON: &str = "run.json";

/// Identity of one run, and what it ran on and with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    /// `YYYYMMDDTHHMMSSZ-pid`: sortable and unique per process.
    pub run_id: String,
    /// The subject the run tested (`qlora`, ...): its baselines are under
    /// `reports/baseline/<subject>/`. Records written before subjects
    /// existed are of [`LEGACY_SUBJECT`].
    #[serde(default = "legacy_subject")]
    pub subject: String,
    /// The commit the binary was built from (12 hex digits), nothing else:
    /// whether the code had changes beside it is `git_dirty`.
    pub git_sha: String,
    /// Where `git_dirty` was read, if anywhere.
    #[serde(default)]
    pub git_source: GitSource,
    /// Whether the checkout had uncommitted changes to tracked files when
    /// the run started; `None` when the run was not started from a checkout
    /// of the build commit, so nothing is known beyond `git_sha`.
    #[serde(default)]
    pub git_dirty: Option<bool>,
    /// The host CPU's model name, recorded as the device of `cpu` rows.
    pub cpu: String,
    /// When the run started (UTC, RFC 3339).
    #[serde(default)]
    pub started: String,
    /// When the reports were written (UTC, RFC 3339); empty until then.
    #[serde(default)]
    pub finished: String,
    /// The GPU, when this run opened one.
    #[serde(default)]
    pub gpu: Option<GpuMeta>,
    /// `nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw` as read when the
    /// reports were written, or why it was not read. Clocks and power explain
    /// timing differences between runs; NVML is not used, so this is the
    /// tool's own text.
    #[serde(default)]
    pub clocks: String,
    /// The options the run was started with.
    #[serde(default)]
    pub options: RecordedOptions,
    /// Why the run stopped before every selected trial ran (e.g. "interrupted
    /// by SIGINT"); absent for a run that finished. Its CSVs then hold the
    /// rows of the trials that finished, and no others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// Every trial the run selected, as `{contract}::{test_id}` (sorted):
    /// the evidence the report expects from this run. A selected trial with
    /// no row of this run did not finish, and the run is incomplete. For a
    /// run of several processes (cargo-nextest), the union of theirs.
    #[serde(default)]
    pub selected: Vec<String>,
    /// The runs whose rows this folder's evidence is, when `report --merge`
    /// joined several (the shards' run ids, in the order given); empty for a
    /// folder one run wrote, whose evidence is the rows of `run_id`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<String>,
}

/// The subject of a record written before run records named one: the
/// only subject there was then.
pub const LEGACY_SUBJECT: &str = "qlora";

fn legacy_subject() -> String {
    LEGACY_SUBJECT.to_string()
}

/// Where a run record's `git_dirty` was read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GitSource {
    /// The working directory is a git checkout of the build commit.
    Checkout,
    /// There is no checkout of the build commit here (a copy of the tree
    /// with stale git metadata, as on the GPU machine, or no git at all).
    #[default]
    BuildOnly,
}

/// What the run record says about the device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuMeta {
    pub name: String,
    /// `major.minor`, e.g. `9.0`.
    pub compute_capability: String,
    /// The CUDA version the driver supports, as the driver API reports it (e.g. `13.0`).
    pub cuda_driver_version: String,
    /// The kernel-mode driver (`nvidia-smi`'s `driver_version`), or "not read".
    pub nvidia_driver: String,
    pub sm_count: u32,
    pub total_memory_bytes: usize,
    /// The CUDA devices the run could use (the driver's count, after
    /// `CUDA_VISIBLE_DEVICES`): a host of several is a baseline kind of its
    /// own (`h200x2`). `None` in records from before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_count: Option<u32>,
}

impl GpuMeta {
    /// The record of an opened device on a host of `device_count` GPUs;
    /// `nvidia_driver` is read from `nvidia-smi`.
    pub fn from_facts(facts: &DeviceFacts, device_count: usize) -> Self {
        GpuMeta {
            name: facts.name.clone(),
            compute_capability: format!(
                "{}.{}",
                facts.compute_capability.0, facts.compute_capability.1
            ),
            cuda_driver_version: facts.driver_version.clone(),
            nvidia_driver: nvidia_smi_query("driver_version"),
            sm_count: facts.sm_count,
            total_memory_bytes: facts.total_memory_bytes,
            device_count: u32::try_from(device_count).ok(),
        }
    }
}

/// The run options worth recording (what a rerun needs to reproduce the inputs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordedOptions {
    /// Mixed into every trial's seed.
    pub seed: u64,
    /// Where the reports were written.
    pub out_dir: String,
    /// Device ordinal and GEMM math, as `Debug` text of the GPU options.
    pub gpu: String,
}

impl RecordedOptions {
    /// Every option as `key=value`, the GPU options as `gpu.<field>=<value>`.
    /// `gpu` holds the options' `Debug` text (`GpuOptions { ordinal: 0, ... }`);
    /// text that does not read as such is shown whole, as `gpu=<text>`.
    pub fn key_values(&self) -> Vec<String> {
        let mut out = vec![
            format!("seed={}", self.seed),
            format!("out_dir={}", self.out_dir),
        ];
        match debug_fields(&self.gpu) {
            Some(fields) => out.extend(fields.into_iter().map(|(k, v)| format!("gpu.{k}={v}"))),
            None if self.gpu.is_empty() => {}
            None => out.push(format!("gpu={}", self.gpu)),
        }
        out
    }
}

/// The fields of a flat struct's `Debug` text, `Name { a: 1, b: X }`, as
/// `(a, 1), (b, X)`; `None` for anything else (nested braces included).
fn debug_fields(text: &str) -> Option<Vec<(String, String)>> {
    let (_, body) = text.split_once('{')?;
    let body = body.trim().strip_suffix('}')?.trim();
    if body.contains(['{', '}']) {
        return None;
    }
    body.split(", ")
        .map(|field| {
            let (key, value) = field.split_once(": ")?;
            Some((key.trim().to_string(), value.trim().to_string()))
        })
        .collect()
}

impl RunMeta {
    /// Reads the clock, the git checkout and the CPU model; the subject is
    /// [`LEGACY_SUBJECT`] until the engine sets its own.
    pub fn detect() -> Self {
        let run_id = format!("{}-{}", compact_utc_now(), std::process::id());
        let (git_source, git_dirty) = git_tree_state(BUILD_GIT_SHA);
        RunMeta {
            run_id,
            subject: legacy_subject(),
            git_sha: BUILD_GIT_SHA.to_string(),
            git_source,
            git_dirty,
            cpu: cpu_name(),
            started: Self::now_rfc3339(),
            finished: String::new(),
            gpu: None,
            clocks: "not read".into(),
            options: RecordedOptions::default(),
            incomplete: None,
            selected: Vec::new(),
            runs: Vec::new(),
        }
    }

    /// Writes the record as pretty JSON to `dir/run.json`, through a temp file
    /// and a rename so a reader never sees a torn file.
    pub fn write_json(&self, dir: &Path) -> Result<()> {
        let path = dir.join(RUN_JSON);
        let text = serde_json::to_string_pretty(self).map_err(|e| {
            Error::io(
                &path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?;
        crate::report::write_bytes_atomic(&path, text.as_bytes())
    }

    /// The runs whose rows are this record's evidence: those a merge joined,
    /// else this run alone.
    pub fn evidence_runs(&self) -> Vec<String> {
        if self.runs.is_empty() {
            vec![self.run_id.clone()]
        } else {
            self.runs.clone()
        }
    }

    /// Reads `dir/run.json`; `None` when there is none (an older report).
    pub fn read_json(dir: &Path) -> Result<Option<RunMeta>> {
        let path = dir.join(RUN_JSON);
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let mut meta: RunMeta = serde_json::from_str(&text).map_err(|e| {
            Error::io(
                &path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?;
        meta.upgrade_legacy();
        Ok(Some(meta))
    }

    /// Records written before `git_source` and `git_dirty` existed kept the
    /// tree state in `git_sha` (`<sha>-dirty`, `<sha> (built)`) and named
    /// the CPU `cpu: <model>`; this reads them as the fields of today.
    fn upgrade_legacy(&mut self) {
        let (sha, state) = plain_sha(&self.git_sha);
        if let Some((source, dirty)) = state {
            self.git_sha = sha.to_string();
            self.git_source = source;
            self.git_dirty = dirty;
        }
        self.cpu = plain_device(&self.cpu).to_string();
    }

    /// This record, written after `earlier`. A record of the same run
    /// (another process of one cargo-nextest run) keeps what that process
    /// recorded: the earliest start, the GPU it used with its clocks, an
    /// interruption. A record of another run is simply replaced.
    pub fn after(&self, earlier: Option<&RunMeta>) -> RunMeta {
        match earlier {
            Some(e) if e.run_id == self.run_id => self.joined(e),
            _ => self.clone(),
        }
    }

    /// This record and `other`'s as one: the earlier start, the later
    /// finish, a GPU either used, any interruption, and a tree that is dirty
    /// (or unknown) if either was. Identity and options stay this record's.
    pub fn joined(&self, other: &RunMeta) -> RunMeta {
        let mut out = self.clone();
        if !other.started.is_empty() && (out.started.is_empty() || other.started < out.started) {
            out.started = other.started.clone();
        }
        out.finished = self.finished.clone().max(other.finished.clone());
        if out.gpu.is_none() && other.gpu.is_some() {
            out.gpu = other.gpu.clone();
            out.clocks = other.clocks.clone();
        }
        out.incomplete = match (&self.incomplete, &other.incomplete) {
            (Some(a), Some(b)) if a != b => Some(format!("{a}; {b}")),
            (a, b) => a.clone().or_else(|| b.clone()),
        };
        out.selected = self
            .selected
            .iter()
            .chain(&other.selected)
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        out.git_dirty = match (self.git_dirty, other.git_dirty) {
            (Some(a), Some(b)) => Some(a || b),
            (Some(true), None) | (None, Some(true)) => Some(true),
            _ => None,
        };
        out
    }

    /// The current UTC time in RFC 3339.
    pub fn now_rfc3339() -> String {
        OffsetDateTime::now_utc()
            .format(&Rfc3339)
            .unwrap_or_default()
    }
}

/// The current UTC time as `YYYYMMDDTHHMMSSZ`: sortable, and usable in a
/// file name.
pub fn compact_utc_now() -> String {
    let now = OffsetDateTime::now_utc();
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
    )
}

/// `nvidia-smi --query-gpu=<fields> --format=csv,noheader` on one line
/// (`one_line_per_host`), or "not read" when the tool is missing or fails.
pub fn nvidia_smi_query(fields: &str) -> String {
    Command::new("nvidia-smi")
        .args([&format!("--query-gpu={fields}"), "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| one_line_per_host(&String::from_utf8_lossy(&o.stdout)))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "not read".into())
}

/// nvidia-smi's answer, a line per GPU, as one line: the line itself where
/// every GPU gave the same (the driver version of a host), else each GPU's
/// prefixed with nvidia-smi's index, `GPU 0: ...; GPU 1: ...`.
fn one_line_per_host(out: &str) -> String {
    let lines: Vec<&str> = out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    match lines.first() {
        Some(first) if lines.iter().all(|l| l == first) => (*first).to_string(),
        _ => lines
            .iter()
            .enumerate()
            .map(|(i, l)| format!("GPU {i}: {l}"))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// The clock state the record keeps: SM and memory clocks and power draw.
pub fn read_clocks() -> String {
    nvidia_smi_query("clocks.sm,clocks.mem,power.draw")
}

/// The commit the binary was built from, recorded by `build.rs`.
const BUILD_GIT_SHA: &str = env!("FALSIFY_BUILD_GIT_SHA");

/// Whether the working directory is a checkout of `built`, and if so whether
/// it has uncommitted changes to tracked files. A checkout of another commit
/// (a copy of the tree with stale git metadata, as on the GPU machine) says
/// nothing about the binary, so then nothing is claimed.
fn git_tree_state(built: &str) -> (GitSource, Option<bool>) {
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if head.as_deref() != Some(built) {
        return (GitSource::BuildOnly, None);
    }
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| !o.stdout.is_empty());
    (GitSource::Checkout, dirty)
}

/// The commit of a `git_sha` cell, and the tree state an older report kept
/// in the same cell (`<sha>-dirty`, `<sha> (built)`), if it did.
pub fn plain_sha(cell: &str) -> (&str, Option<(GitSource, Option<bool>)>) {
    if let Some(sha) = cell.strip_suffix(" (built)") {
        return (sha, Some((GitSource::BuildOnly, None)));
    }
    if let Some(sha) = cell.strip_suffix("-dirty") {
        return (sha, Some((GitSource::Checkout, Some(true))));
    }
    (cell, None)
}

/// The model name of a `device` cell; older reports wrote `cpu: <model>`.
pub fn plain_device(cell: &str) -> &str {
    cell.strip_prefix("cpu: ").unwrap_or(cell)
}

/// The CPU's model name, e.g. `AMD EPYC 9454 48-Core Processor`.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| format!("unknown {} CPU", std::env::consts::ARCH))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host's GPUs answer a line each: one line where they agree, each
    /// GPU's labelled where they do not.
    #[test]
    fn nvidia_smi_lines_of_several_gpus_become_one_line() {
        assert_eq!(one_line_per_host("580.159.04\n580.159.04\n"), "580.159.04");
        assert_eq!(
            one_line_per_host("1980 MHz, 3201 MHz\n345 MHz, 3201 MHz\n"),
            "GPU 0: 1980 MHz, 3201 MHz; GPU 1: 345 MHz, 3201 MHz"
        );
        assert_eq!(one_line_per_host(" 1980 MHz \n"), "1980 MHz");
        assert_eq!(one_line_per_host(""), "");
    }

    #[test]
    fn run_json_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let mut meta = RunMeta::detect();
        meta.options.seed = 7;
        meta.gpu = Some(GpuMeta {
            name: "NVIDIA H200".into(),
            compute_capability: "9.0".into(),
            cuda_driver_version: "13.0".into(),
            nvidia_driver: "580.159.04".into(),
            sm_count: 132,
            total_memory_bytes: 1 << 30,
            device_count: Some(1),
        });
        meta.write_json(dir.path()).unwrap();
        assert_eq!(RunMeta::read_json(dir.path()).unwrap(), Some(meta));
        assert_eq!(RunMeta::read_json(&dir.path().join("none")).unwrap(), None);
    }

    /// Processes of one run keep what the others recorded; another run's
    /// record is replaced.
    #[test]
    fn a_record_of_the_same_run_keeps_the_gpu_and_the_earliest_start() {
        let mut first = RunMeta::detect();
        first.run_id = "run".into();
        first.started = "2026-01-01T00:00:01Z".into();
        first.gpu = Some(GpuMeta {
            name: "NVIDIA H200".into(),
            compute_capability: "9.0".into(),
            cuda_driver_version: "13.0".into(),
            nvidia_driver: "580".into(),
            sm_count: 132,
            total_memory_bytes: 1 << 30,
            device_count: Some(1),
        });
        first.clocks = "1980 MHz".into();
        let mut later = first.clone();
        later.started = "2026-01-01T00:00:09Z".into();
        later.gpu = None;
        later.clocks = "not read".into();
        later.incomplete = Some("interrupted".into());
        let joined = later.after(Some(&first));
        assert_eq!(joined.started, first.started);
        assert_eq!(joined.gpu, first.gpu);
        assert_eq!(joined.clocks, "1980 MHz");
        assert_eq!(joined.incomplete.as_deref(), Some("interrupted"));
        let mut other = first.clone();
        other.run_id = "another".into();
        assert_eq!(later.after(Some(&other)), later);
    }

    #[test]
    fn the_sha_is_the_build_commit_and_the_cpu_its_model_name() {
        let meta = RunMeta::detect();
        assert_eq!(meta.git_sha, BUILD_GIT_SHA);
        assert!(!meta.cpu.starts_with("cpu:"), "{}", meta.cpu);
    }

    #[test]
    fn an_older_record_reads_as_todays_fields() {
        let dir = tempfile::tempdir().unwrap();
        let old = r#"{"run_id": "r", "git_sha": "ca3b3dd9d71e (built)",
            "cpu": "cpu: Intel(R) Xeon(R) Processor",
            "options": {"seed": 0, "out_dir": "reports/latest",
              "gpu": "GpuOptions { ordinal: 0, forward_math: Tf32, backward_math: Fp32 }"}}"#;
        std::fs::write(dir.path().join(RUN_JSON), old).unwrap();
        let meta = RunMeta::read_json(dir.path()).unwrap().unwrap();
        assert_eq!(meta.git_sha, "ca3b3dd9d71e");
        assert_eq!(
            (meta.git_source, meta.git_dirty),
            (GitSource::BuildOnly, None)
        );
        assert_eq!(meta.cpu, "Intel(R) Xeon(R) Processor");
        assert_eq!(meta.subject, LEGACY_SUBJECT);
        assert_eq!(
            meta.options.key_values(),
            [
                "seed=0",
                "out_dir=reports/latest",
                "gpu.ordinal=0",
                "gpu.forward_math=Tf32",
                "gpu.backward_math=Fp32"
            ]
        );
        assert_eq!(
            plain_sha("bbbb33334444-dirty"),
            ("bbbb33334444", Some((GitSource::Checkout, Some(true))))
        );
        assert_eq!(plain_sha("aaaa11112222"), ("aaaa11112222", None));
    }
}

//! Facts about a run that every report row records, and the run record
//! (`run.json`) written beside the CSVs for the regression report.

use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::error::{Error, Result};
use qlora::gpu::DeviceFacts;

/// Name of the run record beside the CSVs.
pub const RUN_JSON: &str = "run.json";

/// Identity of one run, and what it ran on and with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    /// `YYYYMMDDTHHMMSSZ-pid`: sortable and unique per process.
    pub run_id: String,
    pub git_sha: String,
    /// The host CPU, recorded as the device of `cpu` rows.
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
}

impl GpuMeta {
    /// The record of an opened device; `nvidia_driver` is read from `nvidia-smi`.
    pub fn from_facts(facts: &DeviceFacts) -> Self {
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

impl RunMeta {
    /// Reads the clock, the git checkout and the CPU model.
    pub fn detect() -> Self {
        let now = OffsetDateTime::now_utc();
        let run_id = format!(
            "{:04}{:02}{:02}T{:02}{:02}{:02}Z-{}",
            now.year(),
            u8::from(now.month()),
            now.day(),
            now.hour(),
            now.minute(),
            now.second(),
            std::process::id()
        );
        RunMeta {
            run_id,
            git_sha: git_sha(),
            cpu: cpu_name(),
            started: Self::now_rfc3339(),
            finished: String::new(),
            gpu: None,
            clocks: "not read".into(),
            options: RecordedOptions::default(),
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

    /// Reads `dir/run.json`; `None` when there is none (an older report).
    pub fn read_json(dir: &Path) -> Result<Option<RunMeta>> {
        let path = dir.join(RUN_JSON);
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        serde_json::from_str(&text).map(Some).map_err(|e| {
            Error::io(
                &path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })
    }

    /// The current UTC time in RFC 3339.
    pub fn now_rfc3339() -> String {
        OffsetDateTime::now_utc()
            .format(&Rfc3339)
            .unwrap_or_default()
    }
}

/// `nvidia-smi --query-gpu=<fields> --format=csv,noheader`, trimmed, or
/// "not read" when the tool is missing or fails.
pub fn nvidia_smi_query(fields: &str) -> String {
    Command::new("nvidia-smi")
        .args([&format!("--query-gpu={fields}"), "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "not read".into())
}

/// The clock state the record keeps: SM and memory clocks and power draw.
pub fn read_clocks() -> String {
    nvidia_smi_query("clocks.sm,clocks.mem,power.draw")
}

/// The commit of the code that runs. The binary records the commit it was
/// built from; when the working directory is a checkout of that same commit,
/// `-dirty` is added if it has changes. A checkout of another commit (a copy
/// of the tree with stale git metadata, as on the GPU machine) says nothing
/// about the binary, so then the build commit is reported with "(built)".
fn git_sha() -> String {
    let built = env!("FALSIFY_BUILD_GIT_SHA");
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        Some(sha) if sha == built => {
            let dirty = Command::new("git")
                .args(["status", "--porcelain", "--untracked-files=no"])
                .output()
                .map(|o| !o.stdout.is_empty())
                .unwrap_or(false);
            if dirty {
                format!("{sha}-dirty")
            } else {
                sha
            }
        }
        _ => format!("{built} (built)"),
    }
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| format!("cpu: {}", s.trim()))
        })
        .unwrap_or_else(|| format!("cpu: {}", std::env::consts::ARCH))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        });
        meta.write_json(dir.path()).unwrap();
        assert_eq!(RunMeta::read_json(dir.path()).unwrap(), Some(meta));
        assert_eq!(RunMeta::read_json(&dir.path().join("none")).unwrap(), None);
    }
}

//! Facts about a run that every report row records.

use std::process::Command;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Identity of one run.
#[derive(Debug, Clone)]
pub struct RunMeta {
    /// `YYYYMMDDTHHMMSSZ-pid`: sortable and unique per process.
    pub run_id: String,
    pub git_sha: String,
    /// The host CPU, recorded as the device of `cpu` rows.
    pub cpu: String,
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
        }
    }

    /// The current UTC time in RFC 3339.
    pub fn now_rfc3339() -> String {
        OffsetDateTime::now_utc()
            .format(&Rfc3339)
            .unwrap_or_default()
    }
}

/// The checkout's commit (with `-dirty` when the tree has changes); where there
/// is no checkout (a staged binary on the GPU machine) the commit it was built from.
fn git_sha() -> String {
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        Some(sha) if !sha.is_empty() => {
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
        _ => format!("{} (built)", env!("FALSIFY_BUILD_GIT_SHA")),
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

//! Running a Python script this repository ships (a checker such as
//! `scripts/check-peft-adapter.py`, a peer such as
//! `scripts/peers/qwen2_lora_step.py`): finding out, when the trial runs,
//! whether python3 has what the script imports, and reading the one JSON
//! line the script prints last.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// The repository root (scripts and fixtures are read from it).
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// An error ([`Error::PeerAbsent`]: the trial is skipped) unless python3
/// finds every one of `packages`. The probe asks importlib where they are
/// without importing them (importing torch takes seconds); `purpose` ends
/// the reason ("needed to run PEFT").
pub(crate) fn require_python(packages: &[&str], purpose: &str) -> Result<()> {
    let list = packages
        .iter()
        .map(|p| format!("'{p}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let probe = format!(
        "import importlib.util as u, sys; \
         missing = [m for m in ({list},) if u.find_spec(m) is None]; \
         print(', '.join(missing)); sys.exit(1 if missing else 0)"
    );
    match Command::new("python3").args(["-c", &probe]).output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(Error::PeerAbsent(format!(
            "python3 lacks {} ({purpose})",
            String::from_utf8_lossy(&out.stdout).trim()
        ))),
        Err(e) => Err(Error::PeerAbsent(format!("no python3 ({purpose}): {e}"))),
    }
}

/// The last line of the script's stdout that starts with `{`, parsed; an
/// error naming the script, its exit status and its stderr otherwise.
pub(crate) fn last_json_line<T: DeserializeOwned>(
    op: &'static str,
    script: &str,
    output: &Output,
) -> Result<T> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|l| l.starts_with('{'));
    let parsed = last.and_then(|l| serde_json::from_str::<T>(l).ok());
    parsed.ok_or_else(|| {
        let stderr = String::from_utf8_lossy(&output.stderr);
        // The end of stderr holds the Python exception, if any.
        let tail: Vec<&str> = stderr.lines().rev().take(12).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Error::InvalidArgument {
            op,
            message: format!(
                "{script} gave no result ({}): {}",
                output.status,
                tail.join("\n").trim()
            ),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn output(stdout: &str, stderr: &str, code: i32) -> Output {
        Output {
            status: std::process::ExitStatus::from_raw(code << 8),
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
        }
    }

    #[derive(Debug, serde::Deserialize)]
    struct R {
        x: f64,
    }

    #[test]
    fn the_last_json_line_is_read_and_a_failure_names_the_script() {
        let ok = output("progress\n{\"x\": 1}\n{\"x\": 2.5}\n", "", 0);
        let r: R = last_json_line("t", "s.py", &ok).unwrap();
        assert_eq!(r.x, 2.5);
        let bad = output("nothing\n", "Traceback\nValueError: boom\n", 1);
        let e = last_json_line::<R>("t", "s.py", &bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s.py gave no result") && e.contains("ValueError: boom"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_package_is_a_peer_absent_error() {
        match require_python(&["no_such_package_for_falsify"], "needed for a test") {
            Err(Error::PeerAbsent(why)) => assert!(why.contains("needed for a test"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}

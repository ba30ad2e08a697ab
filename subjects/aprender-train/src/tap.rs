//! This process's stderr, read back while a session runs.
//!
//! aprender-train says only on stderr when it compiles a kernel, captures a
//! graph or leaves the GPU path (see [`crate::StderrWitness`]). A session
//! runs in a trial process of its own, so it points file descriptor 2 at a
//! temporary file for its lifetime, reads what was written there after each
//! step, and on drop points fd 2 back and copies everything to the real
//! stderr, so the harness still captures the process's full stderr.
//!
//! fd 2 is one per process: at most one tap exists at a time (one session
//! per process, see [`crate::Session`]); a second is refused.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

const STDERR: libc::c_int = 2;

/// Whether a tap holds fd 2 now.
static TAPPED: AtomicBool = AtomicBool::new(false);

/// fd 2, redirected to a temporary file until dropped.
pub struct StderrTap {
    file: File,
    saved: OwnedFd,
}

impl StderrTap {
    /// Points fd 2 at a new temporary file.
    pub fn start() -> Result<Self> {
        if TAPPED.swap(true, Ordering::SeqCst) {
            return Err(Error::Tap(
                "stderr is already tapped in this process".into(),
            ));
        }
        let started = Self::redirect();
        if started.is_err() {
            TAPPED.store(false, Ordering::SeqCst);
        }
        started
    }

    fn redirect() -> Result<Self> {
        let file = tempfile::tempfile().map_err(|e| Error::Tap(format!("temporary file: {e}")))?;
        // SAFETY: dup(2) duplicates a descriptor this process owns (fd 2 is
        // open for every process the harness starts); it touches no memory.
        let saved = unsafe { libc::dup(STDERR) };
        if saved < 0 {
            return Err(os_error("dup(2)"));
        }
        // SAFETY: `saved` was just returned by dup and is owned by nothing
        // else: the OwnedFd closes it exactly once.
        let saved = unsafe { OwnedFd::from_raw_fd(saved) };
        // SAFETY: dup2 makes fd 2 a copy of the file's open descriptor,
        // which stays open while `file` lives; it touches no memory.
        if unsafe { libc::dup2(file.as_raw_fd(), STDERR) } < 0 {
            return Err(os_error("dup2(file, 2)"));
        }
        Ok(Self { file, saved })
    }

    /// Everything written to stderr since the tap started. Read with
    /// `pread`: fd 2 shares the file's offset, which must stay where the
    /// writers left it.
    pub fn text(&self) -> Result<String> {
        let mut bytes = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let read = self
                .file
                .read_at(&mut chunk, bytes.len() as u64)
                .map_err(|e| Error::Tap(format!("reading the tapped stderr: {e}")))?;
            if read == 0 {
                break;
            }
            bytes.extend_from_slice(&chunk[..read]);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

impl Drop for StderrTap {
    fn drop(&mut self) {
        let text = self.text().unwrap_or_default();
        // SAFETY: dup2 makes fd 2 a copy of the saved original stderr,
        // still open (owned by `self.saved`); it touches no memory.
        let restored = unsafe { libc::dup2(self.saved.as_raw_fd(), STDERR) } >= 0;
        if restored {
            // Best effort: stderr is where an error would be reported.
            let _ = std::io::stderr().write_all(text.as_bytes());
        } else {
            log::warn!(
                "could not point stderr back: {}",
                os_error("dup2(saved, 2)")
            );
        }
        TAPPED.store(false, Ordering::SeqCst);
    }
}

fn os_error(call: &str) -> Error {
    Error::Tap(format!("{call}: {}", std::io::Error::last_os_error()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test touches fd 2, so no other test of this crate races it.
    #[test]
    fn what_goes_to_stderr_is_read_back_and_a_second_tap_is_refused() {
        let tap = StderrTap::start().unwrap();
        assert!(matches!(StderrTap::start(), Err(Error::Tap(_))));
        // Not `eprintln!`: the test harness captures that; the subject's
        // own `eprintln!` in a trial process goes to fd 2 like this.
        std::io::stderr()
            .write_all(b"[FWD-CACHE] Compiling 'x' (ptx_len=3)\n")
            .unwrap();
        // SAFETY: writes 4 bytes from a live buffer to fd 2.
        let written = unsafe { libc::write(STDERR, b"raw\n".as_ptr().cast(), 4) };
        assert_eq!(written, 4);
        assert_eq!(
            tap.text().unwrap(),
            "[FWD-CACHE] Compiling 'x' (ptx_len=3)\nraw\n"
        );
        drop(tap);
        let again = StderrTap::start().unwrap();
        drop(again);
    }
}

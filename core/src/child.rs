//! A child process of this executable, as the trial processes
//! (`run::isolate`) and the data-parallel ranks (`ranks`) run them: started
//! in a process group of its own with its request on stdin and its output
//! pipes drained, bound to die with its parent, polled, stopped with its
//! whole group, and its reply read from the line of its stdout that starts
//! with a marker.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::de::DeserializeOwned;

/// How often a parent looks at its running children.
pub const POLL: Duration = Duration::from_millis(10);

/// A started child and the threads feeding its stdin and draining its
/// stdout and stderr.
pub struct Piped {
    pub child: Child,
    stdin: Option<JoinHandle<()>>,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

impl Piped {
    /// Starts `cmd` with `input` on its stdin (written on a thread of its
    /// own, then closed: a request of any size, where one command-line
    /// argument is bounded), its stdout and stderr piped and drained, in a
    /// process group of its own, so stopping it stops whatever it started
    /// too (a grandchild holding the pipes open would otherwise keep the
    /// parent waiting), and a terminal's Ctrl-C reaches the parent only,
    /// which then stops the child itself.
    ///
    /// The child dies with this process, whatever ends it (SIGKILL
    /// included; see `die_with_parent`). On Linux the kernel sends that
    /// signal when the *thread* that started the child ends, so a `Piped`
    /// is waited for, or stopped, on the thread that started it: both
    /// users do (`run::isolate::run_in_child` starts, polls and reaps its
    /// trial process on one thread, `ranks::launch` its ranks).
    pub fn start(cmd: &mut Command, input: Vec<u8>) -> std::io::Result<Piped> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        own_process_group(cmd);
        die_with_parent(cmd);
        let mut child = cmd.spawn()?;
        let stdin = feed(child.stdin.take(), input);
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        Ok(Piped {
            child,
            stdin,
            stdout,
            stderr,
        })
    }

    /// Kills the child's whole process group, then the child, and reaps it.
    pub fn stop(&mut self) {
        kill_group(&self.child);
        // Best effort: a child that already exited cannot be killed, and
        // `wait` then reaps it all the same.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// What the child wrote to stdout and stderr, once it has exited.
    pub fn output(self) -> (String, String) {
        // The writer ends once the child has read its input or is gone
        // (its pipe then breaks); how it ended changes nothing here.
        if let Some(h) = self.stdin {
            let _ = h.join();
        }
        (join(self.stdout), join(self.stderr))
    }
}

/// The reply on the last line of `out` that starts with `marker`, parsed;
/// `None` when no line does.
pub fn marked_reply<T: DeserializeOwned>(out: &str, marker: &str) -> Option<serde_json::Result<T>> {
    out.lines()
        .rev()
        .find_map(|l| l.strip_prefix(marker))
        .map(serde_json::from_str::<T>)
}

/// Makes the child die with this process: the kernel sends it SIGKILL
/// when the thread that started it ends, however this process ends
/// (SIGKILL, a crash, an exit). A parent that died between the fork and
/// this hook would never send that signal, so the child then refuses to
/// start. Elsewhere than Linux, a child outlives a parent killed with
/// SIGKILL.
#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    let hook = move || {
        let (signal, unused): (libc::c_ulong, libc::c_ulong) = (libc::SIGKILL as _, 0);
        // SAFETY: prctl(PR_SET_PDEATHSIG) changes a flag of the calling
        // process only; its arguments are plain integers.
        let armed = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal, unused, unused, unused) };
        if armed != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: getppid(2) cannot fail and touches no memory.
        let ppid = unsafe { libc::getppid() };
        if u32::try_from(ppid).ok() != Some(parent) {
            // Re-parented already: the parent is gone.
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook runs in the child between fork and exec, where only
    // async-signal-safe work is sound: it makes two system calls and builds
    // an error from an errno, allocating nothing and taking no lock.
    unsafe { cmd.pre_exec(hook) };
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}

#[cfg(unix)]
fn own_process_group(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
}

#[cfg(not(unix))]
fn own_process_group(_cmd: &mut Command) {}

/// Kills the child's whole process group.
#[cfg(unix)]
fn kill_group(child: &Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) with a negative pid signals the process group the
        // child leads (it was started with process_group(0)); it touches no
        // memory of this process. An error (the group is gone) is harmless.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
}

#[cfg(not(unix))]
fn kill_group(_child: &Child) {}

/// The most bytes of a child's stderr an error quotes.
pub const STDERR_TAIL: usize = 600;

/// Writes `input` to the child's stdin on a thread of its own and closes
/// it, so a child that reads slowly never blocks the parent. A child that
/// exits without reading it all breaks the pipe, which ends the writer.
fn feed(pipe: Option<ChildStdin>, input: Vec<u8>) -> Option<JoinHandle<()>> {
    pipe.map(|mut p| {
        std::thread::spawn(move || {
            // A broken pipe: the child did not want (all of) it, and its
            // exit, not this write, says what went wrong.
            let _ = p.write_all(&input);
        })
    })
}

/// Reads a pipe to its end on a thread of its own, so a child that writes a
/// lot never blocks on a full pipe while the parent waits.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> Option<JoinHandle<Vec<u8>>> {
    pipe.map(|mut p| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            // A read error ends the capture; what was read is still used.
            let _ = p.read_to_end(&mut buf);
            buf
        })
    })
}

/// What a drained pipe held, as text.
fn join(handle: Option<JoinHandle<Vec<u8>>>) -> String {
    let bytes = handle.and_then(|h| h.join().ok()).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `; stderr: ...` with the last [`STDERR_TAIL`] bytes of a child's stderr
/// (lines joined by ` | `), or nothing.
pub fn tail(stderr: &str) -> String {
    let text = stderr.trim();
    if text.is_empty() {
        return String::new();
    }
    let start = text
        .char_indices()
        .map(|(i, _)| i)
        .find(|&i| text.len() - i <= STDERR_TAIL)
        .unwrap_or(0);
    format!("; stderr: {}", text[start..].replace('\n', " | "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_tails_keep_the_end_on_one_line() {
        assert_eq!(tail("  \n"), "");
        let long = format!("{}\nlast line", "x".repeat(2000));
        let t = tail(&long);
        assert!(
            t.starts_with("; stderr: ") && t.ends_with("| last line"),
            "{t}"
        );
        assert!(t.len() <= STDERR_TAIL + 20);
    }
}

//! A child process's output pipes, read to their end: shared by the trial
//! processes (`run::isolate`) and the data-parallel ranks (`ranks`).

use std::io::Read;
use std::thread::JoinHandle;

/// The most bytes of a child's stderr an error quotes.
pub const STDERR_TAIL: usize = 600;

/// Reads a pipe to its end on a thread of its own, so a child that writes a
/// lot never blocks on a full pipe while the parent waits.
pub fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> Option<JoinHandle<Vec<u8>>> {
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
pub fn join(handle: Option<JoinHandle<Vec<u8>>>) -> String {
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

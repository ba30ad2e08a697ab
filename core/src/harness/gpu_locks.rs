//! One lock per GPU between the trial processes of a machine, so that no
//! process works on a GPU while a trial times it.
//!
//! A trial that times its GPU (the `gpu` test group) holds that GPU's lock
//! exclusively for as long as its process lives; one that spans the whole
//! host holds every GPU's. A trial that only shares a GPU (`gpu-shared`:
//! parity, gradients, trajectories) holds its GPU's lock shared, and an
//! untimed data-parallel trial (`gpu-ranks`) every GPU's, since its ranks
//! run on all of them. The test groups' priorities decide the order in
//! which cargo-nextest starts the trials; the locks make that order a
//! matter of speed only: a timed trial started while shared ones still run
//! on its GPU waits for them, in any run, filtered, partitioned or beside
//! another run on the same machine.
//!
//! The locks are `flock` locks on one file per GPU (the file named by the
//! GPU's UUID, so every process of the machine agrees on it whatever its
//! `CUDA_VISIBLE_DEVICES`) in the machine's temporary folder. The kernel
//! releases them when the process ends, however it ends. A process takes
//! its locks in the order of their names, so two processes that each want
//! several never wait for each other in a cycle. A tool of one's own that
//! must not run beside a timed trial (a benchmark, a profiler) can take the
//! same locks with [`acquire`].

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How a trial uses the GPUs it locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Beside other sharing trials: it times nothing.
    Shared,
    /// Alone: it times the GPU, or fills its memory.
    Exclusive,
}

/// Locks held until this value is dropped (in the harness: the process's
/// end).
#[derive(Debug)]
#[must_use = "the locks are released when this is dropped"]
pub struct Held {
    _files: Vec<File>,
}

/// The folder of the lock files, shared by every process of the machine.
pub fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("falsify-gpu-locks")
}

/// The lock file's name for the CUDA device `ordinal` of this process: the
/// GPU's UUID where the driver gives it, else the ordinal (no driver: no
/// GPU work to keep apart, but the same rule).
pub fn gpu_name(ordinal: usize) -> String {
    let uuid = crate::run::driver_present()
        .then(|| {
            let ordinal = i32::try_from(ordinal).ok()?;
            cudarc::driver::result::init().ok()?;
            let device = cudarc::driver::result::device::get(ordinal).ok()?;
            cudarc::driver::result::device::get_uuid(device).ok()
        })
        .flatten();
    match uuid {
        Some(u) => {
            let hex: String = u
                .bytes
                .iter()
                .map(|b| format!("{:02x}", *b as u8))
                .collect();
            format!("gpu-{hex}")
        }
        None => format!("ordinal-{ordinal}"),
    }
}

/// Takes the lock of each GPU in `gpus` (lock file names, as
/// [`gpu_name`] gives them) in the folder `dir`, waiting as long as
/// another process holds one in a way `access` cannot share. Returns the
/// held locks and how long it waited.
pub fn acquire(dir: &Path, gpus: &[String], access: Access) -> crate::Result<(Held, Duration)> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| crate::Error::Io { path, source }
    };
    make_shared_dir(dir).map_err(io(dir))?;
    let mut names = gpus.to_vec();
    names.sort();
    names.dedup();
    let started = Instant::now();
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let path = dir.join(format!("{name}.lock"));
        let file = open_lock_file(&path).map_err(io(&path))?;
        match access {
            Access::Shared => file.lock_shared(),
            Access::Exclusive => file.lock(),
        }
        .map_err(io(&path))?;
        files.push(file);
    }
    Ok((Held { _files: files }, started.elapsed()))
}

/// Creates the lock folder where it is missing, writable by every user of
/// the machine (and, like `/tmp`, sticky: only a file's owner removes it),
/// so that the trials of every user of a shared runner see one lock per GPU.
fn make_shared_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // Another user may have made it in the meantime: theirs is as good.
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
    }
    Ok(())
}

/// Opens a lock file, creating it where it is missing. `flock` needs no
/// write access, so another user's lock file opens read-only.
fn open_lock_file(path: &Path) -> std::io::Result<File> {
    match File::open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path),
        opened => opened,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::TryLockError;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Whether another process (here: another open file, which `flock`
    /// treats alike) could take `name`'s lock exclusively right now.
    fn free(dir: &Path, name: &str) -> bool {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{name}.lock")))
            .expect("the lock file opens");
        match file.try_lock() {
            Ok(()) => true,
            Err(TryLockError::WouldBlock) => false,
            Err(TryLockError::Error(e)) => panic!("{e}"),
        }
    }

    #[test]
    fn shared_holders_share_and_an_exclusive_one_waits_for_them() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let (first, _) = acquire(dir.path(), &names(&["gpu-a"]), Access::Shared).expect("lock");
        let (second, waited) =
            acquire(dir.path(), &names(&["gpu-a"]), Access::Shared).expect("lock");
        assert!(waited < Duration::from_millis(200), "{waited:?}");
        assert!(!free(dir.path(), "gpu-a"));
        assert!(free(dir.path(), "gpu-b"));
        let path = dir.path().to_path_buf();
        let timed = std::thread::spawn(move || {
            acquire(&path, &names(&["gpu-a"]), Access::Exclusive).expect("lock")
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!timed.is_finished(), "the exclusive lock did not wait");
        drop(first);
        drop(second);
        let (held, waited) = timed.join().expect("the timed holder returns");
        assert!(waited >= Duration::from_millis(250), "{waited:?}");
        assert!(!free(dir.path(), "gpu-a"));
        drop(held);
        assert!(free(dir.path(), "gpu-a"));
    }

    #[cfg(unix)]
    #[test]
    fn the_lock_folder_it_makes_is_every_users() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().expect("a temporary folder");
        let dir = root.path().join("falsify-gpu-locks");
        let (_held, _) = acquire(&dir, &names(&["gpu-a"]), Access::Shared).expect("lock");
        let mode = std::fs::metadata(&dir)
            .expect("the folder")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o1777, "{mode:o}");
    }

    #[test]
    fn an_exclusive_holder_keeps_every_gpu_it_names_and_no_other() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let all = names(&["gpu-b", "gpu-a", "gpu-b"]);
        let (held, _) = acquire(dir.path(), &all, Access::Exclusive).expect("lock");
        assert!(!free(dir.path(), "gpu-a"));
        assert!(!free(dir.path(), "gpu-b"));
        assert!(free(dir.path(), "gpu-c"));
        drop(held);
        assert!(free(dir.path(), "gpu-a") && free(dir.path(), "gpu-b"));
    }
}

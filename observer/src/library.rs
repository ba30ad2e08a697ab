//! Finding libcupti before cudarc's loader, which panics where it is absent.
//!
//! cudarc opens CUPTI by name only (`libcupti.so`, `libcupti.so.13`, ...:
//! `cudarc::get_lib_name_candidates("cupti")`), which the dynamic loader finds
//! only on its search path. A CUDA toolkit keeps CUPTI in
//! `extras/CUPTI/lib64`, which is usually not on it. So: first cudarc's names
//! as they are; then the toolkit's folders, by full path: under `CUDA_HOME`
//! and `CUDA_PATH` (the toolkit's standard variables, which cudarc's build
//! reads too), `/usr/local/cuda`, `/usr/local/cuda-*` (newest first) and
//! `/opt/cuda`. A library loaded by full path then answers cudarc's names:
//! the dynamic loader returns an already loaded library whose soname is the
//! name asked for (glibc's `_dl_map_object`), so cudarc's loader finds it.

use std::path::{Path, PathBuf};

use crate::error::ObserverError;

/// The CUPTI library the observer uses, kept loaded for its lifetime.
#[derive(Debug)]
pub struct CuptiLibrary {
    /// The file the process mapped, where the platform tells it
    /// (`/proc/self/maps`); else what it was opened as.
    pub path: PathBuf,
    /// The name or path it was opened by.
    pub opened_as: String,
    _library: libloading::Library,
}

/// Folders of a toolkit that may hold libcupti, relative to its root.
const TOOLKIT_FOLDERS: [&str; 6] = [
    "extras/CUPTI/lib64",
    "extras/CUPTI/lib",
    "lib64",
    "lib",
    "targets/x86_64-linux/lib",
    "targets/sbsa-linux/lib",
];

fn open(name: &str) -> Option<libloading::Library> {
    // SAFETY: loading CUPTI runs its initialisers, which have no
    // preconditions on the caller (cudarc loads it the same way).
    unsafe { libloading::Library::new(name) }.ok()
}

/// Whether the CUDA driver library loads here, by cudarc's names for it.
/// What loads stays loaded for the life of the process: cudarc's own loader
/// then finds the library mapped already. cudarc's `is_culib_present` drops
/// its handle, which unmaps the library, so the first driver call maps and
/// relocates it all over again.
pub fn driver_present() -> bool {
    ["cuda", "nvcuda"]
        .iter()
        .flat_map(|name| cudarc::get_lib_name_candidates(name))
        .find_map(|name| open(&name))
        // Forgetting the handle keeps the library mapped; cudarc holds its
        // own handle to it for the life of the process anyway.
        .map(std::mem::forget)
        .is_some()
}

fn open_first(names: &[String]) -> Option<(libloading::Library, String)> {
    names
        .iter()
        .find_map(|name| open(name).map(|lib| (lib, name.clone())))
}

/// The roots of the CUDA toolkits on this machine, most specific first.
fn toolkit_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    let mut versioned: Vec<PathBuf> = std::fs::read_dir("/usr/local")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("cuda-"))
        })
        .collect();
    versioned.sort();
    roots.extend(versioned.into_iter().rev());
    roots.push(PathBuf::from("/opt/cuda"));
    roots.dedup();
    roots
}

/// The `libcupti.so*` files in `folder`, shortest name first (the
/// unversioned link before the versioned files).
fn cupti_files(folder: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libcupti.so"))
        })
        .collect();
    files.sort_by_key(|p| (p.as_os_str().len(), p.clone()));
    files
}

/// Where the process mapped a library whose file name contains `needle`.
fn mapped_path(needle: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().contains(needle))
        })
        .map(PathBuf::from)
}

fn found(library: libloading::Library, opened_as: String) -> CuptiLibrary {
    CuptiLibrary {
        path: mapped_path("libcupti").unwrap_or_else(|| PathBuf::from(&opened_as)),
        opened_as,
        _library: library,
    }
}

impl CuptiLibrary {
    /// Loads CUPTI as [`DriverObserver::attach`](crate::DriverObserver::attach)
    /// would, without subscribing: whether an observer can attach in this
    /// process's environment (the error is the reason to skip a trial that
    /// needs one, e.g. `CUPTI not found (tried ...)`).
    pub fn probe() -> Result<CuptiLibrary, ObserverError> {
        load()
    }
}

/// Loads CUPTI so that cudarc's loader finds it; the error says everything
/// that was tried.
pub(crate) fn load() -> Result<CuptiLibrary, ObserverError> {
    let mut names = cudarc::get_lib_name_candidates("cupti");
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    if let Some((library, name)) = open_first(&names) {
        return Ok(found(library, name));
    }
    let mut tried = names.clone();
    for root in toolkit_roots() {
        for folder in TOOLKIT_FOLDERS.iter().map(|f| root.join(f)) {
            if !folder.is_dir() {
                continue;
            }
            tried.push(folder.display().to_string());
            for file in cupti_files(&folder) {
                let path = file.display().to_string();
                let Some(library) = open(&path) else {
                    continue;
                };
                // cudarc opens it by name: one of its names must now reach it.
                return match open_first(&names) {
                    Some(_) => Ok(found(library, path)),
                    None => Err(ObserverError::CuptiNotByName {
                        path,
                        names: names.join(", "),
                    }),
                };
            }
        }
    }
    if tried.len() == names.len() {
        tried.push(
            "no CUDA toolkit under $CUDA_HOME, $CUDA_PATH, /usr/local/cuda*, /opt/cuda".into(),
        );
    }
    Err(ObserverError::CuptiNotFound { tried })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_cupti_is_an_error_that_says_what_was_tried() {
        // This machine has no CUDA toolkit; where one is installed CUPTI is
        // found instead, which the GPU smoke example covers.
        match load() {
            Err(ObserverError::CuptiNotFound { tried }) => {
                assert!(tried.iter().any(|t| t.starts_with("libcupti")), "{tried:?}");
                let unique: std::collections::HashSet<&String> = tried.iter().collect();
                assert_eq!(unique.len(), tried.len(), "{tried:?}");
                let message = ObserverError::CuptiNotFound { tried }.to_string();
                assert!(
                    message.starts_with("CUPTI not found (tried libcupti"),
                    "{message}"
                );
            }
            Err(other) => panic!("unexpected error: {other}"),
            Ok(library) => assert!(library.path.to_string_lossy().contains("cupti")),
        }
    }

    #[test]
    fn cupti_files_put_the_plain_name_first() {
        let dir = std::env::temp_dir().join(format!("falsify-observer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "libcupti.so.2025.3.1",
            "libcupti.so",
            "libcupti.so.13",
            "libother.so",
        ] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let names: Vec<String> = cupti_files(&dir)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            names,
            ["libcupti.so", "libcupti.so.13", "libcupti.so.2025.3.1"]
        );
    }
}

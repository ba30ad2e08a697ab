//! Which entries of a contract directory are contracts.
//!
//! Rules:
//! - Every regular file named `*.yaml` anywhere under the directory is a
//!   contract: the walk descends into subdirectories. A symbolic link to a
//!   regular file counts as that file.
//! - The result is sorted by path, component by component (so each
//!   directory's files stay together), which is the trial order.
//! - Other regular files (`README.md`, `.gitkeep`) are not contracts and are
//!   ignored.
//! - Anything else that could hide a contract is refused with an error that
//!   names it, never skipped: a file named `*.yml` (or `*.YAML`, any other
//!   case), a directory named `*.yaml`, a FIFO, socket or device, a symbolic
//!   link whose target cannot be read (dangling, or a loop), and a symbolic
//!   link to a directory (not followed: links can form cycles or lead far
//!   outside the tree).
//!
//! An entry refused here is never opened, so a FIFO cannot block the load.
//! Its error has line 0: there is no line to give.

use std::fs::FileType;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// What one directory entry is, for discovery.
pub(super) enum Kind {
    /// A regular file named `*.yaml` (or a link to one).
    Contract,
    /// A real directory, to be walked.
    Directory,
    /// A regular file that is not a contract (`README.md`).
    Ignored,
    /// Something that could hide a contract; the reason, for the error.
    Refused(String),
}

/// Classifies `path` without opening it. Only a failure to read the entry
/// itself (it vanished, no permission) is an I/O error.
pub(super) fn classify(path: &Path) -> Result<Kind> {
    let entry = std::fs::symlink_metadata(path).map_err(|e| Error::io(path, e))?;
    if !entry.file_type().is_symlink() {
        return Ok(classify_type(path, entry.file_type()));
    }
    Ok(match std::fs::metadata(path) {
        Err(e) => Kind::Refused(format!(
            "a symbolic link whose target cannot be read ({e}); a contract directory holds \
             regular files named `*.yaml`, or links to them"
        )),
        Ok(target) if target.is_dir() => Kind::Refused(
            "a symbolic link to a directory; discovery does not follow links to directories \
             (they can form cycles): put the contracts in a real subdirectory"
                .to_string(),
        ),
        Ok(target) => classify_type(path, target.file_type()),
    })
}

/// How a contract file is named, judged by the extension alone.
#[derive(PartialEq)]
enum Name {
    /// `*.yaml`.
    Contract,
    /// `*.yml`, or `yaml` in another case: meant as a contract, not read as one.
    Lookalike,
    Other,
}

fn name_of(path: &Path) -> Name {
    match path.extension().and_then(|e| e.to_str()) {
        Some("yaml") => Name::Contract,
        Some(e) if e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml") => {
            Name::Lookalike
        }
        _ => Name::Other,
    }
}

fn classify_type(path: &Path, file_type: FileType) -> Kind {
    let name = name_of(path);
    if file_type.is_dir() {
        if name == Name::Other {
            return Kind::Directory;
        }
        return Kind::Refused(
            "a directory named like a contract file; contract files are regular files \
             named `*.yaml`: rename the directory"
                .to_string(),
        );
    }
    if !file_type.is_file() {
        return Kind::Refused(
            "not a regular file (a FIFO, socket or device); contract files are regular \
             files named `*.yaml`"
                .to_string(),
        );
    }
    match name {
        Name::Contract => Kind::Contract,
        Name::Lookalike => Kind::Refused(format!(
            "contract files are named `*.yaml` (lower case; `.yml` is not read): rename \
             this file to `{}.yaml`",
            path.file_stem()
                .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
        )),
        Name::Other => Kind::Ignored,
    }
}

/// Every contract file and every refused entry under `dir`, sorted by path:
/// `None` for a contract, the error for a refused entry. An unreadable root
/// is the error; an unreadable directory inside the tree is one entry's error
/// and does not stop the walk.
pub(super) fn walk(root: &Path) -> Result<Vec<(PathBuf, Option<Error>)>> {
    let (mut found, mut pending) = (Vec::new(), Vec::new());
    sort_out(list(root)?, &mut found, &mut pending);
    while let Some(dir) = pending.pop() {
        match list(&dir) {
            Ok(paths) => sort_out(paths, &mut found, &mut pending),
            Err(e) => found.push((dir, Some(e))),
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

/// The paths of the entries of `dir`.
fn list(dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .map(|entry| entry.map(|e| e.path()).map_err(|e| Error::io(dir, e)))
        .collect()
}

/// Files `paths` as contracts, refusals or directories still to walk.
fn sort_out(
    paths: Vec<PathBuf>,
    found: &mut Vec<(PathBuf, Option<Error>)>,
    pending: &mut Vec<PathBuf>,
) {
    for path in paths {
        match classify(&path) {
            Ok(Kind::Contract) => found.push((path, None)),
            Ok(Kind::Directory) => pending.push(path),
            Ok(Kind::Ignored) => {}
            Ok(Kind::Refused(reason)) => {
                let e = refused(&path, &reason);
                found.push((path, Some(e)));
            }
            Err(e) => found.push((path, Some(e))),
        }
    }
}

/// The error for an entry discovery refuses: located at the path alone.
pub(super) fn refused(path: &Path, reason: &str) -> Error {
    Error::Contract {
        path: path.to_path_buf(),
        line: 0,
        column: 0,
        message: reason.to_string(),
    }
}

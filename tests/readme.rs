//! The README's commands run as written.
//!
//! Every `cargo run --release -- ...` line of the README's `sh` blocks runs
//! here through the built `falsify` binary, in order, in a scratch copy of
//! the project's contracts and baselines, and must exit as the README says (0,
//! unless its comment says "exits N"). Every `cargo test --test contracts --
//! FILTER` line must select at least one trial. Lines for the GPU machine are
//! left to it.

use std::path::{Path, PathBuf};
use std::process::Command;

use falsify_core::contract::load_dir;
use falsify_core::run::plan;
use falsify_qlora::Qlora;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The lines of the README's ```sh blocks, comments kept.
fn sh_lines() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let mut lines = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("```") {
            inside = line.trim() == "```sh";
            continue;
        }
        if inside {
            lines.push(line.to_string());
        }
    }
    lines
}

/// The command part of a line and the exit code its comment states.
fn split(line: &str) -> (Vec<String>, i32) {
    let (command, comment) = line.split_once('#').unwrap_or((line, ""));
    let expected = comment
        .split_once("exits ")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    (
        command.split_whitespace().map(str::to_string).collect(),
        expected,
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

#[test]
fn the_readme_commands_run_as_written() {
    let scratch = tempfile::tempdir().expect("tempdir");
    copy_dir(&root().join("contracts"), &scratch.path().join("contracts"));
    copy_dir(
        &root().join("examples/contracts"),
        &scratch.path().join("examples/contracts"),
    );
    copy_dir(
        &root().join("reports/baseline"),
        &scratch.path().join("reports/baseline"),
    );
    let trials =
        plan::<Qlora>(load_dir::<Qlora>(&root().join("contracts")).expect("the contracts load"));
    let mut ran = 0;
    for line in sh_lines() {
        let (words, expected) = split(&line);
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        match words.as_slice() {
            ["cargo", "run", "--release", "--", args @ ..] => {
                let out = Command::new(env!("CARGO_BIN_EXE_falsify"))
                    .args(args.iter().map(|a| a.replace("/tmp/", "scratch-tmp/")))
                    .current_dir(scratch.path())
                    .output()
                    .expect("falsify runs");
                assert_eq!(
                    out.status.code(),
                    Some(expected),
                    "`{line}` exited {:?}\nstdout: {}\nstderr: {}",
                    out.status.code(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                ran += 1;
            }
            ["cargo", "test", "--test", "contracts", "--", filter, ..]
                if !filter.starts_with("--") =>
            {
                assert!(
                    trials.iter().any(|t| t.name.contains(filter)),
                    "`{line}`: the filter `{filter}` selects no trial"
                );
            }
            _ => {}
        }
    }
    assert!(ran >= 6, "only {ran} README commands found");
}

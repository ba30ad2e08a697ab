//! Property tests of the contract loader against hostile text.
//!
//! Property: for any input the loader returns, without panicking, either a
//! contract or an `Error::Contract` that names the file and a line within it
//! (`1..=lines + 1`; the one whole-file error without a line, the size cap,
//! cannot occur at these sizes).
//!
//! Inputs: (a) arbitrary bytes, through the byte path (`load_file`, which
//! also decodes UTF-8); (b) token soup built from YAML's own punctuation;
//! (c) structured mutations of valid contracts (the embedded seed and every
//! file in `contracts/`): delete, duplicate or swap lines, replace a scalar
//! with a hostile token, insert arbitrary characters or bytes; (d) arbitrary
//! test ids, where the property is also that an id the loader accepts is in
//! the safe set (at most 100 characters), and that a safe id is refused only
//! when another test has it, in any case.
//!
//! Runs are seeded, so a failure reproduces. The default case counts keep the
//! file at a few seconds in CI. For a longer run:
//!
//! ```text
//! PROPTEST_CASES=100000 cargo test --release --test loader_fuzz
//! FUZZ_SEED=7 PROPTEST_CASES=100000 cargo test --release --test loader_fuzz  # other inputs
//! ```

use std::path::{Path, PathBuf};

use falsify_core::contract::{discover, load_file, parse};
use falsify_core::Error;
use falsify_qlora::Qlora;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// A valid contract touching every part of the schema the loader parses.
const SEED: &str = r#"metadata:
  id: fuzz-seed
  version: 1.0.0
  description: >
    Seed for the loader fuzz tests: equations, obligations and nested
    check parameters, all valid.
  references:
    - "a reference"
requires: []
equations:
  softmax:
    formula: "y_i = exp(x_i) / sum_j exp(x_j)"
    domain: "x in R^n"
    invariants: ["sum y = 1"]
proof_obligations:
  - type: invariant
    property: rows sum to one
    tolerance: 1.0e-12
falsification_tests:
  - id: F-FUZZ-001
    rule: Rows sum to one
    prediction: within 1e-12
    if_fails: no max subtraction
    mutant: softmax_without_max_subtraction
    check:
      kind: property
      property: softmax_rows_sum_to_one
      cases: 8
      tolerance: 1.0e-12
  - id: F-FUZZ-002
    rule: Clipping modes differ
    prediction: the losses agree within 0.1
    if_fails: per-layer clipping
    mutant: clip_per_layer
    check:
      kind: trajectory_match
      model: tiny
      steps: 4
      checkpoints: [2, 4]
      baseline: { clip: global }
      candidate: { clip: per_layer, graph: false }
      max_abs_diff: 0.1
      hyper: { lr: 1.0e-3 }
  - id: F-FUZZ-003
    rule: The reference backward matches finite differences
    prediction: rel error <= 1e-6
    if_fails: a missing term
    requires: []
    mutant: softmax_backward_missing_dot
    check:
      kind: gradient_check
      op: softmax
      shapes:
        - { rows: 2, seq: 3 }
      tolerance: 1.0e-6
"#;

/// Tokens that stress YAML's grammar and the schema's number rules.
const TOKENS: &[&str] = &[
    "",
    " ",
    "~",
    "null",
    "true",
    "-1",
    "0",
    "1.5",
    ".nan",
    ".inf",
    "-.inf",
    "1e999",
    "-1e400",
    "1e-400",
    "4.9e-324",
    "0x1ffffffffffffffffffff",
    "99999999999999999999999",
    "=HYPERLINK(\"x\")",
    "a::b",
    "0x1F",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ": ",
    "- ",
    "-",
    "? ",
    "&a ",
    "*a",
    "*b",
    "&a [x, *a]",
    "!!str",
    "!!binary",
    "!tag",
    "'",
    "\"",
    "'unclosed",
    "\"unclosed",
    "|",
    ">",
    "|-",
    "#",
    "# comment",
    "---",
    "...",
    "\t",
    "\n",
    "\r\n",
    "<<",
    "%YAML 1.2",
    "%TAG ! x",
    "@",
    "`",
    "\u{feff}",
    "\u{0}",
    "\u{85}",
    "\u{2028}",
    "é",
    "😀",
    "kind: property",
    "kind",
    "id",
    "metadata",
    "falsification_tests",
    "check",
    "mutant",
];

/// Case count: `PROPTEST_CASES` if set (env vars are fine in tests), else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A runner with a fixed seed (`FUZZ_SEED` picks another one).
fn runner(default_cases: u32, salt: u8) -> TestRunner {
    let seed = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse::<u8>().ok())
        .unwrap_or(0);
    let mut key = [0u8; 32];
    key[0] = salt;
    key[1] = seed;
    let config = Config {
        cases: cases(default_cases),
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key))
}

/// The property: no panic (the runner catches one and shrinks the input),
/// and any error is a located contract error on `path`.
fn check_outcome(
    path: &Path,
    lines: usize,
    result: falsify_core::Result<falsify_core::contract::ContractOf<Qlora>>,
) -> Result<(), TestCaseError> {
    match result {
        Ok(_) => Ok(()),
        Err(Error::Contract { path: p, line, .. }) => {
            prop_assert_eq!(&p, path);
            prop_assert!(
                (1..=lines + 1).contains(&line),
                "line {} outside 1..={}",
                line,
                lines + 1
            );
            Ok(())
        }
        Err(other) => Err(TestCaseError::fail(format!(
            "not a contract error: {other:?}"
        ))),
    }
}

/// Lines as YAML counts them: `\r\n`, `\r` and `\n` each end a line, and so
/// (in YAML 1.1, which libyaml follows) do NEL, LS and PS. This is at least
/// the `\n` count the loader's own line lookups use.
fn line_count(bytes: &[u8]) -> usize {
    let mut lines = 1;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i..] {
            [b'\r', b'\n', ..] => {
                lines += 1;
                i += 1;
            }
            [b'\r' | b'\n', ..] | [0xC2, 0x85, ..] | [0xE2, 0x80, 0xA8 | 0xA9, ..] => lines += 1,
            _ => {}
        }
        i += 1;
    }
    lines
}

/// Parses `text` as if read from `contracts/{stem}.yaml`.
fn check_text(stem: &str, text: &str) -> Result<(), TestCaseError> {
    let path = PathBuf::from(format!("contracts/{stem}.yaml"));
    check_outcome(
        &path,
        line_count(text.as_bytes()),
        parse::<Qlora>(&path, text),
    )
}

/// Writes `bytes` to `{dir}/{stem}.yaml` and loads it through the byte path.
fn check_bytes(dir: &Path, stem: &str, bytes: &[u8]) -> Result<(), TestCaseError> {
    let path = dir.join(format!("{stem}.yaml"));
    std::fs::write(&path, bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    check_outcome(&path, line_count(bytes), load_file::<Qlora>(&path))
}

/// The seed contracts: the embedded one and every shipped one (found as the
/// harness finds them), as (stem, text).
fn seeds() -> Vec<(String, String)> {
    let mut seeds = vec![("fuzz-seed".to_string(), SEED.to_string())];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts");
    if let Ok(paths) = discover(&dir) {
        for p in paths {
            let stem = p.file_stem().and_then(|s| s.to_str()).map(str::to_string);
            if let (Some(stem), Ok(text)) = (stem, std::fs::read_to_string(&p)) {
                seeds.push((stem, text));
            }
        }
    }
    seeds
}

/// One structured edit of a contract's lines.
#[derive(Debug, Clone)]
enum Edit {
    Delete(Index),
    Duplicate(Index),
    Swap(Index, Index),
    /// Replace the value after `key:` (or the whole line) with a token.
    ReplaceScalar(Index, String),
    /// Insert text at a character position of the whole file.
    Insert(Index, String),
    /// Re-indent a line by a number of spaces (-3..=3).
    Indent(Index, i8),
}

fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(TOKENS).prop_map(str::to_string),
        1 => "\\PC{0,6}",
        1 => proptest::collection::vec(any::<char>(), 0..4).prop_map(|c| c.into_iter().collect()),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        1 => any::<Index>().prop_map(Edit::Delete),
        1 => any::<Index>().prop_map(Edit::Duplicate),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::Swap(a, b)),
        3 => (any::<Index>(), token()).prop_map(|(i, t)| Edit::ReplaceScalar(i, t)),
        2 => (any::<Index>(), token()).prop_map(|(i, t)| Edit::Insert(i, t)),
        1 => (any::<Index>(), -3i8..=3).prop_map(|(i, d)| Edit::Indent(i, d)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for e in edits {
        if lines.is_empty() {
            lines.push(String::new());
        }
        let n = lines.len();
        match e {
            Edit::Delete(i) => {
                lines.remove(i.index(n));
            }
            Edit::Duplicate(i) => {
                let i = i.index(n);
                lines.insert(i, lines[i].clone());
            }
            Edit::Swap(a, b) => lines.swap(a.index(n), b.index(n)),
            Edit::ReplaceScalar(i, t) => {
                let line = &mut lines[i.index(n)];
                *line = match line.find(": ") {
                    Some(at) => format!("{}: {t}", &line[..at]),
                    None => t.clone(),
                };
            }
            Edit::Insert(i, t) => {
                let mut joined = lines.join("\n");
                let at = joined
                    .char_indices()
                    .map(|(at, _)| at)
                    .nth(i.index(joined.chars().count() + 1))
                    .unwrap_or(joined.len());
                joined.insert_str(at, t);
                lines = joined.split('\n').map(str::to_string).collect();
            }
            Edit::Indent(i, d) => {
                let line = &mut lines[i.index(n)];
                if *d >= 0 {
                    line.insert_str(0, &" ".repeat(*d as usize));
                } else {
                    let strip = line.len() - line.trim_start_matches(' ').len();
                    line.drain(..strip.min(d.unsigned_abs() as usize));
                }
            }
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

#[test]
fn the_seeds_are_valid() {
    for (stem, text) in seeds() {
        let path = PathBuf::from(format!("contracts/{stem}.yaml"));
        if let Err(e) = parse::<Qlora>(&path, &text) {
            panic!("seed {stem} does not load: {e}");
        }
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let strategy = proptest::collection::vec(any::<u8>(), 0..512);
    runner(600, 1)
        .run(&strategy, |bytes| check_bytes(dir.path(), "fuzz", &bytes))
        .expect("arbitrary bytes");
}

#[test]
fn token_soup_never_panics() {
    let strategy = proptest::collection::vec(token(), 0..64).prop_map(|t| t.concat());
    runner(1500, 2)
        .run(&strategy, |text| check_text("fuzz", &text))
        .expect("token soup");
}

#[test]
fn mutated_contracts_never_panic() {
    let seeds = seeds();
    let strategy = (
        proptest::sample::select(seeds),
        proptest::collection::vec(edit(), 1..5),
    );
    runner(1500, 3)
        .run(&strategy, |((stem, text), edits)| {
            check_text(&stem, &apply(&text, &edits))
        })
        .expect("mutated contracts");
}

#[test]
fn contracts_with_stray_bytes_never_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seeds = seeds();
    let strategy = (
        proptest::sample::select(seeds),
        proptest::collection::vec((any::<Index>(), any::<u8>()), 1..4),
    );
    runner(300, 4)
        .run(&strategy, |((stem, text), stray)| {
            let mut bytes = text.into_bytes();
            for (at, b) in stray {
                let at = at.index(bytes.len() + 1);
                bytes.insert(at, b);
            }
            check_bytes(dir.path(), &stem, &bytes)
        })
        .expect("stray bytes");
}

/// `s` as a YAML double-quoted scalar: every character but printable ASCII
/// escaped, so any string fits on the `id:` line.
fn double_quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            c if (c as u32) <= 0xFFFF => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// The documented safe set, written out independently of the loader: at
/// most 100 characters.
fn in_safe_set(id: &str) -> bool {
    let mut chars = id.chars();
    id.chars().count() <= 100
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

#[test]
fn only_safe_test_ids_are_accepted() {
    let strategy = prop_oneof![
        "[A-Za-z0-9._:=+@,/\" -]{0,10}",
        "\\PC{0,8}",
        // Around the length bound.
        "[A-Za-z0-9][A-Za-z0-9._-]{95,105}",
        proptest::collection::vec(any::<char>(), 0..6).prop_map(|c| c.into_iter().collect()),
    ];
    runner(1000, 5)
        .run(&strategy, |id: String| {
            let text = SEED.replace("- id: F-FUZZ-001", &format!("- id: {}", double_quoted(&id)));
            let path = PathBuf::from("contracts/fuzz-seed.yaml");
            let result = parse::<Qlora>(&path, &text);
            if let Ok(c) = &result {
                prop_assert!(in_safe_set(&id), "unsafe id {:?} accepted", id);
                prop_assert_eq!(&c.falsification_tests[0].id, &id);
            } else {
                // The other tests' ids, also in another case, are taken.
                let taken = ["F-FUZZ-002", "F-FUZZ-003"]
                    .iter()
                    .any(|t| id.eq_ignore_ascii_case(t));
                prop_assert!(!in_safe_set(&id) || taken, "safe id {:?} refused", id);
            }
            check_outcome(&path, line_count(text.as_bytes()), result)
        })
        .expect("test ids");
}

//! The loader against a corpus of broken contracts (`tests/bad-contracts/`, see
//! its README.md) and against inputs too large to commit, generated here.
//!
//! Every case must be refused with an `Error::Contract` that names the
//! offending file, a line (> 0, except for what is refused before it is read
//! and so has no line: 0, a file over the size cap or an entry discovery
//! refuses), where given a column, and a message containing the expected
//! text; it must not panic and must finish within [`TIME_LIMIT`]. The
//! expectations table and the corpus are kept in step: a corpus entry without
//! an expectation, or an expectation without its entry, fails the test.
//!
//! Special files (FIFOs, sockets, symbolic links) and directories named like
//! contracts cannot be committed portably; the tests below make them in a
//! temporary directory.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use falsify_core::contract::{load_dir, load_file, MAX_CONTRACT_BYTES};
use falsify_core::Error;
use falsify_qlora::Qlora;

/// The most one case may take. Generous for a 2-core CI machine; the real
/// figures are a few milliseconds.
const TIME_LIMIT: Duration = Duration::from_secs(2);

/// One corpus entry: a file (`name.yaml`) or a directory loaded with
/// `load_dir` (`name/`, where `file` is the offending file inside it).
struct Case {
    /// File name or directory name inside the corpus.
    name: &'static str,
    /// For a directory case, the file the error must name.
    file: Option<&'static str>,
    /// Text the error message must contain.
    expect: &'static str,
    /// The 1-based line the error must give.
    line: usize,
    /// The 1-based column the error must give, where the case checks it.
    column: Option<usize>,
}

const fn case(name: &'static str, expect: &'static str, line: usize) -> Case {
    Case {
        name,
        file: None,
        expect,
        line,
        column: None,
    }
}

/// A case whose error must also give `column`.
const fn case_at(name: &'static str, expect: &'static str, line: usize, column: usize) -> Case {
    Case {
        name,
        file: None,
        expect,
        line,
        column: Some(column),
    }
}

const fn dir_case(
    name: &'static str,
    file: &'static str,
    expect: &'static str,
    line: usize,
) -> Case {
    Case {
        name,
        file: Some(file),
        expect,
        line,
        column: None,
    }
}

/// file -> expected message text and line.
const CASES: &[Case] = &[
    // YAML syntax
    case(
        "syntax-bad-indentation.yaml",
        "mapping values are not allowed in this context",
        3,
    ),
    case(
        "syntax-unclosed-quote.yaml",
        "found unexpected end of stream",
        16,
    ),
    case(
        "syntax-unclosed-bracket.yaml",
        "did not find expected ',' or ']'",
        6,
    ),
    case(
        "syntax-tab-indentation.yaml",
        "found a tab character that violates indentation",
        7,
    ),
    // wrong types
    case(
        "type-string-for-number.yaml",
        "invalid type: string \"many\"",
        14,
    ),
    case(
        "type-list-for-map.yaml",
        "invalid type: sequence, expected struct Metadata",
        1,
    ),
    case(
        "type-number-for-list.yaml",
        "invalid type: integer `3`, expected a sequence",
        5,
    ),
    case(
        "type-map-for-string.yaml",
        "invalid type: map, expected a string",
        7,
    ),
    // unknown keys, at every level
    case("unknown-key-top.yaml", "unknown field `owner`", 5),
    case("unknown-key-metadata.yaml", "unknown field `licence`", 5),
    case("unknown-key-equation.yaml", "unknown field `range`", 8),
    case("unknown-key-obligation.yaml", "unknown field `severity`", 8),
    case("unknown-key-test.yaml", "unknown field `owner`", 10),
    case(
        "unknown-key-check-params.yaml",
        "unknown field `tolerence`",
        15,
    ),
    case("unknown-key-step-mode.yaml", "unknown field `grpah`", 16),
    case("unknown-obligation-type.yaml", "unknown variant `vibes`", 6),
    case("unknown-requirement.yaml", "unknown variant `tpu`", 5),
    case("merge-key.yaml", "unknown field `<<`", 13),
    // ids
    case(
        "duplicate-test-id.yaml",
        "test id `F-BAD-001` appears twice",
        16,
    ),
    case_at(
        "test-id-with-separator.yaml",
        "test id `F-BAD::001` is not a safe id (`::` joins contract, test and `mutant` in \
         trial names): ids use only ASCII letters, digits, `-`, `_` and `.`, starting with a \
         letter or digit",
        6,
        9,
    ),
    case_at(
        "test-id-formula.yaml",
        "test id `=HYPERLINK(\"http://example.com/x\",\"click\")` is not a safe id (it starts \
         with '=')",
        6,
        9,
    ),
    case_at("test-id-comma.yaml", "(',' is not allowed)", 6, 9),
    case_at(
        "test-id-newline.yaml",
        "test id `F-BAD\\n001` is not a safe id ('\\n' is not allowed)",
        6,
        9,
    ),
    case_at("test-id-quote.yaml", "('\"' is not allowed)", 6, 9),
    case_at(
        "test-id-path.yaml",
        "test id `../../etc/passwd` is not a safe id (it starts with '.')",
        6,
        9,
    ),
    case_at("test-id-leading-dash.yaml", "(it starts with '-')", 6, 9),
    case_at(
        "test-id-empty.yaml",
        "test id `` is not a safe id (it is empty)",
        6,
        9,
    ),
    case_at(
        "contract-id-formula.yaml",
        "contract id `@SUM(A1:A9)` is not a safe id (it starts with '@')",
        2,
        7,
    ),
    case_at(
        "test-id-case-twin.yaml",
        "test id `f-bad-001` differs from test id `F-BAD-001` (line 6) only in case",
        16,
        9,
    ),
    case_at(
        "test-id-too-long.yaml",
        "is too long: 112 characters, ids have at most 100",
        6,
        9,
    ),
    case_at(
        "contract-id-too-long.yaml",
        "is too long: 121 characters, ids have at most 100",
        2,
        7,
    ),
    case(
        "id-mismatch.yaml",
        "must equal the file stem `id-mismatch`",
        2,
    ),
    case("id-mismatch-flow-style.yaml", "must equal the file stem", 1),
    case(
        "no-falsification-tests.yaml",
        "has no falsification test",
        5,
    ),
    case(
        "missing-falsification-tests.yaml",
        "missing field `falsification_tests`",
        1,
    ),
    case("missing-rule.yaml", "missing field `rule`", 6),
    // check kinds, mutants, model presets
    case(
        "unknown-check-kind.yaml",
        "unknown check kind `vibe_check`; known kinds: op_parity",
        12,
    ),
    case(
        "kind-not-first.yaml",
        "`kind` must be the first key of `check`, found `property`",
        12,
    ),
    case("check-without-kind.yaml", "missing field `kind`", 12),
    case(
        "unknown-mutant.yaml",
        "unknown variant `softmax_that_is_wrong`",
        10,
    ),
    case(
        "unknown-model-preset.yaml",
        "unknown model preset `gpt-17`; known presets:",
        13,
    ),
    case(
        "kind-wrong-backend.yaml",
        "check kind `memory_budget` cannot run on `cpu`",
        6,
    ),
    // shapes the ops (or, on cpu, the reference) refuse: at the shape
    case_at(
        "attention-heads-not-multiple.yaml",
        "shapes[1] {batch=1, head_dim=16, heads=6, kv_heads=4, seq=8}: attention: heads (6) \
         must be a multiple of kv_heads (4)",
        17,
        11,
    ),
    case_at(
        "attention-head-dim-too-large.yaml",
        "attention: head_dim 256 exceeds the kernels' 128",
        16,
        16,
    ),
    case_at("rope-odd-head-dim.yaml", "head_dim must be even", 17, 11),
    case_at(
        "gradient-check-kv-heads.yaml",
        "heads (3) must be a multiple of kv_heads (2)",
        15,
        11,
    ),
    case_at(
        "model-batch-past-grid.yaml",
        "model `small-4l` at batch 70000 and seq_len 1: attention: batch needs 70000 blocks, \
         more than the grid limit 65535",
        14,
        14,
    ),
    // a timeout no trial can be judged under
    case_at(
        "timeout-below-floor.yaml",
        "0.001 is out of range: it must be >= 1",
        10,
        16,
    ),
    // numbers out of range
    case("negative-tolerance.yaml", "it must be >= 0", 15),
    case("zero-steps.yaml", "0 is out of range: it must be > 0", 14),
    case("zero-ratio.yaml", "0 is out of range: it must be > 0", 16),
    case(
        "zero-tokens-per-second.yaml",
        "0 is out of range: it must be > 0",
        16,
    ),
    case(
        "unknown-backward-math.yaml",
        "unknown variant `bf16`, expected `fp32` or `tf32`",
        15,
    ),
    case(
        "peer-memory-ratio-zero.yaml",
        "0 is out of range: it must be > 0",
        16,
    ),
    case(
        "peer-two-claims.yaml",
        "max_memory_ratio: a peer_ratio check judges one claim: give `min_ratio`",
        17,
    ),
    case(
        "fraction-too-large.yaml",
        "1.5 is out of range: it must be in (0, 1]",
        15,
    ),
    case(
        "checkpoint-beyond-steps.yaml",
        "checkpoint 8 is beyond `steps` (4)",
        12,
    ),
    case(
        "count-negative.yaml",
        "-3 is out of range: it must be > 0",
        14,
    ),
    case_at(
        "count-huge.yaml",
        "99999999999999999999999 is out of range: whole numbers must fit in 64 bits",
        14,
        14,
    ),
    // numbers that are not finite
    case("nan-tolerance.yaml", "NaN is not a finite number", 15),
    case("inf-max-abs-diff.yaml", "inf is not a finite number", 18),
    case_at(
        "overflow-to-inf.yaml",
        "1.0e999 is out of range: the largest number is 1.7976931348623157e308",
        15,
        18,
    ),
    case_at("overflow-in-count.yaml", "1e400 is out of range", 14, 14),
    // numbers too small for a 64-bit float: serde_yaml alone reads them as 0
    case_at(
        "underflow-to-zero.yaml",
        "1.0e-400 is out of range: a nonzero number must be at least \
         2.2250738585072014e-308 in magnitude",
        15,
        18,
    ),
    case_at(
        "subnormal-tolerance.yaml",
        "1.0e-310 is out of range",
        15,
        18,
    ),
    case_at("underflow-in-count.yaml", "1e-400 is out of range", 14, 14),
    case_at(
        "underflow-in-obligation.yaml",
        "1.0e-330 is out of range",
        8,
        16,
    ),
    // whole-file conditions and document structure
    case("empty.yaml", "the file is empty", 1),
    case("whitespace-only.yaml", "the file is empty", 1),
    case("comments-only.yaml", "missing field `metadata`", 4),
    case(
        "null-document.yaml",
        "invalid type: unit value, expected struct Contract",
        1,
    ),
    case("scalar-document.yaml", "invalid type: string", 1),
    case("not-a-contract.yaml", "invalid type: string", 1),
    case(
        "two-documents.yaml",
        "exactly one YAML document; a second one starts here",
        16,
    ),
    case("duplicate-mapping-key.yaml", "duplicate key `version`", 4),
    case("duplicate-equation-key.yaml", "duplicate key `softmax`", 8),
    case("unknown-anchor.yaml", "unknown anchor", 5),
    // YAML tags: the schema uses none, so a tag would be dropped unread
    case_at("tagged-value.yaml", "YAML tag `!!binary`", 14, 14),
    case_at("local-tag.yaml", "YAML tag `!shout`", 4, 16),
    case_at("tagged-mapping.yaml", "YAML tag `!!map`", 11, 12),
    // an error inside an anchored node reached through an alias: at the alias
    case_at(
        "alias-scalar-at-use.yaml",
        "invalid type: string \"many rows\"",
        14,
        14,
    ),
    case_at("alias-mapping-at-use.yaml", "unknown field `clip`", 20, 14),
    case_at(
        "alias-twice-at-second-use.yaml",
        "shapes[0] {rows=2, seq=3}: op `rmsnorm` takes the dimensions [rows, hidden], not \
         [rows, seq] (in the value of `*shapes`, anchored at line 14)",
        35,
        15,
    ),
    case(
        "non-utf8.yaml",
        "not valid UTF-8 (invalid byte at offset",
        9,
    ),
    // a byte order mark is dropped: the error is where it would be without one
    case("bom-unknown-key.yaml", "unknown field `licence`", 5),
    // hostile inputs
    case("alias-bomb.yaml", "repetition limit exceeded", 7),
    case("deep-nesting.yaml", "nest too deeply", 1),
    // directories: problems only visible when files are loaded together
    dir_case(
        "dir-duplicate-test-id",
        "second.yaml",
        "test id `F-SHARED-001` is already used in",
        6,
    ),
    dir_case(
        "dir-duplicate-contract-id",
        "twin.yaml",
        "contract id `twin` is already used in",
        2,
    ),
    dir_case(
        "dir-test-id-case-twin",
        "second.yaml",
        "test id `F-Shared-001` differs from test id `F-SHARED-001` of ",
        6,
    ),
    dir_case(
        "dir-contract-id-case-twin",
        "twin.yaml",
        "contract id `twin` differs from contract id `Twin` of ",
        2,
    ),
    dir_case("dir-one-bad-one-good", "bad.yaml", "0 is out of range", 14),
    // discovery: subdirectories are walked; `.yml` is refused, not skipped
    dir_case(
        "dir-bad-in-subdirectory",
        "nested/deeper/bad.yaml",
        "0 is out of range",
        14,
    ),
    dir_case(
        "dir-yml-extension",
        "legacy.yml",
        "contract files are named `*.yaml` (lower case; `.yml` is not read): rename this file \
         to `legacy.yaml`",
        0,
    ),
];

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad-contracts")
}

/// What a case produced: the errors, or a note that it loaded.
type Outcome = Result<(), Vec<Error>>;

/// Loads `path` (a file, or a directory with `load_dir`), proving that it
/// neither panics nor takes longer than [`TIME_LIMIT`].
fn load_guarded(path: &Path) -> Outcome {
    let start = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| {
        if path.is_dir() {
            load_dir::<Qlora>(path).map(|_| ())
        } else {
            load_file::<Qlora>(path).map(|_| ()).map_err(|e| vec![e])
        }
    }));
    let elapsed = start.elapsed();
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(_) => panic!("{}: the loader panicked", path.display()),
    };
    assert!(
        elapsed < TIME_LIMIT,
        "{}: loading took {elapsed:?}, more than {TIME_LIMIT:?}",
        path.display()
    );
    outcome
}

/// Checks that `outcome` holds a contract error on `file` at `line` whose
/// message contains `expect`.
fn assert_refused(outcome: Outcome, file: &Path, expect: &str, line: usize) {
    assert_refused_at(outcome, file, expect, line, None)
}

/// [`assert_refused`], also checking the column where one is given.
fn assert_refused_at(
    outcome: Outcome,
    file: &Path,
    expect: &str,
    line: usize,
    column: Option<usize>,
) {
    let errors = match outcome {
        Ok(()) => panic!("{}: loaded, but it must be refused", file.display()),
        Err(errors) => errors,
    };
    let found = errors.iter().any(|e| match e {
        Error::Contract {
            path,
            line: l,
            column: c,
            message,
        } => {
            path == file
                && *l == line
                && column.is_none_or(|column| *c == column)
                && message.contains(expect)
        }
        _ => false,
    });
    let shown: Vec<String> = errors.iter().map(|e| format!("{e:?}")).collect();
    assert!(
        found,
        "{}: expected a contract error at line {line} (column {column:?}) containing \
         {expect:?}; got:\n  {}",
        file.display(),
        shown.join("\n  ")
    );
    for e in &errors {
        if let Error::Contract { path, .. } = e {
            assert!(
                e.to_string().starts_with(&path.display().to_string()),
                "the message must start with the file: {e}"
            );
        }
    }
}

#[test]
fn every_corpus_entry_has_an_expectation_and_vice_versa() {
    let dir = corpus_dir();
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .expect("corpus directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != "README.md")
        .collect();
    let expected: BTreeSet<String> = CASES.iter().map(|c| c.name.to_string()).collect();
    let missing: Vec<_> = on_disk.difference(&expected).collect();
    let stale: Vec<_> = expected.difference(&on_disk).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "corpus entries without an expectation: {missing:?}; expectations without an entry: {stale:?}"
    );
}

#[test]
fn every_bad_contract_is_refused_with_a_located_error() {
    let dir = corpus_dir();
    let mut failures = Vec::new();
    for c in CASES {
        let path = dir.join(c.name);
        let file = c.file.map_or(path.clone(), |f| path.join(f));
        let result = catch_unwind(AssertUnwindSafe(|| {
            assert_refused_at(load_guarded(&path), &file, c.expect, c.line, c.column)
        }));
        if let Err(payload) = result {
            let text = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(text);
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_shipped_contracts_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts");
    match load_dir::<Qlora>(&dir) {
        Ok(contracts) => assert!(!contracts.is_empty()),
        Err(errors) => {
            let shown: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            panic!("shipped contracts fail to load:\n{}", shown.join("\n"));
        }
    }
}

/// A valid contract for `stem`, the base of the generated cases.
fn valid(stem: &str) -> String {
    valid_with_test(stem, "F-GEN-001")
}

/// [`valid`] with its one test named `test`, so that several can load together.
fn valid_with_test(stem: &str, test: &str) -> String {
    format!(
        "metadata:\n  id: {stem}\n  version: 1.0.0\n  description: generated\n\
         falsification_tests:\n  - id: {test}\n    rule: r\n    prediction: p\n    if_fails: f\n\
         \x20   mutant: softmax_without_max_subtraction\n    check:\n      kind: property\n\
         \x20     property: softmax_rows_sum_to_one\n      tolerance: 1.0e-12\n"
    )
}

/// Writes `bytes` to `{dir}/{stem}.yaml`, loads it, and checks the refusal.
fn generated(stem: &str, bytes: &[u8], expect: &str, line: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{stem}.yaml"));
    std::fs::write(&path, bytes).expect("write");
    assert_refused(load_guarded(&path), &path, expect, line);
}

#[test]
fn generated_valid_contract_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gen.yaml");
    std::fs::write(&path, valid("gen")).expect("write");
    load_file::<Qlora>(&path).expect("the generator's base contract is valid");
}

#[test]
fn a_file_over_the_size_cap_is_refused_before_parsing() {
    // 10 MB of otherwise valid YAML: a comment padding the file.
    let mut text = valid("oversize");
    let pad = format!("# {}\n", "x".repeat(1022));
    while text.len() < 10_000_000 {
        text.push_str(&pad);
    }
    generated("oversize", text.as_bytes(), "contracts are limited to", 0);
}

#[test]
fn a_very_long_line_is_located() {
    // One 512 KiB line: a description, then an unknown key on the next line.
    let long = "y".repeat(512 * 1024);
    let text = valid("long-line").replace(
        "description: generated",
        &format!("description: {long}\n  colour: red"),
    );
    generated("long-line", text.as_bytes(), "unknown field `colour`", 5);
}

#[test]
fn nesting_up_to_the_size_cap_is_refused_quickly() {
    // libyaml's work grows with the square of the flow depth: without the
    // loader's bound these take tens of minutes.
    let text = format!("metadata: {}\n", "[".repeat(MAX_CONTRACT_BYTES - 16));
    generated("deep-nesting-max", text.as_bytes(), "nest too deeply", 1);
    let text = format!(
        "metadata: {}\n",
        "{a: ".repeat((MAX_CONTRACT_BYTES - 16) / 4)
    );
    generated("deep-nesting-maps", text.as_bytes(), "nest too deeply", 1);
    // One level per line, each with a quoted "]" that must not count as a close.
    let text = format!("metadata:\n{}", "  [ \"]\",\n".repeat(20_000));
    generated(
        "deep-nesting-lines",
        text.as_bytes(),
        "nest too deeply",
        2_237,
    );
    // Shallow enough for serde_yaml's depth limit, but 400 KB of entries
    // inside 100 open collections: too much work per entry for libyaml.
    let text = format!("metadata: {}{}\n", "[".repeat(100), "a, ".repeat(130_000));
    generated("wide-and-deep", text.as_bytes(), "nest too deeply", 1);
}

#[test]
fn nesting_within_the_flow_bound_hits_the_depth_limit() {
    let text = format!("metadata: {}\n", "[".repeat(1_000));
    generated(
        "nested-1000",
        text.as_bytes(),
        "recursion limit exceeded",
        1,
    );
    let text = format!("metadata:\n{}", "  - ".repeat(200));
    generated(
        "nested-block",
        text.as_bytes(),
        "recursion limit exceeded",
        2,
    );
}

/// A contract whose `equations` reference one anchored list of `n` strings
/// `m` times: every alias expands to `n` strings, so a naive parse builds
/// `n * m` of them from a file of about `2n + 40m` bytes.
fn amplified(stem: &str, n: usize, m: usize) -> String {
    let list = vec!["a"; n].join(",");
    let mut text = valid(stem).replace(
        "falsification_tests:\n",
        &format!(
            "equations:\n  e0: {{formula: x, invariants: &big [{list}]}}\nfalsification_tests:\n"
        ),
    );
    let at = text.find("falsification_tests:").unwrap_or(0);
    let refs: String = (1..m)
        .map(|i| format!("  e{i}: {{formula: x, invariants: *big}}\n"))
        .collect();
    text.insert_str(at, &refs);
    text
}

#[test]
fn alias_amplification_is_bounded() {
    // 400 million strings (tens of GiB) from a file under the size cap.
    let text = amplified("alias-amplification", 20_000, 20_000);
    assert!(text.len() < MAX_CONTRACT_BYTES);
    generated(
        "alias-amplification",
        text.as_bytes(),
        "aliases expanded",
        6,
    );
}

// Discovery: which entries of a contract tree are read, and in what order.

/// Writes a valid contract `stem` (its test `F-{stem}`) at `dir/rel`.
fn put(dir: &Path, rel: &str, stem: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(&path, valid_with_test(stem, &format!("F-{stem}"))).expect("write");
}

/// Loads `dir` with `load_dir` and checks that it is refused because of
/// `entry` (relative to `dir`), at line 0, with `expect` in the message.
fn assert_entry_refused(dir: &Path, entry: &str, expect: &str) {
    assert_refused(load_guarded(dir), &dir.join(entry), expect, 0);
}

#[test]
fn discovery_walks_subdirectories_in_sorted_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    put(dir.path(), "b.yaml", "b");
    put(dir.path(), "a/z.yaml", "z");
    put(dir.path(), "a/b/y.yaml", "y");
    put(dir.path(), "c.yaml", "c");
    // Regular files that are not contracts are not read.
    std::fs::write(dir.path().join("README.md"), "# contracts\n").expect("write");
    std::fs::write(dir.path().join("a/notes.txt"), "x: [").expect("write");
    let contracts = load_dir::<Qlora>(dir.path()).expect("the tree loads");
    let ids: Vec<&str> = contracts.iter().map(|c| c.metadata.id.as_str()).collect();
    assert_eq!(ids, ["y", "z", "b", "c"]);
}

#[test]
fn an_empty_tree_selects_nothing_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("empty")).expect("mkdir");
    std::fs::write(dir.path().join("README.md"), "# none yet\n").expect("write");
    match load_dir::<Qlora>(dir.path()) {
        Err(errors) => assert!(
            matches!(&errors[..], [Error::NothingSelected(m)] if m.contains("or its subdirectories")),
            "{errors:?}"
        ),
        Ok(c) => panic!("loaded {} contracts from an empty tree", c.len()),
    }
}

#[test]
fn a_directory_named_like_a_contract_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    put(dir.path(), "good.yaml", "good");
    // A contract inside it would be lost if the directory were skipped.
    put(dir.path(), "x-v1.yaml/x-v1.yaml", "x-v1");
    assert_entry_refused(
        dir.path(),
        "x-v1.yaml",
        "a directory named like a contract file; contract files are regular files named \
         `*.yaml`: rename the directory",
    );
    // `load_file` applies the same rule as discovery.
    let path = dir.path().join("x-v1.yaml");
    let outcome = load_file::<Qlora>(&path).map(|_| ()).map_err(|e| vec![e]);
    assert_refused(outcome, &path, "a directory named like a contract file", 0);
}

#[test]
fn every_lookalike_extension_is_refused_in_path_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    put(dir.path(), "good.yaml", "good");
    put(dir.path(), "a.yml", "a");
    put(dir.path(), "sub/SHOUT.YAML", "SHOUT");
    put(dir.path(), "sub/z.Yml", "z");
    let errors = load_dir::<Qlora>(dir.path()).expect_err("lookalikes are refused");
    let refused: Vec<PathBuf> = errors
        .iter()
        .map(|e| match e {
            Error::Contract { path, line: 0, .. } => path.clone(),
            other => panic!("not a discovery error: {other:?}"),
        })
        .collect();
    let expected: Vec<PathBuf> = ["a.yml", "sub/SHOUT.YAML", "sub/z.Yml"]
        .iter()
        .map(|f| dir.path().join(f))
        .collect();
    assert_eq!(refused, expected);
    // `load_file` applies the same rule as discovery.
    let path = dir.path().join("a.yml");
    assert_refused(
        load_guarded(&path),
        &path,
        "rename this file to `a.yaml`",
        0,
    );
}

#[test]
fn a_byte_order_mark_is_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bom.yaml");
    std::fs::write(&path, format!("\u{feff}{}", valid("bom"))).expect("write");
    let contract = load_file::<Qlora>(&path).expect("a contract with a BOM loads");
    assert_eq!(contract.metadata.id, "bom");
}

#[test]
fn out_of_range_literals_are_text_where_text_is_wanted() {
    // Plain or quoted, in descriptions, lists of strings and comments: text.
    let text = valid("text-numbers")
        .replace(
            "description: generated",
            "description: 1e-400\n  references: [1e400, \"1e-400\", 0x1ffffffffffffffffff]",
        )
        .replace("rule: r", "rule: 1e-400 # 1e-400")
        .replace("prediction: p", "prediction: '1e400'");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("text-numbers.yaml");
    std::fs::write(&path, text).expect("write");
    let c = load_file::<Qlora>(&path).expect("out-of-range literals are text in text fields");
    assert_eq!(c.metadata.description, "1e-400");
    assert_eq!(
        c.metadata.references,
        ["1e400", "1e-400", "0x1ffffffffffffffffff"]
    );
    // Quoted where a number is wanted: a string, and said so.
    let quoted = valid("quoted-number").replace("tolerance: 1.0e-12", "tolerance: \"1e400\"");
    generated(
        "quoted-number",
        quoted.as_bytes(),
        "invalid type: string \"1e400\"",
        14,
    );
}

#[cfg(unix)]
mod special_files {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_fifo_and_a_socket_are_refused_without_being_opened() {
        let dir = tempfile::tempdir().expect("tempdir");
        put(dir.path(), "good.yaml", "good");
        let fifo = dir.path().join("pipe.yaml");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success(), "mkfifo failed");
        // A socket refused whatever its name: a FIFO or socket never holds a contract.
        let _socket =
            std::os::unix::net::UnixListener::bind(dir.path().join("sock")).expect("bind");
        let expect = "not a regular file (a FIFO, socket or device)";
        let errors = load_guarded(dir.path()).expect_err("special files are refused");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_entry_refused(dir.path(), "pipe.yaml", expect);
        assert_entry_refused(dir.path(), "sock", expect);
        // Opening a FIFO blocks until a writer comes: `load_file` must not.
        assert_refused(load_guarded(&fifo), &fifo, expect, 0);
    }

    #[test]
    fn a_dangling_or_looping_symlink_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        put(dir.path(), "good.yaml", "good");
        symlink(
            dir.path().join("missing.yaml"),
            dir.path().join("gone.yaml"),
        )
        .expect("symlink");
        symlink(dir.path().join("loop"), dir.path().join("loop")).expect("symlink");
        let expect = "a symbolic link whose target cannot be read";
        assert_entry_refused(dir.path(), "gone.yaml", expect);
        assert_entry_refused(dir.path(), "loop", expect);
        let gone = dir.path().join("gone.yaml");
        assert_refused(load_guarded(&gone), &gone, expect, 0);
    }

    #[test]
    fn a_symlink_to_a_directory_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        put(dir.path(), "real/inner.yaml", "inner");
        symlink(dir.path().join("real"), dir.path().join("linked")).expect("symlink");
        assert_entry_refused(
            dir.path(),
            "linked",
            "a symbolic link to a directory; discovery does not follow links to directories",
        );
    }

    #[test]
    fn a_symlink_to_a_contract_is_read() {
        let outside = tempfile::tempdir().expect("tempdir");
        put(outside.path(), "shared.yaml", "shared");
        let dir = tempfile::tempdir().expect("tempdir");
        put(dir.path(), "own.yaml", "own");
        symlink(
            outside.path().join("shared.yaml"),
            dir.path().join("shared.yaml"),
        )
        .expect("symlink");
        let contracts = load_dir::<Qlora>(dir.path()).expect("a link to a contract loads");
        let ids: Vec<&str> = contracts.iter().map(|c| c.metadata.id.as_str()).collect();
        assert_eq!(ids, ["own", "shared"]);
    }
}

//! Discovery and validation of contract files.
//!
//! Every problem becomes an [`Error::Contract`] naming the file, the line and
//! column, and (where one is involved) the contract and test id. Loading a
//! directory reports every bad file, not just the first.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::contract::schema::Contract;
use crate::error::{Error, Result};

/// Largest contract file accepted. Real contracts are a few KiB; this bounds the
/// time and memory a hostile or broken file can cost before parsing starts.
pub const MAX_CONTRACT_BYTES: usize = 1 << 20;

/// The `*.yaml` / `*.yml` files directly inside `dir`, sorted by name so that
/// trial order is deterministic.
pub fn discover(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        let is_yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        if is_yaml && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(Error::NothingSelected(format!(
            "no contract files (*.yaml) in {}",
            dir.display()
        )));
    }
    Ok(files)
}

/// Loads and validates every contract in `dir`. On failure returns all the
/// errors found, one per problem, in file order.
pub fn load_dir(dir: &Path) -> std::result::Result<Vec<Contract>, Vec<Error>> {
    let files = discover(dir).map_err(|e| vec![e])?;
    let mut contracts = Vec::new();
    let mut errors = Vec::new();
    for path in &files {
        match load_file(path) {
            Ok(c) => contracts.push(c),
            Err(e) => errors.push(e),
        }
    }
    errors.extend(check_unique_ids(&contracts));
    if errors.is_empty() {
        Ok(contracts)
    } else {
        Err(errors)
    }
}

/// Reads, parses and validates one contract file.
pub fn load_file(path: &Path) -> Result<Contract> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let text = decode(path, &bytes)?;
    parse(path, &text)
}

/// Parses and validates contract text that came from `path`.
pub fn parse(path: &Path, text: &str) -> Result<Contract> {
    if text.trim().is_empty() {
        return Err(contract_error(path, 1, 1, "the file is empty; a contract needs `metadata` and `falsification_tests`"));
    }
    let mut contract: Contract = serde_yaml::from_str(text).map_err(|e| yaml_error(path, &e))?;
    contract.path = path.to_path_buf();
    validate(&contract, text)?;
    Ok(contract)
}

fn decode(path: &Path, bytes: &[u8]) -> Result<String> {
    if bytes.len() > MAX_CONTRACT_BYTES {
        return Err(contract_error(
            path,
            0,
            0,
            &format!(
                "the file is {} bytes; contracts are limited to {} bytes",
                bytes.len(),
                MAX_CONTRACT_BYTES
            ),
        ));
    }
    String::from_utf8(bytes.to_vec()).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let (line, column) = line_column(&bytes[..offset]);
        contract_error(
            path,
            line,
            column,
            &format!("the file is not valid UTF-8 (invalid byte at offset {offset})"),
        )
    })
}

/// 1-based line and column of the end of `prefix`.
fn line_column(prefix: &[u8]) -> (usize, usize) {
    let line = prefix.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = prefix
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    (line, prefix.len() - line_start + 1)
}

fn contract_error(path: &Path, line: usize, column: usize, message: &str) -> Error {
    Error::Contract {
        path: path.to_path_buf(),
        line,
        column,
        message: message.to_string(),
    }
}

fn yaml_error(path: &Path, e: &serde_yaml::Error) -> Error {
    let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
    // serde_yaml appends " at line L column C" to its message; the location is
    // already in our prefix, so drop the duplicate.
    let message = e.to_string();
    let message = match message.rfind(" at line ") {
        Some(i) if line > 0 => message[..i].to_string(),
        _ => message,
    };
    contract_error(path, line, column, &message)
}

/// The 1-based line of the first `key: value` (or `- key: value`) in `text`,
/// used to locate problems found after parsing (ids, cross-file checks).
pub fn locate(text: &str, key: &str, value: &str) -> usize {
    text.lines()
        .position(|l| {
            let l = l.trim_start().trim_start_matches("- ").trim_start();
            l.strip_prefix(key)
                .and_then(|rest| rest.trim_start().strip_prefix(':'))
                .map(|v| v.trim().trim_matches(['"', '\'']) == value)
                .unwrap_or(false)
        })
        .map_or(0, |i| i + 1)
}

fn validate(contract: &Contract, text: &str) -> Result<()> {
    let path = &contract.path;
    let id = &contract.metadata.id;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if id != stem {
        return Err(contract_error(
            path,
            locate(text, "id", id),
            0,
            &format!("metadata.id `{id}` must equal the file stem `{stem}`"),
        ));
    }
    if contract.falsification_tests.is_empty() {
        return Err(contract_error(
            path,
            locate(text, "falsification_tests", "[]").max(1),
            0,
            &format!("contract `{id}` has no falsification test; a contract that cannot be falsified is a defect"),
        ));
    }
    let mut seen: HashMap<&str, ()> = HashMap::new();
    for test in &contract.falsification_tests {
        let line = locate(text, "id", &test.id);
        if test.id.trim().is_empty() || test.id.contains("::") {
            return Err(contract_error(
                path,
                line,
                0,
                &format!("contract `{id}`: test id `{}` must be non-empty and must not contain `::`", test.id),
            ));
        }
        if seen.insert(&test.id, ()).is_some() {
            return Err(contract_error(
                path,
                line,
                0,
                &format!("contract `{id}`: test id `{}` appears twice", test.id),
            ));
        }
        let backend = contract.backend_of(test);
        if !test.check.supports(backend) {
            return Err(contract_error(
                path,
                line,
                0,
                &format!(
                    "contract `{id}`, test `{}`: check kind `{}` cannot run on `{backend}` (it runs on: {})",
                    test.id,
                    test.check.kind_name(),
                    test.check.backends_text()
                ),
            ));
        }
    }
    Ok(())
}

/// Test ids must be unique across all contracts, and contract ids across files.
fn check_unique_ids(contracts: &[Contract]) -> Vec<Error> {
    let mut errors = Vec::new();
    let mut tests: HashMap<&str, &Path> = HashMap::new();
    let mut ids: HashMap<&str, &Path> = HashMap::new();
    for c in contracts {
        if let Some(first) = ids.insert(&c.metadata.id, &c.path) {
            errors.push(duplicate_error(c, "id", &c.metadata.id, "contract id", first));
        }
        for t in &c.falsification_tests {
            if let Some(first) = tests.insert(&t.id, &c.path) {
                if first != c.path {
                    errors.push(duplicate_error(c, "id", &t.id, "test id", first));
                }
            }
        }
    }
    errors
}

fn duplicate_error(c: &Contract, key: &str, value: &str, what: &str, first: &Path) -> Error {
    let line = std::fs::read_to_string(&c.path)
        .map(|text| locate(&text, key, value))
        .unwrap_or(0);
    contract_error(
        &c.path,
        line,
        0,
        &format!(
            "{what} `{value}` is already used in {}; ids must be unique across contracts",
            first.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_finds_list_items_and_quoted_values() {
        let text = "a: 1\nfalsification_tests:\n  - id: \"T-1\"\n    rule: x\n";
        assert_eq!(locate(text, "id", "T-1"), 3);
        assert_eq!(locate(text, "id", "T-2"), 0);
    }

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column(b""), (1, 1));
        assert_eq!(line_column(b"ab\ncd"), (2, 3));
    }
}

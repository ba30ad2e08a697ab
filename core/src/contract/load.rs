//! Discovery and validation of contract files.
//!
//! Every problem becomes an [`Error::Contract`] naming the file, the line and
//! column, and (where one is involved) the contract and test id. Loading a
//! directory reports every bad file, not just the first. Which files are
//! contracts is decided by the rules in `discover.rs`.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};

use crate::contract::discover::{self as tree, Kind};
use crate::contract::number;
use crate::contract::schema::{Contract, ContractOf};
use crate::contract::tree::{Found, Mark, Tree};
use crate::error::{Error, Result};
use crate::subject::Subject;

/// Largest contract file accepted. Real contracts are a few KiB; this bounds the
/// time and memory a hostile or broken file can cost before parsing starts.
pub const MAX_CONTRACT_BYTES: usize = 1 << 20;

/// The contract files under `dir` and its subdirectories: every regular file
/// named `*.yaml`, sorted by path so that trial order is deterministic. An
/// entry that could hide a contract (a `*.yml` file, a directory named
/// `*.yaml`, a FIFO, a dangling symbolic link, ...) is an error, never
/// skipped; all such errors are returned, in path order.
pub fn discover(dir: &Path) -> std::result::Result<Vec<PathBuf>, Vec<Error>> {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for (path, refused) in tree::walk(dir).map_err(|e| vec![e])? {
        match refused {
            None => files.push(path),
            Some(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    if files.is_empty() {
        return Err(vec![nothing_found(dir)]);
    }
    Ok(files)
}

fn nothing_found(dir: &Path) -> Error {
    Error::NothingSelected(format!(
        "no contract files (`*.yaml`) in {} or its subdirectories",
        dir.display()
    ))
}

/// Loads and validates every contract under `dir` (see [`discover`]). On
/// failure returns all the errors found, one per problem, in path order.
pub fn load_dir<S: Subject>(dir: &Path) -> std::result::Result<Vec<ContractOf<S>>, Vec<Error>> {
    let found = tree::walk(dir).map_err(|e| vec![e])?;
    let mut contracts = Vec::new();
    let mut errors = Vec::new();
    for (path, refused) in found {
        // The walk classified every path already: read a contract file
        // without asking again; keep every refusal beside the parse errors.
        match refused.map_or_else(|| read_contract::<S>(&path), Err) {
            Ok(c) => contracts.push(c),
            Err(e) => errors.push(e),
        }
    }
    if contracts.is_empty() && errors.is_empty() {
        return Err(vec![nothing_found(dir)]);
    }
    errors.extend(check_unique_ids(&contracts));
    if errors.is_empty() {
        Ok(contracts)
    } else {
        Err(errors)
    }
}

/// Reads, parses and validates one contract file. The path must be what
/// discovery takes for a contract: a regular file (or a link to one) named
/// `*.yaml`; anything else is refused before it is opened, so a FIFO cannot
/// block.
pub fn load_file<S: Subject>(path: &Path) -> Result<ContractOf<S>> {
    match tree::classify(path)? {
        Kind::Contract => {}
        Kind::Refused(reason) => return Err(tree::refused(path, &reason)),
        Kind::Directory => return Err(tree::refused(path, "a directory, not a contract file")),
        Kind::Ignored => {
            return Err(tree::refused(
                path,
                "not a contract file: contract files are named `*.yaml`",
            ))
        }
    }
    read_contract::<S>(path)
}

/// Reads, parses and validates a file already known to be a contract file.
fn read_contract<S: Subject>(path: &Path) -> Result<ContractOf<S>> {
    let bytes = read_capped(path)?;
    let text = decode(path, &bytes)?;
    parse::<S>(path, &text)
}

/// Reads at most one byte more than [`MAX_CONTRACT_BYTES`], so a huge (or
/// endless) file costs no more memory than the cap before it is refused.
fn read_capped(path: &Path) -> Result<Vec<u8>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut bytes = Vec::new();
    file.take(MAX_CONTRACT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    Ok(bytes)
}

/// Parses and validates contract text that came from `path`. A leading
/// UTF-8 byte order mark is dropped (editors on Windows write one; libyaml
/// would read it as part of the first key).
pub fn parse<S: Subject>(path: &Path, text: &str) -> Result<ContractOf<S>> {
    let source = text;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim().is_empty() {
        return Err(contract_error(
            path,
            1,
            1,
            "the file is empty; a contract needs `metadata` and `falsification_tests`",
        ));
    }
    check_flow_cost(path, text)?;
    // Structure first (duplicate keys, alias expansion), so the typed parse
    // below never works on a document that expands without bound.
    scan(text).map_err(|e| yaml_error(path, text, None, &e))?;
    let tree = read_tree(path, text)?;
    refuse_tags(path, &tree)?;
    let mut contract: ContractOf<S> =
        serde_yaml::from_str(text).map_err(|e| yaml_error(path, text, Some(&tree), &e))?;
    refuse_tiny_numbers::<S>(path, text, &tree)?;
    contract.path = path.to_path_buf();
    contract.source = source.to_string();
    validate::<S>(&contract, &tree)?;
    Ok(contract)
}

/// The located nodes of `text` (see `tree.rs`). The scan has read the same
/// text with the same parser, so this fails only if libyaml itself does.
fn read_tree(path: &Path, text: &str) -> Result<Tree> {
    Tree::read(text).map_err(|e| contract_error(path, e.mark.line, e.mark.column, &e.problem))
}

/// Refuses any YAML tag (`!foo value`, `!!binary ...`): the schema uses
/// none, and serde_yaml would read the value as if the tag were not there.
fn refuse_tags(path: &Path, tree: &Tree) -> Result<()> {
    match tree.first_tag() {
        None => Ok(()),
        Some((at, tag)) => Err(contract_error(
            path,
            at.line,
            at.column,
            &format!(
                "YAML tag `{}` on this value: the contract schema uses no tags, and a tag \
                 would be dropped unread; write the value without it",
                super::schema::shown(&tag)
            ),
        )),
    }
}

/// Refuses a number literal too small for a normal `f64` (`1e-400`) where a
/// number is wanted: serde_yaml reads it as 0 (or a subnormal) without
/// complaint. The check parses a copy in which each such literal overflows
/// instead (see `number::widen`), so it costs a second parse only in files
/// that hold one.
fn refuse_tiny_numbers<S: Subject>(path: &Path, text: &str, tree: &Tree) -> Result<()> {
    let tiny = number::tiny_literals(text);
    if tiny.is_empty() {
        return Ok(());
    }
    let copy = number::widen(text, &tiny);
    let Err(e) = serde_yaml::from_str::<ContractOf<S>>(&copy) else {
        return Ok(());
    };
    // The copy differs from the text only at tiny literals, so a failure
    // anywhere else cannot come from one.
    let Some(l) = e.location() else {
        return Ok(());
    };
    match number::explain(text, l.index(), &bare_message(&e)) {
        Some(message) => Err(located(path, tree, &l, &message)),
        None => Ok(()),
    }
}

/// An error serde_yaml located at `l`, with `message` (its path first):
/// moved to where the value is used when the path passes an alias
/// (serde_yaml gives the anchored node), and to the parameter a check's
/// cross-field rule names first (`shapes[1] ...`: that shape rather than
/// the `check:` block).
fn located(path: &Path, tree: &Tree, l: &serde_yaml::Location, message: &str) -> Error {
    match relocate(tree, message) {
        Some(found) => {
            let message = match &found.anchor {
                Some((name, anchor)) => format!(
                    "{message} (in the value of `*{name}`, anchored at line {})",
                    anchor.line
                ),
                None => message.to_string(),
            };
            contract_error(path, found.mark.line, found.mark.column, &message)
        }
        None => contract_error(path, l.line().max(1), l.column(), message),
    }
}

/// Where `message` (`path: text`, as serde_yaml writes it) is better
/// located than serde_yaml did it; `None` to keep serde_yaml's location,
/// which is more precise (an unknown key, not its mapping) where no alias
/// is involved.
fn relocate(tree: &Tree, message: &str) -> Option<Found> {
    // The path ends at the first ": " after which the tree has it (a key
    // may itself hold ": ").
    let (found, body, at) = message.match_indices(": ").find_map(|(i, _)| {
        let at = &message[..i];
        tree.find(at).map(|found| (found, &message[i + 2..], at))
    })?;
    let named = body
        .split([' ', ':'])
        .next()
        .filter(|t| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.[]".contains(&b))
        })
        .and_then(|param| tree.find(&format!("{at}.{param}")));
    named.or_else(|| found.anchor.is_some().then_some(found))
}

/// serde_yaml's message without the " at line L column C" it appends when it
/// has a location (the location goes in our own prefix).
fn bare_message(e: &serde_yaml::Error) -> String {
    let message = e.to_string();
    match (e.location(), message.rfind(" at line ")) {
        (Some(_), Some(i)) => message[..i].to_string(),
        _ => message,
    }
}

fn decode(path: &Path, bytes: &[u8]) -> Result<String> {
    if bytes.len() > MAX_CONTRACT_BYTES {
        return Err(contract_error(
            path,
            0,
            0,
            &format!(
                "the file is over {MAX_CONTRACT_BYTES} bytes; contracts are limited to \
                 {MAX_CONTRACT_BYTES} bytes"
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

/// An error from serde_yaml, located. serde_yaml gives no location for a few
/// whole-document conditions; those are located here from the text, so every
/// error from [`parse`] has a line in `1..=lines + 1`.
fn yaml_error(path: &Path, text: &str, tree: Option<&Tree>, e: &serde_yaml::Error) -> Error {
    let message = bare_message(e);
    if let Some(l) = e.location() {
        // A number literal out of f64's range reaches a number field as a
        // string, or as 0: say what is wrong with it instead.
        let message = number::explain(text, l.index(), &message).unwrap_or(message);
        return match tree {
            Some(tree) => located(path, tree, &l, &message),
            None => contract_error(path, l.line().max(1), l.column(), &message),
        };
    }
    if message.starts_with("EOF while parsing") {
        return contract_error(
            path,
            1,
            0,
            "no YAML document in the file (only comments or directives); a contract needs \
             `metadata` and `falsification_tests`",
        );
    }
    if message.contains("more than one document") {
        return contract_error(
            path,
            second_document_line(text),
            0,
            "a contract file holds exactly one YAML document; a second one starts here",
        );
    }
    if message.contains("repetition limit exceeded") {
        return contract_error(
            path,
            first_alias_line(text),
            0,
            &format!("{message}: aliases expand too many times (first alias here)"),
        );
    }
    contract_error(path, 1, 0, &message)
}

/// The line of the `---` (or `...`) that starts the second document: the
/// second marker when the file opens with one, else the first.
fn second_document_line(text: &str) -> usize {
    let is_marker = |l: &str| l.starts_with("---") || l.starts_with("...");
    let is_content = |l: &str| {
        let t = l.trim();
        !t.is_empty() && !t.starts_with('#') && !t.starts_with('%')
    };
    let opens_with_marker = text.lines().find(|l| is_content(l)).is_some_and(is_marker);
    let skip = usize::from(opens_with_marker);
    text.lines()
        .enumerate()
        .filter(|(_, l)| is_marker(l))
        .nth(skip)
        .map_or(1, |(i, _)| i + 1)
}

/// The line of the first `*alias` (a `*` right after a space, `[`, `{` or
/// `,` and followed by a name character), else 1.
fn first_alias_line(text: &str) -> usize {
    text.lines()
        .position(|l| {
            let b = l.as_bytes();
            (0..b.len()).any(|i| {
                b[i] == b'*'
                    && (i == 0 || matches!(b[i - 1], b' ' | b'[' | b'{' | b','))
                    && b.get(i + 1)
                        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
            })
        })
        .map_or(1, |i| i + 1)
}

/// Bound on the flow-nesting work [`check_flow_cost`] estimates. libyaml
/// spends time proportional to the current flow nesting depth on every
/// token, so a file of nested `[` costs time quadratic in its size (1 MiB of
/// `[` takes tens of minutes), although serde_yaml refuses the depth
/// afterwards. At this bound one parse costs a fraction of a second; real
/// contracts score orders of magnitude below it.
const MAX_FLOW_COST: u64 = 20_000_000;

/// Refuses text whose flow collections could make libyaml slow: the sum,
/// over every byte, of an upper bound on the flow depth there.
///
/// The bound counts every `[` and `{`. A `]` or `}` lowers it only when it
/// closes an opening earlier on the same line and the line has no quote or
/// `#`: such a line lies either wholly inside a multi-line quoted or block
/// scalar (every bracket on it is text, so nothing real is cancelled) or
/// wholly outside quotes and comments, where after a real opening every
/// closing bracket is real (flow context ends plain scalars at `]` and `}`).
/// So the bound never underestimates, and one-line collections such as
/// `{ rows: 2, seq: 3 }` cost nothing beyond their own line.
fn check_flow_cost(path: &Path, text: &str) -> Result<()> {
    let (mut depth, mut cost) = (0u64, 0u64);
    for (i, line) in text.split('\n').enumerate() {
        let cancels = !line.contains(['"', '\'', '#']);
        let mut open_here = 0u64;
        for b in line.bytes() {
            cost += depth;
            match b {
                b'[' | b'{' => {
                    depth += 1;
                    open_here += 1;
                }
                b']' | b'}' if cancels && open_here > 0 => {
                    depth -= 1;
                    open_here -= 1;
                }
                _ => {}
            }
        }
        if cost > MAX_FLOW_COST {
            return Err(contract_error(
                path,
                i + 1,
                0,
                &format!(
                    "flow collections (`[`, `{{`) nest too deeply or stay open too long to \
                     parse in bounded time ({depth} may be open at the end of this line); \
                     write long or deep collections in block style"
                ),
            ));
        }
    }
    Ok(())
}

/// Most YAML nodes (scalars, sequences, mappings) a contract may expand to,
/// aliases included. Every node takes at least one byte of the file, so a
/// file within [`MAX_CONTRACT_BYTES`] stays within this unless aliases
/// multiply it; it bounds the time and memory of the typed parse.
const MAX_NODES: usize = MAX_CONTRACT_BYTES;

/// Walks the document once as untyped YAML: counts nodes (expanding aliases,
/// as the typed parse will) up to [`MAX_NODES`], and refuses duplicate
/// mapping keys, which YAML forbids and serde would silently merge in a map
/// (e.g. two `equations` with the same name). Nesting depth is bounded by
/// serde_yaml itself (128 levels) and libyaml parses without recursion.
fn scan(text: &str) -> std::result::Result<(), serde_yaml::Error> {
    let mut budget = MAX_NODES;
    Node {
        budget: &mut budget,
    }
    .deserialize(serde_yaml::Deserializer::from_str(text))
}

/// One node of the [`scan`]; `budget` is the number of nodes still allowed.
struct Node<'a> {
    budget: &'a mut usize,
}

impl Node<'_> {
    fn take<E: de::Error>(&mut self) -> std::result::Result<(), E> {
        match self.budget.checked_sub(1) {
            Some(left) => {
                *self.budget = left;
                Ok(())
            }
            None => Err(E::custom(format!(
                "the document expands to more than {MAX_NODES} YAML nodes (aliases expanded); \
                 contracts must be smaller"
            ))),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_bool<E: de::Error>(mut self, _: bool) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_i64<E: de::Error>(mut self, _: i64) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_u64<E: de::Error>(mut self, _: u64) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_i128<E: de::Error>(mut self, _: i128) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_u128<E: de::Error>(mut self, _: u128) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_f64<E: de::Error>(mut self, _: f64) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_str<E: de::Error>(mut self, _: &str) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_unit<E: de::Error>(mut self) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_none<E: de::Error>(mut self) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        self.deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> std::result::Result<(), A::Error> {
        self.take()?;
        while seq
            .next_element_seed(Node {
                budget: &mut *self.budget,
            })?
            .is_some()
        {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> std::result::Result<(), A::Error> {
        self.take()?;
        let mut seen = HashSet::new();
        while map
            .next_key_seed(Key {
                budget: &mut *self.budget,
                seen: &mut seen,
            })?
            .is_some()
        {
            map.next_value_seed(Node {
                budget: &mut *self.budget,
            })?;
        }
        Ok(())
    }
    fn visit_enum<A: EnumAccess<'de>>(mut self, data: A) -> std::result::Result<(), A::Error> {
        // A tagged node (`!tag value`): serde_yaml offers it as an enum.
        self.take()?;
        let ((), variant) = data.variant_seed(Node {
            budget: &mut *self.budget,
        })?;
        variant.newtype_variant_seed(Node {
            budget: &mut *self.budget,
        })
    }
}

/// A mapping key of the [`scan`]: a scalar, compared by its text with the
/// keys already seen in the same mapping. The error is raised while the key
/// is being read, so serde_yaml marks it with the key's own line.
struct Key<'a> {
    budget: &'a mut usize,
    seen: &'a mut HashSet<String>,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Key<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a scalar mapping key")
    }
    fn visit_str<E: de::Error>(self, key: &str) -> std::result::Result<(), E> {
        Node {
            budget: &mut *self.budget,
        }
        .take()?;
        if self.seen.insert(key.to_string()) {
            Ok(())
        } else {
            Err(E::custom(format!(
                "duplicate key `{key}` in this mapping; YAML keys must be unique"
            )))
        }
    }
}

/// The 1-based line of the first `key: value` (or `- key: value`) in `text`,
/// used to locate problems found after parsing (ids, cross-file checks).
pub fn locate(text: &str, key: &str, value: &str) -> usize {
    locate_nth(text, key, value, 0)
}

/// The 1-based line of the `n`-th (0-based) `key: value` in `text`, 0 if none.
fn locate_nth(text: &str, key: &str, value: &str, n: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.trim_start().trim_start_matches("- ").trim_start();
            l.strip_prefix(key)
                .and_then(|rest| rest.trim_start().strip_prefix(':'))
                .map(|v| v.trim().trim_matches(['"', '\'']) == value)
                .unwrap_or(false)
        })
        .nth(n)
        .map_or(0, |(i, _)| i + 1)
}

/// The position of the node at `path` (see [`Tree::find`]), else line 1,
/// so a validation error always has a line.
fn position(tree: &Tree, path: &str) -> Mark {
    tree.find(path)
        .map_or(Mark { line: 1, column: 0 }, |found| found.mark)
}

fn error_at(path: &Path, at: Mark, message: &str) -> Error {
    contract_error(path, at.line, at.column, message)
}

/// Why ids must differ in more than case, for the messages.
const CASE_RULE: &str = "ids must differ in more than letter case (trial names become file \
    names, and some file systems do not tell case apart)";

/// `id` folded for comparison: ids are ASCII ([`super::is_safe_id`]).
fn folded(id: &str) -> String {
    id.to_ascii_lowercase()
}

fn validate<S: Subject>(contract: &ContractOf<S>, tree: &Tree) -> Result<()> {
    let path = &contract.path;
    let id = &contract.metadata.id;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if id != stem {
        return Err(error_at(
            path,
            position(tree, "metadata.id"),
            &format!("metadata.id `{id}` must equal the file stem `{stem}`"),
        ));
    }
    if contract.falsification_tests.is_empty() {
        return Err(error_at(
            path,
            position(tree, "falsification_tests"),
            &format!("contract `{id}` has no falsification test; a contract that cannot be falsified is a defect"),
        ));
    }
    // Each test id by its folded form, with the position of the first.
    let mut seen: HashMap<String, (&str, Mark)> = HashMap::new();
    for (i, test) in contract.falsification_tests.iter().enumerate() {
        let at = position(tree, &format!("falsification_tests[{i}].id"));
        if let Some((first, first_at)) = seen.insert(folded(&test.id), (&test.id, at)) {
            let message = if first == test.id {
                format!("contract `{id}`: test id `{first}` appears twice")
            } else {
                format!(
                    "contract `{id}`: test id `{}` differs from test id `{first}` (line {}) only \
                     in case; {CASE_RULE}",
                    test.id, first_at.line
                )
            };
            return Err(error_at(path, at, &message));
        }
        let backend = contract.backend_of(test);
        if !test.check.supports(backend) {
            return Err(error_at(
                path,
                at,
                &format!(
                    "contract `{id}`, test `{}`: check kind `{}` cannot run on `{backend}` (it runs on: {})",
                    test.id,
                    test.check.kind_name(),
                    test.check.backends_text()
                ),
            ));
        }
        validate_for_subject::<S>(contract, tree, i)?;
        refuse_foreign_known_violation::<S>(contract, i, tree)?;
    }
    Ok(())
}

/// Refuses test `i`'s `known_violation` unless the subject running the
/// contracts accepts known violations and is the one it names: a known
/// violation excuses a falsified claim in the gate, so it must never reach
/// a stack of our own, nor a subject it was not measured on.
fn refuse_foreign_known_violation<S: Subject>(
    contract: &ContractOf<S>,
    i: usize,
    tree: &Tree,
) -> Result<()> {
    let test = &contract.falsification_tests[i];
    let Some(known) = &test.known_violation else {
        return Ok(());
    };
    let (id, at) = (
        &contract.metadata.id,
        format!("falsification_tests[{i}].known_violation"),
    );
    if !S::ACCEPTS_KNOWN_VIOLATIONS {
        return Err(error_at(
            &contract.path,
            position(tree, &at),
            &format!(
                "contract `{id}`, test `{}`: subject `{}` does not accept known violations \
                 (only a stack we do not own may mark a claim as expected to be falsified; \
                 a failure of our own is a bug to fix)",
                test.id,
                S::NAME
            ),
        ));
    }
    if known.subject != S::NAME {
        return Err(error_at(
            &contract.path,
            position(tree, &format!("{at}.subject")),
            &format!(
                "contract `{id}`, test `{}`: the known violation names subject `{}`, but these \
                 contracts run against `{}`; a known violation holds only for the subject it \
                 was measured on",
                test.id,
                super::schema::shown(&known.subject),
                S::NAME
            ),
        ));
    }
    Ok(())
}

/// Whether the subject can run test `i`'s check (a core kind's `model:`
/// is one its workload trains), and its mutant can take effect on it.
fn validate_for_subject<S: Subject>(contract: &ContractOf<S>, tree: &Tree, i: usize) -> Result<()> {
    let test = &contract.falsification_tests[i];
    let located = |key: &str, why: &str| {
        let at = position(tree, &format!("falsification_tests[{i}].{key}"));
        let message = format!(
            "contract `{}`, test `{}`: {why}",
            contract.metadata.id, test.id
        );
        error_at(&contract.path, at, &message)
    };
    if let Err((key, why)) = test.check.validate_for_subject() {
        return Err(located(&format!("check.{key}"), &why));
    }
    match test.mutant.core().and_then(|m| m.refuses(&test.check)) {
        Some(why) => Err(located("mutant", &why)),
        None => Ok(()),
    }
}

/// Test ids must be unique across all contracts, and contract ids across
/// files, also under case folding.
fn check_unique_ids<K, M>(contracts: &[Contract<K, M>]) -> Vec<Error> {
    let mut errors = Vec::new();
    let mut tests: HashMap<String, (&str, &Path)> = HashMap::new();
    let mut ids: HashMap<String, (&str, &Path)> = HashMap::new();
    for c in contracts {
        let id = c.metadata.id.as_str();
        if let Some(first) = ids.insert(folded(id), (id, &c.path)) {
            errors.push(duplicate_error(c, "metadata.id", id, "contract id", first));
        }
        for (i, t) in c.falsification_tests.iter().enumerate() {
            if let Some(first) = tests.insert(folded(&t.id), (&t.id, &c.path)) {
                // Repeats inside one file were refused when it was read.
                if first.1 != c.path {
                    let at = format!("falsification_tests[{i}].id");
                    errors.push(duplicate_error(c, &at, &t.id, "test id", first));
                }
            }
        }
    }
    errors
}

/// The error for `what` `value` at `at` (a path) in `c`, whose id (the
/// same, or the same but for case) `first.1` used first as `first.0`.
fn duplicate_error<K, M>(
    c: &Contract<K, M>,
    at: &str,
    value: &str,
    what: &str,
    first: (&str, &Path),
) -> Error {
    // The file was read moments ago; if it can no longer be read, line 1
    // still names the file.
    let mark = read_capped(&c.path)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|text| Tree::read(text.strip_prefix('\u{feff}').unwrap_or(&text)).ok())
        .map_or(Mark { line: 1, column: 0 }, |tree| position(&tree, at));
    let (first_id, first_path) = first;
    let message = if first_id == value {
        format!(
            "{what} `{value}` is already used in {}; ids must be unique across contracts",
            first_path.display()
        )
    } else {
        format!(
            "{what} `{value}` differs from {what} `{first_id}` of {} only in case; {CASE_RULE}",
            first_path.display()
        )
    };
    error_at(&c.path, mark, &message)
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
    fn flow_cost_cancels_only_unquoted_same_line_pairs() {
        let path = Path::new("c.yaml");
        // One-line collections cost nothing after their line.
        let shapes = "  - { rows: 2, seq: 3 }\n".repeat(50_000);
        assert!(check_flow_cost(path, &shapes).is_ok());
        // A quoted "]" is text: each line leaves one collection open.
        let nested = "  [ \"]\",\n".repeat(20_000);
        assert!(check_flow_cost(path, &nested).is_err());
        // A close before any opening on its line cancels nothing.
        let text = format!("{}\n{}", "[".repeat(6_000), "]".repeat(6_000));
        assert!(check_flow_cost(path, &text).is_err());
    }

    #[test]
    fn the_second_document_is_located() {
        assert_eq!(second_document_line("a: 1\n---\nb: 2\n"), 2);
        assert_eq!(second_document_line("# c\n---\na: 1\n---\nb: 2\n"), 4);
        assert_eq!(first_alias_line("a: &x 1\nb: [*x]\n"), 2);
    }

    #[test]
    fn scan_refuses_duplicate_keys_at_the_key() {
        let e = scan("a: 1\nb:\n  c: 1\n  c: 2\n").unwrap_err();
        assert!(e.to_string().contains("duplicate key `c`"), "{e}");
        assert_eq!(e.location().map(|l| l.line()), Some(4));
        assert!(scan("a: {c: 1}\nb: {c: 1}\n").is_ok());
    }

    /// A subject we do not own, for the rules of known violations: the
    /// toy's kind, and known violations accepted.
    mod outsider {
        use crate::check::{Backend, Measurement, BOTH};
        use crate::subject::{BasicOptions, DeviceFacts, Kind, NoDevice, Subject, TrialContext};
        use crate::testing::{compare, ToyMutant};

        pub struct Outsider;

        impl Kind<Outsider> for compare::Params {
            fn execute(
                &self,
                _backend: Backend,
                _cx: &mut TrialContext<'_, Outsider>,
            ) -> crate::Result<Measurement> {
                Err(crate::Error::CudaUnavailable("never run".into()))
            }
        }

        crate::kinds! {
            /// The outsider's `check:` block.
            pub enum OutsiderKinds for Outsider {
                Compare(compare) "compare", BOTH, "a number against a bound";
            }
        }

        impl Subject for Outsider {
            const NAME: &'static str = "outsider";
            const ACCEPTS_KNOWN_VIOLATIONS: bool = true;
            type Device = NoDevice;
            type Kinds = OutsiderKinds;
            type Mutant = ToyMutant;
            type Options = BasicOptions;
            type Error = crate::Error;

            fn open_device(_options: &BasicOptions) -> crate::Result<NoDevice> {
                Err(crate::Error::CudaUnavailable("no device".into()))
            }
            fn device_facts(device: &NoDevice) -> DeviceFacts {
                match *device {}
            }
            fn free_memory(device: &NoDevice) -> crate::Result<(u64, u64)> {
                match *device {}
            }
        }
    }

    /// A contract of one toy test that ends with `known` (YAML lines of
    /// the test's mapping, indented by four spaces).
    fn with_known(known: &str) -> String {
        format!(
            "metadata:\n  id: c\n  version: 1.0.0\n  description: d\nfalsification_tests:\n{}{known}",
            crate::testing::test("T-1", 1.0, 2.0, &[])
        )
    }

    const KNOWN: &str = "    known_violation:\n      subject: outsider\n      reason: compiles after the upload\n      evidence: 3 modules loaded after the upload\n      source: src/cache.rs:123\n";

    /// The error of parsing `text` as a contract of `S`, as `(line, message)`.
    fn refused<S: Subject>(text: &str) -> (usize, String) {
        match parse::<S>(Path::new("contracts/c.yaml"), text) {
            Err(Error::Contract { line, message, .. }) => (line, message),
            other => panic!("expected a contract error, got {other:?}"),
        }
    }

    #[test]
    fn a_known_violation_of_the_subject_that_accepts_them_loads() {
        let c = parse::<outsider::Outsider>(Path::new("contracts/c.yaml"), &with_known(KNOWN))
            .expect("loads");
        let known = c.falsification_tests[0]
            .known_violation
            .as_ref()
            .expect("read");
        assert_eq!(known.subject, "outsider");
        assert_eq!(known.reason, "compiles after the upload");
        assert_eq!(known.evidence, "3 modules loaded after the upload");
        assert_eq!(known.source, "src/cache.rs:123");
        let plain = parse::<outsider::Outsider>(Path::new("contracts/c.yaml"), &with_known(""));
        assert!(plain.expect("loads").falsification_tests[0]
            .known_violation
            .is_none());
    }

    #[test]
    fn a_subject_that_does_not_accept_known_violations_refuses_them_located() {
        // The toy keeps the default, as qlora does: never excused.
        const { assert!(!crate::testing::Toy::ACCEPTS_KNOWN_VIOLATIONS) };
        let text = with_known(&KNOWN.replace("outsider", "toy"));
        let (line, message) = refused::<crate::testing::Toy>(&text);
        // The known violation's mapping, from its first line.
        assert_eq!(line, 13, "{message}");
        assert!(
            message.contains("test `T-1`: subject `toy` does not accept known violations"),
            "{message}"
        );
    }

    #[test]
    fn a_known_violation_of_another_subject_is_refused_at_its_subject() {
        let text = with_known(&KNOWN.replace("outsider", "aprender-train"));
        let (line, message) = refused::<outsider::Outsider>(&text);
        assert_eq!(line, 13, "the `subject:` line: {message}");
        assert!(
            message.contains(
                "names subject `aprender-train`, but these contracts run against `outsider`"
            ),
            "{message}"
        );
    }

    #[test]
    fn a_known_violation_is_parsed_strictly_and_located() {
        let cases = [
            // An empty reason says nothing.
            (
                KNOWN.replace("compiles after the upload", "\"  \""),
                14,
                "must not be empty",
            ),
            // Every field is required ...
            (
                KNOWN.replace("      source: src/cache.rs:123\n", ""),
                13,
                "missing field `source`",
            ),
            // ... and no other is accepted.
            (
                KNOWN.replace("evidence:", "evidense:"),
                15,
                "unknown field `evidense`",
            ),
        ];
        for (known, line, says) in cases {
            let (at, message) = refused::<outsider::Outsider>(&with_known(&known));
            assert!(message.contains(says), "{message}");
            assert_eq!(at, line, "{message}");
        }
    }

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column(b""), (1, 1));
        assert_eq!(line_column(b"ab\ncd"), (2, 3));
    }
}

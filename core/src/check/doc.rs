//! The parameter reference of the check kinds, generated from a subject's
//! registry.
//!
//! Each kind declares its parameters as data next to its `Params` struct
//! (`PARAMS`, a slice of [`ParamDoc`]) and a minimal valid check block
//! (`EXAMPLE`); the subject's [`kinds!`](crate::kinds) line hands both to
//! [`super::KindInfo`], and [`kind_markdown`] renders them (for the whole
//! set, `subject::reference_markdown`). Bounds
//! name the constants the code enforces ([`Piece::Int`], [`Piece::Real`]),
//! so a changed bound changes the reference; a subject's tests check the
//! names, the spellings and the defaults against serde.

use std::fmt::Write;

use super::params::MIN_TIMEOUT_S;
use super::{Backend, KindInfo};

/// One documented parameter of a check kind.
#[derive(Debug, Clone, Copy)]
pub struct ParamDoc {
    /// The key in the `check:` block.
    pub name: &'static str,
    /// What an absent key means.
    pub default: ParamDefault,
    /// The values it accepts, in pieces (see [`Piece`]).
    pub bound: &'static [Piece],
    /// What it does, in a few words.
    pub meaning: &'static str,
}

/// What an absent parameter means.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamDefault {
    /// The parameter must be given.
    Required,
    /// The default, as YAML the parser reads (a test parses it and compares
    /// it with the default the parser fills in).
    Yaml(&'static str),
    /// No single value: what omitting it means, in words (e.g. "the preset's").
    Otherwise(&'static str),
}

/// A piece of a bound's text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Piece {
    /// Words, as written.
    Text(&'static str),
    /// A whole number: the constant the code checks against.
    Int(usize),
    /// A real number: the constant the code checks against.
    Real(f64),
    /// Names a value may take that are not enumerated spellings of a serde
    /// enum (e.g. a subject's model presets), shown as a list.
    Names(&'static [&'static str]),
    /// The accepted spellings of an enumerated value (a test compares them
    /// with serde's list).
    OneOf(&'static [&'static str]),
}

/// The spellings of [`super::params::Precision`].
pub const PRECISIONS: &[&str] = &["f32", "tf32", "f16", "bf16"];

/// The bound as Markdown text.
pub fn bound_text(bound: &[Piece]) -> String {
    bound.iter().map(piece_text).collect()
}

fn piece_text(piece: &Piece) -> String {
    match piece {
        Piece::Text(t) => (*t).to_string(),
        Piece::Int(n) => int_text(*n),
        Piece::Real(x) => real_text(*x),
        Piece::Names(names) => code_list(names.iter().copied()),
        Piece::OneOf(names) => code_list(names.iter().copied()),
    }
}

fn code_list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `2^k` for large powers of two, else the digits with thousands separators.
fn int_text(n: usize) -> String {
    if n >= 1 << 16 && n.is_power_of_two() {
        return format!("2^{}", n.trailing_zeros());
    }
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) && digits.len() > 4 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A whole power of two as `2^k`, otherwise in exponent notation (`2e10`).
fn real_text(x: f64) -> String {
    let whole = x.fract() == 0.0 && (1.0..1e18).contains(&x);
    if whole && (x as u64).is_power_of_two() {
        int_text(x as usize)
    } else {
        format!("{x:e}")
    }
}

fn default_text(default: ParamDefault) -> String {
    match default {
        ParamDefault::Required => "required".into(),
        ParamDefault::Yaml(v) => format!("`{v}`"),
        ParamDefault::Otherwise(t) => t.into(),
    }
}

/// A kind's minimal check block as one line of flow YAML, with `extra`
/// pairs appended (or replacing the example's value of the same key).
pub fn example_yaml(kind: &KindInfo, extra: &[(&str, &str)]) -> String {
    let mut pairs: Vec<(&str, &str)> = kind
        .example
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .copied()
        .collect();
    pairs.extend_from_slice(extra);
    let body: Vec<String> = pairs.iter().map(|(k, v)| format!(", {k}: {v}")).collect();
    format!("{{kind: {}{}}}", kind.name, body.concat())
}

/// The default timeout of a kind, and the floor of a test's own
/// `timeout_s`.
fn timeout_text(default_timeout_s: f64) -> String {
    format!(
        "{default_timeout_s} s; a test's `timeout_s` may set another, of at least {MIN_TIMEOUT_S} s"
    )
}

/// One kind's section of the reference: what it measures, where it runs,
/// its default timeout (when known), a minimal check block, and a table of
/// its parameters (default or "required", bound, meaning).
pub fn kind_markdown(kind: &KindInfo, default_timeout_s: Option<f64>) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = write_kind(&mut out, kind, default_timeout_s);
    out
}

fn write_kind(out: &mut String, kind: &KindInfo, timeout: Option<f64>) -> std::fmt::Result {
    let backends: Vec<&str> = kind.backends.iter().map(|b| Backend::as_str(*b)).collect();
    writeln!(out, "#### `{}`\n", kind.name)?;
    writeln!(
        out,
        "Measures {}. Runs on: {}.",
        kind.measures,
        backends.join(", ")
    )?;
    if let Some(t) = timeout {
        writeln!(out, "Default timeout: {}.", timeout_text(t))?;
    }
    writeln!(out, "Minimal check: `{}`.\n", example_yaml(kind, &[]))?;
    writeln!(out, "| parameter | default | bound | meaning |")?;
    writeln!(out, "| --- | --- | --- | --- |")?;
    for p in kind.params {
        writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            p.name,
            default_text(p.default),
            bound_text(p.bound),
            p.meaning
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_the_bounds_are_written() {
        assert_eq!(int_text(64), "64");
        assert_eq!(int_text(1_000), "1000");
        assert_eq!(int_text(10_000), "10,000");
        assert_eq!(int_text(100_000), "100,000");
        assert_eq!(int_text(1 << 20), "2^20");
        assert_eq!(real_text((1u64 << 30) as f64), "2^30");
        assert_eq!(real_text(2e10), "2e10");
        assert_eq!(real_text(5e8), "5e8");
    }
}

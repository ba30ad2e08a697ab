//! Number literals a 64-bit float or integer cannot hold.
//!
//! serde_yaml reads a plain scalar that overflows `f64` (`1e400`) as a
//! string, so a number field reports "invalid type: string", and one that
//! underflows (`1e-400`) as `0`, silently. The loader finds such literals in
//! the text and names them instead.
//!
//! A literal is out of range when it is a YAML number (decimal integer,
//! `0x`/`0o`/`0b` integer, or decimal float, with an optional sign) and
//! - as a float, its magnitude exceeds `f64::MAX`, or it is nonzero and
//!   below `f64::MIN_POSITIVE` (it would be read as 0 or as a subnormal
//!   that keeps only some of its digits); or
//! - as an integer (no `.` and no exponent), it does not fit in 64 bits.

use std::ops::Range;

/// Characters a plain number literal is made of; any other character ends one.
fn is_literal_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-' | b'_')
}

/// Why `lit` is out of range, or `None` when it is in range or no number.
pub(super) fn out_of_range(lit: &str) -> Option<String> {
    let unsigned = lit.strip_prefix(['+', '-']).unwrap_or(lit);
    if let Some(fits) = radix_fits(unsigned) {
        return (!fits)
            .then(|| format!("{lit} is out of range: whole numbers must fit in 64 bits"));
    }
    if !is_decimal(unsigned) {
        return None;
    }
    let v: f64 = lit.parse().ok()?;
    if v.is_infinite() {
        return Some(format!(
            "{lit} is out of range: the largest number is {:e}",
            f64::MAX
        ));
    }
    if v.abs() < f64::MIN_POSITIVE && has_nonzero_digit(unsigned) {
        return Some(format!(
            "{lit} is out of range: a nonzero number must be at least {:e} in magnitude \
             (smaller ones lose digits or read as 0)",
            f64::MIN_POSITIVE
        ));
    }
    let integer = !unsigned.contains(['.', 'e', 'E']);
    let fits = lit.parse::<i64>().is_ok() || lit.parse::<u64>().is_ok();
    (integer && !fits).then(|| format!("{lit} is out of range: whole numbers must fit in 64 bits"))
}

/// For a `0x`, `0o` or `0b` literal with valid digits, whether it fits in
/// 64 bits; `None` for anything else.
fn radix_fits(unsigned: &str) -> Option<bool> {
    let (digits, radix) = [("0x", 16), ("0o", 8), ("0b", 2)]
        .iter()
        .find_map(|(p, r)| unsigned.strip_prefix(p).map(|d| (d, *r)))?;
    let valid = !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix));
    valid.then(|| u64::from_str_radix(digits, radix).is_ok())
}

/// `digits[.digits][e[sign]digits]`, `.digits...` or `digits.` (no sign).
fn is_decimal(s: &str) -> bool {
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mut parts = mantissa.splitn(2, '.');
    let whole = parts.next().unwrap_or("");
    let fraction = parts.next().unwrap_or("");
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = digits(whole) && digits(fraction) && whole.len() + fraction.len() > 0;
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exponent_ok
}

fn has_nonzero_digit(decimal: &str) -> bool {
    let mantissa = decimal.split(['e', 'E']).next().unwrap_or("");
    mantissa.bytes().any(|b| matches!(b, b'1'..=b'9'))
}

/// The plain literal starting at byte `index` of `text` (where serde_yaml
/// locates a scalar), if it is out of range and the error `message` shows it
/// was wanted as a number: the message that says so, after the same field
/// path (`falsification_tests[0].check.cases: `).
///
/// Read as a number when the message expects one (`expected f64`, `expected
/// a whole number > 0`), or comes from a number's own range check (which
/// quotes the value it was read as, not the literal). Elsewhere (a name, a
/// list) the literal was read as text and the original message stands.
pub(super) fn explain(text: &str, index: usize, message: &str) -> Option<String> {
    let lit = literal_at(text, index)?;
    let problem = out_of_range(lit)?;
    let wanted_number = match message.rsplit_once(", expected ") {
        Some((_, expected)) => expects_number(expected),
        None => !message.contains(lit),
    };
    // serde_yaml starts a message with the field's path and ": "; a message
    // of its own has a space before its first ": " (`invalid type: ...`).
    let path = message
        .split_once(": ")
        .filter(|(path, _)| !path.contains(' '))
        .map_or(String::new(), |(path, _)| format!("{path}: "));
    wanted_number.then(|| format!("{path}{problem}"))
}

/// The maximal run of literal characters at `index`, if one starts there.
fn literal_at(text: &str, index: usize) -> Option<&str> {
    let rest = text.get(index..)?;
    let len = rest.bytes().take_while(|&b| is_literal_byte(b)).count();
    (len > 0).then(|| &rest[..len])
}

/// Whether serde's "expected ..." text names a number.
fn expects_number(expected: &str) -> bool {
    const PRIMITIVES: &[&str] = &[
        "f32", "f64", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64",
        "i128", "isize",
    ];
    PRIMITIVES.contains(&expected)
        || ["a number", "a finite number", "a whole number"]
            .iter()
            .any(|p| expected.starts_with(p))
}

/// Byte ranges of every literal in `text` too small for a normal `f64`
/// (see [`out_of_range`]): serde_yaml reads these without complaint, so the
/// loader checks where they land. Runs inside strings and comments count
/// too; they are harmless (see [`widen`]).
pub(super) fn tiny_literals(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let len = bytes[i..]
            .iter()
            .take_while(|&&b| is_literal_byte(b))
            .count();
        if len == 0 {
            i += 1;
            continue;
        }
        let lit = &text[i..i + len];
        if is_tiny(lit) {
            found.push(i..i + len);
        }
        i += len;
    }
    found
}

fn is_tiny(lit: &str) -> bool {
    let unsigned = lit.strip_prefix(['+', '-']).unwrap_or(lit);
    is_decimal(unsigned)
        && has_nonzero_digit(unsigned)
        && lit
            .parse::<f64>()
            .is_ok_and(|v| v.abs() < f64::MIN_POSITIVE)
}

/// `text` with each range replaced by a literal of the same length that
/// overflows (`9e9999...`): serde_yaml reads that as a string, so a parse of
/// the copy fails exactly where one of them was wanted as a number, at the
/// same line and column, and nowhere else (text fields take any string).
/// Every tiny literal has at least 6 characters (`1e-308`), so the copy's
/// exponent has at least 4 digits.
pub(super) fn widen(text: &str, ranges: &[Range<usize>]) -> String {
    let mut copy = text.to_string();
    for r in ranges {
        let wide = format!("9e{}", "9".repeat(r.len().saturating_sub(2)));
        copy.replace_range(r.clone(), &wide[..r.len().min(wide.len())]);
    }
    copy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_literals_are_named() {
        for lit in [
            "1e400",
            "-1.0e999",
            "1e-400",
            "1e-310",
            "0.5e-308",
            "0x1ffffffffffffffff",
        ] {
            assert!(out_of_range(lit).is_some(), "{lit}");
        }
        let huge = "9".repeat(23);
        assert!(out_of_range(&huge).unwrap().contains("64 bits"));
        for lit in [
            "0", "0.0", "0e-999", "1e-300", "1.5", "-3", "0x1F", ".inf", "1_0", "abc", "1e",
        ] {
            assert_eq!(out_of_range(lit), None, "{lit}");
        }
    }

    #[test]
    fn explain_speaks_only_where_a_number_was_wanted() {
        let text = "a: 1e400\n";
        let number = "invalid type: string \"1e400\", expected a finite number that is >= 0";
        assert!(explain(text, 3, number).is_some());
        let list = "invalid type: string \"1e400\", expected a sequence";
        assert_eq!(explain(text, 3, list), None);
        assert_eq!(explain(text, 3, "unknown model preset `1e400`"), None);
        let range = "a.b[0]: 0 is out of range: it must be > 0";
        let said = explain("a: 1e-400\n", 3, range).unwrap_or_default();
        assert!(
            said.starts_with("a.b[0]: 1e-400 is out of range: "),
            "{said}"
        );
        assert_eq!(explain("a: \"1e400\"\n", 3, number), None);
    }

    #[test]
    fn tiny_literals_are_found_and_widened_in_place() {
        let text = "a: 1e-400\nb: [2.5e-320, 1e-5]\nc: x1e-400\n";
        let tiny = tiny_literals(text);
        assert_eq!(tiny, vec![3..9, 14..22]);
        let copy = widen(text, &tiny);
        assert_eq!(copy, "a: 9e9999\nb: [9e999999, 1e-5]\nc: x1e-400\n");
        assert_eq!(copy.len(), text.len());
    }
}

//! Text from contracts on a terminal: what the front ends print (a
//! FALSIFIED line, the summary table, libtest's failure messages, an error
//! that quotes a contract) goes through [`escape_controls`], so a contract
//! can neither recolour, move the cursor over, nor erase what is printed
//! about it.

use std::borrow::Cow;

/// Whether `c` changes how a terminal shows what follows rather than
/// showing itself: the C0 controls (ESC, CR, BS, ...), DEL, the C1
/// controls (U+0080-U+009F, CSI among them), and the bidirectional
/// embeddings, overrides and isolates that reorder the text after them.
fn is_terminal_control(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with each terminal control written as a Rust escape (`\n`, `\r`,
/// `\t`, or `\u{1b}` for the others), so that it prints as one line that
/// shows exactly what the text holds. Text without one is returned as is.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_terminal_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_terminal_control(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_print_as_escapes_and_plain_text_is_untouched() {
        assert!(matches!(escape_controls("plain, é ✓"), Cow::Borrowed(_)));
        assert_eq!(
            escape_controls("a\u{1b}[2K\rPASSED\u{9b}31m\u{7f}\n\tz"),
            "a\\u{1b}[2K\\rPASSED\\u{9b}31m\\u{7f}\\n\\tz"
        );
        assert_eq!(
            escape_controls("x\u{202e}y\u{2066}"),
            "x\\u{202e}y\\u{2066}"
        );
        // A backslash the text holds stays one: only controls are escaped.
        assert_eq!(escape_controls("a\\u{1b}\u{1b}"), "a\\u{1b}\\u{1b}");
    }
}

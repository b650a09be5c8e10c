//! Making what the cluster says safe to print on a terminal.
//!
//! Every string `kuport status` prints comes from objects other people write: an Event's reason
//! and message (anyone who may create Events in a namespace), a condition's message, a class
//! row an agent wrote. A terminal acts on control characters it is sent: ESC and the C1 CSI
//! (`U+009B`) start sequences that move the cursor, rewrite earlier lines, change the window
//! title or, on some terminals, answer back into the shell's input; a carriage return or a
//! newline forges lines; bidirectional overrides make text read differently from what it is.
//! So the text output shows each such character as an escape (`\x1b`, `\u{202e}`) instead.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a terminal as it is: C0 controls (newline included), DEL, C1
/// controls, and the Unicode bidirectional formatting characters.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}')
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

/// `text` with every unsafe character shown as an escape: `\xHH` below `U+0100`, `\u{HHHH}`
/// above. Text without one is returned as it is.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        push_escaped(&mut out, c, is_unsafe);
    }
    Cow::Owned(out)
}

/// A whole rendered text with every unsafe character but the layout's own newlines escaped: the
/// last line of defence, for a string a renderer forgot to pass through [`escape`].
pub fn escape_keeping_lines(text: &str) -> Cow<'_, str> {
    let unsafe_here = |c: char| c != '\n' && is_unsafe(c);
    if !text.chars().any(unsafe_here) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        push_escaped(&mut out, c, unsafe_here);
    }
    Cow::Owned(out)
}

/// JSON text with DEL, the C1 controls and the bidirectional characters written as `\uXXXX`
/// escapes: the same document (serde_json already escapes the C0 controls), safe to print.
pub fn escape_json(json: &str) -> Cow<'_, str> {
    let unsafe_in_json = |c: char| c != '\n' && is_unsafe(c);
    if !json.chars().any(unsafe_in_json) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if unsafe_in_json(c) {
            // Every such character is in the Basic Multilingual Plane: one \u escape.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn push_escaped(out: &mut String, c: char, escape: impl Fn(char) -> bool) {
    if !escape(c) {
        out.push(c);
    } else if u32::from(c) < 0x100 {
        let _ = write!(out, "\\x{:02x}", u32::from(c));
    } else {
        let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
    }
}

/// Escapes every string a view holds, in place (see [`escape`]).
pub trait Escape {
    fn escape_all(&mut self);
}

impl Escape for String {
    fn escape_all(&mut self) {
        if let Cow::Owned(escaped) = escape(self) {
            *self = escaped;
        }
    }
}

impl<T: Escape> Escape for Option<T> {
    fn escape_all(&mut self) {
        if let Some(v) = self {
            v.escape_all();
        }
    }
}

impl<T: Escape> Escape for Vec<T> {
    fn escape_all(&mut self) {
        for v in self {
            v.escape_all();
        }
    }
}

impl<V: Escape> Escape for std::collections::BTreeMap<String, V> {
    fn escape_all(&mut self) {
        let old = std::mem::take(self);
        for (mut k, mut v) in old {
            k.escape_all();
            v.escape_all();
            self.insert(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_overrides_are_shown_not_sent() {
        assert_eq!(
            escape("\u{1b}[2J\u{1b}]0;owned\u{7}"),
            "\\x1b[2J\\x1b]0;owned\\x07"
        );
        assert_eq!(escape("a\u{9b}31mb\u{7f}"), "a\\x9b31mb\\x7f");
        assert_eq!(escape("line\r\nforged"), "line\\x0d\\x0aforged");
        assert_eq!(escape("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(escape("tab\there"), "tab\\x09here");
        // Plain text, accents and emoji included, is left alone.
        assert!(matches!(
            escape("port 22 held by sshd, café ✓"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn the_last_pass_keeps_only_the_layouts_newlines() {
        assert_eq!(
            escape_keeping_lines("row 1\nrow \u{1b}[1A2\n"),
            "row 1\nrow \\x1b[1A2\n"
        );
    }

    #[test]
    fn json_keeps_its_meaning_and_loses_the_raw_controls() {
        let value = serde_json::json!({"m": "a\u{1b}b\u{9b}c\u{7f}d\u{202e}e"});
        let text = serde_json::to_string(&value).expect("json");
        let safe = escape_json(&text);
        assert!(!safe.chars().any(is_unsafe), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).expect("still JSON");
        assert_eq!(back, value);
    }
}

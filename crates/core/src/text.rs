//! Cutting text to a size in bytes without splitting a character: logs, records and
//! notifications are bounded in bytes, and the text they bound is anyone's UTF-8.
//!
//! Showing text the sandbox chose to a person ([`visible`], [`visible_lines`],
//! [`visible_json`]): tool and server names, skill descriptions and sources, argument values
//! are the code's to choose, and a terminal or a client's form acts on some characters instead
//! of showing them (escape sequences move the cursor and erase rows, a carriage return
//! overwrites a line, bidi overrides reorder what is read, a newline starts what looks like the
//! bridge's own next line). Those characters are shown as escapes instead, so what is printed
//! is what was stored, and cannot pass for the bridge's own words.

use std::borrow::Cow;

/// The largest index `<= at` that is a character boundary of `s` (`s.len()` when `at` is past
/// the end).
pub fn floor_char_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    (0..=at).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

/// `s` cut to at most `max` bytes at a character boundary, with `marker` appended when it was
/// cut.
pub fn truncate_with(s: &mut String, max: usize, marker: &str) {
    if s.len() > max {
        s.truncate(floor_char_boundary(s, max));
        s.push_str(marker);
    }
}

/// Whether `c` is shown as itself: printable, and neither a control (C0, DEL, C1), a format
/// character (bidi overrides and isolates, zero-width ones, the BOM), a line or paragraph
/// separator, a private-use or unassigned code point, nor a space other than `' '`. This is
/// the standard library's `Debug` judgement (`char::escape_debug`), which follows Unicode's
/// categories; a combining mark (grapheme extender) is shown as itself after a character that
/// is, so accented and non-Latin text stays readable, and escaped where it would combine with
/// what the bridge printed before it.
fn shown(c: char, after_shown: bool) -> bool {
    if matches!(c, '"' | '\'' | '\\') {
        return true;
    }
    if c.escape_debug().len() == 1 {
        return true;
    }
    // `str::escape_debug` leaves a grapheme extender as itself except at the start.
    after_shown && {
        let mut pair = String::from("a");
        pair.push(c);
        pair.escape_debug().count() == 2
    }
}

/// How a character that is not [`shown`] is written: `\xNN` below U+0080 (`\x1b`, `\x07`),
/// `\u{NNNN}` above, and `\n`, `\r`, `\t` for the three everyone knows.
fn push_escape(out: &mut String, c: char) {
    use std::fmt::Write as _;
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// `s` as one line of text a person can read safely in a terminal: every character that is
/// not printable (see `shown`) as an escape (`\x1b`, `\r`, `\n`, `\u{202e}`), and a
/// backslash doubled, so an escape in the output always means a character in the data.
/// Plain text comes back unchanged (and unallocated).
pub fn visible(s: &str) -> Cow<'_, str> {
    escape(s, false, true)
}

/// `s` as lines of text (a skill's source, a description shown whole): like [`visible`], but
/// newlines and tabs stay what they are, and backslashes too, so source code reads as the
/// code it is (its own escapes are Python's; a character the terminal would act on is never
/// printed, so nothing printed can hide or rewrite a line).
pub fn visible_lines(s: &str) -> Cow<'_, str> {
    escape(s, true, false)
}

fn escape(s: &str, keep_lines: bool, double_backslash: bool) -> Cow<'_, str> {
    let kept = |c: char, after: bool| {
        (keep_lines && matches!(c, '\n' | '\t'))
            || (shown(c, after) && !(double_backslash && c == '\\'))
    };
    let mut after = false;
    let clean = s.chars().all(|c| {
        let k = kept(c, after);
        after = k && c != '\n';
        k
    });
    if clean {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    let mut after = false;
    for c in s.chars() {
        if kept(c, after) {
            out.push(c);
            after = c != '\n';
        } else if c == '\\' {
            out.push_str("\\\\");
            after = true;
        } else {
            push_escape(&mut out, c);
            after = false;
        }
    }
    Cow::Owned(out)
}

/// A JSON text (as `serde_json` writes it) with every character that is not printable written
/// as the JSON escape `\uNNNN` (a surrogate pair above U+FFFF): still valid JSON for the same
/// value, and safe to show (`serde_json` escapes only C0 controls, not C1 controls, bidi
/// overrides or line separators).
pub fn visible_json(json: &str) -> Cow<'_, str> {
    use std::fmt::Write as _;
    let mut after = false;
    let clean = json.chars().all(|c| {
        let k = shown(c, after);
        after = k;
        k
    });
    if clean {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    let mut after = false;
    for c in json.chars() {
        if shown(c, after) {
            out.push(c);
            after = true;
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{:04x}", u);
            }
            after = false;
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_terminal_acts_on_is_shown_as_escapes() {
        assert!(matches!(visible("github.delete_repo"), Cow::Borrowed(_)));
        assert_eq!(visible("a\x1b[2Kb\rc\x07"), "a\\x1b[2Kb\\rc\\x07");
        assert_eq!(visible("x\ny"), "x\\ny");
        assert_eq!(visible("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(
            visible("abc\u{202e}fed\u{2066}"),
            "abc\\u{202e}fed\\u{2066}"
        );
        assert_eq!(
            visible("\u{200b}\u{2028}\u{feff}\u{a0}"),
            "\\u{200b}\\u{2028}\\u{feff}\\u{a0}"
        );
        // The escape's own text is not a way to fake one: backslashes are doubled.
        assert_eq!(visible("\\x1b"), "\\\\x1b");
        // Readable text stays readable: accents (composed or not), other scripts, emoji.
        for ok in [
            "café",
            "cafe\u{301}",
            "हिन्दी",
            "日本語",
            "naïve 😀",
            "a \"quoted\" 'x'",
        ] {
            assert_eq!(visible(ok), ok);
        }
        // A combining mark at the start would combine with what was printed before it.
        assert_eq!(visible("\u{301}a"), "\\u{301}a");
    }

    #[test]
    fn lines_keep_their_newlines_and_code_its_backslashes() {
        let src = "def f():\n\treturn '\\n'  # \x1b[1A\x1b[2K\r\n";
        assert_eq!(
            visible_lines(src),
            "def f():\n\treturn '\\n'  # \\x1b[1A\\x1b[2K\\r\n"
        );
        assert!(matches!(
            visible_lines("def f():\n    pass\n"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn json_stays_json() {
        let v = serde_json::json!({"a": "x\u{1b}[1Ay\u{202e}z\u{85}\u{1f600}\u{e000}\u{10ffff}"});
        let text = serde_json::to_string(&v).unwrap();
        let shown = visible_json(&text);
        assert!(
            shown.chars().all(|c| c == '😀' || (' '..='~').contains(&c)),
            "{shown}"
        );
        assert!(shown.contains("\\u202e"), "{shown}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&shown).unwrap(),
            v
        );
    }

    #[test]
    fn cuts_fall_between_characters() {
        let s = "aé€😀";
        assert_eq!(floor_char_boundary(s, 0), 0);
        assert_eq!(floor_char_boundary(s, 2), 1);
        assert_eq!(floor_char_boundary(s, 5), 3);
        assert_eq!(floor_char_boundary(s, 99), s.len());
        let mut t = "é".repeat(10);
        truncate_with(&mut t, 5, "…");
        assert_eq!(t, "éé…");
        let mut short = "ok".to_string();
        truncate_with(&mut short, 5, "…");
        assert_eq!(short, "ok");
    }
}

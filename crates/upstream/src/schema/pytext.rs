//! Schema facts as Python text: a union of types (`A | B | None`), a `Literal[...]` of enum
//! values, a value cut short, and a JSON value as Python's `repr` writes it.

use std::fmt::Write as _;

use serde_json::Value;

/// Values shown of one enum, and characters of one shown value (default, example, const).
pub(super) const MAX_ENUM_VALUES: usize = 60;
pub(super) const MAX_VALUE_CHARS: usize = 120;

/// `A | B | None`: each type once, `None` last.
pub(super) fn union(types: Vec<String>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for t in types.iter().flat_map(|t| split_union(t)) {
        if !seen.contains(&t) {
            seen.push(t);
        }
    }
    if seen.iter().any(|t| t == "Any") {
        return "Any".into();
    }
    let none = seen.iter().position(|t| t == "None");
    if let Some(i) = none {
        let n = seen.remove(i);
        seen.push(n);
    }
    seen.join(" | ")
}

/// The members of a union written by [`union`] (top level only: brackets are respected).
pub(super) fn split_union(t: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut cur = String::new();
    let mut chars = t.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            cur.push(c);
            if c == '\\' {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => {
                quote = Some(c);
                cur.push(c);
            }
            '[' => {
                depth += 1;
                cur.push(c);
            }
            ']' => {
                depth -= 1;
                cur.push(c);
            }
            '|' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
            }
            _ => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

pub(super) fn literal(values: &[Value]) -> String {
    if values.is_empty() {
        return "Never".into();
    }
    let mut shown: Vec<String> = values
        .iter()
        .take(MAX_ENUM_VALUES)
        .map(|v| match v {
            Value::Null => "None".to_string(),
            v => short(&py_repr(v)),
        })
        .collect();
    if values.len() > MAX_ENUM_VALUES {
        shown.push(format!("... ({} more)", values.len() - MAX_ENUM_VALUES));
    }
    format!("Literal[{}]", shown.join(", "))
}

pub(super) fn short(s: &str) -> String {
    if s.chars().count() <= MAX_VALUE_CHARS {
        return s.to_string();
    }
    let mut t: String = s.chars().take(MAX_VALUE_CHARS - 1).collect();
    t.push('\u{2026}');
    t
}

/// A JSON value as Python writes it: `'text'`, `True`, `None`, `[1, 'a']`, `{'k': 1.5}`.
pub fn py_repr(v: &Value) -> String {
    let mut out = String::new();
    write_py(v, &mut out);
    out
}

fn write_py(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_py_str(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py(x, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_str(k, out);
                out.push_str(": ");
                write_py(x, out);
            }
            out.push('}');
        }
    }
}

/// A string as Python's `repr` writes it (single quotes unless it holds one and no double).
fn write_py_str(s: &str, out: &mut String) {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(q);
}

//! JSONC, as VS Code and hand-edited `mcpServers` files use it: JSON with `//` and `/* */`
//! comments and trailing commas. Stripped to plain JSON before parsing, rather than parsed by a
//! second parser, so serde_json's errors (and their line numbers) still describe the file.

/// Remove `//` and `/* */` comments and trailing commas, outside strings (JSONC -> JSON).
pub fn strip_jsonc(text: &str) -> String {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut in_str = false;
    let mut start = 0; // start of the pending verbatim run
    while i < b.len() {
        let c = b[i];
        if in_str {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        match c {
            b'"' => {
                in_str = true;
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                out.push_str(&text[start..i]);
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                start = i;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                out.push_str(&text[start..i]);
                let start_of_comment = i;
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i = (i + 2).min(b.len());
                // Keep the line count, so parse errors point at the right line.
                out.push(' ');
                out.extend(std::iter::repeat_n(
                    '\n',
                    text[start_of_comment..i].matches('\n').count(),
                ));
                start = i;
            }
            b',' => {
                // A comma followed (after whitespace/comments) by `}` or `]` is dropped.
                let mut j = i + 1;
                loop {
                    while j < b.len() && b[j].is_ascii_whitespace() {
                        j += 1;
                    }
                    if b.get(j) == Some(&b'/') && b.get(j + 1) == Some(&b'/') {
                        while j < b.len() && b[j] != b'\n' {
                            j += 1;
                        }
                    } else if b.get(j) == Some(&b'/') && b.get(j + 1) == Some(&b'*') {
                        j += 2;
                        while j < b.len() && !(b[j] == b'*' && b.get(j + 1) == Some(&b'/')) {
                            j += 1;
                        }
                        j = (j + 2).min(b.len());
                    } else {
                        break;
                    }
                }
                if matches!(b.get(j), Some(b'}') | Some(b']')) {
                    out.push_str(&text[start..i]);
                    start = i + 1;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    out.push_str(&text[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn jsonc_is_stripped_outside_strings() {
        let s = strip_jsonc("{\"a\": \"http://x//y\", // c\n \"b\": [1, 2, /* z */ ], /* q */ }");
        let v: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["a"], "http://x//y");
        assert_eq!(v["b"], serde_json::json!([1, 2]));
        let s = strip_jsonc("{/* a\nb */\n\"x\": nope}");
        let e = serde_json::from_str::<Value>(&s).unwrap_err();
        assert_eq!(e.line(), 3, "{s:?}");
        let s = strip_jsonc("{\"a\": \"q\\\"//,}\"}");
        let v: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["a"], "q\"//,}");
    }
}

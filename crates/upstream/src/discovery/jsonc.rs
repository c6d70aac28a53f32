//! JSONC, as VS Code and hand-edited `mcpServers` files use it: JSON with `//` and `/* */`
//! comments and trailing commas, and nothing else of JSON5 (no single quotes, bare keys, hex or
//! missing commas: a file other tools reject is not read here either). Parsed by `jsonc-parser`
//! (dprint's, the one Deno uses), whose errors name the line and column in the file as written
//! and whose nesting is bounded (512), so no file can exhaust the stack.

use serde_json::Value;

/// The JSONC of one file: every dialect option off but comments and trailing commas.
fn options() -> jsonc_parser::ParseOptions {
    jsonc_parser::ParseOptions {
        allow_comments: true,
        allow_trailing_commas: true,
        allow_loose_object_property_names: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: false,
        allow_extended_string_escapes: false,
    }
}

/// Why a JSONC file could not be read as JSON.
#[derive(Debug, thiserror::Error)]
pub enum JsoncError {
    /// The text is not JSONC: the parser's message, with its line and column.
    #[error("{0}")]
    Syntax(#[source] jsonc_parser::errors::ParseError),
    /// The text parsed but holds no value (empty, or only comments).
    #[error("the file holds no JSON value")]
    Empty,
}

/// The value of a JSONC text (a leading byte-order mark allowed), or what is wrong and where.
pub fn parse_jsonc(text: &str) -> Result<Value, JsoncError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let parsed = jsonc_parser::parse_to_ast(text, &Default::default(), &options())
        .map_err(JsoncError::Syntax)?;
    parsed.value.map(Value::from).ok_or(JsoncError::Empty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn comments_and_trailing_commas_are_read_outside_strings() {
        let v = parse_jsonc("{\"a\": \"http://x//y\", // c\n \"b\": [1, 2, /* z */ ], /* q */ }")
            .unwrap();
        assert_eq!(v["a"], "http://x//y");
        assert_eq!(v["b"], json!([1, 2]));
        let v = parse_jsonc("{\"a\": \"q\\\"//,}\"}").unwrap();
        assert_eq!(v["a"], "q\"//,}");
        // VS Code's files: trailing commas on lines of their own, a byte-order mark.
        let v = parse_jsonc("\u{feff}{\n  \"s\": {\"a\": [1,\n],\n},\n}\n").unwrap();
        assert_eq!(v["s"]["a"], json!([1]));
    }

    #[test]
    fn errors_name_the_place_and_nothing_else_of_json5_is_taken() {
        let e = parse_jsonc("{/* a\nb */\n\"x\": nope}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3"), "{e}");
        for bad in [
            "{'a': 1}",
            "{a: 1}",
            "{\"a\": 0x1}",
            "{\"a\": 1 \"b\": 2}",
            "{\"a\": 1 /* x",
        ] {
            assert!(parse_jsonc(bad).is_err(), "{bad}");
        }
        assert!(parse_jsonc("").is_err());
        let deep = "[".repeat(100_000);
        assert!(parse_jsonc(&deep).is_err(), "nesting is bounded");
    }
}

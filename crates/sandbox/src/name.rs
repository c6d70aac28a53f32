//! Session names: the rule every name meets wherever it comes from, and how a session's key is
//! shown in a log line.

use bridge_core::identity::SessionKey;

/// The rule of every session name, wherever it comes from (a call's `session`, a fork's name,
/// a listing read back from the store): 1 to 64 characters of letters, digits, '-', '_' or '.'.
/// So a name is never a path, never hides or reorders text, and every session that exists is
/// one a call can name. `Err` says the rule, with the name as it is (escaped, cut).
pub fn check_session_name(name: &str) -> Result<(), BadSessionName> {
    if !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Ok(());
    }
    let cut = &name[..bridge_core::text::floor_char_boundary(name, 80)];
    Err(BadSessionName {
        shown: bridge_core::text::visible(cut).into_owned(),
        bytes: (cut.len() < name.len()).then_some(name.len()),
    })
}

/// A session name outside the rule of [`check_session_name`]: the name as it is shown (escaped,
/// cut at 80 bytes) and, when cut, its whole length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the session name \"{shown}\"{} must be 1-64 characters of letters, digits, '-', '_' or '.'",
    .bytes.map(|n| format!(" ({n} bytes)")).unwrap_or_default()
)]
pub struct BadSessionName {
    /// The name as a log line or a listing shows it.
    pub shown: String,
    /// The name's length in bytes, when `shown` is cut.
    pub bytes: Option<usize>,
}

/// A session's key as a log line shows it: escaped as the CLI's listings are
/// (`bridge_core::text::visible`), so no identity or name rewrites the line it is in.
pub(crate) fn shown(key: &SessionKey) -> String {
    bridge_core::text::visible(&key.to_string()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::check_session_name;

    #[test]
    fn a_session_name_is_1_to_64_of_letters_digits_dash_underscore_dot() {
        for ok in [
            "a",
            "default",
            "mcp-0123456789abcdef",
            "a.b_c-d",
            &"x".repeat(64),
        ] {
            assert!(check_session_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "../x",
            "a/b",
            "/abs",
            " ",
            "alice/work",
            "\u{202e}work",
            "a\u{200b}b",
            "\u{2066}x",
            "a\u{2028}b",
            "tab\there",
            "é",
            &"x".repeat(65),
        ] {
            let err = check_session_name(bad).unwrap_err().to_string();
            assert!(
                err.contains("must be 1-64 characters of letters, digits, '-', '_' or '.'"),
                "{err}"
            );
            assert!(
                !err.chars()
                    .any(|c| c.is_control() || ('\u{2000}'..='\u{206f}').contains(&c)),
                "the name is shown escaped: {err:?}"
            );
        }
        let long = check_session_name(&"x".repeat(5000))
            .unwrap_err()
            .to_string();
        assert!(long.len() < 300 && long.contains("(5000 bytes)"), "{long}");
    }
}

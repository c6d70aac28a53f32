//! How upstream errors read. Every error of this side ends up as text for the model (through the
//! sandbox) or for a person (the CLI), so each says what happened in its `Display` and, where
//! there is something to do about it, what to do next in its [`Hint`] (uv's `hint:` lines).
//! [`Hinted::message`] joins the two into the one line the reader gets.

use std::fmt;

/// What to do next about an error, and how it follows the error in the joined text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint {
    text: String,
    joint: Joint,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Joint {
    /// `what happened; what to do`
    Clause,
    /// `what happened. What to do.`
    Sentence,
    /// `what happened (what to do)`
    Aside,
}

impl Hint {
    /// Advice that continues the message after a semicolon.
    pub fn clause(text: impl Into<String>) -> Hint {
        Hint {
            text: text.into(),
            joint: Joint::Clause,
        }
    }

    /// Advice that is a sentence (or more) of its own.
    pub fn sentence(text: impl Into<String>) -> Hint {
        Hint {
            text: text.into(),
            joint: Joint::Sentence,
        }
    }

    /// Advice in parentheses after the message.
    pub fn aside(text: impl Into<String>) -> Hint {
        Hint {
            text: text.into(),
            joint: Joint::Aside,
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// An error with optional advice.
pub trait Hinted: fmt::Display {
    /// What to do next, when there is something to do.
    fn hint(&self) -> Option<Hint> {
        None
    }

    /// The error and its advice as one text: what the model (or the person at the CLI) reads.
    fn message(&self) -> String {
        match self.hint() {
            None => self.to_string(),
            Some(h) => match h.joint {
                Joint::Clause => format!("{self}; {h}"),
                Joint::Sentence => format!("{self}. {h}"),
                Joint::Aside => format!("{self} ({h})"),
            },
        }
    }
}

/// The last stderr lines of a server, as they follow an error: nothing when there are none.
pub(crate) fn stderr_suffix(lines: &[String]) -> String {
    if lines.is_empty() {
        String::new()
    } else {
        format!("; its stderr ended with:\n{}", lines.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("it broke")]
    struct Broke(Option<Hint>);

    impl Hinted for Broke {
        fn hint(&self) -> Option<Hint> {
            self.0.clone()
        }
    }

    #[test]
    fn hints_join_as_their_kind_says() {
        assert_eq!(Broke(None).message(), "it broke");
        assert_eq!(
            Broke(Some(Hint::clause("fix it"))).message(),
            "it broke; fix it"
        );
        assert_eq!(
            Broke(Some(Hint::sentence("Fix it."))).message(),
            "it broke. Fix it."
        );
        assert_eq!(
            Broke(Some(Hint::aside("is it there?"))).message(),
            "it broke (is it there?)"
        );
        assert_eq!(stderr_suffix(&[]), "");
        assert_eq!(
            stderr_suffix(&["a".into(), "b".into()]),
            "; its stderr ended with:\na\nb"
        );
    }
}

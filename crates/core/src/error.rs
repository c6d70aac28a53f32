//! How every error of the bridge reads. Each ends up as text for the model (a result, an RPC
//! failure in the sandbox) or for a person (the command line, the log), so each says what
//! happened in its `Display` and, where there is something to do about it, what to do next in
//! its [`Hint`] (uv's `hint:` lines), kept apart from the message.
//!
//! Two joins, one for each reader: [`Hinted::message`] makes the one text the model or the log
//! gets; [`Hinted::report`] is the command line's one printer (`what happened`, then a
//! `hint:` line).
//!
//! **Architecture invariant:** every error type with advice implements [`Hinted`]; nothing else
//! puts a hint into a message (no `hint:` in a `Display`, no hand-made joins).

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
    /// `what happened` and, on a line of its own, `what to do` (a message that lists what was
    /// tried, a line each).
    Line,
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

    /// Advice on a line of its own after the message.
    pub fn line(text: impl Into<String>) -> Hint {
        Hint {
            text: text.into(),
            joint: Joint::Line,
        }
    }

    /// The advice alone, without the joint that attaches it to a message.
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
            Some(h) => {
                let what = self.to_string();
                match h.joint {
                    Joint::Clause => format!("{what}; {h}"),
                    // A message that ends its own sentence is not given a second full stop.
                    Joint::Sentence if what.ends_with('.') => format!("{what} {h}"),
                    Joint::Sentence => format!("{what}. {h}"),
                    Joint::Aside => format!("{what} ({h})"),
                    Joint::Line => format!("{what}\n{h}"),
                }
            }
        }
    }

    /// The error as the command line prints it after `error: `: the message, then its advice
    /// on a `hint:` line of its own.
    fn report(&self) -> String {
        match self.hint() {
            None => self.to_string(),
            Some(h) => format!("{self}\nhint: {h}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("it broke")]
    struct Broke(Option<Hint>);

    #[derive(Debug, thiserror::Error)]
    #[error("it broke.")]
    struct Stopped;

    impl Hinted for Stopped {
        fn hint(&self) -> Option<Hint> {
            Some(Hint::sentence("Start it."))
        }
    }

    #[test]
    fn a_sentence_gets_one_full_stop() {
        assert_eq!(Stopped.message(), "it broke. Start it.");
    }

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
        assert_eq!(
            Broke(Some(Hint::line("Try again."))).message(),
            "it broke\nTry again."
        );
        assert_eq!(
            Broke(Some(Hint::clause("fix it"))).report(),
            "it broke\nhint: fix it"
        );
        assert_eq!(Broke(None).report(), "it broke");
    }
}

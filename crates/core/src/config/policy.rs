//! `[policy]`: which proxied tool calls run, ask the user first, or are refused. The schema and
//! its load-time checks live here; the matching and the decisions are `crate::policy`'s.
//!
//! Rules are `"server.tool"` globs on the server's name and the tool's real name (`globset`
//! syntax: `*`, `?`, `[a-z]`, `{a,b}`). In TOML they are lists; in the environment one string,
//! split at the commas outside `{…}`, so `MCP_BRIDGE_POLICY_DENY="github.{delete,drop}_*,*.rm"`
//! is two rules.

use super::flows::FlowsConfig;
pub use super::globs::Patterns;
use std::fmt;

use serde::{Deserialize, Serialize};

/// What a rule, the default or the destructive-tools setting does to a call. Ordered least to
/// most restrictive: the most restrictive matching rule wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// The call runs.
    Allow,
    /// The user is asked first; the call runs only if they allow it (or, when they cannot be
    /// asked, as `ask_fallback` says).
    Ask,
    /// The call is refused, never sent.
    Deny,
}

impl Action {
    /// The action as the configuration spells it: `allow`, `ask` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Ask => "ask",
            Action::Deny => "deny",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `destructive`: an [`Action`] for tools no rule matches whose annotations say
/// `destructiveHint: true` (and not `readOnlyHint: true`), or `unset`: such tools follow
/// `default` like any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Destructive {
    /// Destructive tools no rule matches are allowed.
    Allow,
    /// The user is asked before a destructive tool no rule matches runs.
    Ask,
    /// Destructive tools no rule matches are refused.
    Deny,
    /// Annotations are not looked at: such tools follow `default` (the default).
    Unset,
}

impl Destructive {
    /// The action for a destructive tool no rule matches; `None` for `unset`.
    pub fn action(self) -> Option<Action> {
        match self {
            Destructive::Allow => Some(Action::Allow),
            Destructive::Ask => Some(Action::Ask),
            Destructive::Deny => Some(Action::Deny),
            Destructive::Unset => None,
        }
    }
}

/// `ask_fallback`: what `ask` means when the client cannot be asked. Asking again is no answer,
/// so only `allow` and `deny` are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// The call (or install, or save) goes ahead unasked.
    Allow,
    /// It is refused, saying that the client cannot be asked.
    Deny,
}

impl Fallback {
    /// The same choice as an [`Action`].
    pub fn action(self) -> Action {
        match self {
            Fallback::Allow => Action::Allow,
            Fallback::Deny => Action::Deny,
        }
    }
}

/// The `[policy]` section. With none written, every call is allowed, as before there was a
/// policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// For a tool no rule matches (and, with `destructive` set, that is not destructive).
    pub default: Action,
    /// `server.tool` globs of calls that run unasked (unless a `deny` or `ask` rule matches
    /// too).
    pub allow: Patterns,
    /// Globs of calls the user is asked about first (unless a `deny` rule matches too).
    pub ask: Patterns,
    /// Globs of calls that are refused; they win over every other rule.
    pub deny: Patterns,
    /// `unset` by default: annotations are the server's own claims, and a default of `ask`
    /// would turn every destructive-annotated tool of a client without elicitation into a
    /// refusal (`ask_fallback`), changing what runs for users who wrote no `[policy]`.
    pub destructive: Destructive,
    /// What `ask` means when the client cannot be asked (no elicitation, no `input_required`).
    pub ask_fallback: Fallback,
    /// `[policy.flows]`: where a guarded argument's value may come from (off by default).
    pub flows: FlowsConfig,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            default: Action::Allow,
            allow: Patterns::default(),
            ask: Patterns::default(),
            deny: Patterns::default(),
            destructive: Destructive::Unset,
            ask_fallback: Fallback::Deny,
            flows: FlowsConfig::default(),
        }
    }
}

impl PolicyConfig {
    /// The rule lists with their key names, most restrictive first.
    pub fn lists(&self) -> [(&'static str, Action, &Patterns); 3] {
        [
            ("policy.deny", Action::Deny, &self.deny),
            ("policy.ask", Action::Ask, &self.ask),
            ("policy.allow", Action::Allow, &self.allow),
        ]
    }

    /// Every pattern is a `server.tool` glob; the error names the key and why.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        for (key, _, list) in self.lists() {
            for p in &list.0 {
                Patterns::check(p).map_err(|why| (key, why.to_string()))?;
            }
        }
        self.flows.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_lists_split_at_commas_outside_braces() {
        assert_eq!(
            Patterns::split("github.{delete,drop}_*, *.rm,"),
            ["github.{delete,drop}_*", " *.rm", ""]
        );
        let p: Patterns = serde_json::from_value(serde_json::json!("a.{x,y}, b.*,,")).unwrap();
        assert_eq!(p.0, ["a.{x,y}", "b.*"]);
        let p: Patterns = serde_json::from_value(serde_json::json!(["a.*", " "])).unwrap();
        assert_eq!(p.0, ["a.*"]);
    }

    #[test]
    fn bad_patterns_are_named_with_their_key() {
        let mut c = PolicyConfig::default();
        assert!(c.validate().is_ok());
        c.deny = Patterns(vec!["github".into()]);
        let (key, why) = c.validate().unwrap_err();
        assert_eq!(key, "policy.deny");
        assert!(
            why.contains("has no '.'") && why.contains("github.*"),
            "{why}"
        );
        c.deny = Patterns::default();
        c.ask = Patterns(vec!["github.[create".into()]);
        let (key, why) = c.validate().unwrap_err();
        assert_eq!(key, "policy.ask");
        assert!(
            why.contains("github.[create") && why.contains("not a glob"),
            "{why}"
        );
    }
}

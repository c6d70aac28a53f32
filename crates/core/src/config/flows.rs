//! `[policy.flows]`: where the values of a proxied call's arguments may come from. Off unless
//! `enabled = true`, so no configuration gets a question it did not ask for. The schema and its
//! load-time checks live here; the labels compiled for matching and the provenance of values are
//! `crate::flows`'.
//!
//! The label lists are `"server.tool"` globs, as `[policy]`'s rules are ([`Patterns`]).
//! `guard` names, per glob, the arguments of an acting or open tool that must be the user's
//! intent: in TOML a table (`guard = { "bank.send_money" = ["recipient", "amount"] }`), in the
//! environment one string, `glob=arg+arg` entries split at `;`
//! (`MCP_BRIDGE_POLICY_FLOWS_GUARD="bank.send_money=recipient+amount;mail.send=to"`).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use super::globs::Patterns;
use super::values::flexible_bool;

/// `on_suspect`: what a suspect flow gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnSuspect {
    /// The user is asked, naming the argument, its value and where it came from (the default).
    Ask,
    /// The call is refused (`ToolDenied` in Python).
    Deny,
}

impl OnSuspect {
    /// As the configuration spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnSuspect::Ask => "ask",
            OnSuspect::Deny => "deny",
        }
    }
}

/// `guard`: per `server.tool` glob, the arguments that must be the user's intent. A tool no
/// glob names has every argument guarded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Guards(pub BTreeMap<String, Vec<String>>);

impl Guards {
    /// Read the environment's form: `glob=arg+arg` entries separated by `;`.
    fn parse(s: &str) -> BTreeMap<String, Vec<String>> {
        s.split(';')
            .filter(|e| !e.trim().is_empty())
            .map(|e| {
                let (glob, args) = e.split_once('=').unwrap_or((e, ""));
                let args = args
                    .split('+')
                    .map(|a| a.trim().to_string())
                    .filter(|a| !a.is_empty())
                    .collect();
                (glob.trim().to_string(), args)
            })
            .collect()
    }
}

impl<'de> Deserialize<'de> for Guards {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum G {
            Table(BTreeMap<String, Vec<String>>),
            Str(String),
        }
        Ok(Guards(match G::deserialize(d)? {
            G::Table(t) => t,
            G::Str(s) => Guards::parse(&s),
        }))
    }
}

/// The `[policy.flows]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlowsConfig {
    /// Whether flows are checked at all (off by default).
    #[serde(deserialize_with = "flexible_bool")]
    pub enabled: bool,
    /// Tools whose results carry someone else's words.
    pub untrusted: Patterns,
    /// Tools whose results are private.
    pub private: Patterns,
    /// Tools that act on the world: their guarded arguments must be the user's intent.
    pub acting: Patterns,
    /// Tools that send their arguments to others: no guarded argument may carry private text.
    pub open: Patterns,
    /// The guarded arguments of acting and open tools, per glob; default every argument.
    pub guard: Guards,
    /// What a suspect flow gets.
    pub on_suspect: OnSuspect,
    /// Whether tools' MCP annotations label them too (`openWorldHint`, `readOnlyHint`,
    /// `destructiveHint`), where a server sets them.
    #[serde(deserialize_with = "flexible_bool")]
    pub annotations: bool,
}

impl Default for FlowsConfig {
    fn default() -> Self {
        FlowsConfig {
            enabled: false,
            untrusted: Patterns::default(),
            private: Patterns::default(),
            acting: Patterns::default(),
            open: Patterns::default(),
            guard: Guards::default(),
            on_suspect: OnSuspect::Ask,
            annotations: true,
        }
    }
}

impl FlowsConfig {
    /// The label lists with their key names.
    pub fn lists(&self) -> [(&'static str, &Patterns); 4] {
        [
            ("policy.flows.untrusted", &self.untrusted),
            ("policy.flows.private", &self.private),
            ("policy.flows.acting", &self.acting),
            ("policy.flows.open", &self.open),
        ]
    }

    /// Every glob is a `server.tool` glob and every guard names an argument; the error names
    /// the key and why.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        for (key, list) in self.lists() {
            for p in &list.0 {
                Patterns::check(p).map_err(|why| (key, why.to_string()))?;
            }
        }
        for (glob, args) in &self.guard.0 {
            Patterns::check(glob).map_err(|why| ("policy.flows.guard", why.to_string()))?;
            if args.is_empty() {
                return Err((
                    "policy.flows.guard",
                    format!(
                        "{glob:?} names no argument; list the arguments that must be the user's intent (e.g. [\"recipient\", \"amount\"]), or leave the tool out to guard all of them"
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_read_as_a_table_or_the_environments_string() {
        let g: Guards = serde_json::from_value(serde_json::json!(
            "bank.send_money=recipient+amount; mail.send = to ;"
        ))
        .unwrap();
        assert_eq!(g.0["bank.send_money"], ["recipient", "amount"]);
        assert_eq!(g.0["mail.send"], ["to"]);
        let g: Guards = serde_json::from_value(serde_json::json!({"bank.pay": ["iban"]})).unwrap();
        assert_eq!(g.0["bank.pay"], ["iban"]);
    }

    #[test]
    fn bad_globs_and_empty_guards_are_named_with_their_key() {
        let mut c = FlowsConfig::default();
        assert!(c.validate().is_ok());
        c.acting = Patterns(vec!["bank".into()]);
        assert_eq!(c.validate().unwrap_err().0, "policy.flows.acting");
        c.acting = Patterns::default();
        c.guard = Guards([("bank.send".to_string(), Vec::new())].into());
        let (key, why) = c.validate().unwrap_err();
        assert_eq!(key, "policy.flows.guard");
        assert!(why.contains("names no argument"), "{why}");
        c.guard = Guards([("bank[".to_string(), vec!["a".into()])].into());
        assert_eq!(c.validate().unwrap_err().0, "policy.flows.guard");
    }
}

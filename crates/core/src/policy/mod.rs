//! The user's control over proxied tool calls: the `[policy]` rules compiled for matching, the
//! [`Decision`] taken for each call, the [`Approver`] that asks the human, and what "allow for
//! this session" remembers ([`Grants`]).
//!
//! Decisions are made per proxied call, in `upstream::rpc`, never per `run_python` call: code
//! outlives its call within a session (a thread left running), so which call's code sent a
//! request proves nothing. This module knows `config` and rmcp's data model only; the client it
//! asks is behind [`Approver`], implemented by `server` with the MCP peer, so `upstream` never
//! learns rmcp's server side.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use globset::GlobSet;
use serde_json::{Map, Value};

use crate::config::Loaded;
use crate::config::policy::{Action, PolicyConfig};
use crate::identity::SessionKey;

/// What happened to one proxied call, as the audit log spells it ([`Verdict::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A rule (or the default) allows it.
    Allow,
    /// A rule (or the default) refuses it.
    Deny,
    /// The user was asked and allowed it (now, or earlier for this session).
    AskAllowed,
    /// The user was asked and refused (declined, cancelled, or chose deny).
    AskDenied,
    /// The rule says ask, the client cannot be asked: `ask_fallback` decided.
    AskUnavailable,
}

impl Verdict {
    /// The verdict as the audit log's `decision` spells it (`ask:allowed`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::AskAllowed => "ask:allowed",
            Verdict::AskDenied => "ask:denied",
            Verdict::AskUnavailable => "ask:unavailable",
        }
    }
}

/// The decision about one proxied call: the verdict, whether the call goes ahead (an
/// `ask:unavailable` call goes ahead when `ask_fallback = "allow"`), the rule that decided
/// (`policy.deny "github.delete_*"`, `policy.default = "allow"`) and where that rule is set (a
/// file path, `environment variable MCP_BRIDGE_POLICY_DENY`, `default`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// What happened to the call.
    pub verdict: Verdict,
    /// Whether the call goes ahead (`allow`, `ask:allowed`, or `ask:unavailable` with
    /// `ask_fallback = "allow"`).
    pub allowed: bool,
    /// The rule that decided (`policy.deny "github.delete_*"`); `None` when no rule did (a
    /// question left unanswered when its exec ended).
    pub rule: Option<String>,
    /// Where that rule is set (a file's path, `environment variable MCP_BRIDGE_POLICY_DENY`,
    /// `default`); `None` with `rule`.
    pub origin: Option<String>,
    /// For an `ask` rule, which path decided: the human, asked by `elicitation` or
    /// `input_required`; `session_grant` (allowed for the session before); `fallback` (the
    /// client could not be asked: `ask_fallback`). `None` for other rules.
    pub ask: Option<&'static str>,
}

/// What the rules say of a call before anyone is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruling {
    /// What the rule does to the call.
    pub action: Action,
    /// The rule that matched, as people read it: its list and pattern
    /// (`policy.deny "github.delete_*"`), `policy.destructive = ...` or `policy.default = ...`.
    pub rule: String,
    /// Where that rule is set: a file's path, an environment variable, a flag, or `default`.
    pub origin: String,
}

impl Ruling {
    /// The decision when no one is asked: `allow` and `deny` as they are; `ask` only through
    /// [`Ruling::asked`].
    pub fn decided(&self, verdict: Verdict, allowed: bool) -> Decision {
        Decision {
            verdict,
            allowed,
            rule: Some(self.rule.clone()),
            origin: Some(self.origin.clone()),
            ask: None,
        }
    }

    /// [`Ruling::decided`] for an `ask` rule, naming the path that decided.
    pub fn asked(&self, verdict: Verdict, allowed: bool, path: &'static str) -> Decision {
        Decision {
            ask: Some(path),
            ..self.decided(verdict, allowed)
        }
    }
}

/// One rule list compiled: a glob set and its patterns, by index.
struct RuleList {
    key: &'static str,
    action: Action,
    set: GlobSet,
    patterns: Vec<String>,
    origin: String,
}

/// The `[policy]` in force, compiled once at start.
pub struct Policy {
    /// Most restrictive first (deny, ask, allow): the first list with a match decides.
    lists: Vec<RuleList>,
    default: Action,
    default_origin: String,
    destructive: Option<(Action, String)>,
    fallback: Action,
    fallback_origin: String,
}

impl Default for Policy {
    /// No `[policy]`: every call allowed.
    fn default() -> Self {
        Policy::new(&PolicyConfig::default(), |_| "default".into())
    }
}

impl Policy {
    /// The policy of the loaded configuration, each rule knowing where it was set.
    pub fn from_loaded(loaded: &Loaded) -> Policy {
        Policy::new(&loaded.config.policy, |key| loaded.source_of(key))
    }

    /// Compile `cfg`; `origin(key)` says where `key` (`policy.deny`) was set. Patterns were
    /// checked at load (`PolicyConfig::validate`); one that still does not compile is skipped
    /// with a warning rather than taking the bridge down.
    pub fn new(cfg: &PolicyConfig, origin: impl Fn(&str) -> String) -> Policy {
        let lists = cfg
            .lists()
            .into_iter()
            .map(|(key, action, patterns)| {
                let (set, patterns) = patterns.compile(key);
                RuleList {
                    key,
                    action,
                    set,
                    patterns,
                    origin: origin(key),
                }
            })
            .collect();
        Policy {
            lists,
            default: cfg.default,
            default_origin: origin("policy.default"),
            destructive: cfg
                .destructive
                .action()
                .map(|a| (a, origin("policy.destructive"))),
            fallback: cfg.ask_fallback.action(),
            fallback_origin: origin("policy.ask_fallback"),
        }
    }

    /// What the rules say of `server.tool`: the most restrictive matching rule; else, for a
    /// `destructive` tool, the `destructive` setting when set; else the default.
    pub fn rule_for(&self, server: &str, tool: &str, destructive: bool) -> Ruling {
        let subject = format!("{server}.{tool}");
        for l in &self.lists {
            if let Some(&i) = l.set.matches(&subject).first() {
                return Ruling {
                    action: l.action,
                    rule: format!("{} {:?}", l.key, l.patterns[i]),
                    origin: l.origin.clone(),
                };
            }
        }
        if destructive && let Some((action, origin)) = &self.destructive {
            return Ruling {
                action: *action,
                rule: format!(
                    "policy.destructive = {:?} (the tool is annotated destructiveHint)",
                    action.as_str()
                ),
                origin: origin.clone(),
            };
        }
        Ruling {
            action: self.default,
            rule: format!("policy.default = {:?}", self.default.as_str()),
            origin: self.default_origin.clone(),
        }
    }

    /// What `ask` becomes when the client cannot be asked, and where that is set.
    pub fn fallback(&self) -> (Action, &str) {
        (self.fallback, &self.fallback_origin)
    }

    /// Whether this policy lets every call through unasked (no rule but allow, default allow,
    /// destructive unset or allow).
    pub fn allows_everything(&self) -> bool {
        self.default == Action::Allow
            && self
                .lists
                .iter()
                .all(|l| l.action == Action::Allow || l.patterns.is_empty())
            && self
                .destructive
                .as_ref()
                .is_none_or(|(a, _)| *a == Action::Allow)
    }

    /// One line for `doctor`: the policy in force.
    pub fn summary(&self) -> String {
        if self.allows_everything() {
            return "every proxied tool call is allowed (no [policy] rules)".into();
        }
        let mut parts = vec![format!("default {}", self.default)];
        for l in &self.lists {
            if !l.patterns.is_empty() {
                parts.push(format!("{} {}", l.action, l.patterns.join(",")));
            }
        }
        if let Some((a, _)) = &self.destructive {
            parts.push(format!("destructive {a}"));
        }
        parts.push(format!("ask_fallback {}", self.fallback));
        parts.join("; ")
    }

    /// The rules as markdown lines for the model (the capabilities resource): what will ask and
    /// what is refused, so it does not spend calls finding out.
    pub fn markdown(&self) -> String {
        if self.allows_everything() {
            return "Every tool call is allowed.\n".into();
        }
        let mut s = String::new();
        for l in &self.lists {
            if !l.patterns.is_empty() {
                let what = match l.action {
                    Action::Deny => "refused (`runtime.ToolDenied`, a `PermissionError`)",
                    Action::Ask => {
                        "asked of the user first (a refusal raises `runtime.ToolDenied`)"
                    }
                    Action::Allow => "allowed",
                };
                let globs: Vec<String> = l.patterns.iter().map(|p| format!("`{p}`")).collect();
                s.push_str(&format!("- {what}: {}\n", globs.join(", ")));
            }
        }
        if let Some((a, _)) = &self.destructive {
            s.push_str(&format!(
                "- tools annotated destructive that no rule names: {a}\n"
            ));
        }
        s.push_str(&format!("- any other tool: {}\n", self.default));
        s.push_str("`runtime.describe_server(name)` marks each tool's `policy` (`ask` or `deny`; allowed tools have none). Do not retry a refused call.\n");
        s
    }
}

/// Whether `tool`'s annotations say it is destructive: `destructiveHint: true` and not
/// `readOnlyHint: true`. Only what the server says: an unannotated tool is not (the MCP default
/// of `destructiveHint` would make nearly every tool ask).
pub fn is_destructive(tool: &rmcp::model::Tool) -> bool {
    annotated_destructive(tool.annotations.as_ref())
}

/// [`is_destructive`] of a tool's annotations.
pub fn annotated_destructive(annotations: Option<&rmcp::model::ToolAnnotations>) -> bool {
    annotations.is_some_and(|a| a.destructive_hint == Some(true) && a.read_only_hint != Some(true))
}

/// What the human is asked about.
#[derive(Debug, Clone)]
pub struct ApprovalRequest {
    /// The upstream server of the call (empty for [`Asked::Other`]).
    pub server: String,
    /// The tool called (empty for [`Asked::Other`]).
    pub tool: String,
    /// [`summarize_arguments`]' text: readable and bounded.
    pub arguments: String,
    /// The rule that says to ask, as people read it ([`Ruling::rule`]).
    pub rule: String,
    /// Where that rule is set ([`Ruling::origin`]).
    pub origin: String,
    /// What is asked about: a proxied call (the fields above), or something else the bridge
    /// words itself (an install, a skill's save).
    pub asked: Asked,
}

/// What an approval question is about.
#[derive(Debug, Clone, Default)]
pub enum Asked {
    /// A proxied tool call: `server`, `tool` and `arguments`.
    #[default]
    ToolCall,
    /// Another action: the form's title, and the bridge's text of the question (every name in
    /// it the code chose quoted by [`shown_name`] or a counted block of its own).
    Other {
        /// The form's title (`Allow this install?`).
        title: &'static str,
        /// The question's text, every name the code chose quoted or in a counted block.
        text: String,
    },
}

impl ApprovalRequest {
    /// A question about something other than a tool call.
    pub fn other(
        title: &'static str,
        text: String,
        rule: String,
        origin: String,
    ) -> ApprovalRequest {
        ApprovalRequest {
            server: String::new(),
            tool: String::new(),
            arguments: String::new(),
            rule,
            origin,
            asked: Asked::Other { title, text },
        }
    }

    /// The title of the form's one choice.
    pub fn title(&self) -> &'static str {
        match &self.asked {
            Asked::ToolCall => "Allow this tool call?",
            Asked::Other { title, .. } => title,
        }
    }

    /// The question as the client shows it. The bridge's own words come first and end before
    /// the arguments; tool and server names are quoted and escaped ([`shown_name`]), and the
    /// arguments are a counted block of one line each, closed by an end line, so nothing the
    /// code chose can read as the bridge speaking (a fake "asked because of" line, a fake
    /// verdict) or push the real lines out of view.
    pub fn message(&self) -> String {
        if let Asked::Other { text, .. } = &self.asked {
            return format!(
                "{}\nAsked because of {} in {}.",
                text, self.rule, self.origin
            );
        }
        format!(
            "Code running in run_python wants to call the tool {} of the MCP server {}.\nAsked because of {} in {}.\n\n{}",
            shown_name(&self.tool),
            shown_name(&self.server),
            self.rule,
            self.origin,
            self.arguments
        )
    }
}

/// A name the code chose, as the question shows it: a JSON string (quoted, every character
/// that is not printable escaped), cut at 64 characters.
pub fn shown_name(name: &str) -> String {
    shown_string(name, 64)
}

/// `s` as a quoted JSON string of at most `max` of its characters, escaped to be read safely
/// (`text::visible_json`); a cut is said after the closing quote, with the whole length.
fn shown_string(s: &str, max: usize) -> String {
    let (head, cut) = match s.char_indices().nth(max) {
        Some((i, _)) => (&s[..i], true),
        None => (s, false),
    };
    let json = serde_json::to_string(head).expect("a string serializes");
    let mut out = crate::text::visible_json(&json).into_owned();
    if cut {
        out.push_str(&format!("… (cut: {} characters in all)", s.chars().count()));
    }
    out
}

/// The human's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    /// Allowed, this call only.
    Once,
    /// Allowed for the rest of this session (until reset or a new interpreter).
    Session,
    /// Denied, declined or cancelled.
    Denied,
    /// The client could not be asked after all (an error answering the request); the policy's
    /// `ask_fallback` decides.
    Unavailable(String),
}

/// Asks the human about a call. `server` implements it with the MCP client of the
/// `run_python` request, by elicitation; `upstream` knows only this trait.
#[async_trait::async_trait]
pub trait Approver: Send + Sync {
    /// Whether the client can be asked at all (it declared form elicitation).
    fn can_ask(&self) -> bool;
    /// How the question travels, as the audit log names it: `elicitation` (a request to the
    /// client) or `input_required` (a result the client answers by retrying, 2026-07-28).
    fn path(&self) -> &'static str {
        "elicitation"
    }
    /// Ask; waits as long as the human takes. The caller bounds it: the RPC is aborted at the
    /// call's deadline or cancellation.
    async fn ask(&self, request: &ApprovalRequest) -> Approval;
}

/// At most this many arguments are shown, each value cut to [`MAX_ARGUMENT_CHARS`].
pub const MAX_SHOWN_ARGUMENTS: usize = 12;
/// Characters of one argument's value the question shows at most; a longer value is cut, with
/// its length said.
pub const MAX_ARGUMENT_CHARS: usize = 200;

/// The closing line of the arguments' block in the question.
pub const END_OF_ARGUMENTS: &str = "(end of arguments)";

/// The arguments as the approval question shows them: a header with their count, then one
/// line each, `  "name" = value`, the value as JSON (a string quoted), every character that is
/// not printable escaped (`text::visible_json`: a newline is `\n`, an escape sequence
/// `\u001b`, a bidi override `\u202e`), so an argument is one line however it is made; then
/// [`END_OF_ARGUMENTS`]. Each value is cut at [`MAX_ARGUMENT_CHARS`] characters and at most
/// [`MAX_SHOWN_ARGUMENTS`] are shown: what the code sends is the model's to choose, so what
/// reaches the person's screen is bounded, and is data, never more of the bridge's words.
pub fn summarize_arguments(arguments: Option<&Map<String, Value>>) -> String {
    let Some(args) = arguments.filter(|a| !a.is_empty()) else {
        return "Arguments: none.".into();
    };
    let mut out = format!(
        "Arguments ({}, one line each, as JSON; chosen by the code):\n",
        args.len()
    );
    for (k, v) in args.iter().take(MAX_SHOWN_ARGUMENTS) {
        let value = match v {
            Value::String(s) => shown_string(s, MAX_ARGUMENT_CHARS),
            other => {
                let json = other.to_string();
                match json.char_indices().nth(MAX_ARGUMENT_CHARS) {
                    Some((i, _)) => format!(
                        "{}… (cut: {} characters in all)",
                        crate::text::visible_json(&json[..i]),
                        json.chars().count()
                    ),
                    None => crate::text::visible_json(&json).into_owned(),
                }
            }
        };
        out.push_str(&format!("  {} = {value}\n", shown_string(k, 64)));
    }
    if args.len() > MAX_SHOWN_ARGUMENTS {
        out.push_str(&format!(
            "  … and {} more not shown\n",
            args.len() - MAX_SHOWN_ARGUMENTS
        ));
    }
    out.push_str(END_OF_ARGUMENTS);
    out
}

/// Most sessions remembered, and most tools per session: every grant is a human's click, but
/// the maps stay bounded whatever happens.
const MAX_GRANT_SESSIONS: usize = 256;
const MAX_GRANTS_PER_SESSION: usize = 1024;

/// "Allow for this session", remembered per session and `server.tool`, and tied to the
/// session's interpreter: a reset, a crash or an idle close gives the session a new container,
/// whose code the human never approved, and its grants are gone.
#[derive(Default)]
pub struct Grants {
    by_session: Mutex<HashMap<SessionKey, SessionGrants>>,
}

struct SessionGrants {
    interpreter: String,
    tools: HashSet<String>,
}

impl Grants {
    /// Whether `key` (`server.tool`) is allowed for `session` running in `interpreter`.
    pub fn has(&self, session: &SessionKey, interpreter: &str, key: &str) -> bool {
        let mut m = self.by_session.lock().unwrap();
        match m.get(session) {
            Some(g) if g.interpreter == interpreter => g.tools.contains(key),
            Some(_) => {
                m.remove(session);
                false
            }
            None => false,
        }
    }

    /// Allow `key` (`server.tool`) for the rest of `session`, as long as it runs in
    /// `interpreter`: a grant for another interpreter of the session is dropped first. Past
    /// the bounds (sessions remembered, tools per session) the oldest session is forgotten,
    /// or the grant is not kept, and the human is asked again.
    pub fn grant(&self, session: &SessionKey, interpreter: &str, key: &str) {
        let mut m = self.by_session.lock().unwrap();
        if !m.contains_key(session) && m.len() >= MAX_GRANT_SESSIONS {
            let victim = m.keys().next().cloned();
            if let Some(v) = victim {
                m.remove(&v);
            }
        }
        let g = m.entry(session.clone()).or_insert_with(|| SessionGrants {
            interpreter: interpreter.to_string(),
            tools: HashSet::new(),
        });
        if g.interpreter != interpreter {
            g.interpreter = interpreter.to_string();
            g.tools.clear();
        }
        if g.tools.len() < MAX_GRANTS_PER_SESSION {
            g.tools.insert(key.to_string());
        }
    }

    /// Forget what `session` was allowed (reset).
    pub fn forget(&self, session: &SessionKey) {
        self.by_session.lock().unwrap().remove(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::policy::{Destructive, Fallback, Patterns};

    fn pats(p: &[&str]) -> Patterns {
        Patterns(p.iter().map(|s| s.to_string()).collect())
    }

    fn policy(cfg: PolicyConfig) -> Policy {
        Policy::new(&cfg, |key| format!("<{key}>"))
    }

    #[test]
    fn the_most_restrictive_matching_rule_wins_and_is_named_with_its_origin() {
        let p = policy(PolicyConfig {
            default: Action::Ask,
            allow: pats(&["time.*", "filesystem.read_*", "github.*"]),
            ask: pats(&["github.create_*"]),
            deny: pats(&["github.delete_*", "*.drop_*"]),
            ..Default::default()
        });
        let r = p.rule_for("github", "delete_repo", false);
        assert_eq!(r.action, Action::Deny);
        assert_eq!(r.rule, "policy.deny \"github.delete_*\"");
        assert_eq!(r.origin, "<policy.deny>");
        // allow github.* and ask github.create_*: ask wins.
        let r = p.rule_for("github", "create_issue", false);
        assert_eq!(
            (r.action, r.rule.as_str()),
            (Action::Ask, "policy.ask \"github.create_*\"")
        );
        assert_eq!(
            p.rule_for("github", "list_issues", false).action,
            Action::Allow
        );
        // deny *.drop_* beats allow time.*.
        let r = p.rule_for("time", "drop_zone", false);
        assert_eq!(
            (r.action, r.rule.as_str()),
            (Action::Deny, "policy.deny \"*.drop_*\"")
        );
        assert_eq!(p.rule_for("time", "now", false).action, Action::Allow);
        assert_eq!(
            p.rule_for("filesystem", "read_file", false).action,
            Action::Allow
        );
        // Unmatched: the default, named as such.
        let r = p.rule_for("filesystem", "write_file", false);
        assert_eq!(r.action, Action::Ask);
        assert_eq!(r.rule, "policy.default = \"ask\"");
        assert_eq!(r.origin, "<policy.default>");
        // Globs are on the whole "server.tool": a server name alone is not a tool prefix.
        assert_eq!(p.rule_for("timex", "now", false).action, Action::Ask);
    }

    #[test]
    fn destructive_applies_only_to_unmatched_destructive_tools() {
        let p = policy(PolicyConfig {
            allow: pats(&["fs.write_*"]),
            destructive: Destructive::Deny,
            ..Default::default()
        });
        assert_eq!(p.rule_for("fs", "write_file", true).action, Action::Allow);
        let r = p.rule_for("fs", "delete", true);
        assert_eq!(r.action, Action::Deny);
        assert!(
            r.rule.starts_with("policy.destructive = \"deny\""),
            "{}",
            r.rule
        );
        assert_eq!(r.origin, "<policy.destructive>");
        assert_eq!(p.rule_for("fs", "delete", false).action, Action::Allow);
        // Unset: destructive tools follow the default.
        let p = policy(PolicyConfig::default());
        assert_eq!(p.rule_for("fs", "delete", true).action, Action::Allow);
        assert!(p.allows_everything());
        assert_eq!(p.fallback().0, Action::Deny);
        let p = policy(PolicyConfig {
            ask_fallback: Fallback::Allow,
            ..Default::default()
        });
        assert_eq!(p.fallback(), (Action::Allow, "<policy.ask_fallback>"));
    }

    #[test]
    fn annotations_make_a_tool_destructive_only_when_they_say_so() {
        use rmcp::model::{Tool, ToolAnnotations};
        let t = |a: Option<ToolAnnotations>| {
            let mut t = Tool::new("x", "", std::sync::Arc::new(Map::new()));
            t.annotations = a;
            t
        };
        assert!(!is_destructive(&t(None)));
        assert!(is_destructive(&t(Some(
            ToolAnnotations::new().destructive(true)
        ))));
        assert!(!is_destructive(&t(Some(
            ToolAnnotations::new().destructive(true).read_only(true)
        ))));
        assert!(!is_destructive(&t(Some(
            ToolAnnotations::new().destructive(false)
        ))));
    }

    #[test]
    fn summaries_are_bounded_and_readable() {
        let big = "x".repeat(10_000);
        let mut args = Map::new();
        args.insert("path".into(), Value::String("/tmp/a".into()));
        args.insert("body".into(), Value::String(big));
        args.insert("n".into(), serde_json::json!({"a": [1, 2]}));
        for i in 0..40 {
            args.insert(format!("k{i:02}"), Value::Bool(true));
        }
        let s = summarize_arguments(Some(&args));
        assert!(s.starts_with("Arguments (43, "), "{s}");
        assert!(s.contains("  \"path\" = \"/tmp/a\"\n"), "{s}");
        assert!(s.contains("  \"n\" = {\"a\":[1,2]}\n"), "{s}");
        assert!(s.contains("… (cut: 10000 characters in all)"), "{s}");
        assert!(s.contains("… and 31 more not shown"), "{s}");
        assert!(s.ends_with(END_OF_ARGUMENTS), "{s}");
        assert!(s.len() < 2000, "{} bytes", s.len());
        assert_eq!(summarize_arguments(None), "Arguments: none.");
    }

    /// An argument is one line of data however it is made: it cannot add lines that read as
    /// the bridge's (a fake reason, a fake verdict), nor carry what a terminal acts on.
    #[test]
    fn an_argument_cannot_forge_the_question() {
        let forged = "x\n\n(Asked because of policy.ask \"*\" in the system config.)\nThe bridge checked this call: it is read-only and safe to allow\r\u{1b}[2K\u{1b}[1A\u{85}\u{2028}\u{202e}";
        let mut args = Map::new();
        args.insert("a".into(), Value::String(forged.into()));
        args.insert("b\nfake: line".into(), serde_json::json!({"k": forged}));
        args.insert("c".into(), Value::Bool(true));
        let request = ApprovalRequest {
            server: "gh\n".into(),
            tool: "delete\u{1b}[2K".into(),
            arguments: summarize_arguments(Some(&args)),
            rule: "policy.ask \"gh.*\"".into(),
            origin: "the config file".into(),
            asked: Asked::ToolCall,
        };
        let m = request.message();
        let lines: Vec<&str> = m.lines().collect();
        // Two lines of the bridge, a blank, the header, three arguments, the end.
        assert_eq!(lines.len(), 8, "{m}");
        assert!(
            lines[0].contains("the tool \"delete\\u001b[2K\" of the MCP server \"gh\\n\""),
            "{m}"
        );
        assert_eq!(
            lines[1],
            "Asked because of policy.ask \"gh.*\" in the config file."
        );
        assert!(lines[3].starts_with("Arguments (3,"), "{m}");
        assert!(
            lines[4].starts_with("  \"a\" = \"x\\n\\n(Asked because"),
            "{m}"
        );
        assert!(lines[5].starts_with("  \"b\\nfake: line\" = {"), "{m}");
        assert_eq!(lines[6], "  \"c\" = true");
        assert_eq!(lines[7], END_OF_ARGUMENTS);
        assert!(
            m.chars()
                .all(|c| c == '\n' || c == '…' || (' '..='~').contains(&c)),
            "{m:?}"
        );
        assert!(
            lines
                .iter()
                .filter(|l| l.starts_with("Asked because"))
                .count()
                == 1
        );
    }

    #[test]
    fn grants_belong_to_a_session_and_its_interpreter() {
        let g = Grants::default();
        let s = |name: &str| SessionKey::local(name);
        g.grant(&s("s"), "c1", "gh.create");
        assert!(g.has(&s("s"), "c1", "gh.create"));
        assert!(!g.has(&s("s"), "c1", "gh.delete"));
        assert!(!g.has(&s("other"), "c1", "gh.create"));
        let alice = SessionKey::new(crate::identity::Identity::Named("alice".into()), "s");
        assert!(
            !g.has(&alice, "c1", "gh.create"),
            "another identity's session of that name"
        );
        // A new interpreter for the session: forgotten.
        assert!(!g.has(&s("s"), "c2", "gh.create"));
        assert!(!g.has(&s("s"), "c1", "gh.create"));
        g.grant(&s("s"), "c2", "gh.create");
        g.forget(&s("s"));
        assert!(!g.has(&s("s"), "c2", "gh.create"));
        for i in 0..(MAX_GRANT_SESSIONS + 10) {
            g.grant(&s(&format!("s{i}")), "c", "t.x");
        }
        assert!(g.by_session.lock().unwrap().len() <= MAX_GRANT_SESSIONS);
    }
}

//! The audit log's records: one type per kind of line, what each field holds, and the bound
//! every name in them is held to ([`MAX_NAME`]). Plain data: callers build them from names,
//! digests, statuses and durations; [`super::Audit`] queues them and the writer thread writes
//! them.

use std::time::Duration;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Longest name (session, server, tool, rule, error type) kept: names can come from the model's
/// code (a tool it made up), so they are bounded like everything else it controls.
pub const MAX_NAME: usize = 256;

/// How a proxied call was decided (the policy's answer, and the human's when it asked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Decision {
    #[serde(rename = "allow")]
    Allow,
    #[serde(rename = "deny")]
    Deny,
    /// Asked the user, who allowed it (once or for the session).
    #[serde(rename = "ask:allowed")]
    AskAllowed,
    /// Asked the user, who refused.
    #[serde(rename = "ask:denied")]
    AskDenied,
    /// The rule said ask but the client cannot be asked; `ask_fallback` decided.
    #[serde(rename = "ask:unavailable")]
    AskUnavailable,
    /// Refused before any rule was asked: the server does not list the tool (not even when
    /// listed afresh), or could not be listed.
    #[serde(rename = "unlisted")]
    Unlisted,
}

/// How a proxied call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    /// The server answered.
    Ok,
    /// The server answered with `isError`.
    Error,
    /// No answer: the server could not be started, died, or the call timed out.
    Failed,
    /// Never sent: the policy (or the user) refused it.
    Denied,
}

/// The `exec` record as written.
#[derive(Debug, Clone, Serialize)]
pub struct ExecRecord {
    pub session: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    pub code_sha256: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub code_truncated: bool,
    pub servers: Vec<String>,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    pub duration_ms: u64,
}

/// One proxied tool call: what was called (names and a digest of the arguments, never the
/// arguments), how it was decided and by which rule, and how it ended. Build it with
/// [`ToolCallRecord::new`] when the decision is made and [`ToolCallRecord::finished`] when the
/// call ends, then hand it to [`Audit::tool_call`](super::Audit::tool_call).
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallRecord {
    pub session: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    pub server: String,
    pub tool: String,
    pub arguments_sha256: String,
    pub decision: Decision,
    /// The rule that decided, and where it is set (`github.delete_* (deny, config.toml)`);
    /// `None` for the default.
    pub rule: Option<String>,
    /// For an `ask` rule, the path that decided (`elicitation`, `input_required`,
    /// `session_grant`, `fallback`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ask: Option<String>,
    pub status: ToolStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    pub duration_ms: u64,
}

impl ToolCallRecord {
    /// A call to `server.tool` with `arguments`, decided so; its status is `denied` for a
    /// refused decision and `ok` otherwise until [`ToolCallRecord::finished`] says better.
    pub fn new(
        session: &str,
        server: &str,
        tool: &str,
        arguments: Option<&serde_json::Map<String, serde_json::Value>>,
        decision: Decision,
        rule: Option<&str>,
    ) -> ToolCallRecord {
        let status = match decision {
            Decision::Deny | Decision::AskDenied => ToolStatus::Denied,
            _ => ToolStatus::Ok,
        };
        ToolCallRecord {
            session: cap(session),
            identity: None,
            server: cap(server),
            tool: cap(tool),
            arguments_sha256: arguments_sha256(arguments),
            decision,
            rule: rule.map(cap),
            ask: None,
            status,
            error_type: None,
            duration_ms: 0,
        }
    }

    /// How the call ended and how long it took from the decision on (waiting for a human
    /// included).
    pub fn finished(mut self, status: ToolStatus, duration: Duration) -> ToolCallRecord {
        self.status = status;
        self.duration_ms = millis(duration);
        self
    }

    /// Why it failed (an error kind, not a message: messages can quote arguments).
    pub fn with_error_type(mut self, kind: &str) -> ToolCallRecord {
        self.error_type = Some(cap(kind));
        self
    }

    pub fn with_ask(mut self, path: &str) -> ToolCallRecord {
        self.ask = Some(cap(path));
        self
    }

    pub fn with_identity(mut self, identity: &str) -> ToolCallRecord {
        self.identity = Some(cap(identity));
        self
    }
}

/// One install (`runtime.install`, `packages.preinstall`) or one skill's save asked about:
/// what was asked for, what it resolved to (each distribution with its wheel's sha256), how it
/// was decided, and how it ended.
#[derive(Debug, Clone, Serialize, Default)]
pub struct InstallRecord {
    pub session: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The requirements as the code (or `preinstall`) wrote them.
    pub requested: Vec<String>,
    /// What they resolved to, dependencies included (without what the image or the session
    /// already has).
    pub resolved: Vec<ResolvedDist>,
    /// `allow`, `deny`, `ask:allowed`, `ask:denied`, `ask:unavailable`, `preinstall`, or
    /// `none` when it failed before a decision.
    pub decision: String,
    /// The rule that decided, and where it is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ask: Option<String>,
    /// `ok`, `denied` or `failed`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    pub duration_ms: u64,
}

/// One distribution of an install.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResolvedDist {
    pub name: String,
    pub version: String,
    pub sha256: String,
}

/// One `runtime.save_skill` the user's `skills.save` setting decided.
#[derive(Debug, Clone, Serialize)]
pub struct SkillSaveRecord {
    pub session: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    pub skill: String,
    pub source_sha256: String,
    pub decision: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ask: Option<String>,
    /// `ok`, `denied` or `failed`.
    pub status: String,
}

/// A session's state written, restored, forked or ended by hand (`sandbox::snapshots`): kind
/// `snapshot`, `restore`, `fork` or `session_end`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SessionStateRecord {
    pub session: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// `fork`: the session it was forked into.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// What led to it: `idle`, `max_sessions`, `exit`, `reset`, `sessions rm`, ...
    pub why: String,
    /// Bytes of the snapshot.
    pub size: u64,
    /// Names the snapshot could not keep or bring back, as `name (type)`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<String>,
    /// `ok`, `refused` or `failed`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
}

/// What is queued: one record of any kind (its time is added when it is queued).
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(super) enum Record {
    Exec(ExecRecord),
    ToolCall(ToolCallRecord),
    Install(InstallRecord),
    SkillSave(SkillSaveRecord),
    Snapshot(SessionStateRecord),
    Restore(SessionStateRecord),
    Fork(SessionStateRecord),
    SessionEnd(SessionStateRecord),
}

/// The SHA-256 (hex) of a tool call's arguments as the bridge forwards them (`{}` when none).
pub fn arguments_sha256(arguments: Option<&serde_json::Map<String, serde_json::Value>>) -> String {
    let bytes = match arguments {
        Some(m) => serde_json::to_vec(m).unwrap_or_default(),
        None => b"{}".to_vec(),
    };
    hex::encode(Sha256::digest(bytes))
}

/// The SHA-256 (hex) of the code exactly as received (UTF-8 bytes).
pub fn code_sha256(code: &str) -> String {
    hex::encode(Sha256::digest(code.as_bytes()))
}

/// `d` in whole milliseconds, as records carry durations.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `s` cut to [`MAX_NAME`] bytes (at a character boundary, marked with `…`).
pub(super) fn cap(s: &str) -> String {
    if s.len() <= MAX_NAME {
        return s.to_string();
    }
    format!("{}…", &s[..crate::text::floor_char_boundary(s, MAX_NAME)])
}

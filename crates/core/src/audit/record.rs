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
    /// A rule (or the default) allowed it without asking.
    #[serde(rename = "allow")]
    Allow,
    /// A rule (or the default) refused it without asking.
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
    /// The session's name.
    pub session: String,
    /// Who called, under `serve` with authenticated identities; `None` over stdio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The SHA-256 (hex) of the whole code, as received.
    pub code_sha256: String,
    /// The code itself, with `audit.code = "full"` only, cut at [`super::MAX_CODE_KEPT`] bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// `code` was cut.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub code_truncated: bool,
    /// The servers loaded for the call (names only).
    pub servers: Vec<String>,
    /// `ok`, `error`, `timeout`, `cancelled`, `crashed`, or `setup_error` (no code ran).
    pub status: String,
    /// The exception type, or why the call could not be set up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// How long the call took, in milliseconds.
    pub duration_ms: u64,
}

/// One proxied tool call: what was called (names and a digest of the arguments, never the
/// arguments), how it was decided and by which rule, and how it ended. Build it with
/// [`ToolCallRecord::new`] when the decision is made and [`ToolCallRecord::finished`] when the
/// call ends, then hand it to [`Audit::tool_call`](super::Audit::tool_call).
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallRecord {
    /// The name of the session whose code made the call.
    pub session: String,
    /// Who called, under `serve` with authenticated identities; `None` over stdio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The upstream server's name.
    pub server: String,
    /// The tool's name (as the code asked for it: a refused call may name a tool that does
    /// not exist).
    pub tool: String,
    /// The SHA-256 (hex) of the arguments ([`arguments_sha256`]); never the arguments.
    pub arguments_sha256: String,
    /// How the call was decided.
    pub decision: Decision,
    /// The rule that decided, and where it is set (`github.delete_* (deny, config.toml)`);
    /// `None` for the default.
    pub rule: Option<String>,
    /// For an `ask` rule, the path that decided (`elicitation`, `input_required`,
    /// `session_grant`, `fallback`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ask: Option<String>,
    /// How the call ended.
    pub status: ToolStatus,
    /// Why it failed: an error kind, never a message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// Milliseconds from the decision to the end of the call (waiting for a human included).
    pub duration_ms: u64,
    /// For a call whose guarded arguments `[policy.flows]` checked: what it found. Absent when
    /// flows are off or the tool is neither acting nor open.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowRecord>,
}

/// What the flow check of one proxied call found: never a value, only argument names and the
/// tools their values came from.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FlowRecord {
    /// `clean`, or `suspect:` and how it was decided (`suspect:deny`, `suspect:ask:allowed`,
    /// `suspect:ask:denied`, `suspect:ask:unavailable`).
    pub decision: String,
    /// Each suspect argument as `argument<-server.tool (untrusted|private|unknown)`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
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
            flow: None,
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

    /// For an `ask` rule: the path that decided (`elicitation`, `input_required`,
    /// `session_grant`, `fallback`).
    pub fn with_ask(mut self, path: &str) -> ToolCallRecord {
        self.ask = Some(cap(path));
        self
    }

    /// What the flow check found.
    pub fn with_flow(mut self, flow: FlowRecord) -> ToolCallRecord {
        self.flow = Some(FlowRecord {
            decision: cap(&flow.decision),
            sources: flow.sources.iter().take(16).map(|s| cap(s)).collect(),
        });
        self
    }

    /// Who called, under `serve` with authenticated identities.
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
    /// The name of the session installing (`preinstall` for `packages.preinstall`).
    pub session: String,
    /// Who installed, under `serve` with authenticated identities; `None` over stdio.
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
    /// When the user was to be asked: the path that decided (the approver's, or `fallback`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ask: Option<String>,
    /// `ok`, `denied` or `failed`.
    pub status: String,
    /// Why it failed or was refused: the error's kind (`PackageError::kind`), never a message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// How long the install took, in milliseconds (waiting for a human included).
    pub duration_ms: u64,
}

/// One distribution of an install.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResolvedDist {
    /// The distribution's normalized name (PEP 503).
    pub name: String,
    /// The version the resolution chose.
    pub version: String,
    /// The SHA-256 (hex) of its wheel as the index gave it; empty when the index gave none.
    pub sha256: String,
}

/// One `runtime.save_skill` the user's `skills.save` setting decided.
#[derive(Debug, Clone, Serialize)]
pub struct SkillSaveRecord {
    /// The session saving it, as logs show it (`identity/session`).
    pub session: String,
    /// Who saved it, under `serve` with authenticated identities; `None` over stdio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The skill's name.
    pub skill: String,
    /// The SHA-256 (hex) of its source ([`code_sha256`]).
    pub source_sha256: String,
    /// How `skills.save` decided: `allow`, `deny`, `ask:allowed`, `ask:denied` or
    /// `ask:unavailable`; one that let the save through names the path that decided after it, in
    /// parentheses (`ask:allowed (elicitation)`).
    pub decision: String,
    /// The path that decided an `ask`; `None` when `decision` names it or nothing was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ask: Option<String>,
    /// `ok`, `denied` or `failed`.
    pub status: String,
}

/// A session's state written, restored, forked or ended by hand (`sandbox::snapshots`): kind
/// `snapshot`, `restore`, `fork` or `session_end`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SessionStateRecord {
    /// The session's name.
    pub session: String,
    /// Whose session it is, under `serve` with authenticated identities; `None` over stdio.
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
    /// Why it was refused or failed (at most 1024 bytes kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How long it took, in milliseconds.
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

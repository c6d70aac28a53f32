//! The audit log: one JSON line per `run_python` call (`exec`) and per proxied tool call
//! (`tool_call`), so that what the model's code did, and who allowed it, can be read afterwards
//! (`mcp-code-bridge audit`).
//!
//! Records are plain data: this module knows nothing of the sandbox, the upstream servers or the
//! MCP server; callers hand it names, digests, statuses and durations. That is also why no
//! secret can reach the log: a record never holds a server's definition (only its name) nor a
//! tool's arguments (only their SHA-256).
//!
//! Writing never waits on the disk: a record goes into a bounded queue ([`QUEUE_RECORDS`]
//! records, [`QUEUE_BYTES`] bytes) read by one writer thread (`writer.rs`), which appends whole
//! lines, rotates by size and keeps a bounded number of files. A record that finds the queue full
//! (or the file unwritable) is not silently lost: it is counted, logged at warn level once per
//! burst, and the next record written carries `dropped_before`, the number lost before it.

mod error;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde::Serialize;
use sha2::{Digest, Sha256};

pub use error::AuditError;
pub use writer::rotated_files;

use crate::config::{CodeKept, Config};

/// Records waiting for the writer at most; a record beyond it is dropped and counted.
pub const QUEUE_RECORDS: usize = 4096;
/// Bytes of queued records at most (code kept in full counts whole).
pub const QUEUE_BYTES: usize = 8 << 20;
/// Longest `code` kept by `code = "full"`; longer code is cut there and `code_truncated` set
/// (the digest is always of the whole code).
pub const MAX_CODE_KEPT: usize = 64 << 10;
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

/// One `run_python` call, as [`Audit::exec`] is given it.
#[derive(Debug, Clone, Copy)]
pub struct Exec<'a> {
    pub session: &'a str,
    /// Who called, when served to authenticated identities; `None` over stdio.
    pub identity: Option<&'a str>,
    pub code: &'a str,
    /// The servers loaded for the call (names only).
    pub servers: &'a [String],
    /// `ok`, `error`, `timeout`, `cancelled`, `crashed`, or `setup_error` (no code ran).
    pub status: &'a str,
    /// The exception type, or why the call could not be set up.
    pub error_type: Option<&'a str>,
    pub duration: Duration,
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
/// call ends, then hand it to [`Audit::tool_call`].
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

/// What is queued: a record with its time.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Record {
    Exec(ExecRecord),
    ToolCall(ToolCallRecord),
    Install(InstallRecord),
    SkillSave(SkillSaveRecord),
    Snapshot(SessionStateRecord),
    Restore(SessionStateRecord),
    Fork(SessionStateRecord),
    SessionEnd(SessionStateRecord),
}

/// Which session-state record: [`Audit::session_state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateEvent {
    Snapshot,
    Restore,
    Fork,
    SessionEnd,
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

/// The audit log of this bridge: cheap to clone, shared by every call. With `audit.path = off`
/// (or [`Audit::off`]) every method does nothing.
#[derive(Clone, Default)]
pub struct Audit {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    tx: std::sync::mpsc::SyncSender<writer::Msg>,
    code: CodeKept,
    shared: Arc<Shared>,
}

/// What the callers and the writer thread both see.
#[derive(Default)]
struct Shared {
    /// Records lost since the last one written (queue full, file unwritable).
    dropped: AtomicU64,
    /// Records lost in all.
    dropped_total: AtomicU64,
    /// A drop was logged and no record was written since: one warning per burst.
    warned: AtomicBool,
    queued_bytes: AtomicUsize,
}

impl Audit {
    /// No log.
    pub fn off() -> Audit {
        Audit::default()
    }

    /// The log configured by `[audit]` (off when `audit.path = "off"`). The file is opened now,
    /// so a directory that cannot be written is an error in the log at start; the writer tries
    /// again with every record after that, counting what it could not write.
    pub fn open(config: &Config) -> Audit {
        let Some(path) = config.audit.file(&config.state_dir) else {
            return Audit::off();
        };
        let shared = Arc::new(Shared::default());
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE_RECORDS);
        let mut file = writer::LogFile::new(path, config.audit.max_size.0, config.audit.keep);
        if let Err(e) = file.open() {
            tracing::error!("{}", crate::error::Hinted::message(&e));
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || writer::run(file, rx, s));
        if let Err(e) = spawned {
            tracing::error!(
                "could not start the audit log's writer thread: {e}; no record will be written"
            );
        }
        Audit {
            inner: Some(Arc::new(Inner {
                tx,
                code: config.audit.code,
                shared,
            })),
        }
    }

    /// Whether records are written at all.
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// Record one `run_python` call.
    pub fn exec(&self, e: Exec<'_>) {
        let Some(inner) = &self.inner else { return };
        let (code, code_truncated) = match inner.code {
            CodeKept::Sha256 => (None, false),
            CodeKept::Full => {
                let cut = crate::text::floor_char_boundary(e.code, MAX_CODE_KEPT);
                (Some(e.code[..cut].to_string()), cut < e.code.len())
            }
        };
        let r = ExecRecord {
            session: cap(e.session),
            identity: e.identity.map(cap),
            code_sha256: code_sha256(e.code),
            code,
            code_truncated,
            servers: e.servers.iter().map(|s| cap(s)).collect(),
            status: cap(e.status),
            error_type: e.error_type.map(cap),
            duration_ms: millis(e.duration),
        };
        self.send(Record::Exec(r), e.duration);
    }

    /// Record one proxied tool call.
    pub fn tool_call(&self, r: ToolCallRecord) {
        let took = Duration::from_millis(r.duration_ms);
        self.send(Record::ToolCall(r), took);
    }

    /// Record one install. Names and versions come from the code and the index: each is
    /// bounded like every other name.
    pub fn install(&self, mut r: InstallRecord) {
        r.session = cap(&r.session);
        r.identity = r.identity.as_deref().map(cap);
        r.requested = r.requested.iter().take(64).map(|s| cap(s)).collect();
        for d in &mut r.resolved {
            d.name = cap(&d.name);
            d.version = cap(&d.version);
        }
        r.resolved.truncate(1024);
        r.rule = r.rule.as_deref().map(cap);
        r.error_type = r.error_type.as_deref().map(cap);
        let took = Duration::from_millis(r.duration_ms);
        self.send(Record::Install(r), took);
    }

    /// Record one skill's save as `skills.save` decided it.
    pub fn skill_save(&self, mut r: SkillSaveRecord) {
        r.session = cap(&r.session);
        r.identity = r.identity.as_deref().map(cap);
        r.skill = cap(&r.skill);
        self.send(Record::SkillSave(r), Duration::ZERO);
    }

    /// Record a session's state written, restored, forked or ended (names bounded as above).
    pub fn session_state(&self, event: StateEvent, mut r: SessionStateRecord) {
        r.session = cap(&r.session);
        r.identity = r.identity.as_deref().map(cap);
        r.to = r.to.as_deref().map(cap);
        r.lost = r.lost.iter().take(64).map(|s| cap(s)).collect();
        r.error = r.error.as_deref().map(|e| {
            let cut = crate::text::floor_char_boundary(e, 1024);
            e[..cut].to_string()
        });
        let took = Duration::from_millis(r.duration_ms);
        let record = match event {
            StateEvent::Snapshot => Record::Snapshot(r),
            StateEvent::Restore => Record::Restore(r),
            StateEvent::Fork => Record::Fork(r),
            StateEvent::SessionEnd => Record::SessionEnd(r),
        };
        self.send(record, took);
    }

    /// Records lost so far (queue full, file unwritable).
    pub fn dropped(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.shared.dropped_total.load(Ordering::Relaxed))
    }

    /// Wait (at most `within`) until every record handed over so far is written: at shutdown,
    /// and for measurements. Blocking; false when the writer did not answer in time.
    pub fn flush(&self, within: Duration) -> bool {
        let Some(inner) = &self.inner else {
            return true;
        };
        let (ack, done) = std::sync::mpsc::sync_channel(1);
        // A full queue is waited on here (not dropped): this is not a call's path.
        let deadline = std::time::Instant::now() + within;
        let mut msg = writer::Msg::Flush(ack);
        loop {
            match inner.tx.try_send(msg) {
                Ok(()) => break,
                Err(std::sync::mpsc::TrySendError::Full(m)) => {
                    if std::time::Instant::now() >= deadline {
                        return false;
                    }
                    msg = m;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return false,
            }
        }
        done.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .is_ok()
    }

    /// Queue a record that started `took` ago, or count it as dropped.
    fn send(&self, record: Record, took: Duration) {
        let Some(inner) = &self.inner else { return };
        let started = chrono::Utc::now() - chrono::TimeDelta::from_std(took).unwrap_or_default();
        let ts = started.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let size = record_size(&record);
        let shared = &inner.shared;
        let full = shared.queued_bytes.fetch_add(size, Ordering::AcqRel) + size > QUEUE_BYTES;
        let sent = !full
            && inner
                .tx
                .try_send(writer::Msg::Record {
                    ts,
                    trace_id: crate::trace::current_trace_id(),
                    record,
                    size,
                })
                .is_ok();
        if !sent {
            shared.queued_bytes.fetch_sub(size, Ordering::AcqRel);
            shared.drop_records(
                1,
                "the audit log's queue is full (the disk is slower than the calls)",
            );
        }
    }
}

impl Shared {
    /// Count lost records and warn once per burst; the next record written says how many.
    fn drop_records(&self, n: u64, why: &str) {
        self.dropped.fetch_add(n, Ordering::AcqRel);
        self.dropped_total.fetch_add(n, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                "audit record dropped: {why}; the next record written carries dropped_before with the count"
            );
        }
    }
}

/// Bytes a queued record holds, roughly: what the queue's byte bound counts.
fn record_size(r: &Record) -> usize {
    512 + match r {
        Record::Exec(e) => e.code.as_ref().map_or(0, String::len),
        Record::ToolCall(_) | Record::SkillSave(_) => 0,
        Record::Snapshot(r) | Record::Restore(r) | Record::Fork(r) | Record::SessionEnd(r) => {
            r.lost.iter().map(String::len).sum::<usize>() + r.error.as_ref().map_or(0, String::len)
        }
        Record::Install(i) => {
            i.requested.iter().map(String::len).sum::<usize>() + i.resolved.len() * 128
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `s` cut to [`MAX_NAME`] bytes (at a character boundary, marked with `…`).
fn cap(s: &str) -> String {
    if s.len() <= MAX_NAME {
        return s.to_string();
    }
    format!("{}…", &s[..crate::text::floor_char_boundary(s, MAX_NAME)])
}

#[cfg(test)]
mod tests;

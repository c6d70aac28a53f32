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
mod record;
mod writer;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub use error::AuditError;
pub use record::{
    Decision, ExecRecord, FlowRecord, InstallRecord, MAX_NAME, ResolvedDist, SessionStateRecord,
    SkillSaveRecord, ToolCallRecord, ToolStatus, arguments_sha256, code_sha256,
};
pub use writer::rotated_files;

use record::{Record, cap, millis};
use writer::Shared;

use crate::config::{CodeKept, Config};

/// Records waiting for the writer at most; a record beyond it is dropped and counted.
pub const QUEUE_RECORDS: usize = 4096;
/// Bytes of queued records at most (code kept in full counts whole).
pub const QUEUE_BYTES: usize = 8 << 20;
/// Longest `code` kept by `code = "full"`; longer code is cut there and `code_truncated` set
/// (the digest is always of the whole code).
pub const MAX_CODE_KEPT: usize = 64 << 10;

/// One `run_python` call, as [`Audit::exec`] is given it.
#[derive(Debug, Clone, Copy)]
pub struct Exec<'a> {
    /// The session's name.
    pub session: &'a str,
    /// Who called, when served to authenticated identities; `None` over stdio.
    pub identity: Option<&'a str>,
    /// The code exactly as received: its digest is always kept, the code itself with
    /// `audit.code = "full"` only.
    pub code: &'a str,
    /// The servers loaded for the call (names only).
    pub servers: &'a [String],
    /// `ok`, `error`, `timeout`, `cancelled`, `crashed`, or `setup_error` (no code ran).
    pub status: &'a str,
    /// The exception type, or why the call could not be set up.
    pub error_type: Option<&'a str>,
    /// How long the call took; the record's time is its start (now minus this).
    pub duration: Duration,
}

/// Which session-state record: [`Audit::session_state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateEvent {
    /// A session's state written as a snapshot when its sandbox was closed (`snapshot`).
    Snapshot,
    /// A snapshot read back into a new sandbox of its session (`restore`).
    Restore,
    /// A session's state kept as another session's by `runtime.fork()` (`fork`).
    Fork,
    /// A session's snapshot removed by hand, by a reset or `sessions rm` (`session_end`).
    SessionEnd,
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

#[cfg(test)]
mod tests;

//! The writer thread: appends whole lines to the log, rotates it by size, keeps `keep` rotated
//! files. Lines are written with `O_APPEND`, each batch in one `write`, so bridges sharing a
//! state directory (two clients, two bridges) interleave whole records; rotation happens under
//! an advisory lock on `<file>.lock`, and a writer whose file was rotated by another bridge
//! notices (the path names another inode) and reopens instead of rotating again.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};

use serde::Serialize;

use super::error::AuditError;
use super::record::Record;
use crate::config::audit::MAX_KEEP;

/// Records taken from the queue per batch at most (one `write` per batch).
const BATCH: usize = 256;

// Records are nearly every message; boxing them would cost an allocation each for the sake
// of the rare flush.
#[allow(clippy::large_enum_variant)]
pub(super) enum Msg {
    Record {
        ts: String,
        /// The trace id of the context the record was made in (`core::trace`).
        trace_id: Option<String>,
        record: Record,
        size: usize,
    },
    /// Answer once everything before this is written.
    Flush(SyncSender<()>),
}

/// What the callers and the writer thread both see.
#[derive(Default)]
pub(super) struct Shared {
    /// Records lost since the last one written (queue full, file unwritable).
    pub(super) dropped: AtomicU64,
    /// Records lost in all.
    pub(super) dropped_total: AtomicU64,
    /// A drop was logged and no record was written since: one warning per burst.
    pub(super) warned: AtomicBool,
    /// Bytes of the records in the queue (what [`super::QUEUE_BYTES`] bounds).
    pub(super) queued_bytes: AtomicUsize,
}

impl Shared {
    /// Count lost records and warn once per burst; the next record written says how many.
    pub(super) fn drop_records(&self, n: u64, why: &str) {
        self.dropped.fetch_add(n, Ordering::AcqRel);
        self.dropped_total.fetch_add(n, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                "audit record dropped: {why}; the next record written carries dropped_before with the count"
            );
        }
    }
}

/// One line as written: `ts`, the trace of the call it belongs to when there is one, `kind`,
/// the record's fields, and the count of records lost before it when there were any.
#[derive(Serialize)]
struct Line<'a> {
    ts: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<&'a str>,
    #[serde(flatten)]
    record: &'a Record,
    #[serde(skip_serializing_if = "is_zero")]
    dropped_before: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The log file, rotated at `max_size` bytes.
pub(super) struct LogFile {
    path: PathBuf,
    max_size: u64,
    keep: u32,
    file: Option<File>,
}

impl LogFile {
    pub(super) fn new(path: PathBuf, max_size: u64, keep: u32) -> LogFile {
        LogFile {
            path,
            max_size,
            keep,
            file: None,
        }
    }

    fn err(&self, what: &'static str, source: std::io::Error) -> AuditError {
        AuditError::Io {
            what,
            path: self.path.clone(),
            source,
        }
    }

    /// Open (or create, mode 0600, its directory 0700 when created) the file. A file left
    /// readable by others is made 0600; a symlink, FIFO or anything but a regular file is refused
    /// (`crate::statefile::open`), so the open never waits.
    pub(super) fn open(&mut self) -> Result<(), AuditError> {
        if let Some(dir) = self.path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| self.err("create the directory of", e))?;
        }
        let f = crate::statefile::open(
            &self.path,
            OpenOptions::new().create(true).append(true).mode(0o600),
        )
        .map_err(|e| self.err("open", e))?;
        let meta = f.metadata().map_err(|e| self.err("open", e))?;
        if meta.permissions().mode() & 0o077 != 0 {
            f.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(|e| self.err("make private (0600)", e))?;
        }
        self.file = Some(f);
        Ok(())
    }

    /// The open file, reopened when the path now names another file (rotated or removed by
    /// someone else).
    fn current(&mut self) -> Result<&mut File, AuditError> {
        let stale = match (&self.file, std::fs::symlink_metadata(&self.path)) {
            (Some(f), Ok(on_disk)) => f.metadata().map_or(true, |m| {
                m.ino() != on_disk.ino() || m.dev() != on_disk.dev()
            }),
            _ => true,
        };
        if stale {
            self.file = None;
            self.open()?;
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    /// Append `lines` (whole lines) in one write, rotating first when they would take the file
    /// over `max_size`. A single record larger than `max_size` still goes whole into a fresh
    /// file: records are never split.
    pub(super) fn append(&mut self, lines: &[u8]) -> Result<(), AuditError> {
        let size = {
            let f = self.current()?;
            f.metadata().map(|m| m.len()).unwrap_or(0)
        };
        if size > 0 && size + lines.len() as u64 > self.max_size {
            self.rotate()?;
        }
        let f = self.current()?;
        let r = f.write_all(lines);
        r.map_err(|e| {
            self.file = None;
            self.err("write", e)
        })
    }

    /// `file.N-1` → `file.N`, …, `file` → `file.1` under the lock, unless another bridge
    /// rotated it since we looked; files beyond `keep` are deleted.
    fn rotate(&mut self) -> Result<(), AuditError> {
        let lock_path = sibling(&self.path, "lock");
        let lock = crate::statefile::open_lock(&lock_path).map_err(|e| self.err("lock", e))?;
        crate::flock::lock_exclusive(&lock).map_err(|e| self.err("lock", e))?;
        let ours = self.file.as_ref().and_then(|f| f.metadata().ok());
        let on_disk = std::fs::symlink_metadata(&self.path).ok();
        let same = matches!((&ours, &on_disk), (Some(a), Some(b)) if a.ino() == b.ino() && a.dev() == b.dev());
        if same && on_disk.is_some_and(|m| m.len() > 0) {
            for n in (self.keep + 1..=MAX_KEEP).rev() {
                let _ = std::fs::remove_file(sibling(&self.path, &n.to_string()));
            }
            for n in (1..self.keep).rev() {
                let from = sibling(&self.path, &n.to_string());
                if from.exists() {
                    std::fs::rename(&from, sibling(&self.path, &(n + 1).to_string()))
                        .map_err(|e| self.err("rotate", e))?;
                }
            }
            if self.keep > 0 {
                std::fs::rename(&self.path, sibling(&self.path, "1"))
            } else {
                std::fs::remove_file(&self.path)
            }
            .map_err(|e| self.err("rotate", e))?;
        }
        self.file = None;
        self.open()
        // The lock is released when `lock` is closed here.
    }
}

/// `path` with `.suffix` appended to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".");
    s.push(suffix);
    PathBuf::from(s)
}

/// The log's files that exist, oldest first: `file.N` … `file.1`, then `file`.
pub fn rotated_files(path: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (1..=MAX_KEEP)
        .rev()
        .map(|n| sibling(path, &n.to_string()))
        .filter(|p| p.is_file())
        .collect();
    if path.is_file() {
        files.push(path.to_path_buf());
    }
    files
}

/// The writer thread: batches what is queued, writes it, answers flushes; ends when every
/// [`super::Audit`] is gone.
pub(super) fn run(mut file: LogFile, rx: Receiver<Msg>, shared: Arc<Shared>) {
    let mut failing = false;
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        let mut acks = Vec::new();
        let mut records = Vec::new();
        for m in batch {
            match m {
                Msg::Record {
                    ts,
                    trace_id,
                    record,
                    size,
                } => {
                    shared.queued_bytes.fetch_sub(size, Ordering::AcqRel);
                    records.push((ts, trace_id, record));
                }
                Msg::Flush(ack) => acks.push(ack),
            }
        }
        if !records.is_empty() {
            write_records(&mut file, &records, &shared, &mut failing);
        }
        for a in acks {
            let _ = a.try_send(());
        }
    }
}

/// Write one batch, or count it as dropped. Lines are cut into chunks that fit `max_size`, so
/// rotation happens between them.
fn write_records(
    file: &mut LogFile,
    records: &[(String, Option<String>, Record)],
    shared: &Shared,
    failing: &mut bool,
) {
    let dropped = shared.dropped.swap(0, Ordering::AcqRel);
    let mut chunk: Vec<u8> = Vec::new();
    let (mut in_chunk, mut written) = (0u64, 0u64);
    let mut result = Ok(());
    for (i, (ts, trace_id, record)) in records.iter().enumerate() {
        let line = Line {
            ts,
            trace_id: trace_id.as_deref(),
            record,
            dropped_before: if i == 0 { dropped } else { 0 },
        };
        let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
        bytes.push(b'\n');
        if !chunk.is_empty() && (chunk.len() + bytes.len()) as u64 > file.max_size {
            result = result.and_then(|()| file.append(&chunk));
            if result.is_ok() {
                written += in_chunk;
            }
            chunk.clear();
            in_chunk = 0;
        }
        chunk.extend_from_slice(&bytes);
        in_chunk += 1;
    }
    if !chunk.is_empty() {
        result = result.and_then(|()| file.append(&chunk));
        if result.is_ok() {
            written += in_chunk;
        }
    }
    match result {
        Ok(()) => {
            if dropped > 0 {
                tracing::warn!(
                    "{dropped} audit records were dropped before this one; the log says so (dropped_before)"
                );
            }
            shared.warned.store(false, Ordering::Release);
            if *failing {
                tracing::info!("the audit log is written again");
            }
            *failing = false;
        }
        Err(e) => {
            // What was lost: the records not written, and the count the first line would
            // have carried when it was not written either.
            let lost = records.len() as u64 - written;
            if written == 0 {
                shared.dropped.fetch_add(dropped, Ordering::AcqRel);
            }
            if !*failing {
                tracing::error!("{}", crate::error::Hinted::message(&e));
            }
            *failing = true;
            shared.drop_records(lost, "the audit log could not be written");
        }
    }
}

//! Why the audit log could not be written. The message says what happened; its [`Hint`] says
//! what to do next.

use crate::error::{Hint, Hinted};
use std::path::PathBuf;

/// Why the audit log's file could not be opened, written or rotated.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// A file operation on the log, its directory or its lock failed: at start (the file is
    /// opened then) or when the writer thread writes or rotates.
    #[error("could not {what} the audit log {}: {source}", .path.display())]
    Io {
        /// What was being done, as a verb (`open`, `write`, `rotate`, `lock`).
        what: &'static str,
        /// The log file (or its directory or lock).
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl Hinted for AuditError {
    /// What to do about it.
    fn hint(&self) -> Option<Hint> {
        Some(Hint::clause(match self {
            AuditError::Io { source, .. } if source.raw_os_error() == Some(libc::ELOOP) => {
                "the path is a symbolic link, which the audit log refuses to follow; set audit.path to the real file"
            }
            AuditError::Io { .. } => {
                "make its directory writable by this user, set audit.path (MCP_BRIDGE_AUDIT_PATH) to another absolute file, or to off; records not written are counted and the next one written says how many"
            }
        }))
    }
}

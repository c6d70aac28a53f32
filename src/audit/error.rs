//! Why the audit log could not be written. The message says what happened; [`AuditError::hint`]
//! says what to do next.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("could not {what} the audit log {}: {source}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl AuditError {
    /// What to do about it.
    pub fn hint(&self) -> String {
        match self {
            AuditError::Io { source, .. } if source.raw_os_error() == Some(libc::ELOOP) => {
                "the path is a symbolic link, which the audit log refuses to follow; set audit.path to the real file".into()
            }
            AuditError::Io { .. } => {
                "make its directory writable by this user, set audit.path (MCP_BRIDGE_AUDIT_PATH) to another absolute file, or to off; records not written are counted and the next one written says how many".into()
            }
        }
    }
}

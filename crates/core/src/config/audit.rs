//! The `[audit]` section: where the audit log is written, what of the executed code it keeps,
//! and the bounds of its files. The log itself is `crate::audit`; this is only its settings.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::values::{Size, empty_as_none, flexible_u32};

/// File name of the log under the state directory when `audit.path` is not set.
pub const DEFAULT_FILE: &str = "audit.jsonl";

/// `[audit]`: one JSON line per `run_python` call and per proxied tool call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// The log file; unset means `<state_dir>/audit.jsonl`, `off` writes no log at all.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub path: Option<String>,
    /// What of the executed code a record keeps.
    pub code: CodeKept,
    /// Size at which the file is rotated (`audit.jsonl` becomes `audit.jsonl.1`).
    pub max_size: Size,
    /// Rotated files kept (`.1` newest ... `.N` oldest); 0 keeps none.
    #[serde(deserialize_with = "flexible_u32")]
    pub keep: u32,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            path: None,
            code: CodeKept::Sha256,
            max_size: Size(16 << 20),
            keep: 5,
        }
    }
}

/// What of the executed code an `exec` record keeps: its digest always, the text with `full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CodeKept {
    /// Only the code's SHA-256 (`sha256`, the default).
    Sha256,
    /// The SHA-256 and the code itself, cut at `audit::MAX_CODE_KEPT` bytes (`full`).
    Full,
}

/// Smallest `max_size`: one record of a large `code` is capped below this, so any file holds a
/// record or more.
pub const MIN_MAX_SIZE: u64 = 1 << 10;
/// Most rotated files: enough for any retention, few enough that a rotation stays quick.
pub const MAX_KEEP: u32 = 100;

impl AuditConfig {
    /// The log file in force, or `None` when `path = "off"`. A relative path is refused by
    /// `AuditConfig::check` at load, so the file does not depend on where a client started the
    /// bridge.
    pub fn file(&self, state_dir: &Path) -> Option<PathBuf> {
        match self.path.as_deref().map(str::trim) {
            None | Some("") => Some(state_dir.join(DEFAULT_FILE)),
            Some(p) if p.eq_ignore_ascii_case("off") => None,
            Some(p) => Some(PathBuf::from(p)),
        }
    }

    /// Range checks, as `Config::validate` reports them: the key at fault and why.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if let Some(p) = self.path.as_deref().map(str::trim)
            && !p.is_empty()
            && !p.eq_ignore_ascii_case("off")
            && !Path::new(p).is_absolute()
        {
            return Err((
                "audit.path",
                format!("{p:?} is not an absolute path; write an absolute path, or off"),
            ));
        }
        if self.max_size.0 < MIN_MAX_SIZE {
            return Err((
                "audit.max_size",
                format!(
                    "{} is too small for a record; use at least 1k",
                    self.max_size
                ),
            ));
        }
        if self.keep > MAX_KEEP {
            return Err((
                "audit.keep",
                format!("{} rotated files is above the most, {MAX_KEEP}", self.keep),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_is_the_state_dir_default_an_absolute_path_or_off() {
        let state = Path::new("/state");
        let mut a = AuditConfig::default();
        assert_eq!(a.file(state), Some(PathBuf::from("/state/audit.jsonl")));
        a.path = Some("OFF".into());
        assert_eq!(a.file(state), None);
        a.path = Some("/var/log/mcb.jsonl".into());
        assert_eq!(a.file(state), Some(PathBuf::from("/var/log/mcb.jsonl")));
        assert!(a.check().is_ok());
        a.path = Some("logs/audit.jsonl".into());
        assert_eq!(a.check().unwrap_err().0, "audit.path");
    }

    #[test]
    fn bounds_are_checked() {
        let mut a = AuditConfig {
            max_size: Size(100),
            ..Default::default()
        };
        assert_eq!(a.check().unwrap_err().0, "audit.max_size");
        a.max_size = Size(MIN_MAX_SIZE);
        a.keep = MAX_KEEP + 1;
        assert_eq!(a.check().unwrap_err().0, "audit.keep");
    }
}

//! Why a configuration was refused. The message names the key, the bad value and where it came
//! from; [`ConfigError::hint`] says what to do next.

use crate::error::{Hint, Hinted};
use std::path::PathBuf;

use super::keys::{KEYS, edit_distance};
use super::source::{SYSTEM_CONFIG_ENV, Source, source_from};

/// A value that is not what its key, flag or field takes: the message says what was wrong and
/// what it takes (a duration, a size, an address, a glob, a requirement).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidValue(pub String);

impl From<String> for InvalidValue {
    fn from(s: String) -> Self {
        InvalidValue(s)
    }
}

impl std::ops::Deref for InvalidValue {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<InvalidValue> for String {
    fn from(e: InvalidValue) -> String {
        e.0
    }
}

impl From<&str> for InvalidValue {
    fn from(s: &str) -> Self {
        InvalidValue(s.to_string())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--config` names no file.
    #[error("config file {} (from --config) does not exist or is not a file", .0.display())]
    MissingFile(PathBuf),
    /// `MCP_BRIDGE_SYSTEM_CONFIG` names no file.
    #[error(
        "system config file {} (from {SYSTEM_CONFIG_ENV}) does not exist or is not a file",
        .0.display()
    )]
    MissingSystemFile(PathBuf),
    /// What figment could not read, one problem a line (every bad layer is named at once), each
    /// with its hint on a `hint:` line after it.
    #[error("{}", .0.iter().map(Hinted::report).collect::<Vec<_>>().join("\n"))]
    Unreadable(Vec<Problem>),
    /// A value of the right type out of its range, or at odds with another key.
    #[error("invalid value for `{key}` from {origin}: {why}")]
    Invalid {
        key: &'static str,
        origin: Source,
        why: String,
    },
}

/// One thing figment could not read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Problem {
    /// A key no table has; its hint suggests the closest known one.
    #[error("unknown key `{key}` in {origin}")]
    UnknownKey {
        key: String,
        origin: Source,
        closest: Option<String>,
        known: Vec<String>,
    },
    /// A value that does not parse; `what` says why (and, for a closed set, what would).
    #[error("invalid value for `{key}` from {origin}: {what}")]
    Value {
        key: String,
        origin: Source,
        what: String,
    },
    /// A file that is not a TOML table at all.
    #[error("invalid configuration in {origin}: {what}")]
    File { origin: Source, what: String },
}

impl Hinted for ConfigError {
    /// What to do about it, when there is something to say beyond the message. Problems that
    /// figment listed together carry their own hints, each on the line after its problem.
    fn hint(&self) -> Option<Hint> {
        match self {
            ConfigError::MissingSystemFile(_) => Some(Hint::clause(format!(
                "point {SYSTEM_CONFIG_ENV} at an existing file, or set it to `none` to read no system file"
            ))),
            _ => None,
        }
    }
}

impl Hinted for Problem {
    fn hint(&self) -> Option<Hint> {
        match self {
            Problem::UnknownKey { closest, known, .. } => Some(Hint::line(format!(
                "{}Known keys: {}",
                closest
                    .as_ref()
                    .map(|k| format!("did you mean `{k}`? "))
                    .unwrap_or_default(),
                known.join(", ")
            ))),
            _ => None,
        }
    }
}

impl ConfigError {
    pub(super) fn from_figment(e: figment::Error) -> Self {
        let mut out = Vec::new();
        for err in e {
            let key = err.path.join(".");
            let origin = err
                .metadata
                .as_ref()
                .map(|m| source_from(m, &key))
                .unwrap_or(Source::Default);
            let what = match &err.kind {
                figment::error::Kind::UnknownField(f, expected) => {
                    let known: Vec<String> = if err.path.len() <= 1 {
                        KEYS.iter()
                            .map(|k| k.name)
                            .chain(["servers"])
                            .map(String::from)
                            .collect()
                    } else {
                        expected.iter().map(|k| k.to_string()).collect()
                    };
                    let closest = known.iter().min_by_key(|k| edit_distance(f, k)).cloned();
                    out.push(Problem::UnknownKey {
                        key: f.clone(),
                        origin,
                        closest,
                        known,
                    });
                    continue;
                }
                // figment's own wording doubles the backticks (``a` or `b``).
                figment::error::Kind::UnknownVariant(v, expected) => {
                    format!("`{v}` is not one of: {}", expected.join(", "))
                }
                other => other.to_string(),
            };
            if key.is_empty() {
                out.push(Problem::File { origin, what });
            } else {
                out.push(Problem::Value { key, origin, what });
            }
        }
        ConfigError::Unreadable(out)
    }
}

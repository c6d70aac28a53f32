//! Why a configuration was refused. The message names the key, the bad value and where it came
//! from; [`ConfigError::hint`] says what to do next.

use std::path::PathBuf;

use super::keys::{KEYS, edit_distance};
use super::source::{SYSTEM_CONFIG_ENV, Source, source_from};

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
    /// What figment could not read, one problem a line (every bad layer is named at once).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
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
    /// A key no table has; the closest known one is suggested on its own `hint:` line, since
    /// several problems may be listed together.
    #[error(
        "unknown key `{key}` in {origin}\nhint: {}Known keys: {}",
        closest.as_ref().map(|k| format!("did you mean `{k}`? ")).unwrap_or_default(),
        known.join(", ")
    )]
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

impl ConfigError {
    /// What to do about it, when there is something to say beyond the message.
    pub fn hint(&self) -> Option<String> {
        match self {
            ConfigError::MissingSystemFile(_) => Some(format!(
                "point {SYSTEM_CONFIG_ENV} at an existing file, or set it to `none` to read no system file"
            )),
            _ => None,
        }
    }

    /// The message with its hint on a `hint:` line, as the command line prints it.
    pub fn with_hint(&self) -> String {
        match self.hint() {
            Some(h) => format!("{self}\nhint: {h}"),
            None => self.to_string(),
        }
    }

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

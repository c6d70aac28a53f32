//! Why a configuration was refused. The message names the key, the bad value and where it came
//! from; [`ConfigError::hint`] says what to do next.

use crate::error::{Hint, Hinted};
use std::path::PathBuf;

use super::keys::{KEYS, edit_distance};
use super::source::{SYSTEM_CONFIG_ENV, Source, source_from};

/// A value that is not what its key, flag or field takes: the message says what was wrong and
/// what it takes (a duration, a size, an address, a glob, a requirement).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidValue {
    /// A duration whose number does not parse.
    #[error("{text:?} is not a duration; write e.g. 30, 30s, 500ms, 2m")]
    Duration {
        /// The value as written (trimmed).
        text: String,
        /// Why its number is not one.
        #[source]
        error: std::num::ParseFloatError,
    },
    /// A duration whose unit is none of `ms`, `s`, `m`, `h`, `d`.
    #[error("{text:?} has an unknown unit {unit:?}; use ms, s, m, h or d")]
    DurationUnit {
        /// The value as written (trimmed).
        text: String,
        /// The unit it has.
        unit: String,
    },
    /// A size whose number does not parse.
    #[error("{text:?} is not a size; write e.g. 512m, 1g, 65536")]
    Size {
        /// The value as written.
        text: String,
        /// Why its number is not one.
        #[source]
        error: std::num::ParseFloatError,
    },
    /// A size whose unit is none of `k`, `m`, `g`.
    #[error("{text:?} has an unknown unit {unit:?}; use k, m or g")]
    SizeUnit {
        /// The value as written.
        text: String,
        /// The unit it has, in lower case.
        unit: String,
    },
    /// A duration or size that is negative, not finite, or too large.
    #[error("{text:?} is out of range")]
    OutOfRange {
        /// The value as written.
        text: String,
    },
    /// A container engine that is neither a known name nor a socket URL.
    #[error(
        "`{text}` is not one of: auto, podman, docker, or a socket URL (unix:///path/to.sock, tcp://host:port){}",
        .closest.map(|n| format!("; did you mean `{n}`?")).unwrap_or_default()
    )]
    Runtime {
        /// The value as written (trimmed).
        text: String,
        /// The engine name closest to it, unless it looks like a URL.
        closest: Option<&'static str>,
    },
    /// A listening address that is not an address and port.
    #[error(
        "{text:?} is not an address and port ({error}); write it as 127.0.0.1:8931 or [::]:8931"
    )]
    Address {
        /// The value as written.
        text: String,
        /// Why it does not parse.
        #[source]
        error: std::net::AddrParseError,
    },
    /// A distribution-name glob with characters no distribution name has.
    #[error(
        "{pattern:?} is not a distribution-name glob (letters, digits, '-', '_', '.', and * ? [ ] {{ }})"
    )]
    NameGlob {
        /// The pattern as written.
        pattern: String,
    },
    /// A pattern that does not compile as a glob.
    #[error("{pattern:?} is not a glob: {}", .error.kind())]
    Glob {
        /// The pattern as written.
        pattern: String,
        /// Why it does not compile.
        #[source]
        error: globset::Error,
    },
    /// A policy rule without the `.` between server and tool.
    #[error(
        "{pattern:?} has no '.': a rule is \"server.tool\", e.g. \"{pattern}.*\" for every tool of server {pattern:?}"
    )]
    Rule {
        /// The rule as written.
        pattern: String,
    },
    /// A requirement outside the subset of PEP 508 the bridge accepts.
    #[error("{shown:?} is not a requirement: {why}")]
    Requirement {
        /// Its first 80 characters (trimmed), control characters made visible.
        shown: String,
        /// What is wrong with it.
        why: RequirementFault,
    },
    /// An install naming no requirement, or more than [`MAX_REQUIREMENTS`].
    #[error("{count} requirements; an install names 1 to {MAX_REQUIREMENTS}")]
    RequirementCount {
        /// How many it names.
        count: usize,
    },
}

/// Most requirements one install names (and `preinstall` lists).
pub const MAX_REQUIREMENTS: usize = 32;
/// Longest requirement accepted, in bytes.
pub const MAX_REQUIREMENT_LEN: usize = 200;

/// What is wrong with a requirement ([`InvalidValue::Requirement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequirementFault {
    /// Nothing but blanks.
    Empty,
    /// Longer than [`MAX_REQUIREMENT_LEN`] bytes.
    TooLong,
    /// A pip option (`-e`, `--index-url`).
    Option,
    /// A URL or a path.
    UrlOrPath,
    /// An environment marker (`; python_version < "3.12"`).
    Marker,
    /// No distribution name first.
    Name,
    /// An extra's `[` without its `]`.
    UnclosedExtra,
    /// An extra that is not a name.
    Extra,
    /// A version clause without a comparison operator.
    Operator,
    /// A version with characters no version has.
    Version,
}

impl std::fmt::Display for RequirementFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequirementFault::Empty => f.write_str("it is empty"),
            RequirementFault::TooLong => write!(f, "longer than {MAX_REQUIREMENT_LEN} bytes"),
            RequirementFault::Option => f.write_str(
                "options are not accepted; name a distribution, e.g. \"tabulate\" or \"tabulate==0.9.0\"",
            ),
            RequirementFault::UrlOrPath => {
                f.write_str("URLs and paths are not accepted; name a distribution of the index")
            }
            RequirementFault::Marker => f.write_str(
                "environment markers are not accepted; the sandbox's interpreter is the target",
            ),
            RequirementFault::Name => f.write_str(
                "it must start with a distribution name (letters, digits, '-', '_', '.')",
            ),
            RequirementFault::UnclosedExtra => f.write_str("an extra's '[' is not closed"),
            RequirementFault::Extra => f.write_str("an extra is a name"),
            RequirementFault::Operator => {
                f.write_str("a version clause starts with ==, !=, <=, >=, ~=, <, > or ===")
            }
            RequirementFault::Version => {
                f.write_str("a version is letters, digits and . * + ! _ -")
            }
        }
    }
}

/// Why the configuration could not be loaded: a file named but missing, values figment could
/// not read, or a value `Config::validate` refused. The message names the key and where its
/// value came from.
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
        /// The key at fault (`section.key` for a section's).
        key: &'static str,
        /// Where its value came from (a file, a variable, a flag, the default).
        origin: Source,
        /// What is wrong and what to do, as `Config::validate` says it.
        why: String,
    },
}

/// One thing figment could not read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Problem {
    /// A key no table has; its hint suggests the closest known one.
    #[error("unknown key `{key}` in {origin}")]
    UnknownKey {
        /// The key as written.
        key: String,
        /// Where it was written.
        origin: Source,
        /// The known key nearest to it by edit distance.
        closest: Option<String>,
        /// Every key its table knows, for the hint.
        known: Vec<String>,
    },
    /// A value that does not parse; `what` says why (and, for a closed set, what would).
    #[error("invalid value for `{key}` from {origin}: {what}")]
    Value {
        /// The key, `section.key` for a section's.
        key: String,
        /// Where the value came from.
        origin: Source,
        /// Why it does not parse.
        what: String,
    },
    /// A file that is not a TOML table at all.
    #[error("invalid configuration in {origin}: {what}")]
    File {
        /// The file (or other source) at fault.
        origin: Source,
        /// What the TOML parser or figment said.
        what: String,
    },
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

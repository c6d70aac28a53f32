//! Where a configuration value came from (a default, a file, the environment, a flag), as
//! errors and `doctor` name it. Its own module so that both the loader and the errors read it
//! and neither reads the other's.

use std::fmt;
use std::path::PathBuf;

use figment::Metadata;

use super::keys::{KEYS, env_name};

/// Moves the system configuration file elsewhere, or turns it off (`none` or empty). Not a
/// configuration key, since it decides which files are read; the test harness sets it to `none`.
pub const SYSTEM_CONFIG_ENV: &str = "MCP_BRIDGE_SYSTEM_CONFIG";

/// A line that marks a config file `scripts/setup-debian.sh --configure` wrote and may rewrite.
pub const SETUP_MARKER: &str =
    "# Written by mcp-code-bridge's scripts/setup-debian.sh --configure.";

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The built-in default (`Config::default`).
    Default,
    /// A configuration file, by its path.
    File(PathBuf),
    /// The environment variable's name.
    Env(String),
    /// The flag's name (`--image-archive`).
    CommandLine(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Env(var) => write!(f, "environment variable {var}"),
            Source::CommandLine(flag) => write!(f, "command line ({flag})"),
        }
    }
}

impl Source {
    /// Whether this is a file `scripts/setup-debian.sh --configure` wrote (it has the marker).
    pub fn written_by_setup(&self) -> bool {
        match self {
            Source::File(p) => std::fs::read_to_string(p)
                .is_ok_and(|text| text.lines().any(|l| l.trim_end() == SETUP_MARKER)),
            _ => false,
        }
    }
}

pub(super) fn source_from(meta: &Metadata, key: &str) -> Source {
    let top = key.split('.').next().unwrap_or(key);
    match &meta.source {
        Some(figment::Source::File(path)) => Source::File(path.clone()),
        _ if meta.name.contains("environment") => Source::Env(env_name(
            KEYS.iter().find(|k| k.name == key).map_or(top, |k| k.name),
        )),
        // `Serialized` providers are named after their type.
        _ if meta.name.ends_with("::Overrides") => {
            Source::CommandLine(format!("--{}", top.replace('_', "-")))
        }
        _ => Source::Default,
    }
}

//! What the bridge shows of one server ([`ServerInfo`]): its name and alias, where it came from,
//! and how it is reached, read once from its discovered entry. Each pool slot holds one; nothing
//! in it is a secret or needs the server running.

use super::discovery::{DiscoveredEntry, Origin};
#[cfg(test)]
use super::discovery::{Discovery, ServerEntry};

/// What the bridge shows of one server: no secrets, nothing that needs it running.
pub(crate) struct ServerInfo {
    /// The name it was defined under.
    pub(crate) name: String,
    /// Its name as a Python identifier, unique among the servers (`mcp_<alias>` in the sandbox).
    pub(crate) alias: String,
    /// The definition's description, if it has one.
    pub(crate) description: Option<String>,
    /// The directory it starts in, if its definition names one.
    pub(crate) cwd: Option<String>,
    /// How it is reached: "stdio" or "http".
    pub(crate) transport: &'static str,
    /// How it is reached, with no secrets: `stdio <program>` (no arguments, which may carry
    /// tokens) or `http <scheme://host/path>` (no query, no user info).
    pub(crate) target: String,
    /// The source and file that defined it.
    pub(crate) origin: Origin,
}

impl ServerInfo {
    /// The view of `d`, under the alias assigned to it.
    pub(crate) fn new(d: &DiscoveredEntry, alias: String) -> ServerInfo {
        ServerInfo {
            name: d.name.clone(),
            alias,
            description: d.entry.description.clone(),
            cwd: d
                .entry
                .cwd
                .as_ref()
                .map(|c| c.to_string_lossy().to_string()),
            transport: d.entry.transport(),
            target: d.entry.target_summary(),
            origin: d.origin.clone(),
        }
    }

    /// A server whose alias is its name, from the TOML (for tests of the pool).
    #[cfg(test)]
    pub(crate) fn named(name: &str, entry: &ServerEntry) -> ServerInfo {
        let d = Discovery::from_entries([(name.to_string(), entry.clone())]);
        ServerInfo::new(&d.servers[0], name.to_string())
    }
}

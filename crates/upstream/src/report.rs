//! What the upstream side reports to its callers: why an exec could not be bound, what a
//! search left out, what a catalog refresh did, and what the `servers` subcommand shows.

use std::time::Duration;

use serde::Serialize;

use super::discovery::{Origin, SearchedLocation, SkippedEntry, SourceSpec};
use super::pool::CallError;
use bridge_core::error::{Hint, Hinted};

/// A server a search left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedServer {
    /// The server's name.
    pub server: String,
    /// Why its tools are not in the results: it failed to start or list them (and when, if a
    /// search skips it for a while), or it is still starting after the search's wait.
    pub reason: String,
}

/// One server's outcome in [`Upstreams::refresh_catalog`].
#[derive(Debug)]
pub struct Refreshed {
    /// The server's name.
    pub server: String,
    /// How many tools it listed, or why it could not.
    pub result: Result<usize, CallError>,
    /// How long starting it (if needed) and listing took.
    pub took: Duration,
}

/// Why [`Upstreams::load`] could not prepare an exec.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Names that are neither a server's name nor its alias (nor become one as an
    /// identifier); nothing was started.
    #[error(
        "Unknown MCP server{} {}",
        if names.len() > 1 { "s" } else { "" },
        names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
    )]
    UnknownServers {
        /// The names asked for that match no server, in the order given.
        names: Vec<String>,
        /// Every discovered server, by name.
        known: Vec<String>,
    },
    /// Servers that could not be started or listed, each with its own advice, one per line.
    #[error("{}", .0.iter().map(Hinted::message).collect::<Vec<_>>().join("\n"))]
    Unavailable(Vec<CallError>),
}

impl BindError {
    /// The error's type as the reply's `structuredContent.error.type` names it.
    pub fn kind(&self) -> &'static str {
        match self {
            BindError::UnknownServers { .. } => "UnknownServer",
            BindError::Unavailable(_) => "ServerUnavailable",
        }
    }
}

impl Hinted for BindError {
    fn hint(&self) -> Option<Hint> {
        match self {
            BindError::UnknownServers { known, .. } => Some(known_servers(known)),
            BindError::Unavailable(_) => None,
        }
    }
}

/// Which names would have worked.
pub(super) fn known_servers(known: &[String]) -> Hint {
    if known.is_empty() {
        Hint::clause(
            "no MCP servers are configured (see `mcp-code-bridge servers` for where they are read from)",
        )
    } else {
        Hint::clause(format!("known servers: {}", known.join(", ")))
    }
}

/// One discovered server with its provenance, for the `servers` subcommand (no secrets: the
/// program for stdio servers, scheme://host/path for HTTP ones).
#[derive(Debug, Clone, Serialize)]
pub struct ServerSource {
    /// The server's name.
    pub name: String,
    /// Its alias, unique among the servers (`mcp_<alias>` in the sandbox).
    pub alias: String,
    /// The description from its definition, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `stdio` or `http`.
    pub transport: &'static str,
    /// `stdio npx` / `http https://example.com/mcp`.
    pub target: String,
    /// The source and file that defined it.
    pub origin: Origin,
}

/// Everything the `servers` subcommand shows.
#[derive(Debug, Clone, Serialize)]
pub struct SourcesReport {
    /// The places read, in precedence order.
    pub sources: &'static [SourceSpec],
    /// Every discovered server, sorted by name.
    pub servers: Vec<ServerSource>,
    /// Definitions discovery did not offer, with why.
    pub skipped: Vec<SkippedEntry>,
    /// Files discovery could not read or parse, and other problems it met.
    pub warnings: Vec<String>,
    /// Every place discovery looked at, found or not, in precedence order.
    pub searched: Vec<SearchedLocation>,
}

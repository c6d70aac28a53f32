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
    pub server: String,
    pub reason: String,
}

/// One server's outcome in [`Upstreams::refresh_catalog`].
#[derive(Debug)]
pub struct Refreshed {
    pub server: String,
    /// How many tools it listed, or why it could not.
    pub result: Result<usize, String>,
    pub took: Duration,
}

/// Why [`Upstreams::load`] could not prepare an exec.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(
        "Unknown MCP server{} {}",
        if names.len() > 1 { "s" } else { "" },
        names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
    )]
    UnknownServers {
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
    pub name: String,
    pub alias: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `stdio` or `http`.
    pub transport: &'static str,
    /// `stdio npx` / `http https://example.com/mcp`.
    pub target: String,
    pub origin: Origin,
}

/// Everything the `servers` subcommand shows.
#[derive(Debug, Clone, Serialize)]
pub struct SourcesReport {
    /// The places read, in precedence order.
    pub sources: &'static [SourceSpec],
    pub servers: Vec<ServerSource>,
    pub skipped: Vec<SkippedEntry>,
    pub warnings: Vec<String>,
    pub searched: Vec<SearchedLocation>,
}

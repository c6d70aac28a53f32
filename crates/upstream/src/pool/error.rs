//! Why a call to an upstream server failed, as the model reads it (the message names the
//! server and what happened) and as the audit log records it ([`CallError::kind`]).

use std::time::Duration;

use crate::connection::{StartError, stderr_suffix};
use bridge_core::error::{Hint, Hinted};

/// Why listing a server's tools or calling one of them failed. A tool's own failure is not an
/// error here: it is a result with `isError: true`.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The pool was shut down (`Pool::shutdown`, on the bridge's exit): no server is started
    /// any more.
    #[error("The bridge is shutting down; upstream servers are stopped")]
    ShuttingDown,
    /// The server was not running and could not be started.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The connection closed while the server listed its tools, on the first try and again on
    /// a fresh start.
    #[error(
        "Server '{server}' closed its connection while listing its tools{}",
        stderr_suffix(stderr)
    )]
    ListClosed {
        /// The server's name.
        server: String,
        /// Its last stderr lines (stdio servers; empty for HTTP).
        stderr: Vec<String>,
    },
    /// The server answered `tools/list` with an error.
    #[error("Server '{server}' failed to list its tools: {reason}")]
    ListFailed {
        /// The server's name.
        server: String,
        /// The error as the MCP client gives it.
        reason: String,
    },
    /// The server did not answer `tools/list` within the call timeout.
    #[error("Server '{server}' did not list its tools within {}s", after.as_secs())]
    ListTimeout {
        /// The server's name.
        server: String,
        /// The call timeout that ran out (`upstream_call_timeout`).
        after: Duration,
    },
    /// The request could not be sent: the connection was closed again after a restart, or
    /// writing to it failed. The call never reached the server.
    #[error(
        "Server '{server}' is not reachable: {reason}{}",
        stderr_suffix(stderr)
    )]
    Unreachable {
        /// The server's name.
        server: String,
        /// The MCP client's error.
        reason: String,
        /// Its last stderr lines (stdio servers; empty for HTTP).
        stderr: Vec<String>,
    },
    /// The answer was over the stdio message limit and was dropped.
    #[error(
        "Server '{server}' answered with a message larger than {} MiB, the most one MCP message over stdio may carry; it was dropped, so the call of '{tool}' has no result",
        limit >> 20
    )]
    TooLarge {
        /// The server's name.
        server: String,
        /// The tool's name as the server lists it.
        tool: String,
        /// The limit, in bytes ([`crate::stdio::MAX_MESSAGE_BYTES`]).
        limit: usize,
    },
    /// The server answered the call with an input-required result (a multi-round-trip request:
    /// answer its questions, then send the call again), which a proxied call does not follow.
    #[error(
        "Tool '{tool}' on server '{server}' asked for user input (elicitation), which the bridge cannot provide"
    )]
    InputRequired {
        /// The server's name.
        server: String,
        /// The tool's name as the server lists it.
        tool: String,
    },
    /// The server answered the call with a task to poll (MCP tasks), which the bridge does not
    /// follow.
    #[error(
        "Tool '{tool}' on server '{server}' answered with a task handle, which the bridge does not support"
    )]
    TaskHandle {
        /// The server's name.
        server: String,
        /// The tool's name as the server lists it.
        tool: String,
    },
    /// The server answered the call with a result of another request's type.
    #[error("Server '{server}' answered the call of '{tool}' with an unexpected result: {result}")]
    UnexpectedResult {
        /// The server's name.
        server: String,
        /// The tool's name as the server lists it.
        tool: String,
        /// The result, debug-printed.
        result: String,
    },
    /// The tool did not answer within the call timeout; the server was told to cancel it.
    #[error(
        "Tool '{tool}' on server '{server}' did not answer within {}s (upstream_call_timeout); the call was cancelled",
        after.as_secs()
    )]
    Timeout {
        /// The server's name.
        server: String,
        /// The tool's name as the server lists it.
        tool: String,
        /// The call timeout that ran out (`upstream_call_timeout`).
        after: Duration,
    },
    /// The server answered the call with a JSON-RPC error (an unknown tool, invalid
    /// arguments), not a tool result.
    #[error("Server '{server}' refused the call of '{tool}': {reason}")]
    Refused {
        /// The server's name.
        server: String,
        /// The tool's name as the server lists it.
        tool: String,
        /// The error's message.
        reason: String,
    },
    /// The connection closed after the request reached the server: it may have run the tool,
    /// so the call is not sent again. The next call restarts the server.
    #[error(
        "Server '{server}' crashed during the call of '{tool}' (it will be restarted on the next call){}",
        stderr_suffix(stderr)
    )]
    Crashed {
        /// The server's name.
        server: String,
        /// The tool's name as the server lists it.
        tool: String,
        /// Its last stderr lines (stdio servers; empty for HTTP).
        stderr: Vec<String>,
    },
    /// The request was cancelled before the server answered.
    #[error(
        "The call of '{tool}' on server '{server}' was cancelled{}",
        reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
    )]
    Cancelled {
        /// The server's name.
        server: String,
        /// The tool's name as the server lists it.
        tool: String,
        /// The reason given with the cancellation, if any.
        reason: Option<String>,
    },
    /// Any other failure the MCP client reports for the call.
    #[error("The call of '{tool}' on server '{server}' failed: {reason}")]
    Failed {
        /// The server's name.
        server: String,
        /// The tool's name as the server lists it.
        tool: String,
        /// The MCP client's error.
        reason: String,
    },
    /// The call found its connection closed before its request reached the server, on the
    /// first try and on the fresh connection of the retry.
    #[error("Server '{server}' could not be restarted")]
    NotRestarted {
        /// The server's name.
        server: String,
    },
}

impl CallError {
    /// The kind of failure, without the message (which may quote arguments): the audit log's
    /// `error_type`.
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::ShuttingDown => "ShuttingDown",
            CallError::Start(_) => "StartFailed",
            CallError::ListClosed { .. } | CallError::ListFailed { .. } => "ListFailed",
            CallError::ListTimeout { .. } => "ListTimeout",
            CallError::Unreachable { .. } => "Unreachable",
            CallError::TooLarge { .. } => "TooLarge",
            CallError::InputRequired { .. } => "InputRequired",
            CallError::TaskHandle { .. } => "TaskHandle",
            CallError::UnexpectedResult { .. } => "UnexpectedResult",
            CallError::Timeout { .. } => "Timeout",
            CallError::Refused { .. } => "Refused",
            CallError::Crashed { .. } => "Crashed",
            CallError::Cancelled { .. } => "Cancelled",
            CallError::Failed { .. } => "Failed",
            CallError::NotRestarted { .. } => "NotRestarted",
        }
    }
}

impl Hinted for CallError {
    fn hint(&self) -> Option<Hint> {
        match self {
            CallError::Start(e) => e.hint(),
            CallError::TooLarge { .. } => Some(Hint::sentence(
                "Ask the tool for less at a time (a page, a range, a filter).",
            )),
            _ => None,
        }
    }
}

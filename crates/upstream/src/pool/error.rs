//! Why a call to an upstream server failed, as the model reads it (the message names the
//! server and what happened) and as the audit log records it ([`CallError::kind`]).

use std::time::Duration;

use super::super::connection::{StartError, stderr_suffix};
use bridge_core::error::{Hint, Hinted};

/// Why listing a server's tools or calling one of them failed. A tool's own failure is not an
/// error here: it is a result with `isError: true`.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("The bridge is shutting down; upstream servers are stopped")]
    ShuttingDown,
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(
        "Server '{server}' closed its connection while listing its tools{}",
        stderr_suffix(stderr)
    )]
    ListClosed { server: String, stderr: Vec<String> },
    #[error("Server '{server}' failed to list its tools: {reason}")]
    ListFailed { server: String, reason: String },
    #[error("Server '{server}' did not list its tools within {}s", after.as_secs())]
    ListTimeout { server: String, after: Duration },
    #[error(
        "Server '{server}' is not reachable: {reason}{}",
        stderr_suffix(stderr)
    )]
    Unreachable {
        server: String,
        reason: String,
        stderr: Vec<String>,
    },
    /// The answer was over the stdio message limit (`limit` bytes) and was dropped.
    #[error(
        "Server '{server}' answered with a message larger than {} MiB, the most one MCP message over stdio may carry; it was dropped, so the call of '{tool}' has no result",
        limit >> 20
    )]
    TooLarge {
        server: String,
        tool: String,
        limit: usize,
    },
    #[error(
        "Tool '{tool}' on server '{server}' asked for user input (elicitation), which the bridge cannot provide"
    )]
    InputRequired { server: String, tool: String },
    #[error(
        "Tool '{tool}' on server '{server}' answered with a task handle, which the bridge does not support"
    )]
    TaskHandle { server: String, tool: String },
    #[error("Server '{server}' answered the call of '{tool}' with an unexpected result: {result}")]
    UnexpectedResult {
        server: String,
        tool: String,
        result: String,
    },
    #[error(
        "Tool '{tool}' on server '{server}' did not answer within {}s (upstream_call_timeout); the call was cancelled",
        after.as_secs()
    )]
    Timeout {
        server: String,
        tool: String,
        after: Duration,
    },
    #[error("Server '{server}' refused the call of '{tool}': {reason}")]
    Refused {
        server: String,
        tool: String,
        reason: String,
    },
    #[error(
        "Server '{server}' crashed during the call of '{tool}' (it will be restarted on the next call){}",
        stderr_suffix(stderr)
    )]
    Crashed {
        server: String,
        tool: String,
        stderr: Vec<String>,
    },
    #[error(
        "The call of '{tool}' on server '{server}' was cancelled{}",
        reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
    )]
    Cancelled {
        server: String,
        tool: String,
        reason: Option<String>,
    },
    #[error("The call of '{tool}' on server '{server}' failed: {reason}")]
    Failed {
        server: String,
        tool: String,
        reason: String,
    },
    #[error("Server '{server}' could not be restarted")]
    NotRestarted { server: String },
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

//! The MCP server the agent talks to: one tool, `run_python`, and one resource, the capability
//! summary. The standing context (`tools/list`) is built from constants only, so it is the same
//! bytes however many upstream servers exist.

// The layers below are called by their own names (`bridge_core::config::…`); `crate::` is this crate.
use bridge_core::boxed::Boxed;

pub mod budget;
mod capabilities;
mod handler;
pub mod legacy_tasks;
mod link;
pub mod progress;
pub mod published;
pub mod render;
mod replies;
mod rounds;
mod run;
pub mod stdio;
mod tasks;
mod tool;

pub use capabilities::CAPABILITIES_URI;
pub use handler::Bridge;
pub use link::{APPROVE_DENY, APPROVE_ONCE, APPROVE_SESSION, approval_schema};
pub use tool::{
    HELPERS, MAX_CODE_BYTES, MAX_REQUEST_LINE_BYTES, RunArgs, TOOL_DESCRIPTION, TOOL_NAME,
    TOOL_TITLE, input_schema, tool,
};

/// The first SIGTERM or SIGINT, by name: both servers shut down cleanly on either.
#[inline(never)]
pub fn quit_signal() -> Boxed<'static, &'static str> {
    Box::pin(quit_signal_here())
}

async fn quit_signal_here() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("signal handler");
    let mut int = signal(SignalKind::interrupt()).expect("signal handler");
    tokio::select! { _ = term.recv() => "SIGTERM", _ = int.recv() => "SIGINT" }
}

/// Serve MCP over stdio until the client closes it, then remove every container.
#[inline(never)]
pub fn serve_stdio(bridge: Bridge) -> Boxed<'static, anyhow::Result<()>> {
    Box::pin(serve_stdio_here(bridge))
}

async fn serve_stdio_here(bridge: Bridge) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let this = bridge.clone();
    let transport = stdio::StdioTransport::process(MAX_REQUEST_LINE_BYTES);
    let service = match bridge.serve(transport).await {
        Ok(s) => s,
        // A client that leaves before `initialize` (or `run < /dev/null`, a first try without a
        // client) did nothing wrong: there is nothing to serve.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
            tracing::info!("stdin closed before initialize: no client, nothing to serve");
            this.shutdown().await;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    tokio::select! {
        r = service.waiting() => { if let Err(e) = r { tracing::warn!("MCP service ended: {e}"); } }
        sig = quit_signal_here() => tracing::info!("{sig}: shutting down"),
    }
    this.shutdown().await;
    Ok(())
}

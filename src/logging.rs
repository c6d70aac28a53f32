//! Logging: `tracing` to stderr only (stdout is the MCP channel), and a helper that turns a
//! child's stderr into log lines.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tracing_subscriber::EnvFilter;

use crate::config::LogLevel;

/// Install the stderr subscriber. `RUST_LOG` refines the level when set.
pub fn init(level: LogLevel) {
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "warn,rmcp=warn,mcp_code_bridge={}",
            level.as_filter()
        ))
    });
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false);
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::filter::filter_fn(|meta| {
            !is_rmcp_error_reply(meta)
        }))
        .with(fmt)
        .try_init();
}

/// rmcp's "response error" event: every error reply, at WARN, as the error's Rust `Debug` form.
/// The bridge logs its own readable line for each error it answers (`server::refused`), so
/// this one is left out. Recognised by its fields (`id` and `error`), which no other WARN event
/// of rmcp's service loop carries together.
fn is_rmcp_error_reply(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_event()
        && *meta.level() == tracing::Level::WARN
        && meta.target().starts_with("rmcp::service")
        && meta.fields().field("id").is_some()
        && meta.fields().field("error").is_some()
}

/// Log each line a child writes (its stderr), tagged with `source`. Long lines are cut.
pub async fn forward_lines<R: AsyncRead + Unpin>(reader: R, source: String) {
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line: String = line.chars().take(2000).collect();
        tracing::info!(source = %source, "{line}");
    }
}

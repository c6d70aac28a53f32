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
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();
}

/// Log each line a child writes (its stderr), tagged with `source`. Long lines are cut.
pub async fn forward_lines<R: AsyncRead + Unpin>(reader: R, source: String) {
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line: String = line.chars().take(2000).collect();
        tracing::info!(source = %source, "{line}");
    }
}

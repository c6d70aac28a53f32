//! Output of a running `run_python` call streamed to the client as progress (and logging)
//! notifications, and so is the progress its proxied calls report (a line naming the server
//! and tool, never part of the call's output).
//!
//! The code can write far faster than a client reads. What waits to be sent is bounded by
//! [`BUFFER`] bytes: beyond it, output is not streamed (the reply still has it, under the output
//! cap) and a marker says how much was skipped. The call's reply waits until what was buffered
//! has been sent ([`Forwarder::finish`]), so no notification of a request follows its response.

use std::sync::{Arc, Mutex};
use std::time::Duration;

// MCP logging is deprecated in the newest protocol revision (SEP-2577) but still what most
// clients show: output goes to clients that asked for it with `logging/setLevel`.
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RequestContext, RoleServer};
use serde_json::json;
use tokio::sync::Notify;

use bridge_core::protocol::Stream;
use bridge_sandbox::OutputSink;
use bridge_upstream::{ProgressSink, UpstreamProgress};

/// Output held for streaming, at most.
pub const BUFFER: usize = 256 << 10;
/// Largest message of one notification.
const CHUNK: usize = 16 << 10;
/// How long the reply waits for buffered notifications to go out to a client that reads slowly.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// What a notification carries: the code's output, or a proxied call's progress.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Output(Stream),
    Upstream,
}

#[derive(Default)]
struct Pending {
    /// Runs of (kind, text) in order, `len` bytes in all.
    runs: Vec<(Kind, String)>,
    len: usize,
    skipped: u64,
    closed: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Notify,
}

/// The streaming of one call's output; see the module docs.
pub struct Forwarder {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Shared {
    /// Hold `data` for sending, within [`BUFFER`]; beyond it only its size is counted.
    fn push(&self, kind: Kind, data: &str) {
        let mut p = self.pending.lock().unwrap();
        if p.closed {
            return;
        }
        if p.len + data.len() > BUFFER {
            p.skipped += data.len() as u64;
        } else {
            p.len += data.len();
            match p.runs.last_mut() {
                // A proxied call's progress is one notification each.
                Some((k, text)) if *k == kind && kind != Kind::Upstream => text.push_str(data),
                _ => p.runs.push((kind, data.to_string())),
            }
        }
        drop(p);
        self.wake.notify_one();
    }
}

/// A proxied call's progress as one line: `server.tool: message (3/10)`.
fn upstream_line(p: &UpstreamProgress) -> String {
    let mut line = format!("{}.{}:", p.server, p.tool);
    if let Some(m) = &p.message {
        line.push(' ');
        line.push_str(m);
    }
    match p.total {
        Some(total) => line.push_str(&format!(" ({}/{})", p.progress, total)),
        None => line.push_str(&format!(" ({})", p.progress)),
    }
    line.push('\n');
    line
}

impl Forwarder {
    /// Start forwarding to `peer`: progress notifications when the request carried `token`,
    /// logging notifications when the client set a level.
    pub fn start(
        peer: Peer<RoleServer>,
        token: Option<ProgressToken>,
        logging: bool,
    ) -> (Forwarder, OutputSink, ProgressSink) {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Notify::new(),
        });
        let task = tokio::spawn(forward(shared.clone(), peer, token, logging));
        let out = shared.clone();
        let sink: OutputSink =
            Arc::new(move |stream, data: &str| out.push(Kind::Output(stream), data));
        let up = shared.clone();
        let upstream: ProgressSink = Arc::new(move |p: UpstreamProgress| {
            // A server's message is its own text: cut it so one notification stays small.
            let mut line = upstream_line(&p);
            bridge_core::text::truncate_with(&mut line, CHUNK, "…\n");
            up.push(Kind::Upstream, &line)
        });
        (Forwarder { shared, task }, sink, upstream)
    }

    /// Send what is still buffered, then stop; bounded by [`FLUSH_TIMEOUT`].
    pub(crate) async fn finish(self) {
        self.shared.pending.lock().unwrap().closed = true;
        self.shared.wake.notify_one();
        let mut task = self.task;
        if tokio::time::timeout(FLUSH_TIMEOUT, &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

/// What one connection's client asked to be sent while its calls run: logging notifications
/// once it has set a level with `logging/setLevel` (each HTTP connection starts without one);
/// progress notifications are asked per request, by its progress token.
#[derive(Clone, Default)]
pub(crate) struct Streaming {
    /// The level the client set, if it set one.
    #[allow(deprecated)] // LoggingLevel (the module's imports say why)
    log_level: Arc<Mutex<Option<LoggingLevel>>>,
}

impl Streaming {
    /// Send the code's output as logging notifications too, from now on (`logging/setLevel`).
    #[allow(deprecated)] // LoggingLevel (the module's imports say why)
    pub(crate) fn set_log_level(&self, level: LoggingLevel) {
        *self.log_level.lock().unwrap() = Some(level);
    }

    /// Stream output as progress (and logging, when enabled) notifications, when the client
    /// asked for either: the forwarder, and the sinks of the code's output and of its proxied
    /// calls' progress.
    pub(crate) fn start(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Option<(Forwarder, OutputSink, ProgressSink)> {
        let token = context.meta.get_progress_token();
        let logging = self.log_level.lock().unwrap().is_some();
        if token.is_none() && !logging {
            return None;
        }
        Some(Forwarder::start(context.peer.clone(), token, logging))
    }
}

#[allow(deprecated)] // the logging notifications
async fn forward(
    shared: Arc<Shared>,
    peer: Peer<RoleServer>,
    token: Option<ProgressToken>,
    logging: bool,
) {
    let mut n = 0.0;
    loop {
        let (runs, skipped, closed) = {
            let mut p = shared.pending.lock().unwrap();
            let runs = std::mem::take(&mut p.runs);
            p.len = 0;
            (runs, std::mem::take(&mut p.skipped), p.closed)
        };
        let mut messages: Vec<(Kind, String)> = Vec::new();
        for (kind, text) in runs {
            for chunk in chunks(&text, CHUNK) {
                messages.push((kind, chunk.to_string()));
            }
        }
        if skipped > 0 {
            messages.push((
                Kind::Output(Stream::Stderr),
                format!("\n… [{skipped} bytes of output not streamed: the client reads slower than the code writes; the reply has them, under the output cap] …\n"),
            ));
        }
        for (kind, text) in messages {
            n += 1.0;
            if let Some(t) = &token {
                let p = ProgressNotificationParam::new(t.clone(), n).with_message(text.clone());
                if peer.notify_progress(p).await.is_err() {
                    return;
                }
            }
            if logging {
                let (level, logger) = match kind {
                    Kind::Output(Stream::Stderr) => (LoggingLevel::Warning, "run_python"),
                    Kind::Output(_) => (LoggingLevel::Info, "run_python"),
                    Kind::Upstream => (LoggingLevel::Info, "run_python.upstream"),
                };
                let p =
                    LoggingMessageNotificationParam::new(level, json!(text)).with_logger(logger);
                let _ = peer.notify_logging_message(p).await;
            }
        }
        if closed {
            return;
        }
        // A notify while we were sending left a permit: this returns at once then.
        shared.wake.notified().await;
    }
}

/// `text` in pieces of at most `max` bytes, cut at character boundaries.
fn chunks(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = rest.len().min(max);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (head, tail) = rest.split_at(cut);
        rest = tail;
        Some(head)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cut_at_char_boundaries_and_lose_nothing() {
        let text = "é".repeat(10_000);
        let parts: Vec<&str> = chunks(&text, 1001).collect();
        assert!(parts.iter().all(|p| p.len() <= 1001));
        assert_eq!(parts.concat(), text);
    }
}

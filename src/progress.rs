//! Output of a running `run_python` call streamed to the client as progress (and logging)
//! notifications.
//!
//! The code can write far faster than a client reads. What waits to be sent is bounded by
//! [`BUFFER`] bytes: beyond it, output is not streamed (the reply still has it, under the output
//! cap) and a marker says how much was skipped. The call's reply waits until what was buffered
//! has been sent ([`Forwarder::finish`]), so no notification of a request follows its response.

// MCP logging is deprecated in the newest protocol revision but still what most clients show;
// we keep sending it to clients that ask for it with `logging/setLevel`.
#![allow(deprecated)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken,
};
use rmcp::service::{Peer, RoleServer};
use serde_json::json;
use tokio::sync::Notify;

use crate::protocol::Stream;
use crate::sandbox::OutputSink;

/// Output held for streaming, at most.
pub const BUFFER: usize = 256 << 10;
/// Largest message of one notification.
const CHUNK: usize = 16 << 10;
/// How long the reply waits for buffered notifications to go out to a client that reads slowly.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Pending {
    /// Runs of (stream, text) in order, `len` bytes in all.
    runs: Vec<(Stream, String)>,
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

impl Forwarder {
    /// Start forwarding to `peer`: progress notifications when the request carried `token`,
    /// logging notifications when the client set a level.
    pub fn start(
        peer: Peer<RoleServer>,
        token: Option<ProgressToken>,
        logging: bool,
    ) -> (Forwarder, OutputSink) {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Notify::new(),
        });
        let task = tokio::spawn(forward(shared.clone(), peer, token, logging));
        let sink_shared = shared.clone();
        let sink: OutputSink = Arc::new(move |stream, data: &str| {
            let mut p = sink_shared.pending.lock().unwrap();
            if p.closed {
                return;
            }
            if p.len + data.len() > BUFFER {
                p.skipped += data.len() as u64;
            } else {
                p.len += data.len();
                match p.runs.last_mut() {
                    Some((s, text)) if *s == stream => text.push_str(data),
                    _ => p.runs.push((stream, data.to_string())),
                }
            }
            drop(p);
            sink_shared.wake.notify_one();
        });
        (Forwarder { shared, task }, sink)
    }

    /// Send what is still buffered, then stop; bounded by [`FLUSH_TIMEOUT`].
    pub async fn finish(self) {
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
        let mut messages: Vec<(Stream, String)> = Vec::new();
        for (stream, text) in runs {
            for chunk in chunks(&text, CHUNK) {
                messages.push((stream, chunk.to_string()));
            }
        }
        if skipped > 0 {
            messages.push((
                Stream::Stderr,
                format!("\n… [{skipped} bytes of output not streamed: the client reads slower than the code writes; the reply has them, under the output cap] …\n"),
            ));
        }
        for (stream, text) in messages {
            n += 1.0;
            if let Some(t) = &token {
                let p = ProgressNotificationParam::new(t.clone(), n).with_message(text.clone());
                if peer.notify_progress(p).await.is_err() {
                    return;
                }
            }
            if logging {
                let level = if stream == Stream::Stderr {
                    LoggingLevel::Warning
                } else {
                    LoggingLevel::Info
                };
                let p = LoggingMessageNotificationParam::new(level, json!(text))
                    .with_logger("run_python");
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

//! The channel to one container: its attach stream split into frames by a reader task, and its
//! stdin owned by a writer task.
//!
//! Everything the reader takes in comes from the sandbox and is untrusted: lines over
//! [`MAX_FRAME_BYTES`] are discarded whole, garbage is logged sparingly and dropped, and the
//! container's own stderr goes to the log.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bollard::container::LogOutput;
use futures::StreamExt;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use bridge_core::protocol::{
    self, HostFrame, LineSplitter, MAX_FRAME_BYTES, RpcFailure, SandboxFrame, Split,
};

/// Frames buffered between the reader task and the exec loop (back-pressure beyond this)...
const FRAME_QUEUE: usize = 256;
/// ... and bytes: what the sandbox can make the host hold in the queue, whatever the frame sizes.
pub(super) const QUEUE_BYTES: usize = 16 << 20;
/// Lines of the container's stderr kept to explain a crash.
const STDERR_TAIL: usize = 20;
/// The container's stderr and the runtime's log frames reach the bridge's log at most this many
/// lines a minute; the rest are counted and the count logged, so junk from the sandbox
/// cannot make the log larger than it is.
const LOG_LINES_PER_MINUTE: u32 = 20;

pub(super) type AttachOutput = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
>;
pub(super) type AttachInput = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// A frame from the sandbox with its share of the queue's byte budget, released when dropped.
pub(super) struct Queued {
    pub frame: SandboxFrame,
    /// The line's length in bytes.
    pub len: usize,
    _budget: OwnedSemaphorePermit,
}

/// Both ends of the channel, and what the reader knows of the container.
pub(super) struct Channel {
    /// Lines to the container's stdin, in order.
    pub writer: mpsc::Sender<Vec<u8>>,
    pub frames: mpsc::Receiver<Queued>,
    /// The exec whose frames are wanted (0: none). Frames naming any other exec are dropped as
    /// they arrive, so code left running between calls cannot make the host queue anything.
    pub current: Arc<AtomicU64>,
    /// Set when the attach stream ends or breaks: the container is gone.
    pub dead: Arc<AtomicBool>,
    /// The container's last stderr lines.
    pub stderr_tail: Arc<std::sync::Mutex<VecDeque<String>>>,
}

impl Channel {
    /// Start the reader and writer tasks over an attached container's streams. `booted`: the
    /// runtime said `ready` already (a parked sandbox, adopted), so no `ready` is taken from it
    /// any more.
    pub(crate) fn open(
        output: AttachOutput,
        mut input: AttachInput,
        session: &str,
        booted: bool,
    ) -> Channel {
        let (frame_tx, frames) = mpsc::channel(FRAME_QUEUE);
        let dead = Arc::new(AtomicBool::new(false));
        let current = Arc::new(AtomicU64::new(0));
        let stderr_tail = Arc::new(std::sync::Mutex::new(VecDeque::new()));
        tokio::spawn(
            Reader {
                tx: frame_tx,
                budget: Arc::new(Semaphore::new(QUEUE_BYTES)),
                current: current.clone(),
                dead: dead.clone(),
                stderr_tail: stderr_tail.clone(),
                session: session.to_string(),
                booted,
                spoke: booted,
                log: bridge_core::logging::LogBudget::new(
                    "lines from the sandbox",
                    LOG_LINES_PER_MINUTE,
                ),
                bad: 0,
                stale: 0,
            }
            .run(output),
        );
        let (writer, mut write_rx) = mpsc::channel::<Vec<u8>>(64);
        tokio::spawn(async move {
            while let Some(line) = write_rx.recv().await {
                if input.write_all(&line).await.is_err() || input.flush().await.is_err() {
                    break;
                }
            }
            let _ = input.shutdown().await;
        });
        Channel {
            writer,
            frames,
            current,
            dead,
            stderr_tail,
        }
    }
}

/// The `rpc_result` line answering RPC `id`.
pub(super) fn rpc_line(id: u64, answer: Result<Value, RpcFailure>) -> Vec<u8> {
    match answer {
        Ok(v) => HostFrame::RpcResult {
            id,
            ok: true,
            result: Some(v),
            error: None,
            kind: None,
        },
        Err(e) => HostFrame::RpcResult {
            id,
            ok: false,
            result: None,
            error: Some(e.message),
            kind: e.kind,
        },
    }
    .to_line()
}

/// The reader task: splits the attach stream into frames. Garbage is logged (sparingly) and
/// dropped; oversize lines are discarded whole; frames of no running exec are dropped at arrival;
/// the container's own stderr and the runtime's log frames go to the log, rate-limited.
struct Reader {
    tx: mpsc::Sender<Queued>,
    budget: Arc<Semaphore>,
    current: Arc<AtomicU64>,
    dead: Arc<AtomicBool>,
    stderr_tail: Arc<std::sync::Mutex<VecDeque<String>>>,
    session: String,
    /// `ready` was seen: later ones are forgeries.
    booted: bool,
    /// A line came from the sandbox: a `code` frame after it is not the runtime's.
    spoke: bool,
    log: bridge_core::logging::LogBudget,
    bad: u64,
    stale: u64,
}

impl Reader {
    async fn run(mut self, mut output: AttachOutput) {
        let mut splitter = LineSplitter::new(MAX_FRAME_BYTES);
        while let Some(item) = output.next().await {
            let chunk = match item {
                Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => message,
                Ok(LogOutput::StdErr { message }) => {
                    self.stderr(&message);
                    continue;
                }
                Ok(LogOutput::StdIn { .. }) => continue,
                Err(e) => {
                    tracing::debug!(session = %bridge_core::text::visible(&self.session), "attach stream ended: {e}");
                    break;
                }
            };
            let mut rest: &[u8] = &chunk;
            while !rest.is_empty() {
                let split = splitter.feed(&mut rest);
                let first = split.is_some() && !std::mem::replace(&mut self.spoke, true);
                match split {
                    Some(Split::Oversize) if self.log.allow(&self.session) => {
                        tracing::warn!(session = %bridge_core::text::visible(&self.session), "discarding a line over {MAX_FRAME_BYTES} bytes from the sandbox");
                    }
                    Some(Split::Line(line)) if !line.is_empty() => {
                        let len = line.len();
                        match protocol::decode(line) {
                            Ok(frame) => {
                                if !self.forward(frame, len, first).await {
                                    self.dead.store(true, Ordering::Relaxed);
                                    return;
                                }
                            }
                            Err(e) => {
                                self.bad += 1;
                                if self.bad <= 5 || self.bad.is_power_of_two() {
                                    tracing::warn!(session = %bridge_core::text::visible(&self.session), count = self.bad, "dropping a line from the sandbox that is not a frame: {e}");
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        self.dead.store(true, Ordering::Relaxed);
    }

    /// Queue a frame for the exec loop, or drop it here. False when the session is gone.
    /// `first`: the frame is the first line the sandbox wrote.
    async fn forward(&mut self, frame: SandboxFrame, len: usize, first: bool) -> bool {
        let current = self.current.load(Ordering::SeqCst);
        let wanted = match &frame {
            // The runtime sends its compiled code first of all, before any code but its own
            // ran (boot.py); a later one could be the user's code's.
            SandboxFrame::Code(_) => first && !self.booted,
            SandboxFrame::Ready { .. } => !std::mem::replace(&mut self.booted, true),
            SandboxFrame::Output { id, .. }
            | SandboxFrame::Display { id, .. }
            | SandboxFrame::Result { id, .. }
            | SandboxFrame::Kept { id, .. }
            | SandboxFrame::Tar { id, .. }
            | SandboxFrame::Snap { id, .. }
            | SandboxFrame::Restored { id, .. } => *id == current && current != 0,
            // RPCs of a finished exec are answered with a refusal by the exec loop while one
            // runs (so a waiting thread learns why); between execs nobody is there to answer.
            SandboxFrame::Rpc { .. } => current != 0,
            SandboxFrame::Log { level, message } => {
                if self.log.allow(&self.session) {
                    let end = message
                        .char_indices()
                        .nth(500)
                        .map_or(message.len(), |(i, _)| i);
                    // The runtime's own warnings (a preload that failed, an exec it could
                    // not prepare) are worth seeing at the default level; still rate-limited.
                    if matches!(level.as_str(), "warning" | "error") {
                        tracing::warn!(session = %bridge_core::text::visible(&self.session), "runtime: {}", bridge_core::text::visible(&message[..end]));
                    } else {
                        tracing::debug!(session = %bridge_core::text::visible(&self.session), %level, "runtime: {}", bridge_core::text::visible(&message[..end]));
                    }
                }
                false
            }
            SandboxFrame::Unknown => false,
        };
        if !wanted {
            self.stale += 1;
            if self.stale.is_power_of_two() {
                tracing::debug!(session = %bridge_core::text::visible(&self.session), dropped = self.stale, "dropping frames that belong to no running call");
            }
            return true;
        }
        let permits = len.clamp(1, QUEUE_BYTES) as u32;
        let Ok(budget) = self.budget.clone().acquire_many_owned(permits).await else {
            return false;
        };
        self.tx
            .send(Queued {
                frame,
                len,
                _budget: budget,
            })
            .await
            .is_ok()
    }

    fn stderr(&mut self, message: &[u8]) {
        let text = String::from_utf8_lossy(message);
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            let line: String = l.chars().take(500).collect();
            if self.log.allow(&self.session) {
                tracing::warn!(session = %bridge_core::text::visible(&self.session), "sandbox stderr: {}", bridge_core::text::visible(&line));
            }
            let mut tail = self.stderr_tail.lock().unwrap();
            tail.push_back(line);
            if tail.len() > STDERR_TAIL {
                tail.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frames a channel lets through of `lines`, written by the sandbox in this order.
    fn through(lines: &[&str], booted: bool) -> Vec<&'static str> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let chunks: Vec<Result<LogOutput, bollard::errors::Error>> = lines
                .iter()
                .map(|l| {
                    Ok(LogOutput::StdOut {
                        message: format!("{l}\n").into_bytes().into(),
                    })
                })
                .collect();
            let output: AttachOutput = Box::pin(futures::stream::iter(chunks));
            let input: AttachInput = Box::pin(tokio::io::sink());
            let mut ch = Channel::open(output, input, "test", booted);
            let mut seen = Vec::new();
            while let Some(q) = ch.frames.recv().await {
                seen.push(match q.frame {
                    SandboxFrame::Code(_) => "code",
                    SandboxFrame::Ready { .. } => "ready",
                    _ => "other",
                });
            }
            seen
        })
    }

    const CODE: &str = r#"{"type":"code","magic":"a70d0d0a","modules":{"boot":"YWJj"}}"#;
    const READY: &str = r#"{"type":"ready","python":"3.14.0"}"#;
    const LOG: &str = r#"{"type":"log","level":"info","message":"hi"}"#;

    /// The runtime's compiled code is taken only as a fresh sandbox's first line: what comes
    /// after any other line (code of the user's, a module the preload imported) is not.
    #[test]
    fn a_code_frame_is_let_through_only_as_a_fresh_sandboxs_first_line() {
        assert_eq!(through(&[CODE, READY], false), ["code", "ready"]);
        assert_eq!(through(&[LOG, CODE, READY], false), ["ready"]);
        assert_eq!(through(&["not a frame", CODE, READY], false), ["ready"]);
        assert_eq!(through(&[READY, CODE], false), ["ready"]);
        assert_eq!(through(&[CODE, CODE, READY], false), ["code", "ready"]);
        // An adopted (parked) sandbox booted long ago: nothing it sends is its boot.
        assert_eq!(through(&[CODE], true), Vec::<&str>::new());
    }
}

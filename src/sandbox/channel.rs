//! The channel to one container: its attach stream split into frames by a reader task, and its
//! stdin owned by a writer task.
//!
//! Everything the reader takes in comes from the sandbox and is untrusted: lines over
//! [`MAX_FRAME_BYTES`] are discarded whole, garbage is logged sparingly and dropped, and the
//! container's own stderr goes to the log.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bollard::container::LogOutput;
use futures::StreamExt;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::protocol::{self, HostFrame, LineSplitter, MAX_FRAME_BYTES, SandboxFrame, Split};

/// Frames buffered between the reader task and the exec loop (back-pressure beyond this).
const FRAME_QUEUE: usize = 256;
/// Lines of the container's stderr kept to explain a crash.
const STDERR_TAIL: usize = 20;

pub(super) type AttachOutput = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
>;
pub(super) type AttachInput = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// Both ends of the channel, and what the reader knows of the container.
pub(super) struct Channel {
    /// Lines to the container's stdin, in order.
    pub writer: mpsc::Sender<Vec<u8>>,
    pub frames: mpsc::Receiver<SandboxFrame>,
    /// Set when the attach stream ends or breaks: the container is gone.
    pub dead: Arc<AtomicBool>,
    /// The container's last stderr lines.
    pub stderr_tail: Arc<std::sync::Mutex<VecDeque<String>>>,
}

impl Channel {
    /// Start the reader and writer tasks over an attached container's streams.
    pub fn open(output: AttachOutput, mut input: AttachInput, session: &str) -> Channel {
        let (frame_tx, frames) = mpsc::channel(FRAME_QUEUE);
        let dead = Arc::new(AtomicBool::new(false));
        let stderr_tail = Arc::new(std::sync::Mutex::new(VecDeque::new()));
        tokio::spawn(read_loop(
            output,
            frame_tx,
            dead.clone(),
            stderr_tail.clone(),
            session.to_string(),
        ));
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
            dead,
            stderr_tail,
        }
    }
}

/// The `rpc_result` line answering RPC `id`.
pub(super) fn rpc_line(id: u64, answer: Result<Value, String>) -> Vec<u8> {
    match answer {
        Ok(v) => HostFrame::RpcResult {
            id,
            ok: true,
            result: Some(v),
            error: None,
        },
        Err(e) => HostFrame::RpcResult {
            id,
            ok: false,
            result: None,
            error: Some(e),
        },
    }
    .to_line()
}

/// Split the attach stream into frames. Garbage is logged (sparingly) and dropped; oversize lines
/// are discarded whole; the container's own stderr goes to the log.
async fn read_loop(
    mut output: AttachOutput,
    tx: mpsc::Sender<SandboxFrame>,
    dead: Arc<AtomicBool>,
    stderr_tail: Arc<std::sync::Mutex<VecDeque<String>>>,
    session: String,
) {
    let mut splitter = LineSplitter::new(MAX_FRAME_BYTES);
    let mut bad = 0u64;
    while let Some(item) = output.next().await {
        let chunk = match item {
            Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => message,
            Ok(LogOutput::StdErr { message }) => {
                let text = String::from_utf8_lossy(&message);
                let mut tail = stderr_tail.lock().unwrap();
                for l in text.lines().filter(|l| !l.trim().is_empty()) {
                    tracing::warn!(%session, "sandbox stderr: {}", l.chars().take(500).collect::<String>());
                    tail.push_back(l.chars().take(500).collect());
                    if tail.len() > STDERR_TAIL {
                        tail.pop_front();
                    }
                }
                continue;
            }
            Ok(LogOutput::StdIn { .. }) => continue,
            Err(e) => {
                tracing::debug!(%session, "attach stream ended: {e}");
                break;
            }
        };
        let mut rest: &[u8] = &chunk;
        while !rest.is_empty() {
            match splitter.feed(&mut rest) {
                Some(Split::Oversize) => {
                    tracing::warn!(%session, "discarding a line over {MAX_FRAME_BYTES} bytes from the sandbox");
                }
                Some(Split::Line(line)) if !line.is_empty() => match protocol::decode(line) {
                    Ok(frame) => {
                        if tx.send(frame).await.is_err() {
                            dead.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                    Err(e) => {
                        bad += 1;
                        if bad <= 5 || bad.is_power_of_two() {
                            tracing::warn!(%session, count = bad, "dropping a line from the sandbox that is not a frame: {e}");
                        }
                    }
                },
                _ => {}
            }
        }
    }
    dead.store(true, Ordering::Relaxed);
}

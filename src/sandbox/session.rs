//! One live interpreter in one container: start it, run code in it, interrupt or kill it.
//!
//! Frames arrive through a reader task that splits the attach stream into lines, refuses oversize
//! ones and decodes the rest; frames leave through a writer task that owns the container's stdin.
//! An exec holds the session's frame receiver for its whole duration, so execs on one session run
//! one at a time, and frames that name another exec id are dropped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::{AttachContainerOptionsBuilder, CreateContainerOptionsBuilder};
use futures::StreamExt;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::container;
use crate::protocol::{
    self, ExecBinding, ExecError, ExecStatus, HostFrame, LineSplitter, MAX_FRAME_BYTES, SandboxFrame, Split,
    Stream,
};
use crate::config::Config;

/// The Python runtime, injected into every container at start.
pub const RUNTIME: &str = include_str!("../../image/runtime.py");

/// How long code gets to react to KeyboardInterrupt before its container is killed.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(3);
/// An interrupt still unanswered after this long is sent once more (a second Ctrl-C) before
/// the grace period ends in a kill.
const INTERRUPT_RESEND: Duration = Duration::from_secs(1);
/// How long a fresh container gets to say `ready`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Proxied calls running at once per exec; further ones queue.
const MAX_CONCURRENT_RPCS: usize = 32;
/// Calls queued or running per exec before new ones are refused.
const MAX_PENDING_RPCS: usize = 4096;
/// Frames buffered between the reader task and the exec loop (back-pressure beyond this).
const FRAME_QUEUE: usize = 256;

/// Why a session could not be started or used.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SessionError(pub String);

/// How an exec ended, from the bridge's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The code ran to the end.
    Ok,
    /// The code raised.
    Error,
    /// The time limit expired; the code was interrupted (or killed, see `session_reset`).
    Timeout,
    /// The client cancelled the call.
    Cancelled,
    /// The container died (out of memory, killed); the session was reset.
    Crashed,
}

/// Everything an exec produced.
#[derive(Debug, Clone)]
pub struct ExecOutcome {
    pub outcome: Outcome,
    pub stdout: String,
    pub stderr: String,
    pub value: Option<String>,
    pub error: Option<ExecError>,
    /// `(mime, base64 data)` of each displayed image.
    pub images: Vec<(String, String)>,
    pub duration: Duration,
    /// Output bytes dropped by the output cap.
    pub truncated: u64,
    /// Sentences for the model about what the bridge did (interrupts, resets, limits).
    pub notices: Vec<String>,
    /// The interpreter's state is gone; the next call starts fresh.
    pub session_reset: bool,
}

/// Streamed output of a running exec, for progress notifications.
pub type OutputSink = Arc<dyn Fn(Stream, &str) + Send + Sync>;

/// What a caller asks of one exec.
pub struct ExecRequest {
    pub code: String,
    pub timeout: Duration,
    /// The configured ceiling of `timeout`, quoted when a call runs out of time.
    pub max_timeout: Duration,
    pub output_cap: usize,
    pub binding: ExecBinding,
    pub cancel: CancellationToken,
    pub on_output: Option<OutputSink>,
}

pub struct Session {
    pub name: String,
    pub container_id: String,
    pub python: String,
    docker: Docker,
    memory_limit: String,
    pids_limit: u32,
    writer: mpsc::Sender<Vec<u8>>,
    frames: Mutex<mpsc::Receiver<SandboxFrame>>,
    next_exec: AtomicU64,
    dead: Arc<AtomicBool>,
    last_used: std::sync::Mutex<Instant>,
    /// Calls that hold this session (handed out, exec not finished): such a session is busy even
    /// before its exec takes the frame channel, so no reaper closes it under the caller.
    claims: AtomicU64,
    /// The servers and discovery list last sent to the runtime, serialized; an exec whose are
    /// the same leaves them out (the runtime keeps the previous ones), so a warm call with many
    /// servers loaded does not resend every schema.
    catalog_sent: std::sync::Mutex<Vec<u8>>,
    stderr_tail: Arc<std::sync::Mutex<VecDeque<String>>>,
}

/// A call's hold on a session, from hand-out until the call is done; see [`Session::claim`].
pub struct Claim(Arc<Session>);

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.claims.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::ops::Deref for Claim {
    type Target = Arc<Session>;
    fn deref(&self) -> &Arc<Session> {
        &self.0
    }
}

impl Session {
    /// Create, attach and start a container, inject the runtime and wait for `ready`.
    pub async fn start(
        docker: &Docker,
        config: &Config,
        name: &str,
        owner: &str,
        serial: u64,
    ) -> Result<Session, SessionError> {
        let body = container::spec(config, name, owner);
        let cname = container_name(name, serial);
        let opts = CreateContainerOptionsBuilder::default()
            .name(&cname)
            .build();
        let created = docker
            .create_container(Some(opts), body)
            .await
            .map_err(|e| {
                SessionError(format!(
                    "could not create the sandbox container from image {:?}: {e}",
                    config.image
                ))
            })?;
        let id = created.id;
        match Self::attach_and_boot(docker, config, name, &id).await {
            Ok(s) => Ok(s),
            Err(e) => {
                container::remove(docker, &id).await;
                Err(e)
            }
        }
    }

    async fn attach_and_boot(
        docker: &Docker,
        config: &Config,
        name: &str,
        id: &str,
    ) -> Result<Session, SessionError> {
        let opts = AttachContainerOptionsBuilder::default()
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .stream(true)
            .build();
        let attached = docker
            .attach_container(id, Some(opts))
            .await
            .map_err(|e| SessionError(format!("could not attach to the sandbox container: {e}")))?;
        docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| SessionError(format!("could not start the sandbox container: {e}")))?;

        let (frame_tx, mut frame_rx) = mpsc::channel(FRAME_QUEUE);
        let dead = Arc::new(AtomicBool::new(false));
        let stderr_tail = Arc::new(std::sync::Mutex::new(VecDeque::new()));
        tokio::spawn(read_loop(
            attached.output,
            frame_tx,
            dead.clone(),
            stderr_tail.clone(),
            name.to_string(),
        ));

        let (writer, mut write_rx) = mpsc::channel::<Vec<u8>>(64);
        let mut input = attached.input;
        tokio::spawn(async move {
            while let Some(line) = write_rx.recv().await {
                if input.write_all(&line).await.is_err() || input.flush().await.is_err() {
                    break;
                }
            }
            let _ = input.shutdown().await;
        });

        let _ = writer
            .send(HostFrame::Boot { source: RUNTIME }.to_line())
            .await;
        let python = match tokio::time::timeout(START_TIMEOUT, async {
            loop {
                match frame_rx.recv().await {
                    Some(SandboxFrame::Ready { python }) => return Some(python),
                    Some(_) => continue,
                    None => return None,
                }
            }
        })
        .await
        {
            Ok(Some(p)) => p,
            Ok(None) => {
                let tail: Vec<String> = stderr_tail.lock().unwrap().iter().cloned().collect();
                return Err(SessionError(format!(
                    "the sandbox exited while starting (does image {:?} have python3 >= 3.9?){}",
                    config.image,
                    if tail.is_empty() {
                        String::new()
                    } else {
                        format!(":\n{}", tail.join("\n"))
                    }
                )));
            }
            Err(_) => {
                return Err(SessionError(format!(
                    "the sandbox did not become ready within {}s",
                    START_TIMEOUT.as_secs()
                )));
            }
        };
        tracing::info!(session = name, container = %short(id), %python, "sandbox ready");
        Ok(Session {
            name: name.to_string(),
            container_id: id.to_string(),
            python,
            docker: docker.clone(),
            memory_limit: config.memory.to_string(),
            pids_limit: config.pids,
            writer,
            frames: Mutex::new(frame_rx),
            next_exec: AtomicU64::new(1),
            dead,
            last_used: std::sync::Mutex::new(Instant::now()),
            claims: AtomicU64::new(0),
            catalog_sent: std::sync::Mutex::new(Vec::new()),
            stderr_tail,
        })
    }

    /// Whether the container is gone or the channel broke.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// Whether a call holds this session or an exec is running in it now.
    pub fn is_busy(&self) -> bool {
        self.claims.load(Ordering::SeqCst) > 0 || self.frames.try_lock().is_err()
    }

    /// Hold the session for one call: it counts as busy (and used now) until the claim drops.
    pub fn claim(self: &Arc<Self>) -> Claim {
        self.claims.fetch_add(1, Ordering::SeqCst);
        *self.last_used.lock().unwrap() = Instant::now();
        Claim(Arc::clone(self))
    }

    pub fn idle_for(&self) -> Duration {
        self.last_used.lock().unwrap().elapsed()
    }

    /// Kill and remove the container.
    pub async fn destroy(&self) {
        self.dead.store(true, Ordering::Relaxed);
        container::remove(&self.docker, &self.container_id).await;
    }

    /// Run code. Never fails: every way an exec can end is an [`ExecOutcome`].
    pub async fn exec(&self, req: ExecRequest) -> ExecOutcome {
        let mut frames = self.frames.lock().await;
        let started = Instant::now();
        *self.last_used.lock().unwrap() = started;
        let id = self.next_exec.fetch_add(1, Ordering::Relaxed);
        let mut out = Collector::new(req.output_cap);
        let mut notices = Vec::new();

        let catalog = serde_json::to_vec(&(&req.binding.servers, &req.binding.discovered))
            .expect("server metadata always serializes");
        let unchanged = *self.catalog_sent.lock().unwrap() == catalog;
        let frame = HostFrame::Exec {
            id,
            code: &req.code,
            servers: (!unchanged).then_some(&req.binding.servers[..]),
            discovered: (!unchanged).then_some(&req.binding.discovered[..]),
            output_cap: req.output_cap,
        };
        let line = frame.to_line();
        tracing::debug!(
            session = %self.name,
            exec = id,
            bytes = line.len(),
            servers_sent = !unchanged,
            "exec sent"
        );
        if !unchanged {
            *self.catalog_sent.lock().unwrap() = catalog;
        }
        if self.writer.send(line).await.is_err() {
            self.dead.store(true, Ordering::Relaxed);
            return self.crashed(out, started, notices).await;
        }

        let rpc_slots = Arc::new(Semaphore::new(MAX_CONCURRENT_RPCS));
        let pending = Arc::new(AtomicU64::new(0));
        let mut rpcs = tokio::task::JoinSet::new();
        let deadline = tokio::time::Instant::now() + req.timeout;
        // Set once an interrupt was sent: why, and when it was sent.
        let mut interrupted: Option<(Outcome, tokio::time::Instant)> = None;
        let mut interrupts_sent = 0u32;

        let result = loop {
            let wake = match interrupted {
                Some((_, sent)) if interrupts_sent < 2 => sent + INTERRUPT_RESEND,
                Some((_, sent)) => sent + INTERRUPT_GRACE,
                None => deadline,
            };
            tokio::select! {
                frame = frames.recv() => {
                    let Some(frame) = frame else {
                        break None;
                    };
                    match frame {
                        SandboxFrame::Output { id: fid, stream, data } if fid == id => {
                            if let Some(sink) = &req.on_output {
                                sink(stream, &data);
                            }
                            out.push(stream, &data);
                        }
                        SandboxFrame::Display { id: fid, mime, data } if fid == id => {
                            if out.images.len() < 16 && data.len() <= 8 << 20 && mime.starts_with("image/") {
                                out.images.push((mime, data));
                            } else {
                                notices.push("an image was dropped: at most 16 images of 8 MiB each per call".into());
                            }
                        }
                        SandboxFrame::Rpc { id: rid, exec, method, params } => {
                            if exec != id {
                                self.refuse(rid, "this call was made after its run_python call ended; await every tool call before the code finishes".into(), &pending);
                            } else if pending.load(Ordering::Relaxed) as usize >= MAX_PENDING_RPCS {
                                self.refuse(rid, format!("too many tool calls in flight (limit {MAX_PENDING_RPCS}); await some before starting more"), &pending);
                            } else {
                                pending.fetch_add(1, Ordering::Relaxed);
                                let rpc = req.binding.rpc.clone();
                                let slots = rpc_slots.clone();
                                let writer = self.writer.clone();
                                let pending = pending.clone();
                                rpcs.spawn(async move {
                                    let _permit = slots.acquire_owned().await;
                                    let answer = rpc.handle(&method, params).await;
                                    let _ = writer.send(rpc_line(rid, answer)).await;
                                    pending.fetch_sub(1, Ordering::Relaxed);
                                });
                            }
                        }
                        SandboxFrame::Result { id: fid, status, value, error, truncated } if fid == id => {
                            break Some((status, value, error, truncated));
                        }
                        SandboxFrame::Log { level, message } => {
                            let end = message.char_indices().nth(500).map_or(message.len(), |(i, _)| i);
                            tracing::debug!(session = %self.name, exec = id, %level, "runtime: {}", &message[..end]);
                        }
                        SandboxFrame::Ready { .. } | SandboxFrame::Unknown => {}
                        other => tracing::debug!(session = %self.name, ?other, "dropping frame of another exec"),
                    }
                }
                _ = tokio::time::sleep_until(wake) => {
                    match interrupted {
                        None => {
                            self.send_detached(HostFrame::Interrupt { id }.to_line());
                            interrupts_sent = 1;
                            interrupted = Some((Outcome::Timeout, tokio::time::Instant::now()));
                        }
                        Some(_) if interrupts_sent < 2 => {
                            interrupts_sent += 1;
                            tracing::debug!(session = %self.name, exec = id, "no answer to the interrupt after {}s; sending it again", INTERRUPT_RESEND.as_secs());
                            self.send_detached(HostFrame::Interrupt { id }.to_line());
                        }
                        Some((why, _)) => {
                            tracing::debug!(session = %self.name, exec = id, interrupts = interrupts_sent, "the code ignored its interrupts; killing the sandbox");
                            // The code ignored KeyboardInterrupt: kill the container.
                            rpcs.abort_all();
                            self.destroy().await;
                            let what = match why {
                                Outcome::Cancelled => "the call was cancelled".to_string(),
                                _ => format!("the time limit of {} expired", secs(req.timeout)),
                            };
                            notices.push(format!(
                                "{what}, and the code did not stop within {}s of KeyboardInterrupt, so its sandbox was killed. The session was reset: variables and imports are gone; the next call starts fresh.",
                                INTERRUPT_GRACE.as_secs()
                            ));
                            let mut o = out.finish(why, started, notices);
                            o.session_reset = true;
                            return o;
                        }
                    }
                }
                _ = req.cancel.cancelled(), if interrupted.is_none() => {
                    self.send_detached(HostFrame::Interrupt { id }.to_line());
                    interrupts_sent = 1;
                    interrupted = Some((Outcome::Cancelled, tokio::time::Instant::now()));
                }
            }
        };
        rpcs.abort_all();
        if interrupts_sent > 0 {
            tracing::debug!(session = %self.name, exec = id, interrupts = interrupts_sent, "the code stopped after its interrupt");
        }
        *self.last_used.lock().unwrap() = Instant::now();
        let Some((status, value, error, truncated)) = result else {
            self.dead.store(true, Ordering::Relaxed);
            return self.crashed(out, started, notices).await;
        };
        out.truncated += truncated.unwrap_or(0);
        out.value = value;
        let outcome = match (status, interrupted) {
            (ExecStatus::Ok, _) => Outcome::Ok,
            (ExecStatus::Error, _) => Outcome::Error,
            (ExecStatus::Interrupted, Some((why, _))) => why,
            // KeyboardInterrupt raised by the code itself.
            (ExecStatus::Interrupted, None) => Outcome::Error,
        };
        match outcome {
            Outcome::Timeout => notices.push(format!(
                "the time limit of {} expired and the code was interrupted (KeyboardInterrupt); the session and its variables are kept. Pass a larger \"timeout\" (at most {}) for longer work.",
                secs(req.timeout),
                secs(req.max_timeout)
            )),
            Outcome::Cancelled => notices.push("the call was cancelled and the code was interrupted; the session and its variables are kept.".into()),
            _ => {}
        }
        if let Some(hint) = error.as_ref().and_then(|e| limit_hint(e, self.pids_limit)) {
            notices.push(hint);
        }
        let mut o = out.finish(outcome, started, notices);
        o.error = error;
        if o.error.is_none() && outcome == Outcome::Error && status == ExecStatus::Interrupted {
            o.error = Some(ExecError {
                kind: "KeyboardInterrupt".into(),
                message: String::new(),
                traceback: String::new(),
            });
        }
        o
    }

    /// Refuse an rpc without waiting. The exec loop is the only reader of the sandbox's frames,
    /// and the engine's attach stream carries both directions: if the loop waited on a full
    /// writer while the sandbox waited on its output being read, neither would move again (a
    /// flood of rpcs did exactly that). Refusals are sent from tasks, counted with the pending
    /// calls; past twice the pending limit (a sandbox that floods without reading) they are
    /// dropped, and only that sandbox's own calls wait, until its timeout.
    fn refuse(&self, id: u64, message: String, pending: &Arc<AtomicU64>) {
        if pending.load(Ordering::Relaxed) as usize >= 2 * MAX_PENDING_RPCS {
            tracing::debug!(session = %self.name, rpc = id, "dropping the refusal of an rpc: the sandbox floods without reading");
            return;
        }
        pending.fetch_add(1, Ordering::Relaxed);
        let pending = pending.clone();
        let writer = self.writer.clone();
        tokio::spawn(async move {
            let _ = writer.send(rpc_line(id, Err(message))).await;
            pending.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// Send a frame without making the exec loop wait for the writer (see [`Self::refuse`]).
    fn send_detached(&self, line: Vec<u8>) {
        let writer = self.writer.clone();
        tokio::spawn(async move {
            let _ = writer.send(line).await;
        });
    }

    /// The container died mid-exec: find out why and say so.
    async fn crashed(
        &self,
        out: Collector,
        started: Instant,
        mut notices: Vec<String>,
    ) -> ExecOutcome {
        // The attach stream can close before the engine records the exit: wait for it briefly.
        let wait = self.docker.wait_container(
            &self.container_id,
            None::<bollard::query_parameters::WaitContainerOptions>,
        );
        let _ = tokio::time::timeout(Duration::from_secs(5), wait.into_future()).await;
        let state = self
            .docker
            .inspect_container(&self.container_id, None)
            .await
            .ok()
            .and_then(|c| c.state);
        let oom = state.as_ref().and_then(|s| s.oom_killed).unwrap_or(false);
        let code = state.as_ref().and_then(|s| s.exit_code);
        let reason = if oom {
            format!(
                "the sandbox ran out of memory (memory limit {}) and was killed",
                self.memory_limit
            )
        } else if code == Some(137) {
            // Some engines (podman on cgroup v1) do not report OOMKilled; we did not send this
            // SIGKILL, and the kernel's OOM killer is what does.
            format!(
                "the sandbox was killed by SIGKILL, almost certainly for exceeding its memory limit of {}",
                self.memory_limit
            )
        } else {
            match code {
                Some(c) => format!("the sandbox process exited unexpectedly (exit code {c})"),
                None => "the connection to the sandbox broke".to_string(),
            }
        };
        let tail: Vec<String> = self.stderr_tail.lock().unwrap().iter().cloned().collect();
        if !tail.is_empty() && !oom {
            notices.push(format!("sandbox stderr: {}", tail.join(" | ")));
        }
        notices.push(format!("{reason}. The session was reset: variables and imports are gone; the next call starts a fresh sandbox."));
        self.destroy().await;
        let mut o = out.finish(Outcome::Crashed, started, notices);
        let kind = if oom || code == Some(137) {
            "MemoryLimitExceeded"
        } else {
            "SandboxCrashed"
        };
        o.error = Some(ExecError {
            kind: kind.into(),
            message: reason,
            traceback: String::new(),
        });
        o.session_reset = true;
        o
    }
}

fn rpc_line(id: u64, answer: Result<Value, String>) -> Vec<u8> {
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

/// A sentence naming the limit an error comes from, so the model knows what happened.
fn limit_hint(e: &ExecError, pids: u32) -> Option<String> {
    let m = format!("{} {}", e.kind, e.message);
    if m.contains("Resource temporarily unavailable") || m.contains("can't start new thread") {
        return Some(format!(
            "the sandbox's process/thread limit of {pids} was reached (pids); use fewer processes or threads"
        ));
    }
    if e.kind == "MemoryError" {
        return Some(
            "the sandbox's memory limit was reached (MemoryError); work on smaller pieces of data"
                .into(),
        );
    }
    None
}

fn secs(d: Duration) -> String {
    crate::config::Secs(d).to_string()
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

fn container_name(session: &str, serial: u64) -> String {
    let clean: String = session
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    format!("mcp-code-bridge-{}-{}-{serial}", std::process::id(), clean)
}

/// Collects one exec's output, enforcing the output cap on the host side too: a runtime that
/// ignores the cap cannot make the bridge hold more than twice it.
struct Collector {
    cap: usize,
    stdout: String,
    stderr: String,
    /// Bytes beyond the cap, per stream: we keep the last `cap/2` of them.
    tails: [VecDeque<u8>; 2],
    dropped: [u64; 2],
    truncated: u64,
    value: Option<String>,
    images: Vec<(String, String)>,
}

impl Collector {
    fn new(cap: usize) -> Self {
        Collector {
            cap: cap.max(1024),
            stdout: String::new(),
            stderr: String::new(),
            tails: Default::default(),
            dropped: [0; 2],
            truncated: 0,
            value: None,
            images: Vec::new(),
        }
    }

    fn push(&mut self, stream: Stream, data: &str) {
        let i = stream as usize;
        let head = if i == 0 {
            &mut self.stdout
        } else {
            &mut self.stderr
        };
        // The host keeps up to 2x the cap per stream: the runtime already trims to the cap.
        let room = (self.cap * 2).saturating_sub(head.len());
        if data.len() <= room {
            head.push_str(data);
            return;
        }
        let cut = floor_char_boundary(data, room);
        head.push_str(&data[..cut]);
        let rest = &data.as_bytes()[cut..];
        let tail = &mut self.tails[i];
        tail.extend(rest);
        let keep = self.cap / 2;
        while tail.len() > keep {
            let excess = tail.len() - keep;
            tail.drain(..excess);
            self.dropped[i] += excess as u64;
        }
    }

    fn finish(mut self, outcome: Outcome, started: Instant, notices: Vec<String>) -> ExecOutcome {
        for i in 0..2 {
            let mut tail = std::mem::take(&mut self.tails[i]);
            if tail.is_empty() {
                continue;
            }
            let tail = String::from_utf8_lossy(tail.make_contiguous()).into_owned();
            let head = if i == 0 {
                &mut self.stdout
            } else {
                &mut self.stderr
            };
            if self.dropped[i] > 0 {
                head.push_str(&format!(
                    "\n… [output truncated: {} bytes omitted] …\n",
                    self.dropped[i]
                ));
            }
            head.push_str(&tail);
            self.truncated += self.dropped[i];
        }
        ExecOutcome {
            outcome,
            stdout: self.stdout,
            stderr: self.stderr,
            value: self.value,
            error: None,
            images: self.images,
            duration: started.elapsed(),
            truncated: self.truncated,
            notices,
            session_reset: false,
        }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Split the attach stream into frames. Garbage is logged (sparingly) and dropped; oversize lines
/// are discarded whole; the container's own stderr goes to the log.
async fn read_loop(
    mut output: std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
    >,
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
                    if tail.len() > 20 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collector_keeps_head_and_tail() {
        let mut c = Collector::new(1024);
        let big = "x".repeat(10_000) + "END";
        c.push(Stream::Stdout, &big);
        let o = c.finish(Outcome::Ok, Instant::now(), vec![]);
        assert!(o.stdout.starts_with("xxx"));
        assert!(o.stdout.ends_with("END"));
        assert!(o.stdout.contains("output truncated"));
        assert!(o.truncated > 0);
        assert!(o.stdout.len() < 4096);
    }

    #[test]
    fn limit_errors_are_named() {
        let e = ExecError {
            kind: "BlockingIOError".into(),
            message: "[Errno 11] Resource temporarily unavailable".into(),
            traceback: String::new(),
        };
        assert!(limit_hint(&e, 64).unwrap().contains("limit of 64"));
        let e = ExecError {
            kind: "ValueError".into(),
            message: "x".into(),
            traceback: String::new(),
        };
        assert_eq!(limit_hint(&e, 64), None);
    }
}

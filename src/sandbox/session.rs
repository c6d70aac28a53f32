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

use futures::StreamExt;

use bollard::Docker;
use bollard::query_parameters::{AttachContainerOptionsBuilder, CreateContainerOptionsBuilder};
use tokio::sync::{Mutex, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::channel::{Channel, Queued, rpc_line};
use super::container::{self, Role};
use super::error::SandboxError;
use super::output::{Collector, ExecOutcome, Outcome, OutputSink, limit_hint};
use crate::config::Config;
use crate::protocol::{ExecBinding, ExecError, ExecStatus, HostFrame, SandboxFrame, Stream};

/// How long code gets to react to KeyboardInterrupt before its container is killed.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(3);
/// An interrupt still unanswered after this long is sent once more (a second Ctrl-C) before
/// the grace period ends in a kill.
const INTERRUPT_RESEND: Duration = Duration::from_secs(1);
/// How long a fresh container gets to say `ready`.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Proxied calls running at once per exec; further ones queue.
const MAX_CONCURRENT_RPCS: usize = 32;
/// Calls queued or running per exec before new ones are refused...
const MAX_PENDING_RPCS: usize = 4096;
/// ... and bytes of their arguments: what an exec can make the host hold in calls not answered yet.
const MAX_PENDING_RPC_BYTES: u64 = 16 << 20;
/// Images returned per call.
pub(super) const MAX_IMAGES: usize = 16;
/// Base64 bytes of all images of one reply together: with the output cap's text (which appears
/// twice, as content and as structured content) a reply stays within the 16 MiB of one message
/// that stdio clients such as rmcp's accept; a larger one would never be read.
pub(super) const MAX_IMAGES_TOTAL: usize = 12 << 20;
/// Largest image `display()` may return, raw; the runtime refuses larger ones with the same
/// number (sent in the boot frame, `sandbox::runtime`).
pub const MAX_IMAGE_BYTES: usize = 6 << 20;

/// Whether a `display` frame holds an image a client can show: an allowed type whose bytes are
/// valid base64, no larger than [`MAX_IMAGE_BYTES`], and start as that type's files do.
fn check_image(mime: &str, data: &str) -> Result<(), String> {
    use base64::Engine as _;
    let magic: &[&[u8]] = match mime {
        "image/png" => &[b"\x89PNG\r\n\x1a\n"],
        "image/jpeg" => &[b"\xff\xd8\xff"],
        "image/gif" => &[b"GIF87a", b"GIF89a"],
        "image/webp" => &[b"RIFF"],
        _ => {
            return Err(format!(
                "type {:?} is not an image type clients accept (PNG, JPEG, GIF, WebP)",
                mime.chars().take(60).collect::<String>()
            ));
        }
    };
    if data.len() > MAX_IMAGE_BYTES.div_ceil(3) * 4 {
        return Err(format!("larger than {} MiB", MAX_IMAGE_BYTES >> 20));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|_| "the data is not valid base64".to_string())?;
    if !magic.iter().any(|m| bytes.starts_with(m)) {
        return Err(format!("the bytes are not a {mime} file"));
    }
    Ok(())
}

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
    frames: Mutex<mpsc::Receiver<Queued>>,
    /// The exec whose frames the reader lets through (see [`Channel::current`]).
    current: Arc<AtomicU64>,
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
    /// The files copied out of `/workspace/out` (`sandbox::files`); they go with the session.
    pub files: Arc<super::files::OutStore>,
    file_caps: super::files::Caps,
    out_stamp: std::sync::Mutex<OutStamp>,
    /// What the session's start has to say (inputs not copied, and why): the first call's notices.
    start_notices: std::sync::Mutex<Vec<String>>,
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

/// The state of one exec while it runs.
struct ExecRun {
    id: u64,
    started: Instant,
    out: Collector,
    notices: Vec<String>,
    rpc_slots: Arc<Semaphore>,
    /// RPCs queued, running, or being refused.
    pending: Arc<AtomicU64>,
    /// Bytes of the lines of RPCs queued or running: their arguments are held until answered.
    pending_bytes: Arc<AtomicU64>,
    rpcs: tokio::task::JoinSet<()>,
    /// Images dropped, and why (the last reason): one notice for all of them.
    images_dropped: (u32, String),
    /// Set once an interrupt was sent: why, and when the first was sent.
    interrupted: Option<(Outcome, tokio::time::Instant)>,
    interrupts_sent: u32,
}

impl ExecRun {
    fn drop_image(&mut self, why: String) {
        self.images_dropped.0 += 1;
        self.images_dropped.1 = why;
    }

    /// The one notice about dropped images, if any were.
    fn image_notice(&mut self) {
        let (n, why) = std::mem::take(&mut self.images_dropped);
        if n > 0 {
            self.notices.push(format!(
                "{n} image(s) from display() were not returned: {why}"
            ));
        }
    }

    /// When the exec's timer fires next: its deadline; once interrupted, the resend time, then
    /// the end of the grace period.
    fn wake(&self, deadline: tokio::time::Instant) -> tokio::time::Instant {
        match self.interrupted {
            Some((_, sent)) if self.interrupts_sent < 2 => sent + INTERRUPT_RESEND,
            Some((_, sent)) => sent + INTERRUPT_GRACE,
            None => deadline,
        }
    }
}

/// The `result` frame of an exec.
struct ExecEnd {
    status: ExecStatus,
    value: Option<String>,
    error: Option<ExecError>,
    truncated: Option<u64>,
    out: Option<String>,
}

/// The runtime's digests of `/workspace/out` (`out` of its result frame): the one of the last
/// exec, and the one the last complete copy was made at. Equal, or `"empty"`, means no copy.
#[derive(Default)]
struct OutStamp {
    latest: Option<String>,
    copied: Option<String>,
}

/// The digest the runtime sends when `/workspace/out` is missing or empty.
const OUT_EMPTY: &str = "empty";
/// A longer `out` is not a digest the runtime makes: it is ignored (the directory is copied).
const OUT_STAMP_MAX: usize = 64;

impl Session {
    /// Create, attach and start a container, inject the runtime and wait for `ready`. A pooled
    /// one (`Role::Pool`) also imports the preload list first; its name is `pool-<serial>` until
    /// [`Session::hand_to`] gives it a session's.
    pub async fn start(
        docker: &Docker,
        config: &Config,
        role: Role<'_>,
        owner: &str,
        serial: u64,
    ) -> Result<Session, SandboxError> {
        let t0 = Instant::now();
        let body = container::spec(config, role, owner);
        let cname = container::container_name(role, serial);
        let name = match role {
            Role::Session(name) => name.to_string(),
            Role::Pool => format!("pool-{serial}"),
        };
        let opts = CreateContainerOptionsBuilder::default()
            .name(&cname)
            .build();
        let created = docker
            .create_container(Some(opts), body)
            .await
            .map_err(|e| SandboxError::Create {
                image: config.image.clone(),
                reason: e.to_string(),
            })?;
        let id = created.id;
        tracing::debug!(session = %name, ms = t0.elapsed().as_millis() as u64, "container created");
        match Self::attach_and_boot(docker, config, &name, &id, t0).await {
            Ok(s) => Ok(s),
            Err(e) => {
                container::remove(docker, &id).await;
                Err(e)
            }
        }
    }

    /// Give a pooled sandbox to session `name`. The engine-side name follows in the background
    /// (only `doctor` reads it), so the call that takes it does not wait for the rename.
    pub fn hand_to(&mut self, name: &str, serial: u64) {
        tracing::info!(session = name, container = %short(&self.container_id), pooled = %self.name, "a pooled sandbox serves the session");
        self.name = name.to_string();
        let docker = self.docker.clone();
        let id = self.container_id.clone();
        let new_name = container::container_name(Role::Session(name), serial);
        tokio::spawn(async move {
            let opts = bollard::query_parameters::RenameContainerOptionsBuilder::default()
                .name(&new_name)
                .build();
            let renamed =
                tokio::time::timeout(Duration::from_secs(10), docker.rename_container(&id, opts))
                    .await;
            if !matches!(renamed, Ok(Ok(()))) {
                tracing::debug!(container = %short(&id), "could not rename a pooled container for its session: {renamed:?}");
            }
        });
    }

    async fn attach_and_boot(
        docker: &Docker,
        config: &Config,
        name: &str,
        id: &str,
        t0: Instant,
    ) -> Result<Session, SandboxError> {
        let opts = AttachContainerOptionsBuilder::default()
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .stream(true)
            .build();
        let attached = docker
            .attach_container(id, Some(opts))
            .await
            .map_err(|e| SandboxError::Attach(e.to_string()))?;
        docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| SandboxError::Start(e.to_string()))?;
        tracing::debug!(
            session = name,
            ms = t0.elapsed().as_millis() as u64,
            "container attached and started"
        );

        let Channel {
            writer,
            frames: mut frame_rx,
            current,
            dead,
            stderr_tail,
        } = Channel::open(attached.output, attached.input, name);

        let _ = writer.send(super::runtime::boot_line().to_vec()).await;
        let python = match tokio::time::timeout(START_TIMEOUT, async {
            loop {
                match frame_rx.recv().await.map(|q| q.frame) {
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
                return Err(SandboxError::ExitedAtStart {
                    image: config.image.clone(),
                    stderr: stderr_tail.lock().unwrap().iter().cloned().collect(),
                });
            }
            Err(_) => return Err(SandboxError::NotReady(START_TIMEOUT.as_secs())),
        };
        tracing::info!(session = name, container = %short(id), %python, ms = t0.elapsed().as_millis() as u64, "sandbox ready");
        let start_notices = super::inputs::copy_in(docker, id, config).await;
        Ok(Session {
            start_notices: std::sync::Mutex::new(start_notices),
            name: name.to_string(),
            container_id: id.to_string(),
            python,
            docker: docker.clone(),
            memory_limit: config.memory.to_string(),
            pids_limit: config.pids,
            writer,
            frames: Mutex::new(frame_rx),
            current,
            next_exec: AtomicU64::new(1),
            dead,
            last_used: std::sync::Mutex::new(Instant::now()),
            claims: AtomicU64::new(0),
            catalog_sent: std::sync::Mutex::new(Vec::new()),
            stderr_tail,
            files: Arc::new(super::files::OutStore::new(&config.state_dir, id)),
            file_caps: super::files::Caps::from_config(config),
            out_stamp: std::sync::Mutex::new(OutStamp::default()),
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
        self.files.clear();
    }

    /// Copy what the last exec left in `/workspace/out` (see `sandbox::files`), unless the
    /// runtime's digest of it says it is empty or as it was at the last complete copy: the copy
    /// is a request to the engine, many times a warm call's cost, and most calls write nothing.
    /// An exec without a digest (it crashed, or the runtime could not tell) is always copied, and
    /// a copy with a notice (a cap, an error) does not count as complete.
    pub async fn collect_files(&self) -> super::files::Report {
        let latest = self.out_stamp.lock().unwrap().latest.take();
        if let Some(stamp) = &latest {
            let copied = self.out_stamp.lock().unwrap().copied.clone();
            if stamp == OUT_EMPTY || copied.as_ref() == Some(stamp) {
                return super::files::Report::default();
            }
        }
        let report = super::files::collect(
            &self.docker,
            &self.container_id,
            Arc::clone(&self.files),
            &self.name,
            self.file_caps,
        )
        .await;
        self.out_stamp.lock().unwrap().copied = if report.notices.is_empty() {
            latest
        } else {
            None
        };
        report
    }

    /// Run code once the session is free: one exec at a time, the others wait in line (the
    /// frame receiver's lock, first come first served). Never fails: every way an exec can end
    /// is an [`ExecOutcome`]. `None` when the call was cancelled before its turn: it left the
    /// line (or never sent its code), nothing ran, and the session and its state are untouched
    /// (cancelling calls queued behind a running one had reset the session).
    pub async fn exec(&self, req: ExecRequest) -> Option<ExecOutcome> {
        let mut frames = tokio::select! {
            // A call cancelled in the line leaves it: the lock's future is dropped.
            biased;
            _ = req.cancel.cancelled() => return None,
            f = self.frames.lock() => f,
        };
        if req.cancel.is_cancelled() {
            return None;
        }
        let started = Instant::now();
        *self.last_used.lock().unwrap() = started;
        let id = self.next_exec.fetch_add(1, Ordering::Relaxed);
        let mut run = ExecRun {
            id,
            started,
            out: Collector::new(req.output_cap),
            notices: Vec::new(),
            rpc_slots: Arc::new(Semaphore::new(MAX_CONCURRENT_RPCS)),
            pending: Arc::new(AtomicU64::new(0)),
            pending_bytes: Arc::new(AtomicU64::new(0)),
            images_dropped: (0, String::new()),
            rpcs: tokio::task::JoinSet::new(),
            interrupted: None,
            interrupts_sent: 0,
        };
        self.current.store(id, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + req.timeout;
        // A sandbox that stopped reading its stdin fills the pipe: this send, like every other
        // await on the sandbox, ends at the call's deadline or cancellation.
        // Biased: code the writer takes at once is sent even when a cancellation came at the
        // same moment (the exec loop interrupts it). A cancellation while the writer is full
        // sends nothing (a dropped send leaves nothing in the channel): the call never started.
        let line = self.exec_line(id, &req);
        let sent = tokio::select! {
            biased;
            r = self.writer.send(line) => r.is_ok(),
            _ = req.cancel.cancelled() => {
                self.current.store(0, Ordering::SeqCst);
                // The metadata did not reach the runtime: the next exec sends it again.
                self.catalog_sent.lock().unwrap().clear();
                return None;
            }
            _ = tokio::time::sleep_until(deadline) => false,
        };
        // The session's start notices go to the first call that ran.
        run.notices = std::mem::take(&mut *self.start_notices.lock().unwrap());
        if !sent {
            self.current.store(0, Ordering::SeqCst);
            if !self.is_dead() {
                run.notices.push("the sandbox stopped reading its input, so the code could not be sent; its sandbox was killed. The session was reset: variables and imports are gone; the next call starts fresh.".into());
                self.destroy().await;
                let mut o = run.out.finish(Outcome::Crashed, started, run.notices);
                o.session_reset = true;
                return Some(o);
            }
            return Some(self.crashed(run.out, started, run.notices).await);
        }
        let result = loop {
            tokio::select! {
                frame = frames.recv() => {
                    let Some(q) = frame else { break None };
                    if let Some(end) = self.on_frame(&mut run, &req, q) {
                        break Some(end);
                    }
                }
                _ = tokio::time::sleep_until(run.wake(deadline)) => {
                    if let Some(killed) = self.on_wake(&mut run, &req).await {
                        return Some(killed);
                    }
                }
                _ = req.cancel.cancelled(), if run.interrupted.is_none() => {
                    self.interrupt(&mut run, Outcome::Cancelled);
                }
            }
        };
        self.current.store(0, Ordering::SeqCst);
        run.rpcs.abort_all();
        if run.interrupts_sent > 0 {
            tracing::debug!(session = %self.name, exec = id, interrupts = run.interrupts_sent, "the code stopped after its interrupt");
        }
        *self.last_used.lock().unwrap() = Instant::now();
        Some(match result {
            Some(end) => self.finish(run, &req, end),
            None => {
                self.dead.store(true, Ordering::Relaxed);
                self.crashed(run.out, started, run.notices).await
            }
        })
    }

    /// The `exec` line for `req`, leaving out the server metadata when it is the same as the
    /// last this session sent (compared as bytes), so warm calls stay small.
    fn exec_line(&self, id: u64, req: &ExecRequest) -> Vec<u8> {
        let catalog = serde_json::to_vec(&(&req.binding.servers, &req.binding.discovered))
            .expect("server metadata always serializes");
        let unchanged = *self.catalog_sent.lock().unwrap() == catalog;
        let line = HostFrame::Exec {
            id,
            code: &req.code,
            servers: (!unchanged).then_some(&req.binding.servers[..]),
            discovered: (!unchanged).then_some(&req.binding.discovered[..]),
            output_cap: req.output_cap,
            skills: req.binding.skills,
        }
        .to_line();
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
        line
    }

    /// One frame from the sandbox during an exec; `Some` when it is the exec's result.
    fn on_frame(&self, run: &mut ExecRun, req: &ExecRequest, q: Queued) -> Option<ExecEnd> {
        let id = run.id;
        let len = q.len as u64;
        match q.frame {
            SandboxFrame::Output {
                id: fid,
                stream,
                data,
            } if fid == id => {
                if let Some(sink) = &req.on_output {
                    sink(stream, &data);
                }
                run.out.push(stream, &data);
            }
            SandboxFrame::Display {
                id: fid,
                mime,
                data,
            } if fid == id => match check_image(&mime, &data) {
                _ if mime == "text/plain" => {
                    // display() of something that is not an image: shown as text, in order.
                    run.out.push(Stream::Stdout, &data);
                    if !data.ends_with('\n') {
                        run.out.push(Stream::Stdout, "\n");
                    }
                }
                Ok(()) if run.out.images.len() >= MAX_IMAGES => {
                    run.drop_image(format!("at most {MAX_IMAGES} images are returned per call"))
                }
                Ok(())
                    if run.out.images.iter().map(|(_, d)| d.len()).sum::<usize>() + data.len()
                        > MAX_IMAGES_TOTAL =>
                {
                    run.drop_image(format!(
                        "the images of one call may total {} MiB of base64 (split them over calls, or save smaller ones)",
                        MAX_IMAGES_TOTAL >> 20
                    ))
                }
                Ok(()) => run.out.images.push((mime, data)),
                Err(why) => run.drop_image(why),
            },
            SandboxFrame::Rpc {
                id: rid,
                exec,
                method,
                params,
            } => {
                if exec != id {
                    self.refuse(rid, "this call was made after its run_python call ended; await every tool call before the code finishes".into(), &run.pending);
                } else if run.pending.load(Ordering::Relaxed) as usize >= MAX_PENDING_RPCS {
                    self.refuse(rid, format!("too many tool calls in flight (limit {MAX_PENDING_RPCS}); await some before starting more"), &run.pending);
                } else if run.pending_bytes.load(Ordering::Relaxed) + len > MAX_PENDING_RPC_BYTES {
                    self.refuse(rid, format!("too many bytes of tool-call arguments in flight (limit {} MiB); await some calls before starting more", MAX_PENDING_RPC_BYTES >> 20), &run.pending);
                } else {
                    run.pending.fetch_add(1, Ordering::Relaxed);
                    run.pending_bytes.fetch_add(len, Ordering::Relaxed);
                    let rpc = req.binding.rpc.clone();
                    let slots = run.rpc_slots.clone();
                    let writer = self.writer.clone();
                    let pending = run.pending.clone();
                    let pending_bytes = run.pending_bytes.clone();
                    run.rpcs.spawn(async move {
                        let _permit = slots.acquire_owned().await;
                        let answer = rpc.answer(&method, params).await;
                        pending_bytes.fetch_sub(len, Ordering::Relaxed);
                        let _ = writer.send(rpc_line(rid, answer)).await;
                        pending.fetch_sub(1, Ordering::Relaxed);
                    });
                }
            }
            SandboxFrame::Result {
                id: fid,
                status,
                value,
                error,
                truncated,
                out,
            } if fid == id => {
                return Some(ExecEnd {
                    status,
                    value,
                    error,
                    truncated,
                    out,
                });
            }
            // The reader lets through only this exec's frames; a log frame never reaches here.
            _ => {}
        }
        None
    }

    /// Send the exec an interrupt (the first, or the second when the first went unanswered).
    fn interrupt(&self, run: &mut ExecRun, why: Outcome) {
        self.send_detached(HostFrame::Interrupt { id: run.id }.to_line());
        run.interrupts_sent += 1;
        if run.interrupted.is_none() {
            run.interrupted = Some((why, tokio::time::Instant::now()));
        }
    }

    /// The exec's timer fired: the deadline (interrupt), the resend time (interrupt again), or
    /// the end of the grace period (kill the container: `Some` outcome, the session is reset).
    async fn on_wake(&self, run: &mut ExecRun, req: &ExecRequest) -> Option<ExecOutcome> {
        match run.interrupted {
            None => self.interrupt(run, Outcome::Timeout),
            Some((why, _)) if run.interrupts_sent < 2 => {
                tracing::debug!(session = %self.name, exec = run.id, "no answer to the interrupt after {}s; sending it again", INTERRUPT_RESEND.as_secs());
                self.interrupt(run, why);
            }
            Some((why, _)) => {
                // The code ignored KeyboardInterrupt: kill the container.
                tracing::debug!(session = %self.name, exec = run.id, interrupts = run.interrupts_sent, "the code ignored its interrupts; killing the sandbox");
                self.current.store(0, Ordering::SeqCst);
                run.rpcs.abort_all();
                self.destroy().await;
                let what = match why {
                    Outcome::Cancelled => "the call was cancelled".to_string(),
                    _ => format!("the time limit of {} expired", secs(req.timeout)),
                };
                run.image_notice();
                let mut notices = std::mem::take(&mut run.notices);
                notices.push(format!(
                    "{what}, and the code did not stop within {}s of KeyboardInterrupt, so its sandbox was killed. The session was reset: variables and imports are gone; the next call starts fresh.",
                    INTERRUPT_GRACE.as_secs()
                ));
                let out = std::mem::replace(&mut run.out, Collector::new(0));
                let mut o = out.finish(why, run.started, notices);
                o.session_reset = true;
                return Some(o);
            }
        }
        None
    }

    /// The outcome of an exec that sent its result.
    fn finish(&self, mut run: ExecRun, req: &ExecRequest, end: ExecEnd) -> ExecOutcome {
        run.image_notice();
        let ExecRun {
            mut out,
            mut notices,
            interrupted,
            started,
            ..
        } = run;
        let ExecEnd {
            status,
            value,
            error,
            truncated,
            out: stamp,
        } = end;
        self.out_stamp.lock().unwrap().latest = stamp.filter(|s| s.len() <= OUT_STAMP_MAX);
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
            let _ = writer.send(rpc_line(id, Err(message.into()))).await;
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
        let inspect = self.docker.inspect_container(&self.container_id, None);
        let state = tokio::time::timeout(Duration::from_secs(10), inspect)
            .await
            .ok()
            .and_then(Result::ok)
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

fn secs(d: Duration) -> String {
    crate::config::Secs(d).to_string()
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

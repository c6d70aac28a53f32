//! One live interpreter in one container: start it, run code in it, interrupt or kill it.
//!
//! Frames arrive through a reader task that splits the attach stream into lines, refuses oversize
//! ones and decodes the rest; frames leave through a writer task that owns the container's stdin.
//! An exec holds the session's frame receiver for its whole duration, so execs on one session run
//! one at a time, and frames that name another exec id are dropped.

use bridge_core::identity::SessionKey;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;

use bollard::Docker;
use bollard::query_parameters::{AttachContainerOptionsBuilder, CreateContainerOptionsBuilder};
use tokio::sync::{Mutex, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

mod exec;
mod keep;
mod snap;

use super::attach::AttachError;
use super::channel::{Channel, Queued, rpc_line};
use super::compiled::{BootLine, Compiled};
use super::container::{self, Role};
use super::error::SandboxError;
use super::images::{MAX_IMAGES, MAX_IMAGES_TOTAL, check_image};
use super::output::{Collector, ExecOutcome, Outcome, OutputSink, limit_hint};
use crate::snapshots::{Info, LostName};
use bridge_core::config::Config;
use bridge_core::protocol::{
    ExecBinding, ExecError, ExecStatus, HostFrame, Interpreter, Provision, SandboxFrame, Stream,
};

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
/// What a start waits for before it boots the runtime (see [`Session::start`]).
pub type Gate<'a> = futures::future::BoxFuture<'a, Result<(), SandboxError>>;

/// `r`; but when it failed and the gate has not been awaited yet, the gate's failure first: a
/// start that failed because of a limit the host cannot enforce is reported as that.
async fn gate_first<T>(
    gate: &mut Option<Gate<'_>>,
    r: Result<T, SandboxError>,
) -> Result<T, SandboxError> {
    if r.is_err()
        && let Some(g) = gate.take()
    {
        g.await?;
    }
    r
}

/// Why a snapshot was not written: the runtime's refusal (with what it said of the state: its
/// largest values) or a failure of the sandbox or the disk.
#[derive(Debug)]
pub struct SnapFailed {
    /// Why, for the model and the log.
    pub why: String,
    /// What the runtime said of the state (its largest values), if it said.
    pub info: Box<Info>,
}

impl SnapFailed {
    fn new(why: impl Into<String>) -> SnapFailed {
        SnapFailed {
            why: why.into(),
            info: Box::default(),
        }
    }

    /// The notice: why, and the largest values when the runtime named them.
    pub fn notice(&self) -> String {
        if self.info.largest.is_empty() {
            return self.why.clone();
        }
        let largest: Vec<String> = self
            .info
            .largest
            .iter()
            .map(|(name, size)| format!("{} ({size} bytes)", bridge_core::text::visible(name)))
            .collect();
        format!("{}; the largest values: {}", self.why, largest.join(", "))
    }
}

/// What a restore brought back, as the runtime said.
#[derive(Debug, Default, Clone)]
pub struct Restored {
    /// Names brought back.
    pub names: usize,
    /// Names that could not be, and why.
    pub lost: Vec<LostName>,
    /// Modules that could not be imported again.
    pub modules: Vec<String>,
}

/// What a caller asks of one exec.
pub struct ExecRequest {
    /// The code to run.
    pub code: String,
    /// How long it may run.
    pub timeout: Duration,
    /// The configured ceiling of `timeout`, quoted when a call runs out of time.
    pub max_timeout: Duration,
    /// The most bytes of output kept (`output_cap`).
    pub output_cap: usize,
    /// The servers the code may call, and their handler.
    pub binding: ExecBinding,
    /// Cancelled when the client gives up on the call: the code is interrupted.
    pub cancel: CancellationToken,
    /// Where output goes as it comes (progress notifications), if anywhere.
    pub on_output: Option<OutputSink>,
    /// Parts too long for the result are kept as files (`None`: everything is returned, as
    /// `exec` on the command line does).
    pub spill: Option<super::output::Spill>,
}

/// One container and its interpreter: started, handed to one session, destroyed.
pub struct Session {
    /// The session it serves, as logs and the engine's container name show it (its key, or
    /// `pool-<serial>` while pooled).
    pub name: String,
    /// The container's id.
    pub container_id: String,
    /// Its interpreter's version.
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
    /// `/workspace/out` is copied through the runtime's channel, not the engine's archive API:
    /// under gVisor, whose tmpfs the engine cannot read (`Session::collect_through_channel`).
    files_through_channel: bool,
    /// What the session's start has to say (inputs not copied, and why): the first call's notices.
    start_notices: std::sync::Mutex<Vec<String>>,
    /// The interpreter as RPC handlers are told of it: its id, its package directory (removed
    /// with it) and what it said of itself at boot.
    pub interpreter: Interpreter,
    /// A pooled sandbox attached through `sandbox::attach`: its attach connection, for
    /// `sandbox::park` to hand to a keeper when the bridge exits.
    park_fd: std::sync::Mutex<Option<std::os::fd::OwnedFd>>,
    /// The state dir, where snapshots of it are written (`sandbox::snapshots`), and
    /// `snapshot_max_size` (0: none).
    state_dir: std::path::PathBuf,
    snapshot_limit: Option<u64>,
    /// The snapshot the last `runtime.fork()` sent, until its `fork` call takes it.
    forked: std::sync::Mutex<Option<Result<crate::snapshots::Received, crate::snapshots::Failed>>>,
    /// Whether code of a call ran in it: only such a session is worth a snapshot.
    ran_code: AtomicBool,
    /// What follows its engine-side name: the adopter's mark on a sandbox adopted from a bridge
    /// that is gone (`container::adopted_name`), kept when a session takes it.
    name_suffix: String,
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
    ///
    /// `gate`, when given, is awaited before the session is handed out: the engine's checks
    /// (what it can enforce, the image) run while the container is created, started and the
    /// runtime (the bridge's own code) boots, and a sandbox they refuse is removed before any
    /// code of the user's reaches it. A create that fails before the gate passed (the image
    /// still loading) is tried once more after it.
    ///
    /// The boot frame comes from `boot`, with the runtime's compiled code when it holds some;
    /// a sandbox that exits at its start with that code has it dropped and is started once
    /// more, compiling (the code is the bridge's own, kept in the state dir: a damaged file
    /// costs one start, never the call).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn start(
        engine: &crate::engine::Engine,
        config: &Config,
        boot: &Compiled,
        role: Role<'_>,
        owner: &str,
        serial: u64,
        provision: Option<&Arc<dyn Provision>>,
        park_via: Option<&std::path::Path>,
        mut gate: Option<Gate<'_>>,
    ) -> Result<Session, SandboxError> {
        let mut retried = false;
        let ids = engine.host_ids(config);
        loop {
            let line = boot.boot_line().await;
            let started = Self::start_once(
                &engine.docker,
                config,
                ids,
                boot,
                &line,
                role,
                owner,
                serial,
                provision,
                park_via,
                gate.take(),
            )
            .await;
            match started {
                // Exited at start: the gate (the engine's checks) was awaited and passed
                // before this error was given (`gate_first`), so the next try needs none.
                Err(e @ SandboxError::ExitedAtStart { .. }) if line.carries_code && !retried => {
                    tracing::warn!(
                        "a sandbox given the runtime's kept compiled code did not start ({e}); dropping that code and starting again"
                    );
                    boot.forget().await;
                    retried = true;
                }
                Err(e @ SandboxError::NotReady(_)) if line.carries_code => {
                    boot.forget().await;
                    return Err(e);
                }
                other => return other,
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_once(
        docker: &Docker,
        config: &Config,
        ids: &crate::engine::HostIds,
        boot: &Compiled,
        line: &BootLine,
        role: Role<'_>,
        owner: &str,
        serial: u64,
        provision: Option<&Arc<dyn Provision>>,
        park_via: Option<&std::path::Path>,
        mut gate: Option<Gate<'_>>,
    ) -> Result<Session, SandboxError> {
        let t0 = Instant::now();
        let mut body = container::spec(config, ids, role, owner);
        let cname = container::container_name(role, serial);
        let packages = crate::pkgdir::record(config, &cname);
        let mounted = match crate::pkgdir::make(config, &packages) {
            Ok(dir) => dir,
            Err(e) => {
                return Err(SandboxError::Create {
                    image: config.image.clone(),
                    reason: format!(
                        "could not make the package directory {}: {e}",
                        packages.display()
                    ),
                });
            }
        };
        container::mount_packages(&mut body, &mounted);
        let name = match role {
            Role::Session(name) => name.to_string(),
            Role::Pool => format!("pool-{serial}"),
        };
        let opts = CreateContainerOptionsBuilder::default()
            .name(&cname)
            .build();
        let mut created = docker
            .create_container(Some(opts.clone()), body.clone())
            .await;
        if created.is_err()
            && let Some(g) = gate.take()
        {
            if let Err(e) = g.await {
                crate::pkgdir::remove(&packages);
                return Err(e);
            }
            created = docker.create_container(Some(opts), body).await;
        }
        let created = match created {
            Ok(c) => c,
            Err(e) => {
                crate::pkgdir::remove(&packages);
                return Err(SandboxError::Create {
                    image: config.image.clone(),
                    reason: e.to_string(),
                });
            }
        };
        let id = created.id;
        tracing::debug!(session = %bridge_core::text::visible(&name), ms = t0.elapsed().as_millis() as u64, "container created");
        match Self::attach_and_boot(
            docker,
            config,
            boot,
            line,
            &name,
            &id,
            t0,
            packages.clone(),
            park_via,
            gate,
        )
        .await
        {
            Ok(s) => {
                if let Some(p) = provision {
                    let notices = p.provision(&s.interpreter).await;
                    s.start_notices.lock().unwrap().extend(notices);
                }
                Ok(s)
            }
            Err(e) => {
                container::remove(docker, &id).await;
                crate::pkgdir::remove(&packages);
                Err(e)
            }
        }
    }

    /// Give a pooled sandbox to session `name`. The engine-side name follows in the background
    /// (only `doctor` reads it), so the call that takes it does not wait for the rename.
    pub fn hand_to(&mut self, name: &str, serial: u64) {
        tracing::info!(session = name, container = %short(&self.container_id), pooled = %bridge_core::text::visible(&self.name), "a pooled sandbox serves the session");
        self.name = name.to_string();
        let docker = self.docker.clone();
        let id = self.container_id.clone();
        let new_name = format!(
            "{}{}",
            container::container_name(Role::Session(name), serial),
            self.name_suffix
        );
        tokio::spawn(async move {
            if let Err(e) = container::rename(&docker, &id, &new_name).await {
                tracing::debug!(container = %short(&id), "could not rename a pooled container for its session: {e}");
            }
        });
    }

    #[allow(clippy::too_many_arguments)]
    async fn attach_and_boot(
        docker: &Docker,
        config: &Config,
        boot: &Compiled,
        line: &BootLine,
        name: &str,
        id: &str,
        t0: Instant,
        packages: std::path::PathBuf,
        park_via: Option<&std::path::Path>,
        mut gate: Option<Gate<'_>>,
    ) -> Result<Session, SandboxError> {
        let (output, input, park_fd) = match park_via {
            Some(socket) => {
                let attached = super::attach::attach(socket, id)
                    .await
                    .map_err(SandboxError::Attach);
                let (o, i, fd) = gate_first(&mut gate, attached).await?;
                (o, i, Some(fd))
            }
            None => {
                let opts = AttachContainerOptionsBuilder::default()
                    .stdin(true)
                    .stdout(true)
                    .stderr(true)
                    .stream(true)
                    .build();
                let attached = docker
                    .attach_container(id, Some(opts))
                    .await
                    .map_err(|e| SandboxError::Attach(AttachError::Engine(e)));
                let attached = gate_first(&mut gate, attached).await?;
                (attached.output, attached.input, None)
            }
        };
        tracing::debug!(
            session = name,
            ms = t0.elapsed().as_millis() as u64,
            "container attached"
        );
        let started = docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| SandboxError::Start(e.to_string()));
        gate_first(&mut gate, started).await?;
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
        } = Channel::open(output, input, name, false);

        let _ = writer.send(line.line.to_vec()).await;
        let (python, kernel, target, compiled) = match tokio::time::timeout(START_TIMEOUT, async {
            loop {
                match frame_rx.recv().await.map(|q| q.frame) {
                    // Let through only as the sandbox's first line (`channel`).
                    Some(SandboxFrame::Code(code)) => boot.offer(code).await,
                    Some(SandboxFrame::Ready {
                        python,
                        kernel,
                        target,
                        compiled,
                    }) => return Some((python, kernel, target, compiled)),
                    Some(_) => continue,
                    None => return None,
                }
            }
        })
        .await
        {
            Ok(Some(p)) => p,
            Ok(None) => {
                let exited = Err(SandboxError::ExitedAtStart {
                    image: config.image.clone(),
                    stderr: stderr_tail.lock().unwrap().iter().cloned().collect(),
                });
                return gate_first(&mut gate, exited).await;
            }
            Err(_) => return Err(SandboxError::NotReady(START_TIMEOUT.as_secs())),
        };
        // The proof of the isolation asked for, sandbox by sandbox: the kernel the runtime saw
        // at boot, before any code of the user's ran, is gVisor's (the caller removes the
        // container otherwise).
        if config.isolation == bridge_core::config::Isolation::Gvisor
            && let Err(why) = super::kernel::gvisor(kernel.as_ref(), &super::kernel::host())
        {
            return Err(SandboxError::NotGvisor {
                runtime: config.gvisor_runtime.clone(),
                why: why.to_string(),
            });
        }
        // The runtime (the bridge's own code) booted meanwhile; the user's code comes only after.
        if let Some(g) = gate {
            g.await?;
        }
        tracing::info!(session = name, container = %short(id), %python, kernel = %super::kernel::describe(kernel.as_ref()), runtime_code = if compiled { "compiled" } else { "kept" }, ms = t0.elapsed().as_millis() as u64, "sandbox ready");
        let start_notices = super::inputs::copy_in(docker, id, config).await;
        let channel = Channel {
            writer,
            frames: frame_rx,
            current,
            dead,
            stderr_tail,
        };
        let mut s = Self::assemble(docker, config, name, id, channel, python, target, packages);
        s.start_notices = std::sync::Mutex::new(start_notices);
        s.park_fd = std::sync::Mutex::new(park_fd);
        Ok(s)
    }

    /// A sandbox a bridge that is gone parked (`sandbox::park`), on its attach connection
    /// `fd`: it booted and said `ready` then, so its channel starts past the boot. `name` is the
    /// engine-side name it was given (with [`container::adopted_name`]'s mark), `packages` its
    /// package directory, renamed for this bridge.
    pub fn adopt(
        docker: &Docker,
        config: &Config,
        meta: &super::park::Meta,
        fd: std::os::fd::OwnedFd,
        name: &str,
        suffix: &str,
        packages: std::path::PathBuf,
    ) -> Result<Session, SandboxError> {
        // A copy for this bridge to park it again when it exits (`sandbox::parking`).
        let again = fd.try_clone().ok();
        let (output, input) = super::attach::from_fd(fd)
            .map_err(|e| SandboxError::Attach(AttachError::HandedOver(e)))?;
        let channel = Channel::open(output, input, name, true);
        let mut s = Self::assemble(
            docker,
            config,
            name,
            &meta.container_id,
            channel,
            meta.python.clone(),
            meta.target.clone(),
            packages,
        );
        s.name_suffix = suffix.to_string();
        s.park_fd = std::sync::Mutex::new(again);
        // Past every id a bridge before this one gave it (those count from 1 up, one a call).
        s.next_exec = AtomicU64::new(bridge_core::clock::now_secs().saturating_mul(1000));
        Ok(s)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        docker: &Docker,
        config: &Config,
        name: &str,
        id: &str,
        channel: Channel,
        python: String,
        target: Option<bridge_core::protocol::Target>,
        packages: std::path::PathBuf,
    ) -> Session {
        let Channel {
            writer,
            frames: frame_rx,
            current,
            dead,
            stderr_tail,
        } = channel;
        Session {
            start_notices: std::sync::Mutex::new(Vec::new()),
            park_fd: std::sync::Mutex::new(None),
            state_dir: config.state_dir.clone(),
            snapshot_limit: Some(config.snapshot_max_size.0).filter(|l| *l > 0),
            forked: std::sync::Mutex::new(None),
            ran_code: AtomicBool::new(false),
            name_suffix: String::new(),
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
            files_through_channel: config.isolation == bridge_core::config::Isolation::Gvisor,
            interpreter: Interpreter {
                id: id.to_string(),
                packages: Some(packages),
                target,
            },
        }
    }

    /// The attach connection of a pooled sandbox that may be parked (taken once).
    pub fn take_park_fd(&self) -> Option<std::os::fd::OwnedFd> {
        self.park_fd.lock().unwrap().take()
    }

    /// Whether code of a call ran in it (its state may be worth a snapshot).
    pub fn ran_code(&self) -> bool {
        self.ran_code.load(Ordering::Relaxed)
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

    /// How long since its last call ended.
    pub fn idle_for(&self) -> Duration {
        self.last_used.lock().unwrap().elapsed()
    }

    /// Kill and remove the container.
    pub(crate) async fn destroy(&self) {
        self.dead.store(true, Ordering::Relaxed);
        container::remove(&self.docker, &self.container_id).await;
        self.files.clear();
        if let Some(dir) = self.interpreter.packages.clone() {
            let _ = tokio::task::spawn_blocking(move || crate::pkgdir::remove(&dir)).await;
        }
    }

    /// Whether what the last exec left in `/workspace/out` is to be copied: not when the
    /// runtime's digest of it says it is empty or as it was at the last complete copy (a copy is
    /// a request to the engine, or a tar through the channel, many times a warm call's cost, and
    /// most calls write nothing). An exec without a digest (it crashed, or the runtime could not
    /// tell) is always copied. `Some` holds the digest the copy is made at.
    fn wanted_copy(&self) -> Option<Option<String>> {
        let mut stamp = self.out_stamp.lock().unwrap();
        let latest = stamp.latest.take();
        if let Some(l) = &latest
            && (l == OUT_EMPTY || stamp.copied.as_ref() == Some(l))
        {
            return None;
        }
        Some(latest)
    }

    /// Record a copy made at digest `latest`: a copy with a notice (a cap, an error) does not
    /// count as complete.
    fn copied(&self, latest: Option<String>, report: &super::files::Report) {
        self.out_stamp.lock().unwrap().copied = if report.notices.is_empty() {
            latest
        } else {
            None
        };
    }

    /// Copy what the last exec left in `/workspace/out` (see `sandbox::files`) through the
    /// engine's archive API, when [`Self::wanted_copy`] says so. Under gVisor the exec itself
    /// copied it, through the channel, before it let go of the session
    /// (`Session::collect_through_channel`): nothing is left to do here.
    pub(crate) async fn collect_files(&self, session: &SessionKey) -> super::files::Report {
        if self.files_through_channel {
            return super::files::Report::default();
        }
        let Some(latest) = self.wanted_copy() else {
            return super::files::Report::default();
        };
        let report = super::files::collect(
            &self.docker,
            &self.container_id,
            Arc::clone(&self.files),
            session.name(),
            self.file_caps,
        )
        .await;
        self.copied(latest, &report);
        report
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

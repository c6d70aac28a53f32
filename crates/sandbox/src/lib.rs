//! The sandbox: the engine (connected by the warm-up after `initialize`, or at the first call),
//! the image made present once, named sessions (one container each) that live until reset, idle
//! timeout or shutdown, and a pool of ready containers a new session takes at once.
//!
//! [`Sandbox`] is a façade over parts that each own their state, each below the next:
//! `readiness` (the engine, the image, what the engine enforces, what makes a sandbox), `pool`
//! (ready sandboxes), `parking` (sandboxes and sessions handed to the next bridge), `carry`
//! (sessions' snapshots), and `table` (the sessions: found, started, restored, closed, reaped;
//! its invariant bounds every container this process creates). A part asks the parts below it
//! and never the one above; `fork` answers `runtime.fork()` over the table and `carry`.

// The layers below are called by their own names (`bridge_core::config::…`); `crate::` is this crate.
use bridge_core::boxed::Boxed;

mod attach;
mod carry;
mod channel;
mod compiled;
pub mod container;
pub mod engine;
mod error;
mod fdpass;
pub mod files;
mod fork;
pub mod image;
mod images;
pub mod inputs;
mod keeperdir;
pub mod kernel;
mod name;
mod output;
pub mod park;
pub mod parked;
mod parking;
pub mod pkgdir;
mod pool;
mod readiness;
mod runtime;
pub mod session;
pub mod snapshots;
mod table;

use std::sync::Arc;
use std::time::Duration;

use bridge_core::trace::Within as _;

use bridge_core::config::Config;
use bridge_core::identity::SessionKey;
use carry::Carry;
use engine::Engine;
pub use error::SandboxError;
pub use name::{BadSessionName, check_session_name};
pub use output::{ExecOutcome, Fit, Kept, NotKept, Outcome, OutputSink, Part, Spill};
use parking::Parking;
use pool::Pool;
pub use pool::starts_at_once;
pub use readiness::LoadProgress;
use readiness::Readiness;
pub use session::{Claim, ExecRequest, Session};
pub use table::Start;
use table::Table;

/// The session used when a call names none: one per client, and a stdio bridge has one client.
pub use bridge_core::identity::DEFAULT_SESSION;

/// A kept file and its bytes ([`Sandbox::read_file`]).
pub type FileBytes = (files::OutFile, Vec<u8>);

/// The notice of a call cancelled while it waited for its session's running call.
const NOT_STARTED: &str = "the call was cancelled before its code started (it was waiting for the session's running call): nothing ran, and the session and its variables are untouched.";

/// The sandbox of a bridge: its parts, composed (see the crate's text).
pub struct Sandbox {
    config: Arc<Config>,
    ready: Arc<Readiness>,
    pool: Arc<Pool>,
    parking: Arc<Parking>,
    carry: Arc<Carry>,
    table: Arc<Table>,
}

impl Sandbox {
    /// A sandbox for `config`, nothing started: the engine is connected by the warm-up or the
    /// first call. Idle sessions and strays are reaped in the background from now on.
    pub fn new(config: Arc<Config>) -> Arc<Self> {
        let sb = Arc::new_cyclic(|this: &std::sync::Weak<Sandbox>| {
            // A kept answer of the engine's, due to be checked again, is checked by the
            // sandbox: its sessions close if it no longer holds.
            let weak = this.clone();
            let recheck: readiness::Recheck = Arc::new(move || {
                let weak = weak.clone();
                Box::pin(async move {
                    if let Some(sb) = weak.upgrade() {
                        sb.check_kept(false).await;
                    }
                })
            });
            let ready = Arc::new(Readiness::new(Arc::clone(&config), recheck));
            let pool = Arc::new(Pool::new());
            let parking = Arc::new(Parking::new(
                Arc::clone(&config),
                Arc::clone(&ready),
                Arc::clone(&pool),
            ));
            let carry = Arc::new(Carry::new(Arc::clone(&config), Arc::clone(&parking)));
            let table = Arc::new(Table::new(
                Arc::clone(&config),
                Arc::clone(&ready),
                Arc::clone(&pool),
                Arc::clone(&parking),
                Arc::clone(&carry),
            ));
            Sandbox {
                config,
                ready,
                pool,
                parking,
                carry,
                table,
            }
        });
        // Two loops: idle sessions are closed on time even while the engine is slow to list
        // containers for the strays' sweep (a listing waits on every container's lock, other
        // tenants' included).
        let idle = sb.config.runtime_idle_timeout.0;
        let tick = (idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(15));
        let table = Arc::downgrade(&sb.table);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                let Some(table) = table.upgrade() else { return };
                table.reap_idle(idle).await;
            }
        });
        let table = Arc::downgrade(&sb.table);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                let Some(table) = table.upgrade() else { return };
                table.reap_strays(false).await;
            }
        });
        sb
    }

    /// The server is up (`run` calls it at process start, before `initialize`; again at
    /// `initialized`, which finds it done): keep a pool of ready sandboxes from now on and,
    /// with `warm_start`, connect the engine, make the image present and fill the pool in the
    /// background. Never waits and never fails: what goes wrong here is logged, and the first
    /// call meets it again and reports it.
    pub fn warm_up(&self) {
        if self.config.pool_size > 0 {
            self.pool.enable();
        }
        if !self.config.warm_start {
            return;
        }
        self.pool.touch();
        self.parking.adopt_parked();
        let table = Arc::clone(&self.table);
        tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            match table.prepare().await {
                Ok(_) => {
                    tracing::debug!(
                        ms = t0.elapsed().as_millis() as u64,
                        "warm-up: engine connected and image present"
                    );
                    // A call that came meanwhile (an agent that sent its code at once) starts
                    // its own sandbox now; the pool fills after it.
                    if table.pending() == 0 {
                        table.refill();
                    }
                }
                Err(e) => {
                    tracing::info!("warm-up did not finish; the first call will try again: {e}")
                }
            }
        });
    }

    /// Take the sandbox a bridge before this one parked on the same state dir, if a keeper
    /// holds one, as a pooled sandbox (`parking`). Never fails: one that cannot be taken is
    /// removed, and the call starts its own.
    pub fn adopt_parked(&self) {
        self.parking.adopt_parked();
    }

    /// Park its live sessions when it shuts down, and write their states when they close
    /// without a caller (`run`, `serve`: their clients come back; not `exec`).
    pub fn park_sessions_at_exit(&self) {
        self.parking.park_sessions_at_exit();
    }

    /// The engine, connected at first use. A failure is not cached: the next call tries again.
    #[inline(never)]
    pub fn engine(&self) -> Boxed<'_, Result<Arc<Engine>, SandboxError>> {
        Box::pin(self.ready.engine())
    }

    /// What the last sandbox to boot said of its interpreter; `None` before any booted.
    pub fn seen_target(&self) -> Option<bridge_core::protocol::Target> {
        self.ready.seen_target()
    }

    /// Run `p` on every new sandbox after its boot, before it serves a call.
    pub fn set_provision(&self, p: Arc<dyn bridge_core::protocol::Provision>) {
        self.ready.set_provision(p);
    }

    /// Report image-load progress to `f` instead of the log (a progress bar on a terminal).
    pub fn set_load_progress(&self, f: LoadProgress) {
        self.ready.set_load_progress(f);
    }

    /// The audit log the session-state records go to (`server` sets it).
    pub fn set_audit(&self, audit: bridge_core::audit::Audit) {
        self.carry.set_audit(audit);
    }

    /// Run a request in session `name`. Errors are for failures to get a sandbox at all.
    #[inline(never)]
    pub fn run<'a>(
        &'a self,
        name: &'a SessionKey,
        reset: bool,
        req: ExecRequest,
    ) -> Boxed<'a, Result<ExecOutcome, SandboxError>> {
        Box::pin(self.run_here(name, reset, req))
    }

    async fn run_here(
        &self,
        name: &SessionKey,
        reset: bool,
        req: ExecRequest,
    ) -> Result<ExecOutcome, SandboxError> {
        // The session's sandbox as a span of the call: found running, handed out of the pool,
        // started, resumed or restored, and how long that took.
        let span = bridge_core::trace::Guard::new(bridge_core::trace::internal("sandbox", vec![]));
        let got = self
            .table
            .session(name, reset, req.timeout)
            .within(span.context().clone())
            .await;
        let (session, start, mut notices) = match got {
            Ok(got) => {
                let how = match &got.1 {
                    Start::Running => "running",
                    Start::Fresh => "new",
                    Start::Resumed => "resumed",
                    Start::Restored { .. } => "restored",
                };
                bridge_core::trace::set(
                    span.context(),
                    vec![bridge_core::trace::Attr::new(
                        "mcp_code_bridge.sandbox.session",
                        how,
                    )],
                );
                span.end(None);
                got
            }
            Err(e) => {
                span.end(Some("SandboxUnavailable"));
                return Err(e);
            }
        };
        let fresh = start != Start::Running;
        let mut req = req;
        req.binding.rpc = fork::handler(
            &self.table,
            &self.carry,
            &self.config,
            name,
            &session,
            req.binding.rpc,
        );
        req.binding.rpc.on_interpreter(&session.interpreter);
        let cancel = req.cancel.clone();
        let Some(mut outcome) = session.exec(req, name).await else {
            // Cancelled in the line behind another call: nothing ran, nothing to copy out.
            drop(session);
            notices.push(NOT_STARTED.to_string());
            return Ok(output::not_started(notices));
        };
        if outcome.session_reset && cancel.is_cancelled() {
            // Its caller gave up on this reply: the next call of the session says it instead.
            self.table.note_lost(
                name,
                format!(
                    "a call that was cancelled reset it: {}",
                    outcome
                        .notices
                        .last()
                        .map(String::as_str)
                        .unwrap_or("its sandbox was killed")
                ),
            );
        }
        // Even after an error or a timeout: what the code wrote before it is there. Not from a
        // container that is gone (its files went with it). Under gVisor the exec copied them
        // already, through the channel, while it held the session (`collect_files` is a no-op).
        if !outcome.session_reset && !session.is_dead() {
            let report = session.collect_files(name).await;
            outcome.files.extend(report.new);
            outcome.notices.extend(report.notices);
            images::inline_images(&mut outcome, &session.files);
        }
        if outcome.session_reset {
            self.table.forget(name, &session).await;
        }
        drop(session);
        // After the call, not during it: a refill competes with the code for the CPU.
        self.table.refill();
        for n in notices.into_iter().rev() {
            outcome.notices.insert(0, n);
        }
        if fresh && let Some(n) = self.table.take_lost(name) {
            // A reset asked for needs no explanation; a restore has its own.
            if !reset && !matches!(start, Start::Restored { .. }) {
                outcome.notices.insert(0, n);
            }
        }
        match start {
            Start::Resumed => {
                outcome.notices.insert(0, parking::RESUMED.into());
                outcome.resumed = Some("live");
            }
            Start::Restored { lost } => {
                outcome.resumed = Some("snapshot");
                outcome.lost = lost;
            }
            Start::Running | Start::Fresh => {}
        }
        if fresh && reset {
            outcome
                .notices
                .insert(0, "started a fresh interpreter (reset)".into());
        }
        Ok(outcome)
    }

    /// Every kept file of the live sessions, as `(session, file)`.
    #[inline(never)]
    pub fn files(&self) -> Boxed<'_, Vec<(SessionKey, files::OutFile)>> {
        Box::pin(self.table.files())
    }

    /// The kept file `name` of session `session` and its bytes; `None` when there is none (the
    /// session was reset or closed, or never wrote it).
    #[inline(never)]
    pub fn read_file<'a>(
        &'a self,
        session: &'a SessionKey,
        name: &'a str,
    ) -> Boxed<'a, std::io::Result<Option<FileBytes>>> {
        Box::pin(self.read_file_here(session, name))
    }

    async fn read_file_here(
        &self,
        session: &SessionKey,
        name: &str,
    ) -> std::io::Result<Option<FileBytes>> {
        let Some(store) = self.table.file_store(session).await else {
            return Ok(None);
        };
        let name = name.to_string();
        tokio::task::spawn_blocking(move || store.read(&name))
            .await
            .map_err(std::io::Error::other)?
    }

    /// Ask the engine again what it can enforce, if a kept answer is in use unchecked; when
    /// that no longer lets the sandbox run, every call is refused from now on and every session
    /// and pooled sandbox is closed. `at_shutdown`: called by the shutdown, which stops the
    /// timer.
    async fn check_kept(&self, at_shutdown: bool) {
        if self.ready.check_kept(at_shutdown).await.is_some() {
            self.table.close_all().await;
        }
    }

    /// Remove every container (sessions and pool) and stop our podman service.
    #[inline(never)]
    pub fn shutdown(&self) -> Boxed<'_, ()> {
        Box::pin(self.shutdown_here())
    }

    async fn shutdown_here(&self) {
        // Before parking: a sandbox is parked only under an answer the engine confirmed.
        self.check_kept(true).await;
        self.parking.park_one().await;
        if !self.ready.is_revoked() {
            self.carry
                .snapshot_at_exit(self.table.idle_sessions().await)
                .await;
        }
        if self.parking.parks_sessions() {
            let idle = self.table.idle_sessions().await;
            for (key, s) in self.parking.park_sessions(idle).await {
                self.table.forget(&key, &s).await;
            }
        }
        self.table.close().await;
        self.ready.shutdown().await;
        let config = Arc::clone(&self.config);
        let _ = tokio::task::spawn_blocking(move || pkgdir::leave(&config)).await;
    }
}

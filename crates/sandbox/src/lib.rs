//! The sandbox: the engine (connected by the warm-up after `initialize`, or at the first call),
//! the image made present once, named sessions (one container each) that live until reset, idle
//! timeout or shutdown, and a pool of ready containers a new session takes at once.
//!
//! Invariant: every container this process creates is in `sessions`, in the pool (ready or being
//! started), held `busy` (being started for a session, restored, or closed), or being removed;
//! `shutdown` removes all of them, and the next bridge reaps any left by a killed one. Sessions,
//! pooled containers and those held `busy` stay within `max_sessions`.

// The layers below are called by their own names (`bridge_core::config::…`); `crate::` is this crate.
use bridge_core::boxed::Boxed;

mod adopt;
mod attach;
mod carry;
mod channel;
mod compiled;
pub mod container;
pub mod engine;
mod error;
mod fdpass;
pub mod files;
pub mod image;
mod images;
pub mod inputs;
mod keeperdir;
pub mod kernel;
mod output;
pub mod park;
pub mod parked;
pub mod pkgdir;
mod pool;
mod readiness;
mod resume;
mod runtime;
pub mod session;
pub mod snapshots;
mod start;
mod table;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{Mutex, OnceCell};

use bridge_core::trace::Within as _;

use bridge_core::config::Config;
use bridge_core::identity::{Identity, SessionKey};
use container::Role;
use engine::{Enforcement, Engine};
pub use error::SandboxError;
pub use output::{ExecOutcome, Fit, Kept, Outcome, OutputSink, Part, Spill};
use pool::Pool;
use readiness::{Failed, Unchecked};
pub use session::{Claim, ExecRequest, Session};
pub use start::starts_at_once;
pub use table::Start;
use table::{Busy, Lost};

/// The session used when a call names none: one per client, and a stdio bridge has one client.
pub use bridge_core::identity::DEFAULT_SESSION;

/// The rule of every session name, wherever it comes from (a call's `session`, a fork's name,
/// a listing read back from the store): 1 to 64 characters of letters, digits, '-', '_' or '.'.
/// So a name is never a path, never hides or reorders text, and every session that exists is
/// one a call can name. `Err` says the rule, with the name as it is (escaped, cut).
pub fn check_session_name(name: &str) -> Result<(), BadSessionName> {
    if !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Ok(());
    }
    let cut = &name[..bridge_core::text::floor_char_boundary(name, 80)];
    Err(BadSessionName {
        shown: bridge_core::text::visible(cut).into_owned(),
        bytes: (cut.len() < name.len()).then_some(name.len()),
    })
}

/// A session name outside the rule of [`check_session_name`]: the name as it is shown (escaped,
/// cut at 80 bytes) and, when cut, its whole length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the session name \"{shown}\"{} must be 1-64 characters of letters, digits, '-', '_' or '.'",
    .bytes.map(|n| format!(" ({n} bytes)")).unwrap_or_default()
)]
pub struct BadSessionName {
    /// The name as a log line or a listing shows it.
    pub shown: String,
    /// The name's length in bytes, when `shown` is cut.
    pub bytes: Option<usize>,
}

/// A session's key as a log line shows it: escaped as the CLI's listings are
/// (`bridge_core::text::visible`), so no identity or name rewrites the line it is in.
pub(crate) fn shown(key: &SessionKey) -> String {
    bridge_core::text::visible(&key.to_string()).into_owned()
}

/// The notice of a call cancelled while it waited for its session's running call.
const NOT_STARTED: &str = "the call was cancelled before its code started (it was waiting for the session's running call): nothing ran, and the session and its variables are untouched.";

pub struct Sandbox {
    config: Arc<Config>,
    engine: OnceCell<Arc<Engine>>,
    /// Serializes image preparation so concurrent first calls load the archive once.
    image_ready: OnceCell<()>,
    /// Failed attempts at either, shared with those that waited for them.
    engine_failed: Failed,
    image_failed: Failed,
    sessions: Mutex<HashMap<SessionKey, Arc<Session>>>,
    /// Held while the sessions are counted and changed: a new session is counted (`busy`, after
    /// room is made for it within `max_sessions`) or a pooled start reserved, sessions closed
    /// (to make room, idle), strays compared, a fork's target checked. Never while a container
    /// starts: that is bounded by `start_permits` instead.
    starting: Mutex<()>,
    /// Containers being started at once, sessions' and the pool's ([`starts_at_once`]).
    start_permits: tokio::sync::Semaphore,
    owner: String,
    serial: AtomicU64,
    /// Shows image-load progress (bytes so far); the log when unset.
    load_progress: std::sync::OnceLock<LoadProgress>,
    pool: Pool,
    /// Cancelled by [`Sandbox::shutdown`]: a pooled sandbox still booting is given up at once
    /// (under gVisor's ptrace platform a boot takes seconds) and swept with the rest.
    closing: tokio_util::sync::CancellationToken,
    lost: Lost,
    /// Calls between asking for their session and getting it: the warm-up does not start a
    /// pooled sandbox while one waits, since that call would either wait for it (its boot and
    /// preload) or start beside it on the same cores.
    pending: std::sync::atomic::AtomicUsize,
    /// Itself, for the background tasks it spawns (warm-up, refill).
    this: Weak<Sandbox>,
    /// What the last sandbox to boot said of its interpreter (the image's Python and
    /// distributions), for the capabilities resource.
    seen_target: std::sync::Mutex<Option<bridge_core::protocol::Target>>,
    /// What makes every new sandbox ready after its boot (`packages.preinstall`).
    provision: std::sync::OnceLock<Arc<dyn bridge_core::protocol::Provision>>,
    /// The containers this bridge parked as it shut down (`park`, `resume`): keepers hold them
    /// now, so the shutdown's sweep of this bridge's containers leaves them.
    parked: std::sync::Mutex<Vec<String>>,
    /// Whether its live sessions are parked when it shuts down (`run` and `serve`, whose clients
    /// come back; not `exec`, whose next call expects a fresh interpreter).
    parks_sessions: std::sync::atomic::AtomicBool,
    /// Whether [`Sandbox::adopt_parked`] ran (the warm-up runs twice).
    adopt_tried: std::sync::atomic::AtomicBool,
    /// Set when the engine, asked again after its kept answer was used (`engine::Kept`), can
    /// no longer enforce what this bridge needs: why, refused to every call from then on.
    revoked: std::sync::OnceLock<String>,
    /// A kept answer in use that the engine has not confirmed yet ([`Sandbox::check_kept`]).
    unchecked: std::sync::Mutex<Option<Unchecked>>,
    /// The boot frame every sandbox is sent, with the runtime's compiled code once a sandbox
    /// sent it (kept in the state dir for the next bridges).
    compiled: compiled::Compiled,
    /// Where the records of sessions' snapshots, restores and forks go (`carry`).
    audit: std::sync::OnceLock<bridge_core::audit::Audit>,
    /// Sessions out of the table while their state is written (closed idle) or restored: each
    /// still has its container, and a call naming one waits for it (`table::Busy`).
    busy: Busy,
}

/// A reporter of image-load progress: bytes streamed so far.
pub type LoadProgress = Arc<dyn Fn(u64) + Send + Sync>;

impl Sandbox {
    pub fn new(config: Arc<Config>) -> Arc<Self> {
        let compiled = compiled::Compiled::new(&config.state_dir, &config.image);
        let sb = Arc::new_cyclic(|this| Sandbox {
            config,
            compiled,
            engine: OnceCell::new(),
            image_ready: OnceCell::new(),
            engine_failed: Failed::default(),
            image_failed: Failed::default(),
            sessions: Mutex::new(HashMap::new()),
            starting: Mutex::new(()),
            start_permits: tokio::sync::Semaphore::new(starts_at_once()),
            owner: container::owner_id(),
            serial: AtomicU64::new(0),
            load_progress: std::sync::OnceLock::new(),
            provision: std::sync::OnceLock::new(),
            seen_target: std::sync::Mutex::new(None),
            pool: Pool::new(),
            closing: tokio_util::sync::CancellationToken::new(),
            lost: Lost::default(),
            pending: Default::default(),
            this: this.clone(),
            parked: std::sync::Mutex::new(Vec::new()),
            parks_sessions: Default::default(),
            adopt_tried: Default::default(),
            revoked: std::sync::OnceLock::new(),
            unchecked: std::sync::Mutex::new(None),
            audit: std::sync::OnceLock::new(),
            busy: Busy::default(),
        });
        let weak = Arc::downgrade(&sb);
        let idle = sb.config.runtime_idle_timeout.0;
        tokio::spawn(async move {
            let tick = (idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(15));
            loop {
                tokio::time::sleep(tick).await;
                let Some(sb) = weak.upgrade() else { return };
                sb.reap_idle(idle).await;
                sb.reap_strays(false).await;
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
            self.pool.enabled.store(true, Ordering::SeqCst);
        }
        if !self.config.warm_start {
            return;
        }
        self.pool.touch();
        self.adopt_parked();
        let Some(sb) = self.this.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            match sb.prepare().await {
                Ok(_) => {
                    tracing::debug!(
                        ms = t0.elapsed().as_millis() as u64,
                        "warm-up: engine connected and image present"
                    );
                    // A call that came meanwhile (an agent that sent its code at once) starts
                    // its own sandbox now; the pool fills after it.
                    if sb.pending.load(Ordering::SeqCst) == 0 {
                        sb.refill();
                    }
                }
                Err(e) => {
                    tracing::info!("warm-up did not finish; the first call will try again: {e}")
                }
            }
        });
    }

    /// Start pooled sandboxes in the background until the pool holds `pool_size`, within
    /// `max_sessions` with the live sessions. Not while the bridge is idle or shutting down.
    fn refill(&self) {
        if !self.pool.enabled.load(Ordering::SeqCst)
            || self.pool.closed.load(Ordering::SeqCst)
            || self.pool.idle_for() >= self.config.runtime_idle_timeout.0
            || self.engine.get().is_none()
            || !self.pool.begin_refill()
        {
            return;
        }
        let Some(sb) = self.this.upgrade() else {
            self.pool.end_refill();
            return;
        };
        tokio::spawn(async move {
            // Up to the starts at once; each fills until the pool holds its target.
            let fillers = (0..starts_at_once()).map(|_| async { while sb.fill_one().await {} });
            futures::future::join_all(fillers).await;
            sb.pool.end_refill();
        });
    }

    /// Start one pooled sandbox if there is room; false when there is none or it failed.
    async fn fill_one(&self) -> bool {
        let Ok(engine) = self.prepare().await else {
            return false;
        };
        // A start for a session comes first: the pool takes a free permit or none.
        let Ok(_permit) = self.start_permits.try_acquire() else {
            return false;
        };
        {
            let _starting = self.starting.lock().await;
            let live = self.live_sessions().await;
            if self.pool.closed.load(Ordering::SeqCst)
                || self.pool.idle_for() >= self.config.runtime_idle_timeout.0
                || self.pool.held() >= self.pool_target()
                || live + self.pool.held() + self.busy.len() >= self.config.max_sessions as usize
                || self.memory_short().is_some()
            {
                return false;
            }
            self.pool.reserve();
        }
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        // Attached on a connection of its own when it may be parked at exit (`park`).
        let socket = engine
            .unix_socket()
            .filter(|_| park::eligible(&self.config));
        let start = Session::start(
            &engine,
            &self.config,
            &self.compiled,
            Role::Pool,
            &self.owner,
            serial,
            self.provision.get(),
            socket.as_deref(),
            None,
        );
        // Given up when the bridge shuts down; the container it may have created is removed by
        // the shutdown's sweep of every container this bridge owns.
        let Some(started) = self.closing.run_until_cancelled(start).await else {
            self.pool.filled(None);
            return false;
        };
        match started {
            Ok(s)
                if self.pool.closed.load(Ordering::SeqCst)
                    || self.revoked.get().is_some()
                    || self.pool.idle_for() >= self.config.runtime_idle_timeout.0 =>
            {
                // Said as the reaper says it of a waiting one: a boot that outlasted the idle
                // timeout (seconds under gVisor's ptrace platform) ends the same way.
                if !self.pool.closed.load(Ordering::SeqCst) && self.revoked.get().is_none() {
                    tracing::info!(container = %s.container_id, "removing a pooled sandbox: no call for {}s", self.pool.idle_for().as_secs());
                }
                s.destroy().await;
                self.pool.filled(None);
                false
            }
            Ok(s) => {
                self.saw(&s);
                self.pool.filled(Some(s));
                true
            }
            Err(e) => {
                tracing::warn!("could not start a sandbox for the pool: {e}");
                self.pool.filled(None);
                false
            }
        }
    }

    /// What the last sandbox to boot said of its interpreter; `None` before any booted.
    pub fn seen_target(&self) -> Option<bridge_core::protocol::Target> {
        self.seen_target.lock().unwrap().clone()
    }

    fn saw(&self, s: &Session) {
        if let Some(t) = &s.interpreter.target {
            *self.seen_target.lock().unwrap() = Some(t.clone());
        }
    }

    /// Run `p` on every new sandbox after its boot, before it serves a call.
    pub fn set_provision(&self, p: Arc<dyn bridge_core::protocol::Provision>) {
        let _ = self.provision.set(p);
    }

    /// Report image-load progress to `f` instead of the log (a progress bar on a terminal).
    pub fn set_load_progress(&self, f: LoadProgress) {
        let _ = self.load_progress.set(f);
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
        req.binding.rpc = self.fork_handler(name, &session, req.binding.rpc);
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
            self.lost.note(
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
            let mut sessions = self.sessions.lock().await;
            if sessions.get(name).is_some_and(|s| Arc::ptr_eq(s, &session)) {
                sessions.remove(name);
            }
        }
        drop(session);
        // After the call, not during it: a refill competes with the code for the CPU.
        self.refill();
        for n in notices.into_iter().rev() {
            outcome.notices.insert(0, n);
        }
        if fresh && let Some(n) = self.lost.take(name) {
            // A reset asked for needs no explanation; a restore has its own.
            if !reset && !matches!(start, Start::Restored { .. }) {
                outcome.notices.insert(0, n);
            }
        }
        match start {
            Start::Resumed => {
                outcome.notices.insert(0, resume::RESUMED.into());
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
    pub async fn files(&self) -> Vec<(SessionKey, files::OutFile)> {
        let sessions = self.sessions.lock().await;
        let mut all = Vec::new();
        for (name, s) in sessions.iter().filter(|(_, s)| !s.is_dead()) {
            all.extend(s.files.list().into_iter().map(|f| (name.clone(), f)));
        }
        all
    }

    /// The kept file `name` of session `session` and its bytes; `None` when there is none (the
    /// session was reset or closed, or never wrote it).
    pub async fn read_file(
        &self,
        session: &SessionKey,
        name: &str,
    ) -> std::io::Result<Option<(files::OutFile, Vec<u8>)>> {
        let store = match self.sessions.lock().await.get(session) {
            Some(s) if !s.is_dead() => Arc::clone(&s.files),
            _ => return Ok(None),
        };
        let name = name.to_string();
        tokio::task::spawn_blocking(move || store.read(&name))
            .await
            .map_err(std::io::Error::other)?
    }

    /// Remove every container (sessions and pool) and stop our podman service.
    #[inline(never)]
    pub fn shutdown(&self) -> Boxed<'_, ()> {
        Box::pin(self.shutdown_here())
    }

    async fn shutdown_here(&self) {
        // Before parking: a sandbox is parked only under an answer the engine confirmed.
        self.check_kept(true).await;
        self.park_one().await;
        self.snapshot_at_exit().await;
        self.park_sessions().await;
        self.pool.closed.store(true, Ordering::SeqCst);
        self.closing.cancel();
        // A refill that checked `closed` before this reserves its start under `starting`: let
        // it, so that the count below sees it (bounded: counting holds the lock, not starts).
        let _ = tokio::time::timeout(Duration::from_secs(15), self.starting.lock()).await;
        // A pooled sandbox being started is given up by its filler (`closing`) or removed by it
        // once started (it sees `closed`), and a session's start ends within its bound; wait for
        // them, boundedly, so that none is created after the sweep below.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while (self.pool.filling() > 0 || self.busy.starting() > 0)
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.close_all().await;
        self.reap_strays(true).await;
        if let Some(engine) = self.engine.get() {
            engine.shutdown().await;
        }
        let config = Arc::clone(&self.config);
        let _ = tokio::task::spawn_blocking(move || pkgdir::leave(&config)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::check_session_name;

    #[test]
    fn a_session_name_is_1_to_64_of_letters_digits_dash_underscore_dot() {
        for ok in [
            "a",
            "default",
            "mcp-0123456789abcdef",
            "a.b_c-d",
            &"x".repeat(64),
        ] {
            assert!(check_session_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "../x",
            "a/b",
            "/abs",
            " ",
            "alice/work",
            "\u{202e}work",
            "a\u{200b}b",
            "\u{2066}x",
            "a\u{2028}b",
            "tab\there",
            "é",
            &"x".repeat(65),
        ] {
            let err = check_session_name(bad).unwrap_err().to_string();
            assert!(
                err.contains("must be 1-64 characters of letters, digits, '-', '_' or '.'"),
                "{err}"
            );
            assert!(
                !err.chars()
                    .any(|c| c.is_control() || ('\u{2000}'..='\u{206f}').contains(&c)),
                "the name is shown escaped: {err:?}"
            );
        }
        let long = check_session_name(&"x".repeat(5000))
            .unwrap_err()
            .to_string();
        assert!(long.len() < 300 && long.contains("(5000 bytes)"), "{long}");
    }
}

//! The sandbox: the engine (connected by the warm-up after `initialize`, or at the first call),
//! the image made present once, named sessions (one container each) that live until reset, idle
//! timeout or shutdown, and a pool of ready containers a new session takes at once.
//!
//! Invariant: every container this process creates is in `sessions`, in the pool (ready or being
//! started), or being removed; `shutdown` removes all of them, and the next bridge reaps any left
//! by a killed one. Sessions plus pooled containers stay within `max_sessions`.

mod attach;
mod channel;
mod compiled;
pub mod container;
pub mod engine;
mod error;
pub mod files;
pub mod image;
mod images;
pub mod inputs;
pub mod kernel;
mod output;
pub mod park;
mod pool;
mod runtime;
pub mod session;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{Mutex, OnceCell};

use crate::config::Config;
use crate::identity::{Identity, SessionKey};
use container::Role;
use engine::{Enforcement, Engine};
pub use error::SandboxError;
pub use output::{ExecOutcome, Fit, Kept, Outcome, OutputSink, Part, Spill};
use pool::Pool;
pub use session::{Claim, ExecRequest, Session};

/// The session used when a call names none: one per client, and a stdio bridge has one client.
pub use crate::identity::DEFAULT_SESSION;

/// The notice of a call cancelled while it waited for its session's running call.
const NOT_STARTED: &str = "the call was cancelled before its code started (it was waiting for the session's running call): nothing ran, and the session and its variables are untouched.";

/// Sessions whose interpreter went without a reply that said so (a call that reset it was
/// cancelled, its sandbox stopped between calls, it was closed to make room): the next call of
/// that name, which starts a fresh interpreter, says why. Bounded: a name seen again takes its
/// entry, and past [`Lost::MAX`] names an old entry goes.
#[derive(Default)]
struct Lost(std::sync::Mutex<HashMap<SessionKey, String>>);

impl Lost {
    const MAX: usize = 256;

    fn note(&self, session: &SessionKey, why: String) {
        let mut m = self.0.lock().unwrap();
        if m.len() >= Self::MAX
            && !m.contains_key(session)
            && let Some(k) = m.keys().next().cloned()
        {
            m.remove(&k);
        }
        m.insert(session.clone(), why);
    }

    /// The notice for a fresh interpreter of `session`, if its last one went unannounced.
    fn take(&self, session: &SessionKey) -> Option<String> {
        let why = self.0.lock().unwrap().remove(session)?;
        Some(format!(
            "session {:?} was reset since its last reply ({why}); this call runs in a fresh interpreter: variables and imports are gone.",
            session.name()
        ))
    }
}

pub struct Sandbox {
    config: Arc<Config>,
    engine: OnceCell<Arc<Engine>>,
    /// Serializes image preparation so concurrent first calls load the archive once.
    image_ready: OnceCell<()>,
    /// Failed attempts at either, shared with those that waited for them.
    engine_failed: Failed,
    image_failed: Failed,
    sessions: Mutex<HashMap<SessionKey, Arc<Session>>>,
    /// Serializes starting a session of a given name.
    starting: Mutex<()>,
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
    seen_target: std::sync::Mutex<Option<crate::protocol::Target>>,
    /// What makes every new sandbox ready after its boot (`packages.preinstall`).
    provision: std::sync::OnceLock<Arc<dyn crate::protocol::Provision>>,
    /// The container this bridge parked as it shut down (`park`): a keeper holds it now, so the
    /// shutdown's sweep of this bridge's containers leaves it.
    parked: std::sync::Mutex<Option<String>>,
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
}

/// A kept answer of the engine's in use, to be checked [`engine::CHECK_AFTER`] after it was
/// used or when the bridge shuts down, whichever comes first: a bridge gone sooner (`exec`)
/// still checks it, so that no chain of short-lived bridges uses it unchecked.
struct Unchecked {
    kept: engine::Kept,
    used: Enforcement,
    /// Waits [`engine::CHECK_AFTER`], then checks; aborted by a shutdown that checks first.
    timer: tokio::task::JoinHandle<()>,
}

/// The longest the engine gets to answer when asked again.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a bridge that exits waits for a pooled sandbox still booting, to park it: within
/// what an MCP client waits after closing a server's stdin before it sends SIGTERM (2 s for the
/// official Python SDK; SIGTERM does not cut a shutdown short).
const PARK_WAIT: Duration = Duration::from_millis(1500);

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
            parked: std::sync::Mutex::new(None),
            adopt_tried: Default::default(),
            revoked: std::sync::OnceLock::new(),
            unchecked: std::sync::Mutex::new(None),
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
            while sb.fill_one().await {}
            sb.pool.end_refill();
        });
    }

    /// Start one pooled sandbox if there is room; false when there is none or it failed.
    async fn fill_one(&self) -> bool {
        let Ok(engine) = self.prepare().await else {
            return false;
        };
        {
            let _starting = self.starting.lock().await;
            let live = self.live_sessions().await;
            if self.pool.closed.load(Ordering::SeqCst)
                || self.pool.idle_for() >= self.config.runtime_idle_timeout.0
                || self.pool.held() >= self.config.pool_size as usize
                || live + self.pool.held() >= self.config.max_sessions as usize
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
            &engine.docker,
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

    async fn live_sessions(&self) -> usize {
        self.sessions
            .lock()
            .await
            .values()
            .filter(|s| !s.is_dead())
            .count()
    }

    /// What the last sandbox to boot said of its interpreter; `None` before any booted.
    pub fn seen_target(&self) -> Option<crate::protocol::Target> {
        self.seen_target.lock().unwrap().clone()
    }

    fn saw(&self, s: &Session) {
        if let Some(t) = &s.interpreter.target {
            *self.seen_target.lock().unwrap() = Some(t.clone());
        }
    }

    /// Run `p` on every new sandbox after its boot, before it serves a call.
    pub fn set_provision(&self, p: Arc<dyn crate::protocol::Provision>) {
        let _ = self.provision.set(p);
    }

    /// Report image-load progress to `f` instead of the log (a progress bar on a terminal).
    pub fn set_load_progress(&self, f: LoadProgress) {
        let _ = self.load_progress.set(f);
    }

    /// The engine, connected at first use. A failure is not cached: the next call tries again.
    pub async fn engine(&self) -> Result<Arc<Engine>, SandboxError> {
        init_once(&self.engine, &self.engine_failed, || async {
            let engine = Arc::new(Engine::connect(&self.config).await?);
            // Off the first call's path: what bridges that are gone left behind is no
            // container of this one's, and a start need not wait for its removal.
            let reaping = Arc::clone(&engine);
            let config = Arc::clone(&self.config);
            tokio::spawn(async move {
                let reaped = container::reap_orphans(&reaping).await;
                if reaped > 0 {
                    tracing::info!(reaped, "removed containers left by bridges that are gone");
                }
                let _ = tokio::task::spawn_blocking(move || {
                    files::reap_orphans(&config.state_dir);
                    container::sweep_packages_dirs(&config);
                })
                .await;
            });
            Ok::<_, SandboxError>(engine)
        })
        .await
    }

    /// Connect, check enforceable limits and make the image present.
    async fn prepare(&self) -> Result<Arc<Engine>, SandboxError> {
        self.not_revoked()?;
        let engine = self.engine().await?;
        init_once(&self.image_ready, &self.image_failed, || async {
            let report = |bytes: u64| match self.load_progress.get() {
                Some(f) => f(bytes),
                None => tracing::info!(mib = bytes >> 20, "loading sandbox image…"),
            };
            // Independent questions to the engine, asked at once: what it can enforce, and
            // whether the image is there (loaded if not). The limits are judged first.
            let (enf, image) = tokio::join!(
                self.enforcement(&engine),
                image::ensure(&engine.docker, &self.config, &report)
            );
            let missing = match judge(&self.config, &enf?) {
                Ok(missing) => missing,
                Err(e) => {
                    // A sandbox adopted from the bridge before (`park`) was not checked here:
                    // it goes, with any session it became.
                    self.close_all().await;
                    return Err(e);
                }
            };
            if !missing.is_empty() {
                tracing::warn!(
                    "running with limits the host cannot enforce (allow_unenforced_limits): {}",
                    missing.join("; ")
                );
            }
            image.map(|_| ()).map_err(SandboxError::from)
        })
        .await?;
        Ok(engine)
    }

    /// What the engine can enforce: the answer an earlier bridge kept, when everything it is
    /// computed from is unchanged and it lets the sandbox run (asked again [`engine::CHECK_AFTER`]
    /// later, off the path), else the engine's answer now, kept for the next bridge.
    async fn enforcement(&self, engine: &Engine) -> Result<Enforcement, SandboxError> {
        let kept = engine::Kept::of(engine, &self.config.state_dir).await;
        if let Some(kept) = &kept
            && let Some(answer) = kept.answer().await
            && judge(&self.config, &answer).is_ok()
        {
            tracing::debug!("the engine's answer kept by an earlier bridge holds");
            self.check_kept_later(kept.clone(), answer.clone());
            return Ok(answer);
        }
        let answer = Enforcement::query(&engine.docker)
            .await
            .map_err(|e| SandboxError::EngineQuery(e.to_string()))?;
        if let Some(kept) = kept {
            kept.keep(&answer).await;
        }
        Ok(answer)
    }

    /// Check the kept answer just used [`engine::CHECK_AFTER`] from now, or at shutdown if
    /// that comes first ([`Unchecked`]).
    fn check_kept_later(&self, kept: engine::Kept, used: Enforcement) {
        let this = self.this.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(engine::CHECK_AFTER).await;
            if let Some(sb) = this.upgrade() {
                sb.check_kept(false).await;
            }
        });
        let old = self
            .unchecked
            .lock()
            .unwrap()
            .replace(Unchecked { kept, used, timer });
        if let Some(old) = old {
            old.timer.abort();
        }
    }

    /// Ask the engine again what it can enforce, if a kept answer is in use unchecked; keep
    /// what it says, and when that no longer lets the sandbox run, [`Sandbox::revoke`].
    /// `at_shutdown`: called by the shutdown, which stops the timer.
    async fn check_kept(&self, at_shutdown: bool) {
        let Some(Unchecked { kept, used, timer }) = self.unchecked.lock().unwrap().take() else {
            return;
        };
        if at_shutdown {
            timer.abort();
        }
        let Some(engine) = self.engine.get().cloned() else {
            return;
        };
        let now =
            match tokio::time::timeout(CHECK_TIMEOUT, Enforcement::query(&engine.docker)).await {
                Ok(Ok(now)) => now,
                Ok(Err(e)) => {
                    tracing::warn!("asking the engine again what it can enforce failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::warn!(
                        "the engine did not say within {}s what it can enforce, asked again",
                        CHECK_TIMEOUT.as_secs()
                    );
                    return;
                }
            };
        kept.keep(&now).await;
        if now == used {
            tracing::debug!("the engine's answer, asked again, is the one kept");
            return;
        }
        tracing::warn!(
            kept = ?used,
            now = ?now,
            "the engine's answer changed though nothing it is computed from did"
        );
        if let Err(e) = judge(&self.config, &now) {
            self.revoke(format!(
                "{} (the engine said so when asked again; the answer an earlier bridge kept had allowed it, and the sandboxes started since were closed)",
                crate::error::Hinted::message(&e)
            ))
            .await;
        }
    }

    /// Refuse every call from now on, saying `why`, and close every session and pooled sandbox.
    async fn revoke(&self, why: String) {
        tracing::error!("{why}");
        let _ = self.revoked.set(why);
        self.close_all().await;
    }

    /// Close every session and pooled sandbox: at shutdown, or when the engine refuses what
    /// they were started under.
    async fn close_all(&self) {
        let pooled = self.pool.drain();
        let live: Vec<Arc<Session>> = self.sessions.lock().await.drain().map(|(_, s)| s).collect();
        futures::future::join_all(
            live.iter()
                .map(|s| s.destroy())
                .chain(pooled.iter().map(|s| s.destroy())),
        )
        .await;
    }

    fn not_revoked(&self) -> Result<(), SandboxError> {
        match self.revoked.get() {
            Some(why) => Err(SandboxError::Shared(why.clone())),
            None => Ok(()),
        }
    }

    /// The live session `name`, started if needed; with `reset`, a fresh one. Also returns
    /// whether it was started now, and notices for the caller (a session closed to make room).
    pub async fn session(
        &self,
        name: &SessionKey,
        reset: bool,
    ) -> Result<(Claim, bool, Vec<String>), SandboxError> {
        self.not_revoked()?;
        self.pool.touch();
        self.pending.fetch_add(1, Ordering::SeqCst);
        let _pending = Pending(&self.pending);
        // The engine and the image are made ready below, before a start: a live session, a
        // pooled sandbox and one adopted from the bridge before (`park`, made by a bridge that
        // had passed the same checks on the same engine) need neither, and an agent's first call
        // sent at once must not wait for the engine's answers about them.
        // A live session is claimed without waiting for `starting`, which is held while a
        // container starts or one is closed to make room (a second or more): calls to running
        // sessions must not queue behind another's start. Claimed under the `sessions` lock, so
        // `make_room` and the reaper, which re-check under it, never close it under the call.
        if !reset
            && let Some(s) = self
                .sessions
                .lock()
                .await
                .get(name)
                .filter(|s| !s.is_dead())
                .map(|s| s.claim())
        {
            return Ok((s, false, Vec::new()));
        }
        let _guard = self.starting.lock().await;
        let existing = self.sessions.lock().await.get(name).cloned();
        if let Some(s) = existing {
            if !reset && !s.is_dead() {
                return Ok((s.claim(), false, Vec::new()));
            }
            if !reset {
                self.lost
                    .note(name, "its sandbox stopped between calls".into());
            }
            self.sessions.lock().await.remove(name);
            s.destroy().await;
        }
        // A pooled sandbox never served a session: it is as fresh as one started now. When none
        // is ready, one being started is waited for when there is no room for another, or when
        // it should be done before one started now would be.
        let mut pooled = self.pool.take(Duration::ZERO).await;
        if pooled.is_none()
            && self.pool.filling() > 0
            && (self.pool.worth_waiting()
                || self.live_sessions().await + self.pool.held()
                    >= self.config.max_sessions as usize)
        {
            pooled = self.pool.take(session::START_TIMEOUT).await;
        }
        if let Some(mut s) = pooled {
            let serial = self.serial.fetch_add(1, Ordering::Relaxed);
            s.hand_to(&name.to_string(), serial);
            let claim = self.hand_out(name, Arc::new(s)).await?;
            return Ok((claim, true, Vec::new()));
        }
        let engine = self.engine().await?;
        let notices = self.make_room(name).await?;
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let t0 = std::time::Instant::now();
        // The engine's checks (begun by the warm-up) finish while the container is created,
        // started and booted; the user's code reaches it only once they passed.
        let gate: session::Gate<'_> = Box::pin(async { self.prepare().await.map(|_| ()) });
        let s = Arc::new(
            Session::start(
                &engine.docker,
                &self.config,
                &self.compiled,
                Role::Session(&name.to_string()),
                &self.owner,
                serial,
                self.provision.get(),
                None,
                Some(gate),
            )
            .await?,
        );
        self.pool.cold_took(t0.elapsed());
        self.saw(&s);
        let claim = self.hand_out(name, s).await?;
        Ok((claim, true, notices))
    }

    /// Make `s` session `name`'s and claim it, unless the engine's answer was revoked
    /// meanwhile: `revoke` sets its flag before it closes the sessions it finds, so a session
    /// that joins after its sweep (started or taken while the engine was asked again) sees the
    /// flag here and is closed, never handed out.
    async fn hand_out(&self, name: &SessionKey, s: Arc<Session>) -> Result<Claim, SandboxError> {
        self.sessions
            .lock()
            .await
            .insert(name.clone(), Arc::clone(&s));
        if let Err(e) = self.not_revoked() {
            let mut sessions = self.sessions.lock().await;
            if sessions.get(name).is_some_and(|cur| Arc::ptr_eq(cur, &s)) {
                sessions.remove(name);
            }
            drop(sessions);
            s.destroy().await;
            return Err(e);
        }
        Ok(s.claim())
    }

    /// Keep within `max_sessions` before session `name` starts: close the least recently used
    /// idle sessions, or refuse when every session is running code (closing a busy one would
    /// lose work in flight). Called with `starting` held, so no other session starts meanwhile
    /// and the pool can only shrink; pooled sandboxes (being started) count too.
    async fn make_room(&self, name: &SessionKey) -> Result<Vec<String>, SandboxError> {
        let max = self.config.max_sessions as usize;
        // Under `serve` an identity's sessions are also bounded on their own, and make room
        // among themselves first: one user cannot close everyone else's sessions.
        let owner = name.owner();
        let per_identity = self.config.http.max_sessions_per_identity as usize;
        let mut notices = Vec::new();
        loop {
            let (victim, busy, key, limit) = {
                let sessions = self.sessions.lock().await;
                let live: Vec<(&SessionKey, &Arc<Session>)> = sessions
                    .iter()
                    .filter(|(k, s)| *k != name && !s.is_dead())
                    .collect();
                let mine: Vec<(&SessionKey, &Arc<Session>)> = live
                    .iter()
                    .filter(|(k, _)| k.owner() == owner)
                    .copied()
                    .collect();
                let named = *owner != Identity::Local;
                let (candidates, key, limit) = if named && mine.len() >= per_identity {
                    (mine, "http.max_sessions_per_identity", per_identity)
                } else if live.len() + self.pool.held() >= max {
                    (live, "max_sessions", max)
                } else {
                    return Ok(notices);
                };
                let victim = candidates
                    .iter()
                    .filter(|(_, s)| !s.is_busy())
                    .max_by_key(|(_, s)| s.idle_for())
                    .map(|(k, s)| ((*k).clone(), Arc::clone(s)));
                // The caller's own sessions by name; others' only counted, never named.
                let mut busy: Vec<String> = candidates
                    .iter()
                    .filter(|(k, _)| k.owner() == owner)
                    .map(|(k, _)| k.name().to_string())
                    .collect();
                busy.sort();
                let others = candidates.len() - busy.len();
                if others > 0 {
                    busy.push(format!("{others} of other users"));
                }
                (victim, busy, key, limit)
            };
            let Some((victim, s)) = victim else {
                return Err(SandboxError::AllBusy {
                    session: name.name().to_string(),
                    max: limit as u32,
                    key,
                    busy,
                });
            };
            let idle = s.idle_for().as_secs();
            {
                let mut sessions = self.sessions.lock().await;
                if s.is_busy() {
                    // A call claimed it since it was chosen: choose again.
                    continue;
                }
                if sessions
                    .get(&victim)
                    .is_some_and(|cur| Arc::ptr_eq(cur, &s))
                {
                    sessions.remove(&victim);
                }
            }
            tracing::info!(session = %victim, idle_secs = idle, limit, key, "closing the least recently used session to make room");
            s.destroy().await;
            self.lost.note(
                &victim,
                format!("it was closed, unused for {idle}s, to stay within {key} = {limit}"),
            );
            let shown = if victim.owner() == owner {
                format!("session {:?}", victim.name())
            } else {
                "another user's session".to_string()
            };
            notices.push(format!(
                "{shown} (unused for {idle}s) was closed to stay within {key} = {limit}; its variables are gone"
            ));
        }
    }

    /// Run a request in session `name`. Errors are for failures to get a sandbox at all.
    pub async fn run(
        &self,
        name: &SessionKey,
        reset: bool,
        req: ExecRequest,
    ) -> Result<ExecOutcome, SandboxError> {
        let (session, fresh, mut notices) = self.session(name, reset).await?;
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
            // A reset asked for needs no explanation.
            if !reset {
                outcome.notices.insert(0, n);
            }
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

    async fn reap_idle(&self, idle: Duration) {
        if self.pool.idle_for() >= idle {
            for s in self.pool.drain() {
                tracing::info!(container = %s.container_id, "removing a pooled sandbox: no call for {}s", idle.as_secs());
                s.destroy().await;
            }
        }
        let stale = |s: &Arc<Session>| s.is_dead() || (!s.is_busy() && s.idle_for() >= idle);
        // A look first, so that a tick with nothing to close never waits for a start.
        if !self.sessions.lock().await.values().any(stale) {
            return;
        }
        // Closed under `starting`, as `make_room` closes: a session leaves the table before its
        // container is gone, and a start meanwhile would count one container fewer than there
        // are, so `max_sessions` would bound the table, not the containers. Chosen again under
        // it, and taken out of the table in the same step (under `sessions`, where calls claim
        // theirs): one that `make_room` closed while this waited is no longer there, and one a
        // call claimed is busy, so each session is closed once.
        let _starting = self.starting.lock().await;
        let closing: Vec<Arc<Session>> = {
            let mut sessions = self.sessions.lock().await;
            let names: Vec<SessionKey> = sessions
                .iter()
                .filter(|(_, s)| stale(s))
                .map(|(k, _)| k.clone())
                .collect();
            names
                .into_iter()
                .filter_map(|name| {
                    let s = sessions.remove(&name)?;
                    if s.is_dead() {
                        self.lost
                            .note(&name, "its sandbox stopped between calls".into());
                    }
                    tracing::info!(session = %name, "removing idle sandbox");
                    Some(s)
                })
                .collect()
        };
        // Together, so a start waits for one removal, not for each.
        futures::future::join_all(closing.iter().map(|s| s.destroy())).await;
    }

    /// Remove containers of this bridge that no live session uses. A removal that failed while
    /// the engine was unreachable (a restarted podman service) leaves such a stray; this retries
    /// it (tests/e2e/faults_lifecycle.rs::lifecycle_podman_service_restarted_under_a_live_session).
    /// With `all`, every container of this bridge goes (shutdown).
    async fn reap_strays(&self, all: bool) {
        let Some(engine) = self.engine.get() else {
            return;
        };
        // No session is half-started while we compare...
        let _starting = self.starting.lock().await;
        // ... and no pooled one either (it is created before the pool holds it): next time.
        if !all && self.pool.filling() > 0 {
            return;
        }
        let mut live: std::collections::HashSet<String> = HashSet::new();
        if !all {
            live.extend(
                self.sessions
                    .lock()
                    .await
                    .values()
                    .filter(|s| !s.is_dead())
                    .map(|s| s.container_id.clone()),
            );
            live.extend(self.pool.ready_ids());
        }
        let ids = match container::owned_by(engine, &self.owner).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::debug!("could not list this bridge's containers: {e}");
                return;
            }
        };
        if let Some(parked) = self.parked.lock().unwrap().clone() {
            live.insert(parked);
        }
        for id in ids.into_iter().filter(|id| !live.contains(id)) {
            tracing::info!(container = %id, "removing a container no session uses");
            container::remove(&engine.docker, &id).await;
        }
    }

    /// Remove every container (sessions and pool) and stop our podman service.
    pub async fn shutdown(&self) {
        // Before parking: a sandbox is parked only under an answer the engine confirmed.
        self.check_kept(true).await;
        self.park_one().await;
        self.pool.closed.store(true, Ordering::SeqCst);
        self.closing.cancel();
        // A refill that checked `closed` before this reserves its start under `starting`: let
        // it, so that the count below sees it (bounded: a session start holds the lock too).
        let _ = tokio::time::timeout(Duration::from_secs(15), self.starting.lock()).await;
        // A pooled sandbox being started is given up by its filler (`closing`) or removed by it
        // once started (it sees `closed`); wait for that, boundedly, so that it is not created
        // after the sweep below.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while self.pool.filling() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.close_all().await;
        self.reap_strays(true).await;
        if let Some(engine) = self.engine.get() {
            engine.shutdown().await;
        }
    }
}

impl Sandbox {
    /// Take the sandbox a bridge before this one parked on the same state dir (`park`), if a
    /// keeper holds one, as a pooled sandbox: the first call waits for it as for a pooled one
    /// being started (counted now, before any call can look). Never fails: a sandbox that
    /// cannot be taken, or was made with other settings, is removed and the call starts its own.
    pub fn adopt_parked(&self) {
        if !park::eligible(&self.config)
            || self.adopt_tried.swap(true, Ordering::SeqCst)
            || !park::socket(&self.config.state_dir).exists()
        {
            return;
        }
        let Some(sb) = self.this.upgrade() else {
            return;
        };
        self.pool.reserve();
        tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            let adopted = sb.adopt().await;
            if let Some(s) = &adopted {
                sb.saw(s);
                tracing::info!(container = %&s.container_id[..12.min(s.container_id.len())], ms = t0.elapsed().as_millis() as u64, "took the sandbox the previous bridge parked");
            }
            sb.pool.filled(adopted);
        });
    }

    async fn adopt(&self) -> Option<Session> {
        let state = self.config.state_dir.clone();
        let (claimed, engine) = tokio::join!(
            tokio::task::spawn_blocking(move || park::claim(&state)),
            self.engine()
        );
        let (meta, fd) = claimed.ok().flatten()?;
        let engine = match engine {
            Ok(e) => e,
            Err(e) => {
                // Its connection closes with `fd`: the runtime exits; the next reaper removes it.
                tracing::info!("could not take the parked sandbox: {e}");
                return None;
            }
        };
        let remove = |why: String| {
            let docker = engine.docker.clone();
            let (id, dir) = (meta.container_id.clone(), meta.packages.clone());
            async move {
                tracing::info!(container = %id, "removing the sandbox the previous bridge parked: {why}");
                container::remove(&docker, &id).await;
                let _ =
                    tokio::task::spawn_blocking(move || container::remove_packages_dir(&dir)).await;
            }
        };
        if meta.spec != park::spec_digest(&self.config) {
            drop(fd);
            remove("it was made with other settings (or by another version)".into()).await;
            return None;
        }
        if meta.endpoint != engine.endpoint || meta.expires <= park::now_secs() {
            drop(fd);
            remove("it runs on another engine, or its time is over".into()).await;
            return None;
        }
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let base = container::container_name(Role::Pool, serial);
        let name = container::adopted_name(&base, &self.owner);
        let suffix = name[base.len()..].to_string();
        let packages = container::packages_dir(&self.config, &name);
        // Renamed in the background, off the first call's path: until then its parked name keeps
        // the reapers off it while it runs (it runs while this bridge holds its stdin), up to
        // the time in that name; from then on the reapers see this bridge as its owner.
        let docker = engine.docker.clone();
        let (id, new_name) = (meta.container_id.clone(), name.clone());
        tokio::spawn(async move {
            if let Err(e) = container::rename(&docker, &id, &new_name).await {
                tracing::warn!(container = %id, "could not rename an adopted sandbox for this bridge (the reapers take it once its parked time is over): {e}");
            }
        });
        let (from, to) = (meta.packages.clone(), packages.clone());
        let moved = tokio::task::spawn_blocking(move || std::fs::rename(from, to)).await;
        if !matches!(moved, Ok(Ok(()))) {
            drop(fd);
            remove(format!("could not move its package directory: {moved:?}")).await;
            return None;
        }
        match Session::adopt(
            &engine.docker,
            &self.config,
            &meta,
            fd,
            &name,
            &suffix,
            packages,
        ) {
            Ok(s) => Some(s),
            Err(e) => {
                remove(e.to_string()).await;
                None
            }
        }
    }

    /// At shutdown, with `park::eligible`: hand a pooled sandbox (ready, or ready within
    /// [`PARK_WAIT`]) to a keeper for the next bridge, instead of removing it.
    async fn park_one(&self) {
        if !park::eligible(&self.config)
            || !self.pool.enabled.load(Ordering::SeqCst)
            || self.revoked.get().is_some()
        {
            return;
        }
        let Some(engine) = self.engine.get() else {
            return;
        };
        // A refill the last call began may not have counted its start yet: wait for it too.
        let deadline = tokio::time::Instant::now() + PARK_WAIT;
        let s = loop {
            if let Some(s) = self.pool.take(Duration::ZERO).await {
                break s;
            }
            if (self.pool.filling() == 0 && !self.pool.refilling())
                || tokio::time::Instant::now() >= deadline
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        match self.park(engine, &s).await {
            Ok(()) => {
                *self.parked.lock().unwrap() = Some(s.container_id.clone());
                tracing::info!(container = %&s.container_id[..12.min(s.container_id.len())], linger = ?self.config.engine_linger.0, "parked a ready sandbox for the next bridge");
            }
            Err(e) => {
                tracing::info!("could not park a ready sandbox (removed): {e}");
                s.destroy().await;
            }
        }
    }

    async fn park(&self, engine: &Engine, s: &Session) -> Result<(), String> {
        let fd = s
            .take_park_fd()
            .ok_or("it was not attached on a connection of its own")?;
        let expires = park::now_secs() + self.config.engine_linger.0.as_secs().max(1);
        let id = s.container_id.clone();
        let short = &id[..12.min(id.len())];
        let name = format!(
            "mcp-code-bridge-{}{}{expires}-{short}",
            std::process::id(),
            container::PARKED_MARK
        );
        container::rename(&engine.docker, &id, &name)
            .await
            .map_err(|e| format!("could not rename it: {e}"))?;
        let from = s
            .interpreter
            .packages
            .clone()
            .ok_or("it has no package directory")?;
        let to = from.with_file_name(format!("{}{expires}-{short}", container::PARKED_DIR));
        std::fs::rename(&from, &to)
            .map_err(|e| format!("could not move its package directory: {e}"))?;
        let meta = park::Meta {
            container_id: id,
            name,
            python: s.python.clone(),
            target: s.interpreter.target.clone(),
            packages: to.clone(),
            spec: park::spec_digest(&self.config),
            endpoint: engine.endpoint.clone(),
            expires,
            podman: (engine.kind == engine::EngineKind::Podman)
                .then(|| engine::on_path("podman"))
                .flatten(),
        };
        let state = self.config.state_dir.clone();
        let handed = tokio::task::spawn_blocking(move || park::hand_to_keeper(&state, &meta, fd))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        if let Err(e) = handed {
            let _ = std::fs::rename(&to, &from);
            return Err(e);
        }
        Ok(())
    }
}

/// One call waiting for its session, counted in [`Sandbox::pending`] until dropped.
struct Pending<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether the sandbox may run with what the engine can enforce: `Err` when the isolation asked
/// for is missing (never excused) or limits cannot be enforced and `allow_unenforced_limits` is
/// off; `Ok` with the limits that will go unenforced because it is on.
fn judge(config: &Config, enf: &Enforcement) -> Result<Vec<String>, SandboxError> {
    enf.isolation(config)?;
    let missing = enf.missing(config);
    if !missing.is_empty() && !config.allow_unenforced_limits {
        return Err(SandboxError::Unenforceable(missing));
    }
    Ok(missing)
}

/// Failed attempts at one thing, counted, with the last one's message.
#[derive(Default)]
struct Failed {
    count: AtomicU64,
    last: std::sync::Mutex<String>,
}

/// `cell`'s value, initialized by `init` one attempt at a time. A failure is not cached (the
/// next call tries again), but a caller that waited for an attempt that failed gets that
/// failure instead of starting another: the warm-up and a first call that race would otherwise
/// pay twice, the second attempt (a podman service started again) outliving the call's answer.
async fn init_once<T, F, Fut>(
    cell: &OnceCell<T>,
    failed: &Failed,
    init: F,
) -> Result<T, SandboxError>
where
    T: Clone,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T, SandboxError>>,
{
    if let Some(v) = cell.get() {
        return Ok(v.clone());
    }
    let seen = failed.count.load(Ordering::SeqCst);
    cell.get_or_try_init(|| async {
        if failed.count.load(Ordering::SeqCst) != seen {
            return Err(SandboxError::Shared(failed.last.lock().unwrap().clone()));
        }
        init().await.inspect_err(|e| {
            *failed.last.lock().unwrap() = crate::error::Hinted::message(e);
            failed.count.fetch_add(1, Ordering::SeqCst);
        })
    })
    .await
    .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// A caller that waited for a failing attempt gets its failure, and no second attempt runs;
    /// a caller that comes after the failure tries again, and a success is kept.
    #[tokio::test]
    async fn an_attempt_that_failed_is_shared_with_those_that_waited_not_repeated() {
        let cell: OnceCell<u32> = OnceCell::new();
        let failed = Failed::default();
        let runs = AtomicUsize::new(0);
        let attempt = |ok: bool| {
            let runs = &runs;
            move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                if ok {
                    Ok(7)
                } else {
                    Err(SandboxError::NotReady(20))
                }
            }
        };
        let (a, b) = tokio::join!(init_once(&cell, &failed, attempt(false)), async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            init_once(&cell, &failed, attempt(true)).await
        });
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the waiter started an attempt of its own"
        );
        assert!(matches!(a, Err(SandboxError::NotReady(20))));
        match b {
            Err(SandboxError::Shared(m)) => {
                assert_eq!(m, "the sandbox did not become ready within 20s")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(init_once(&cell, &failed, attempt(true)).await.unwrap(), 7);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(init_once(&cell, &failed, attempt(false)).await.unwrap(), 7);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

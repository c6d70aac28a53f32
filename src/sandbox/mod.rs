//! The sandbox: a lazily connected engine, the image made present once, and named sessions
//! (one container each) that live until reset, idle timeout or shutdown.
//!
//! Invariant: every container this process creates is either in `sessions` or being removed;
//! `shutdown` removes all of them, and the next bridge reaps any left by a killed one.

mod channel;
pub mod container;
pub mod engine;
mod error;
pub mod image;
mod output;
pub mod session;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, OnceCell};

use crate::config::Config;
use engine::{Enforcement, Engine};
pub use error::SandboxError;
pub use output::{ExecOutcome, Outcome, OutputSink};
pub use session::{Claim, ExecRequest, Session};

/// The session used when a call names none: one per client, and a stdio bridge has one client.
pub const DEFAULT_SESSION: &str = "default";

pub struct Sandbox {
    config: Arc<Config>,
    engine: OnceCell<Arc<Engine>>,
    /// Serializes image preparation so concurrent first calls load the archive once.
    image_ready: OnceCell<()>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Serializes starting a session of a given name.
    starting: Mutex<()>,
    owner: String,
    serial: AtomicU64,
    /// Shows image-load progress (bytes so far); the log when unset.
    load_progress: std::sync::OnceLock<LoadProgress>,
}

/// A reporter of image-load progress: bytes streamed so far.
pub type LoadProgress = Arc<dyn Fn(u64) + Send + Sync>;

impl Sandbox {
    pub fn new(config: Arc<Config>) -> Arc<Self> {
        let sb = Arc::new(Sandbox {
            config,
            engine: OnceCell::new(),
            image_ready: OnceCell::new(),
            sessions: Mutex::new(HashMap::new()),
            starting: Mutex::new(()),
            owner: container::owner_id(),
            serial: AtomicU64::new(0),
            load_progress: std::sync::OnceLock::new(),
        });
        let weak = Arc::downgrade(&sb);
        let idle = sb.config.runtime_idle_timeout.0;
        tokio::spawn(async move {
            let tick = (idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(15));
            loop {
                tokio::time::sleep(tick).await;
                let Some(sb) = weak.upgrade() else { return };
                sb.reap_idle(idle).await;
                sb.reap_strays().await;
            }
        });
        sb
    }

    /// Report image-load progress to `f` instead of the log (a progress bar on a terminal).
    pub fn set_load_progress(&self, f: LoadProgress) {
        let _ = self.load_progress.set(f);
    }

    /// The engine, connected at first use. A failure is not cached: the next call tries again.
    pub async fn engine(&self) -> Result<Arc<Engine>, SandboxError> {
        self.engine
            .get_or_try_init(|| async {
                let engine = Engine::connect(&self.config).await?;
                let reaped = container::reap_orphans(&engine).await;
                if reaped > 0 {
                    tracing::info!(reaped, "removed containers left by bridges that are gone");
                }
                Ok::<_, SandboxError>(Arc::new(engine))
            })
            .await
            .cloned()
    }

    /// Connect, check enforceable limits and make the image present.
    async fn prepare(&self) -> Result<Arc<Engine>, SandboxError> {
        let engine = self.engine().await?;
        self.image_ready
            .get_or_try_init(|| async {
                let enf = Enforcement::query(&engine.docker).await.map_err(|e| SandboxError::EngineQuery(e.to_string()))?;
                let missing = enf.missing(&self.config);
                if !missing.is_empty() {
                    if self.config.allow_unenforced_limits {
                        tracing::warn!("running with limits the host cannot enforce (allow_unenforced_limits): {}", missing.join("; "));
                    } else {
                        return Err(SandboxError::Unenforceable(missing));
                    }
                }
                let report = |bytes: u64| match self.load_progress.get() {
                    Some(f) => f(bytes),
                    None => tracing::info!(mib = bytes >> 20, "loading sandbox image…"),
                };
                image::ensure(&engine.docker, &self.config, &report)
                    .await
                    .map(|_| ())
                    .map_err(SandboxError::from)
            })
            .await?;
        Ok(engine)
    }

    /// The live session `name`, started if needed; with `reset`, a fresh one. Also returns
    /// whether it was started now, and notices for the caller (a session closed to make room).
    pub async fn session(
        &self,
        name: &str,
        reset: bool,
    ) -> Result<(Claim, bool, Vec<String>), SandboxError> {
        let engine = self.prepare().await?;
        let _guard = self.starting.lock().await;
        let existing = self.sessions.lock().await.get(name).cloned();
        if let Some(s) = existing {
            if !reset && !s.is_dead() {
                return Ok((s.claim(), false, Vec::new()));
            }
            self.sessions.lock().await.remove(name);
            s.destroy().await;
        }
        let notices = self.make_room(name).await?;
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let s = Arc::new(
            Session::start(&engine.docker, &self.config, name, &self.owner, serial).await?,
        );
        let claim = s.claim();
        self.sessions.lock().await.insert(name.to_string(), s);
        Ok((claim, true, notices))
    }

    /// Keep within `max_sessions` before session `name` starts: close the least recently used
    /// idle sessions, or refuse when every session is running code (closing a busy one would
    /// lose work in flight). Called with `starting` held, so no other session starts meanwhile.
    async fn make_room(&self, name: &str) -> Result<Vec<String>, SandboxError> {
        let max = self.config.max_sessions as usize;
        let mut notices = Vec::new();
        loop {
            let (victim, busy) = {
                let sessions = self.sessions.lock().await;
                let live: Vec<(&String, &Arc<Session>)> = sessions
                    .iter()
                    .filter(|(k, s)| k.as_str() != name && !s.is_dead())
                    .collect();
                if live.len() < max {
                    return Ok(notices);
                }
                let victim = live
                    .iter()
                    .filter(|(_, s)| !s.is_busy())
                    .max_by_key(|(_, s)| s.idle_for())
                    .map(|(k, s)| ((*k).clone(), Arc::clone(s)));
                let mut busy: Vec<String> = live.iter().map(|(k, _)| (*k).clone()).collect();
                busy.sort();
                (victim, busy)
            };
            let Some((victim, s)) = victim else {
                return Err(SandboxError::AllBusy {
                    session: name.to_string(),
                    max: self.config.max_sessions,
                    busy,
                });
            };
            let idle = s.idle_for().as_secs();
            {
                let mut sessions = self.sessions.lock().await;
                if sessions
                    .get(&victim)
                    .is_some_and(|cur| Arc::ptr_eq(cur, &s))
                {
                    sessions.remove(&victim);
                }
            }
            tracing::info!(session = %victim, idle_secs = idle, max_sessions = max, "closing the least recently used session to make room");
            s.destroy().await;
            notices.push(format!(
                "session {victim:?} (unused for {idle}s) was closed to stay within max_sessions = {max}; its variables are gone"
            ));
        }
    }

    /// Run a request in session `name`. Errors are for failures to get a sandbox at all.
    pub async fn run(
        &self,
        name: &str,
        reset: bool,
        req: ExecRequest,
    ) -> Result<ExecOutcome, SandboxError> {
        let (session, fresh, notices) = self.session(name, reset).await?;
        let mut outcome = session.exec(req).await;
        if outcome.session_reset {
            let mut sessions = self.sessions.lock().await;
            if sessions.get(name).is_some_and(|s| Arc::ptr_eq(s, &session)) {
                sessions.remove(name);
            }
        }
        drop(session);
        for n in notices.into_iter().rev() {
            outcome.notices.insert(0, n);
        }
        if fresh && reset {
            outcome
                .notices
                .insert(0, "started a fresh interpreter (reset)".into());
        }
        Ok(outcome)
    }

    async fn reap_idle(&self, idle: Duration) {
        let stale: Vec<(String, Arc<Session>)> = {
            let sessions = self.sessions.lock().await;
            sessions
                .iter()
                .filter(|(_, s)| s.is_dead() || (!s.is_busy() && s.idle_for() >= idle))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        for (name, s) in stale {
            let mut sessions = self.sessions.lock().await;
            if sessions.get(&name).is_some_and(|cur| Arc::ptr_eq(cur, &s)) {
                sessions.remove(&name);
            }
            drop(sessions);
            tracing::info!(session = %name, "removing idle sandbox");
            s.destroy().await;
        }
    }

    /// Remove containers of this bridge that no live session uses. A removal that failed while
    /// the engine was unreachable (a restarted podman service) leaves such a stray; this retries
    /// it (tests/faults_lifecycle.rs::lifecycle_podman_service_restarted_under_a_live_session).
    async fn reap_strays(&self) {
        let Some(engine) = self.engine.get() else {
            return;
        };
        // No session is half-started while we compare.
        let _starting = self.starting.lock().await;
        let live: std::collections::HashSet<String> = self
            .sessions
            .lock()
            .await
            .values()
            .filter(|s| !s.is_dead())
            .map(|s| s.container_id.clone())
            .collect();
        let ids = match container::owned_by(engine, &self.owner).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::debug!("could not list this bridge's containers: {e}");
                return;
            }
        };
        for id in ids.into_iter().filter(|id| !live.contains(id)) {
            tracing::info!(container = %id, "removing a container no session uses");
            container::remove(&engine.docker, &id).await;
        }
    }

    /// Remove every container and stop our podman service.
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Session>> = self.sessions.lock().await.drain().map(|(_, s)| s).collect();
        futures::future::join_all(all.iter().map(|s| s.destroy())).await;
        self.reap_strays().await;
        if let Some(engine) = self.engine.get() {
            engine.shutdown().await;
        }
    }
}

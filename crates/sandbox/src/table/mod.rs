//! The session table: a call's session found by its key or started (`session`), handed out,
//! room made under `max_sessions` (`room`), a new session's sandbox taken from the pool or
//! started (`start`), the pool kept filled within the same bound (`fill`), idle sessions and
//! strays reaped (`reap`), and what went without a reply remembered for the next call
//! (`busy::Lost`).
//!
//! Invariant: every container this process creates is in `sessions`, in the pool (ready or being
//! started), held `busy` (being started for a session, restored, or closed), or being removed;
//! `close` removes all of them, and the next bridge reaps any left by a killed one. Sessions,
//! pooled containers and those held `busy` stay within `max_sessions`.
//!
//! The table owns the sessions; the parts below it are asked, never handed the table: the engine
//! and what makes a sandbox (`Readiness`), the pool, the sandboxes of the bridge before
//! (`Parking`) and the sessions' snapshots (`Carry`).

mod busy;
mod fill;
mod reap;
mod room;
mod start;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard, Semaphore};
use tokio_util::sync::CancellationToken;

use bridge_core::config::Config;
use bridge_core::identity::SessionKey;

use crate::carry::{Carry, Restore};
use crate::error::SandboxError;
use crate::files::OutStore;
use crate::name::shown;
use crate::parking::Parking;
use crate::pool::{Pool, starts_at_once};
use crate::readiness::Readiness;
use crate::session::{Claim, Session};
use crate::snapshots;
use busy::{Busy, Lost, Pending};

/// How a call's session came to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// It was running already.
    Running,
    /// Started for this call (or a pooled sandbox handed to it).
    Fresh,
    /// Taken from the bridge before this one, its state as it was (`parking`).
    Resumed,
    /// Started for this call with its snapshot restored (`carry`): the names that could not
    /// be kept or brought back, as `name (type)`.
    Restored {
        /// The names lost, as `name (type)`.
        lost: Vec<String>,
    },
}

/// Why a fork cannot replace session `.0` now.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Occupied {
    /// It is being started, closed or restored.
    #[error("session {0:?} is being started, closed or restored; fork into it once that is done")]
    Held(String),
    /// It is running code.
    #[error("session {0:?} is running code; fork into it once its call is done")]
    Running(String),
}

/// The notice of a call whose session a keeper held but that could not be resumed.
const NOT_RESUMED: &str = "the bridge before this one left this session running, but it could not be resumed (another bridge took it, or it had ended); this is a fresh interpreter";

/// The sessions of this bridge, with the parts it asks (see the module's text).
pub(crate) struct Table {
    config: Arc<Config>,
    ready: Arc<Readiness>,
    pool: Arc<Pool>,
    parking: Arc<Parking>,
    carry: Arc<Carry>,
    sessions: Mutex<HashMap<SessionKey, Arc<Session>>>,
    /// Held while the sessions are counted and changed: a new session is counted (`busy`, after
    /// room is made for it within `max_sessions`) or a pooled start reserved, sessions closed
    /// (to make room, idle), strays compared, a fork's target checked. Never while a container
    /// starts: that is bounded by `start_permits` instead.
    starting: Mutex<()>,
    /// Containers being started at once, sessions' and the pool's ([`starts_at_once`]).
    start_permits: Semaphore,
    /// Sessions out of the table while their state is written (closed idle) or restored: each
    /// still has its container, and a call naming one waits for it.
    busy: Busy,
    lost: Lost,
    /// Calls between asking for their session and getting it: the warm-up does not start a
    /// pooled sandbox while one waits, since that call would either wait for it (its boot and
    /// preload) or start beside it on the same cores.
    pending: AtomicUsize,
    /// Cancelled by [`Table::close`]: a pooled sandbox still booting is given up at once
    /// (under gVisor's ptrace platform a boot takes seconds) and swept with the rest.
    closing: CancellationToken,
}

impl Table {
    /// No session yet.
    pub(crate) fn new(
        config: Arc<Config>,
        ready: Arc<Readiness>,
        pool: Arc<Pool>,
        parking: Arc<Parking>,
        carry: Arc<Carry>,
    ) -> Table {
        Table {
            config,
            ready,
            pool,
            parking,
            carry,
            sessions: Mutex::new(HashMap::new()),
            starting: Mutex::new(()),
            start_permits: Semaphore::new(starts_at_once()),
            busy: Busy::default(),
            lost: Lost::default(),
            pending: AtomicUsize::new(0),
            closing: CancellationToken::new(),
        }
    }

    /// Connect, check and make the image present (`Readiness::prepare`); when the engine
    /// refuses what is needed, every session and pooled sandbox is closed.
    pub(crate) async fn prepare(&self) -> Result<Arc<crate::engine::Engine>, SandboxError> {
        self.ready.prepare(self.close_all()).await
    }

    /// Calls waiting for their session now.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Held while sessions are counted and changed (a fork's target is checked under it).
    pub(crate) async fn counting(&self) -> MutexGuard<'_, ()> {
        self.starting.lock().await
    }

    pub(crate) async fn live_sessions(&self) -> usize {
        self.sessions
            .lock()
            .await
            .values()
            .filter(|s| !s.is_dead())
            .count()
    }

    /// The live session `name`, started if needed (or resumed from the bridge before this one,
    /// `parking`, or restored from its snapshot within `timeout`, the call's); with
    /// `reset`, a fresh one. Also returns how it came to be, and notices for the caller (a
    /// session closed to make room, a snapshot that could not be restored).
    pub(crate) async fn session(
        &self,
        name: &SessionKey,
        reset: bool,
        timeout: Duration,
    ) -> Result<(Claim, Start, Vec<String>), SandboxError> {
        self.ready.not_revoked()?;
        self.pool.touch();
        self.pending.fetch_add(1, Ordering::SeqCst);
        let _pending = Pending(&self.pending);
        // The engine and the image are made ready below, before a start: a live session, a
        // pooled sandbox and one adopted from the bridge before (`park`, made by a bridge that
        // had passed the same checks on the same engine) need neither, and an agent's first call
        // sent at once must not wait for the engine's answers about them.
        // A live session is claimed without waiting for `starting`, which is held while one is
        // closed to make room (a second or more): calls to running sessions must not queue
        // behind that. Claimed under the `sessions` lock, so
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
            return Ok((s, Start::Running, Vec::new()));
        }
        let mut notices = Vec::new();
        let mut restore_failed = false;
        loop {
            // Its state being written (closed idle) or restored by another call: after that,
            // not meanwhile, and without holding `starting` while it lasts.
            self.busy.wait(name).await;
            let guard = self.starting.lock().await;
            if self.busy.contains(name) {
                continue;
            }
            let existing = self.sessions.lock().await.get(name).cloned();
            if let Some(s) = existing {
                if !reset && !s.is_dead() {
                    return Ok((s.claim(), Start::Running, notices));
                }
                if !reset {
                    self.lost
                        .note(name, "its sandbox stopped between calls".into());
                }
                self.sessions.lock().await.remove(name);
                s.destroy().await;
            }
            let stored = if reset {
                self.parking.discard_parked(name).await;
                self.carry.discard_snapshot(name).await;
                None
            } else if self.parking.has_parked(name) {
                notices.extend(self.make_room(name).await?);
                let t0 = std::time::Instant::now();
                if let Some(s) = self.parking.resume_parked(name).await {
                    tracing::info!(session = %shown(name), container = %&s.container_id[..12.min(s.container_id.len())], ms = t0.elapsed().as_millis() as u64, "resumed the session the previous bridge parked");
                    self.ready.saw(&s);
                    self.carry.drop_snapshot(name).await;
                    let claim = self.hand_out(name, Arc::new(s)).await?;
                    return Ok((claim, Start::Resumed, notices));
                }
                // Another bridge took it (or it ended): its snapshot is not restored here
                // either, so that two bridges never both carry the session on.
                notices.push(NOT_RESUMED.to_string());
                None
            } else {
                match self.carry.stored_snapshot(name).await {
                    Some(l) if l.set_aside.is_some() => {
                        if !restore_failed {
                            notices.push(format!(
                                "session {:?} has a snapshot that is set aside: a restore of it failed ({}), so it is not restored again; this is a fresh interpreter (`mcp-code-bridge sessions list` shows it, `sessions rm` removes it)",
                                name.name(),
                                l.set_aside.as_deref().unwrap_or_default()
                            ));
                        }
                        None
                    }
                    other => other,
                }
            };
            // Started without `starting` (`new_sandbox` lets it go once the session is counted):
            // other sessions start beside it, up to the starts at once; a call naming this
            // session waits for it (`busy`).
            let (s, busy) = self.new_sandbox(name, &mut notices, guard).await?;
            let Some(listing) = stored else {
                let claim = self.hand_out(name, s).await?;
                drop(busy);
                return Ok((claim, Start::Fresh, notices));
            };
            // Restored without `starting` too: the restore is bounded by this call's time.
            busy.set_container(&s.container_id);
            match self
                .carry
                .restore_into(name, &s, listing, timeout, &mut notices)
                .await
            {
                Some(restore) => {
                    let start = match restore {
                        Restore::Restored(lost) => Start::Restored { lost },
                        Restore::Fresh => Start::Fresh,
                    };
                    let claim = self.hand_out(name, s).await?;
                    drop(busy);
                    return Ok((claim, start, notices));
                }
                // Closed and its snapshot set aside: a fresh one, as for a session without.
                None => restore_failed = true,
            }
        }
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
        if let Err(e) = self.ready.not_revoked() {
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

    /// Close every session and pooled sandbox: at shutdown, or when the engine refuses what
    /// they were started under.
    pub(crate) async fn close_all(&self) {
        let pooled = self.pool.drain();
        let live: Vec<Arc<Session>> = self.sessions.lock().await.drain().map(|(_, s)| s).collect();
        futures::future::join_all(
            live.iter()
                .map(|s| s.destroy())
                .chain(pooled.iter().map(|s| s.destroy())),
        )
        .await;
    }

    /// The live sessions not running code (at shutdown: to write their snapshots, to park them).
    pub(crate) async fn idle_sessions(&self) -> Vec<(SessionKey, Arc<Session>)> {
        self.sessions
            .lock()
            .await
            .iter()
            .filter(|(_, s)| !s.is_dead() && !s.is_busy())
            .map(|(k, s)| (k.clone(), Arc::clone(s)))
            .collect()
    }

    /// `name`'s session is no longer `s` (it was reset, parked): taken out of the table if it
    /// still is.
    pub(crate) async fn forget(&self, name: &SessionKey, s: &Arc<Session>) {
        let mut sessions = self.sessions.lock().await;
        if sessions.get(name).is_some_and(|cur| Arc::ptr_eq(cur, s)) {
            sessions.remove(name);
        }
    }

    /// Session `name`'s interpreter went without a reply that said so: its next call says why.
    pub(crate) fn note_lost(&self, name: &SessionKey, why: String) {
        self.lost.note(name, why);
    }

    /// The notice for a fresh interpreter of `name`, if its last one went unannounced.
    pub(crate) fn take_lost(&self, name: &SessionKey) -> Option<String> {
        self.lost.take(name)
    }

    /// Every kept file of the live sessions, as `(session, file)`.
    pub(crate) async fn files(&self) -> Vec<(SessionKey, crate::files::OutFile)> {
        let sessions = self.sessions.lock().await;
        let mut all = Vec::new();
        for (name, s) in sessions.iter().filter(|(_, s)| !s.is_dead()) {
            all.extend(s.files.list().into_iter().map(|f| (name.clone(), f)));
        }
        all
    }

    /// The store of session `session`'s kept files, while it is live.
    pub(crate) async fn file_store(&self, session: &SessionKey) -> Option<Arc<OutStore>> {
        match self.sessions.lock().await.get(session) {
            Some(s) if !s.is_dead() => Some(Arc::clone(&s.files)),
            _ => None,
        }
    }

    /// `runtime.fork(name, reset=True)`: session `key` goes in every form (live, parked, kept),
    /// unless it is running code. Called with `starting` held.
    pub(crate) async fn replace_for_fork(&self, key: &SessionKey) -> Result<(), Occupied> {
        if self.busy.contains(key) {
            return Err(Occupied::Held(key.name().to_string()));
        }
        let live = {
            let mut sessions = self.sessions.lock().await;
            match sessions.get(key) {
                Some(s) if s.is_busy() => {
                    return Err(Occupied::Running(key.name().to_string()));
                }
                Some(_) => sessions.remove(key),
                None => None,
            }
        };
        if let Some(s) = live {
            tracing::info!(session = %shown(key), "closing the session: a fork replaces it");
            s.destroy().await;
        }
        self.parking.discard_parked(key).await;
        Ok(())
    }

    /// Whether session `key` exists in any form: live here, parked by the bridge before, or
    /// kept as a snapshot.
    pub(crate) async fn session_exists(&self, key: &SessionKey) -> bool {
        self.busy.contains(key)
            || self
                .sessions
                .lock()
                .await
                .get(key)
                .is_some_and(|s| !s.is_dead())
            || self.parking.has_parked(key)
            || {
                let state = self.config.state_dir.clone();
                let k = key.clone();
                tokio::task::spawn_blocking(move || snapshots::find(&state, &k).is_some())
                    .await
                    .unwrap_or(true)
            }
    }
}

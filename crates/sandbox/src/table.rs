//! The session table: a call's session found by its key or started (`session`), handed out
//! (`hand_out`), room made under `max_sessions` (`make_room`), what went without a reply
//! remembered for the next call (`Lost`), idle sessions and strays reaped.

use super::*;

/// How a call's session came to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// It was running already.
    Running,
    /// Started for this call (or a pooled sandbox handed to it).
    Fresh,
    /// Taken from the bridge before this one, its state as it was (`sandbox::resume`).
    Resumed,
    /// Started for this call with its snapshot restored (`sandbox::snapshots`): the names that
    /// could not be kept or brought back, as `name (type)`.
    Restored { lost: Vec<String> },
}

/// The notice of a call whose session a keeper held but that could not be resumed.
const NOT_RESUMED: &str = "the bridge before this one left this session running, but it could not be resumed (another bridge took it, or it had ended); this is a fresh interpreter";

impl Sandbox {
    pub(super) async fn live_sessions(&self) -> usize {
        self.sessions
            .lock()
            .await
            .values()
            .filter(|s| !s.is_dead())
            .count()
    }

    /// The live session `name`, started if needed (or resumed from the bridge before this one,
    /// `sandbox::resume`, or restored from its snapshot within `timeout`, the call's); with
    /// `reset`, a fresh one. Also returns how it came to be, and notices for the caller (a
    /// session closed to make room, a snapshot that could not be restored).
    pub async fn session(
        &self,
        name: &SessionKey,
        reset: bool,
        timeout: Duration,
    ) -> Result<(Claim, Start, Vec<String>), SandboxError> {
        self.not_revoked()?;
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
                self.discard_parked(name).await;
                self.discard_snapshot(name).await;
                None
            } else if self.has_parked(name) {
                notices.extend(self.make_room(name).await?);
                let t0 = std::time::Instant::now();
                if let Some(s) = self.resume_parked(name).await {
                    tracing::info!(session = %crate::shown(name), container = %&s.container_id[..12.min(s.container_id.len())], ms = t0.elapsed().as_millis() as u64, "resumed the session the previous bridge parked");
                    self.saw(&s);
                    self.drop_snapshot(name).await;
                    let claim = self.hand_out(name, Arc::new(s)).await?;
                    return Ok((claim, Start::Resumed, notices));
                }
                // Another bridge took it (or it ended): its snapshot is not restored here
                // either, so that two bridges never both carry the session on.
                notices.push(NOT_RESUMED.to_string());
                None
            } else {
                match self.stored_snapshot(name).await {
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
                .restore_into(name, &s, listing, timeout, &mut notices)
                .await
            {
                Some(start) => {
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
    pub(super) async fn hand_out(
        &self,
        name: &SessionKey,
        s: Arc<Session>,
    ) -> Result<Claim, SandboxError> {
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
    /// lose work in flight). Called with `starting` held, so no other session is counted
    /// meanwhile and the pool can only shrink; pooled sandboxes and sessions being started
    /// (held `busy`) count too.
    pub(super) async fn make_room(&self, name: &SessionKey) -> Result<Vec<String>, SandboxError> {
        let max = self.config.max_sessions as usize;
        // Under `serve` an identity's sessions are also bounded on their own, and make room
        // among themselves first: one user cannot close everyone else's sessions.
        let owner = name.owner();
        let per_identity = self.config.http.max_sessions_per_identity as usize;
        let mut notices = Vec::new();
        let mut tried = HashSet::new();
        let mut waited = Duration::ZERO;
        loop {
            if let Some(n) = self.end_oldest_parked(name, max, &mut tried).await {
                notices.extend(n);
                continue;
            }
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
                } else if live.len() + self.pool.held() + self.busy.others(name) >= max {
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
                // Sessions being closed (their snapshots written) or restored end within their
                // bounds, and hold no lock: wait for one, then count again.
                if self.busy.others(name) > 0 && waited < BUSY_WAIT {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    waited += Duration::from_millis(100);
                    continue;
                }
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
            tracing::info!(session = %crate::shown(&victim), idle_secs = idle, limit, key, "closing the least recently used session to make room");
            let snapshot = self
                .snapshot_before_close(&victim, &s, carry::Closed::MaxSessions)
                .await;
            s.destroy().await;
            let shown = if victim.owner() == owner {
                format!("session {:?}", victim.name())
            } else {
                "another user's session".to_string()
            };
            let kept = matches!(snapshot, Some(Ok(_)));
            if !kept {
                self.lost.note(
                    &victim,
                    format!("it was closed, unused for {idle}s, to stay within {key} = {limit}"),
                );
            }
            notices.push(if kept {
                format!(
                    "{shown} (unused for {idle}s) was closed to stay within {key} = {limit}; its state was kept as a snapshot, restored by the next call that names it"
                )
            } else {
                format!(
                    "{shown} (unused for {idle}s) was closed to stay within {key} = {limit}; its variables are gone"
                )
            });
        }
    }

    /// Sessions a bridge before this one parked count toward `max_sessions` (their containers
    /// run), and under `serve` an identity's toward `http.max_sessions_per_identity`: when they
    /// make either full, the oldest parked one that counts is ended, before any live session is
    /// closed. `Some` (with the caller's notice, if it was the caller's own) when one was ended;
    /// each is tried once (a keeper that does not answer is left to its time).
    async fn end_oldest_parked(
        &self,
        name: &SessionKey,
        max: usize,
        tried: &mut HashSet<String>,
    ) -> Option<Vec<String>> {
        let me = name.to_string();
        let state = self.config.state_dir.clone();
        let parked: Vec<parked::Parked> = tokio::task::spawn_blocking(move || parked::list(&state))
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.key() != me && !tried.contains(&p.key()))
            .collect();
        if parked.is_empty() {
            return None;
        }
        let owner = name.owner();
        let (live, mine_live) = {
            let sessions = self.sessions.lock().await;
            let live: Vec<&SessionKey> = sessions
                .iter()
                .filter(|(k, s)| *k != name && !s.is_dead())
                .map(|(k, _)| k)
                .collect();
            let mine = live.iter().filter(|k| k.owner() == owner).count();
            (live.len(), mine)
        };
        let mine: Vec<&parked::Parked> = parked
            .iter()
            .filter(|p| p.identity.as_deref() == owner.name())
            .collect();
        let per_identity = self.config.http.max_sessions_per_identity as usize;
        let (oldest, limit, limit_key) =
            if *owner != Identity::Local && mine_live + mine.len() >= per_identity {
                // Only its own parked sessions make room for an identity at its own bound.
                (
                    *mine.first()?,
                    per_identity,
                    "http.max_sessions_per_identity",
                )
            } else if live + self.pool.held() + self.busy.others(name) + parked.len() >= max {
                (&parked[0], max, "max_sessions")
            } else {
                return None;
            };
        let key = oldest.key();
        tried.insert(key.clone());
        let state = self.config.state_dir.clone();
        let k = key.clone();
        let ended = tokio::task::spawn_blocking(move || parked::end(&state, &k))
            .await
            .ok()
            .flatten();
        tracing::info!(session = %bridge_core::text::visible(&key), ended = ended.is_some(), limit, key = limit_key, "ending a session the bridge before this one parked, to make room");
        let ended_key = SessionKey::new(
            oldest
                .identity
                .clone()
                .map_or(Identity::Local, Identity::Named),
            oldest.session.clone(),
        );
        // Its bridge wrote its snapshot as it exited: then it is restored by the call naming it.
        let kept = ended.is_some() && self.has_snapshot(&ended_key).await;
        if ended.is_some() && !kept {
            self.lost.note(
                &ended_key,
                format!("it was parked by the bridge before this one and closed to stay within {limit_key} = {limit}"),
            );
        }
        let mut notices = Vec::new();
        if ended.is_some() && oldest.identity.as_deref() == name.owner().name() {
            notices.push(format!(
                "session {:?}, parked by the bridge before this one, was closed to stay within {limit_key} = {limit}; {}",
                oldest.session,
                if kept {
                    "its state is kept as a snapshot, restored by the next call that names it"
                } else {
                    "its variables are gone"
                }
            ));
        }
        Some(notices)
    }

    pub(super) async fn reap_idle(&self, idle: Duration) {
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
        // Taken out of the table under `starting`, as `make_room` closes (chosen again under
        // it, and taken out in the same step, under `sessions`, where calls claim theirs: one
        // that `make_room` closed while this waited is no longer there, and one a call claimed
        // is busy, so each session is closed once). Each is then `busy` until its container is
        // gone: counted toward `max_sessions` as the container it still is, and a call naming
        // it waits for its snapshot. Its snapshot is written after `starting` is let go: a
        // snapshot that takes long (or never ends, until `max_timeout`) keeps no other
        // session's start waiting.
        let closing: Vec<(SessionKey, Arc<Session>, BusyGuard<'_>)> = {
            let _starting = self.starting.lock().await;
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
                    tracing::info!(session = %crate::shown(&name), "removing idle sandbox");
                    let busy = self.busy.hold(&name, &s.container_id);
                    Some((name, s, busy))
                })
                .collect()
        };
        // Together, so the slowest bounds them all; each writes its snapshot first.
        futures::future::join_all(closing.into_iter().map(|(name, s, busy)| async move {
            let idle = s.idle_for().as_secs();
            if let Some(Err(why)) = self
                .snapshot_before_close(&name, &s, carry::Closed::Idle)
                .await
            {
                self.lost.note(
                    &name,
                    format!(
                        "it was closed, unused for {idle}s, and its snapshot was not kept: {why}"
                    ),
                );
            }
            s.destroy().await;
            drop(busy);
        }))
        .await;
    }

    /// Remove containers of this bridge that no live session uses. A removal that failed while
    /// the engine was unreachable (a restarted podman service) leaves such a stray; this retries
    /// it (tests/e2e/faults_lifecycle.rs::lifecycle_podman_service_restarted_under_a_live_session).
    /// With `all`, every container of this bridge goes (shutdown).
    pub(super) async fn reap_strays(&self, all: bool) {
        let Some(engine) = self.engine.get() else {
            return;
        };
        // No session is counted or closed while we compare...
        let _starting = self.starting.lock().await;
        // ... and no pooled one or session's either (each is created before the pool or the
        // table holds it, and `busy` names it only then): next time.
        if !all && (self.pool.filling() > 0 || self.busy.starting() > 0) {
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
        live.extend(self.parked.lock().unwrap().iter().cloned());
        if !all {
            // Sessions being closed or restored without `starting` still use theirs (held
            // under `starting`, so none joins while this compares).
            live.extend(self.busy.containers());
        }
        for id in ids.into_iter().filter(|id| !live.contains(id)) {
            tracing::info!(container = %id, "removing a container no session uses");
            container::remove(&engine.docker, &id).await;
        }
    }
}

/// The longest a start waits for room that sessions being closed or restored hold (each ends
/// within its own bound: `max_timeout` at most).
const BUSY_WAIT: Duration = Duration::from_secs(120);

/// Sessions out of the table while their state is written or restored (see `Sandbox::busy`),
/// with their containers (no stray for the reaper): a call naming one waits until its holder
/// is done ([`Busy::wait`]).
#[derive(Default)]
pub(super) struct Busy(std::sync::Mutex<HashMap<SessionKey, (BusyLock, String)>>);

/// What a call naming a [`Busy`] session waits on: locked by its holder until it is done.
type BusyLock = Arc<tokio::sync::Mutex<()>>;

/// A session held [`Busy`], until dropped.
pub(super) struct BusyGuard<'a> {
    busy: &'a Busy,
    key: SessionKey,
    lock: Arc<tokio::sync::Mutex<()>>,
    _held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Busy {
    /// Hold `key`, whose sandbox is `container`, or `""` while its sandbox is being started
    /// (it must not be held already: every holder takes it under `starting`).
    pub(super) fn hold(&self, key: &SessionKey, container: &str) -> BusyGuard<'_> {
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let held = Arc::clone(&lock).try_lock_owned().ok();
        self.0
            .lock()
            .unwrap()
            .insert(key.clone(), (Arc::clone(&lock), container.to_string()));
        BusyGuard {
            busy: self,
            key: key.clone(),
            lock,
            _held: held,
        }
    }

    /// Until `key` is not held.
    pub(super) async fn wait(&self, key: &SessionKey) {
        let lock = self.0.lock().unwrap().get(key).map(|(l, _)| Arc::clone(l));
        if let Some(lock) = lock {
            drop(lock.lock().await);
        }
    }

    pub(super) fn contains(&self, key: &SessionKey) -> bool {
        self.0.lock().unwrap().contains_key(key)
    }

    pub(super) fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Sessions held other than `key` (each is, or is about to be, a container).
    pub(super) fn others(&self, key: &SessionKey) -> usize {
        self.0.lock().unwrap().keys().filter(|k| *k != key).count()
    }

    /// Sessions held whose sandbox is being started (no container known yet).
    pub(super) fn starting(&self) -> usize {
        self.0
            .lock()
            .unwrap()
            .values()
            .filter(|(_, c)| c.is_empty())
            .count()
    }

    /// The containers of the sessions held.
    pub(super) fn containers(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .values()
            .filter(|(_, c)| !c.is_empty())
            .map(|(_, c)| c.clone())
            .collect()
    }
}

impl BusyGuard<'_> {
    /// The held session's sandbox is `container` from now on.
    pub(super) fn set_container(&self, container: &str) {
        if let Some((l, c)) = self.busy.0.lock().unwrap().get_mut(&self.key)
            && Arc::ptr_eq(l, &self.lock)
        {
            *c = container.to_string();
        }
    }
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        let mut m = self.busy.0.lock().unwrap();
        if m.get(&self.key)
            .is_some_and(|(l, _)| Arc::ptr_eq(l, &self.lock))
        {
            m.remove(&self.key);
        }
    }
}

/// Sessions whose interpreter went without a reply that said so (a call that reset it was
/// cancelled, its sandbox stopped between calls, it was closed to make room): the next call of
/// that name, which starts a fresh interpreter, says why. Bounded: a name seen again takes its
/// entry, and past [`Lost::MAX`] names an old entry goes.
#[derive(Default)]
pub(super) struct Lost(std::sync::Mutex<HashMap<SessionKey, String>>);

impl Lost {
    pub(super) const MAX: usize = 256;

    pub(super) fn note(&self, session: &SessionKey, why: String) {
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
    pub(super) fn take(&self, session: &SessionKey) -> Option<String> {
        let why = self.0.lock().unwrap().remove(session)?;
        Some(format!(
            "session {:?} was reset since its last reply ({why}); this call runs in a fresh interpreter: variables and imports are gone.",
            session.name()
        ))
    }
}

/// One call waiting for its session, counted in [`Sandbox::pending`] until dropped.
pub(super) struct Pending<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

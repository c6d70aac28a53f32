//! Sessions that outlive their bridge: at exit, each session that ran code is handed to a keeper
//! (`park`, one slot per session key) for `session_linger`, still running; the next bridge on
//! the same state dir takes it on the first call that names the session, its interpreter's
//! state as it was (`"resumed": "live"`).
//!
//! The same conditions as the parked pool sandbox (`park::eligible`: runc, `engine_linger`, no
//! inputs), and the same checks when taken (`Sandbox::take_parked`: the same container settings
//! and version, the same engine, still running, within its time), plus one: the keeper's slot
//! and the session it says it served are both the key asked for, so a session is only ever
//! resumed under its own name and, over `serve`, its own identity.

use super::*;

/// The notice of a call that resumed a parked session.
pub(super) const RESUMED: &str = "resumed this session from the bridge before this one: its variables, imports and files are as that bridge left them";

impl Sandbox {
    /// Park its live sessions when it shuts down (`run`, `serve`), with `session_linger`.
    pub fn park_sessions_at_exit(&self) {
        self.parks_sessions.store(true, Ordering::SeqCst);
    }

    /// Whether this bridge's sessions are parked when it exits: `run` or `serve`, with
    /// `park::sessions_eligible`. Sessions are then attached on connections of their own.
    pub(super) fn parks_sessions(&self) -> bool {
        self.parks_sessions.load(Ordering::SeqCst) && park::sessions_eligible(&self.config)
    }

    /// At shutdown, when [`Sandbox::parks_sessions`]: hand every live session that is not
    /// running code to a keeper, for the next bridge. One that cannot be parked stays in the
    /// table and is closed with the rest.
    pub(super) async fn park_sessions(&self) {
        if !self.parks_sessions() || self.revoked.get().is_some() {
            return;
        }
        let Some(engine) = self.engine.get() else {
            return;
        };
        let linger = park::session_linger(&self.config);
        let candidates: Vec<(SessionKey, Arc<Session>)> = self
            .sessions
            .lock()
            .await
            .iter()
            .filter(|(_, s)| !s.is_dead() && !s.is_busy())
            .map(|(k, s)| (k.clone(), Arc::clone(s)))
            .collect();
        let parked = futures::future::join_all(candidates.into_iter().map(|(key, s)| async move {
            let slot = park::Slot::Session(key.to_string());
            let result = self.park(engine, &s, slot, linger).await;
            (key, s, result)
        }))
        .await;
        let mut sessions = self.sessions.lock().await;
        for (key, s, result) in parked {
            match result {
                Ok(()) => {
                    if sessions.get(&key).is_some_and(|cur| Arc::ptr_eq(cur, &s)) {
                        sessions.remove(&key);
                    }
                    self.parked.lock().unwrap().push(s.container_id.clone());
                    tracing::info!(session = %crate::shown(&key), container = %&s.container_id[..12.min(s.container_id.len())], ?linger, "parked the session for the next bridge");
                }
                Err(e) => {
                    tracing::info!(session = %crate::shown(&key), "could not park the session (closed with the bridge): {e}");
                }
            }
        }
    }

    /// Whether a keeper's socket for session `key` is there (its keeper may have ended since).
    pub(super) fn has_parked(&self, key: &SessionKey) -> bool {
        park::sessions_eligible(&self.config)
            && park::socket_of(
                &self.config.state_dir,
                &park::Slot::Session(key.to_string()),
            )
            .exists()
    }

    /// The session `key` that a bridge before this one parked, if a keeper holds it and it may
    /// be taken (`Sandbox::take_parked`). Called with `starting` held.
    pub(super) async fn resume_parked(&self, key: &SessionKey) -> Option<Session> {
        if !self.has_parked(key) {
            return None;
        }
        self.take_parked(park::Slot::Session(key.to_string())).await
    }

    /// On a reset: the parked session `key`, if any, is taken and closed, so that it does not
    /// come back later.
    pub(super) async fn discard_parked(&self, key: &SessionKey) {
        if let Some(s) = self.resume_parked(key).await {
            tracing::info!(session = %crate::shown(key), "closing the parked session: the call asked for a reset");
            s.destroy().await;
        }
    }
}

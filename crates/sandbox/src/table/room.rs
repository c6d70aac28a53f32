//! Room under `max_sessions` (and, under `serve`, `http.max_sessions_per_identity`) before a
//! session starts: a session the bridge before parked ends first, then the least recently used
//! idle session is closed (its state written first, when sessions' states are kept).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bridge_core::identity::{Identity, SessionKey};

use super::Table;
use super::busy::BUSY_WAIT;
use crate::carry::Closed;
use crate::error::SandboxError;
use crate::name::shown;
use crate::parked;
use crate::session::Session;

impl Table {
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
            tracing::info!(session = %shown(&victim), idle_secs = idle, limit, key, "closing the least recently used session to make room");
            let snapshot = self
                .carry
                .snapshot_before_close(&victim, &s, Closed::MaxSessions)
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
        let kept = ended.is_some() && self.carry.has_snapshot(&ended_key).await;
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
}

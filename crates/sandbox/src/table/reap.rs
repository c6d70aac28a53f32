//! Sessions idle past `runtime_idle_timeout` closed (their state written first), and
//! containers of this bridge that no session uses removed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bridge_core::identity::SessionKey;

use super::Table;
use super::busy::BusyGuard;
use crate::carry::Closed;
use crate::container;
use crate::name::shown;
use crate::session::Session;

impl Table {
    pub(crate) async fn reap_idle(&self, idle: Duration) {
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
                    tracing::info!(session = %shown(&name), "removing idle sandbox");
                    let busy = self.busy.hold(&name, &s.container_id);
                    Some((name, s, busy))
                })
                .collect()
        };
        // Together, so the slowest bounds them all; each writes its snapshot first.
        futures::future::join_all(closing.into_iter().map(|(name, s, busy)| async move {
            let idle = s.idle_for().as_secs();
            if let Some(Err(why)) = self
                .carry
                .snapshot_before_close(&name, &s, Closed::Idle)
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
    pub(crate) async fn reap_strays(&self, all: bool) {
        let Some(engine) = self.ready.connected() else {
            return;
        };
        // Listed before anything is held: the engine's listing waits for every container's
        // lock, and another tenant's container being removed (one that held thousands of tasks
        // under gVisor) can hold one for as long as the listing's 30 s. Meanwhile sessions
        // start and close as usual. Comparing a listing older than the table is safe: a
        // container listed was made before the listing, so at the comparison below it is in
        // the table, the pool or `busy`, still being started (then nothing is removed this
        // time), or already being removed (removed twice: harmless).
        let ids = match container::owned_by(engine, self.ready.owner()).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::debug!("could not list this bridge's containers: {e}");
                return;
            }
        };
        // No session is counted or closed while we compare...
        let _starting = self.starting.lock().await;
        // ... and no pooled one or session's either (each is created before the pool or the
        // table holds it, and `busy` names it only then): next time.
        if !all && (self.pool.filling() > 0 || self.busy.starting() > 0) {
            return;
        }
        let mut live: HashSet<String> = HashSet::new();
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
        live.extend(self.parking.parked_ids());
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

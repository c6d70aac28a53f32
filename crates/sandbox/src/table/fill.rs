//! The pool kept filled within `pool_size` and, with the sessions, within `max_sessions`
//! (`refill`), and the table closed at shutdown (`close`): every start given up or waited for,
//! every container removed.

use std::sync::Arc;
use std::time::Duration;

use super::Table;
use crate::container::Role;
use crate::park;
use crate::pool::starts_at_once;

impl Table {
    /// Start pooled sandboxes in the background until the pool holds its target, within
    /// `max_sessions` with the live sessions. Not while the bridge is idle or shutting down, nor
    /// before the engine is connected.
    pub(crate) fn refill(self: &Arc<Self>) {
        if !self.pool.is_enabled()
            || self.pool.is_closed()
            || self.pool.idle_for() >= self.config.runtime_idle_timeout.0
            || self.ready.connected().is_none()
            || !self.pool.begin_refill()
        {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            // Up to the starts at once; each fills until the pool holds its target.
            let fillers = (0..starts_at_once()).map(|_| async { while this.fill_one().await {} });
            futures::future::join_all(fillers).await;
            this.pool.end_refill();
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
            if self.pool.is_closed()
                || self.pool.idle_for() >= self.config.runtime_idle_timeout.0
                || self.pool.held() >= self.pool.target(self.config.pool_size as usize)
                || live + self.pool.held() + self.busy.len() >= self.config.max_sessions as usize
                || self.ready.memory_short().is_some()
            {
                return false;
            }
            self.pool.reserve();
        }
        let serial = self.ready.next_serial();
        // Attached on a connection of its own when it may be parked at exit (`park`).
        let socket = engine
            .unix_socket()
            .filter(|_| park::eligible(&self.config));
        let start = self
            .ready
            .start(&engine, Role::Pool, serial, socket.as_deref(), None);
        // Given up when the bridge shuts down; the container it may have created is removed by
        // the shutdown's sweep of every container this bridge owns.
        let Some(started) = self.closing.run_until_cancelled(start).await else {
            self.pool.filled(None);
            return false;
        };
        match started {
            Ok(s)
                if self.pool.is_closed()
                    || self.ready.is_revoked()
                    || self.pool.idle_for() >= self.config.runtime_idle_timeout.0 =>
            {
                // Said as the reaper says it of a waiting one: a boot that outlasted the idle
                // timeout (seconds under gVisor's ptrace platform) ends the same way.
                if !self.pool.is_closed() && !self.ready.is_revoked() {
                    tracing::info!(container = %s.container_id, "removing a pooled sandbox: no call for {}s", self.pool.idle_for().as_secs());
                }
                s.destroy().await;
                self.pool.filled(None);
                false
            }
            Ok(s) => {
                self.ready.saw(&s);
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

    /// At shutdown, after sessions were parked: nothing is added to the pool any more, a
    /// pooled sandbox still booting is given up, every start ends (boundedly), and every
    /// session, pooled sandbox and container of this bridge is removed.
    pub(crate) async fn close(&self) {
        self.pool.close();
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
    }
}

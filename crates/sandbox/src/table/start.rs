//! A new session's sandbox (`new_sandbox`): a pooled one, or one started for it. Starts run
//! side by side, up to [`starts_at_once`](crate::pool::starts_at_once); what must not change
//! meanwhile is counted under `Table::starting` first (the session is held `busy` from then
//! on: counted toward `max_sessions`, waited for by a call naming it, never taken for a stray).
//! No sandbox starts while the host's available memory is under `memory_reserve`.

use std::sync::Arc;
use std::time::Duration;

use bridge_core::identity::SessionKey;

use super::Table;
use super::busy::BusyGuard;
use crate::container::Role;
use crate::error::SandboxError;
use crate::name::shown;
use crate::session::{self, Session};

impl Table {
    /// A sandbox for session `name`, not handed out yet: a pooled one, or one started now
    /// (after room is made for it). Called with `starting` held (`guard`): the session is held
    /// [`Busy`] from then on, so it counts toward `max_sessions` and a call naming it waits,
    /// and `starting` is let go before any wait, so that other sessions start meanwhile (within
    /// `Table::start_permits`).
    pub(super) async fn new_sandbox<'a>(
        &'a self,
        name: &SessionKey,
        notices: &mut Vec<String>,
        guard: tokio::sync::MutexGuard<'a, ()>,
    ) -> Result<(Arc<Session>, BusyGuard<'a>), SandboxError> {
        let busy = self.busy.hold(name, "");
        self.pool.started_one();
        let from = |how: &'static str| {
            let attr = bridge_core::trace::Attr::new("mcp_code_bridge.sandbox.from", how);
            bridge_core::trace::set(&bridge_core::trace::Context::current(), vec![attr]);
        };
        let hand = |mut s: Session, busy: &BusyGuard<'_>| {
            busy.set_container(&s.container_id);
            let serial = self.ready.next_serial();
            s.hand_to(&name.to_string(), serial);
            from("pool");
            Arc::new(s)
        };
        // A pooled sandbox never served a session: it is as fresh as one started now. When none
        // is ready, one being started is waited for when there is no room for another, or when
        // it should be done before one started now would be (and no other call waits for it).
        if let Some(s) = self.pool.take(Duration::ZERO).await {
            return Ok((hand(s, &busy), busy));
        }
        let mut guard = Some(guard);
        if self.pool.filling() > self.pool.waiting()
            && (self.pool.worth_waiting()
                || self.live_sessions().await + self.pool.held() + self.busy.others(name)
                    >= self.config.max_sessions as usize)
        {
            drop(guard.take());
            if let Some(s) = self.pool.take(session::START_TIMEOUT).await {
                return Ok((hand(s, &busy), busy));
            }
        }
        from("started");
        if let Some((available, reserve)) = self.ready.memory_short() {
            tracing::warn!(session = %shown(name), available_mib = available >> 20, reserve_mib = reserve >> 20, "refusing a new session: the host's available memory is under memory_reserve");
            return Err(SandboxError::MemoryReserve {
                session: name.name().to_string(),
                available,
                reserve,
            });
        }
        let engine = self.ready.engine().await?;
        let guard = match guard {
            Some(g) => g,
            None => self.starting.lock().await,
        };
        notices.extend(self.make_room(name).await?);
        drop(guard);
        let _permit = self.start_permits.acquire().await;
        let serial = self.ready.next_serial();
        let t0 = std::time::Instant::now();
        tracing::debug!(session = %shown(name), serial, "starting a sandbox for the session");
        // The engine's checks (begun by the warm-up) finish while the container is created,
        // started and booted; the user's code reaches it only once they passed.
        let gate: session::Gate<'_> = Box::pin(async { self.prepare().await.map(|_| ()) });
        // Attached on a connection of its own when it may be parked at exit (`resume`).
        let socket = engine
            .unix_socket()
            .filter(|_| self.parking.parks_sessions());
        let s = Arc::new(
            self.ready
                .start(
                    &engine,
                    Role::Session(&name.to_string()),
                    serial,
                    socket.as_deref(),
                    Some(gate),
                )
                .await?,
        );
        tracing::info!(session = %shown(name), serial, container = %&s.container_id[..12.min(s.container_id.len())], ms = t0.elapsed().as_millis() as u64, "started a sandbox for the session");
        self.pool.cold_took(t0.elapsed());
        self.ready.saw(&s);
        Ok((s, busy))
    }
}

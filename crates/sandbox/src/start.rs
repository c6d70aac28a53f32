//! A new session's sandbox (`new_sandbox`): a pooled one, or one started for it. Starts run
//! side by side, up to [`starts_at_once`]; what must not change meanwhile is counted under
//! `Sandbox::starting` first (the session is held `busy` from then on: counted toward
//! `max_sessions`, waited for by a call naming it, never taken for a stray). No sandbox starts
//! while the host's available memory is under `memory_reserve` (`memory_short`).

use super::*;
use crate::table::BusyGuard;

/// Containers started at once (sessions' and the pool's): one per core, at least 2 and at most
/// 32. A start is the engine's and the interpreter's CPU: measured on 2 cores (BENCHMARKS.md,
/// 11d), 6 at once took 6 times as long each as one alone, and slowed the running sessions'
/// calls, for no start done sooner.
pub fn starts_at_once() -> usize {
    cores().clamp(2, 32)
}

/// The most sandboxes the pool holds while new sessions come: 4 per core, at most 16 (a pooled
/// sandbox holds what a pandas session holds, about 51 MiB: 816 MiB at most).
pub(crate) fn pool_most() -> usize {
    (cores() * 4).min(16)
}

fn cores() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

impl Sandbox {
    /// A sandbox for session `name`, not handed out yet: a pooled one, or one started now
    /// (after room is made for it). Called with `starting` held (`guard`): the session is held
    /// [`Busy`] from then on, so it counts toward `max_sessions` and a call naming it waits,
    /// and `starting` is let go before any wait, so that other sessions start meanwhile (within
    /// [`Sandbox::start_permits`]).
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
            let serial = self.serial.fetch_add(1, Ordering::Relaxed);
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
        if let Some((available, reserve)) = self.memory_short() {
            tracing::warn!(session = %crate::shown(name), available_mib = available >> 20, reserve_mib = reserve >> 20, "refusing a new session: the host's available memory is under memory_reserve");
            return Err(SandboxError::MemoryReserve {
                session: name.name().to_string(),
                available,
                reserve,
            });
        }
        let engine = self.engine().await?;
        let guard = match guard {
            Some(g) => g,
            None => self.starting.lock().await,
        };
        notices.extend(self.make_room(name).await?);
        drop(guard);
        let _permit = self.start_permits.acquire().await;
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let t0 = std::time::Instant::now();
        tracing::debug!(session = %crate::shown(name), serial, "starting a sandbox for the session");
        // The engine's checks (begun by the warm-up) finish while the container is created,
        // started and booted; the user's code reaches it only once they passed.
        let gate: session::Gate<'_> = Box::pin(async { self.prepare().await.map(|_| ()) });
        // Attached on a connection of its own when it may be parked at exit (`resume`).
        let socket = engine.unix_socket().filter(|_| self.parks_sessions());
        let s = Arc::new(
            Session::start(
                &engine,
                &self.config,
                &self.compiled,
                Role::Session(&name.to_string()),
                &self.owner,
                serial,
                self.provision.get(),
                socket.as_deref(),
                Some(gate),
            )
            .await?,
        );
        tracing::info!(session = %crate::shown(name), serial, container = %&s.container_id[..12.min(s.container_id.len())], ms = t0.elapsed().as_millis() as u64, "started a sandbox for the session");
        self.pool.cold_took(t0.elapsed());
        self.saw(&s);
        Ok((s, busy))
    }

    /// How many sandboxes the pool holds: `pool_size`, or as many as new sessions took in the
    /// last two minutes, at most [`pool_most`].
    pub(super) fn pool_target(&self) -> usize {
        self.pool
            .target(self.config.pool_size as usize, pool_most())
    }

    /// The host's available memory and `memory_reserve`, when the first is under the second
    /// (`None` with no reserve, or where the host does not say).
    pub(super) fn memory_short(&self) -> Option<(u64, u64)> {
        let reserve = self.config.memory_reserve.0;
        if reserve == 0 {
            return None;
        }
        let available = bridge_core::procfs::mem_available()?;
        (available < reserve).then_some((available, reserve))
    }
}

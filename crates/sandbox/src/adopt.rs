//! Parking and adoption: a bridge that exits hands a ready pooled sandbox to a keeper
//! (`park_one`), and the next bridge on the same state dir takes it (`adopt_parked`) when it
//! would have made the very same one and it still runs; else it is removed and the call starts
//! its own.

use super::*;

/// How long a bridge that exits waits for a pooled sandbox still booting, to park it: within
/// what an MCP client waits after closing a server's stdin before it sends SIGTERM (2 s for the
/// official Python SDK; SIGTERM does not cut a shutdown short).
pub(super) const PARK_WAIT: Duration = Duration::from_millis(1500);

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

    pub(super) async fn adopt(&self) -> Option<Session> {
        self.take_parked(park::Slot::Pool).await
    }

    /// Take the sandbox a keeper holds in `slot` (see [`Sandbox::adopt`]): a pooled sandbox, or
    /// a parked session, which must have served exactly that session (`sandbox::resume`).
    pub(super) async fn take_parked(&self, slot: park::Slot) -> Option<Session> {
        let state = self.config.state_dir.clone();
        let asked = slot.clone();
        let (claimed, engine) = tokio::join!(
            tokio::task::spawn_blocking(move || park::claim(&state, &asked)),
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
                let _ = tokio::task::spawn_blocking(move || crate::pkgdir::remove(&dir)).await;
            }
        };
        let served = slot.session();
        if meta.session.as_deref() != served {
            drop(fd);
            remove("it served another session than the one asked for".into()).await;
            return None;
        }
        if meta.spec != park::spec_digest(&self.config, engine.host_ids(&self.config)) {
            drop(fd);
            remove("it was made with other settings (or by another version)".into()).await;
            return None;
        }
        if meta.endpoint != engine.endpoint || meta.expires <= bridge_core::clock::now_secs() {
            drop(fd);
            remove("it runs on another engine, or its time is over".into()).await;
            return None;
        }
        // The keeper's connection outlives its container when something else removed it (a
        // prune, `podman rm`): a sandbox that is not running is not taken, and the call starts
        // its own.
        if !container::running(&engine.docker, &meta.container_id).await {
            drop(fd);
            remove("its container is gone or not running".into()).await;
            return None;
        }
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let role = served.map_or(Role::Pool, Role::Session);
        let base = container::container_name(role, serial);
        let name = container::adopted_name(&base, &self.owner);
        let suffix = name[base.len()..].to_string();
        let packages = crate::pkgdir::record(&self.config, &name);
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
        let serves = served.unwrap_or(&name).to_string();
        match Session::adopt(
            &engine.docker,
            &self.config,
            &meta,
            fd,
            &serves,
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
    pub(super) async fn park_one(&self) {
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
        let linger = self.config.engine_linger.0;
        match self.park(engine, &s, park::Slot::Pool, linger).await {
            Ok(()) => {
                self.parked.lock().unwrap().push(s.container_id.clone());
                tracing::info!(container = %&s.container_id[..12.min(s.container_id.len())], linger = ?self.config.engine_linger.0, "parked a ready sandbox for the next bridge");
            }
            Err(e) => {
                tracing::info!("could not park a ready sandbox (removed): {e}");
                s.destroy().await;
            }
        }
    }

    /// Hand `s` to a keeper of `slot` for `linger`: renamed with the parked mark (which the
    /// reapers of every bridge leave alone until it expires), its package directory moved with
    /// it.
    pub(super) async fn park(
        &self,
        engine: &Engine,
        s: &Session,
        slot: park::Slot,
        linger: Duration,
    ) -> Result<(), String> {
        let fd = s
            .take_park_fd()
            .ok_or("it was not attached on a connection of its own")?;
        let expires = bridge_core::clock::now_secs() + linger.as_secs().max(1);
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
        let to = from.with_file_name(format!("{}{expires}-{short}", crate::pkgdir::PARKED));
        std::fs::rename(&from, &to)
            .map_err(|e| format!("could not move its package directory: {e}"))?;
        let meta = park::Meta {
            container_id: id,
            name,
            python: s.python.clone(),
            target: s.interpreter.target.clone(),
            packages: to.clone(),
            spec: park::spec_digest(&self.config, engine.host_ids(&self.config)),
            endpoint: engine.endpoint.clone(),
            expires,
            podman: (engine.kind == engine::EngineKind::Podman)
                .then(|| engine::on_path("podman"))
                .flatten(),
            session: slot.session().map(str::to_string),
            parked_at: bridge_core::clock::now_secs(),
            used_at_ms: std::time::SystemTime::now()
                .checked_sub(s.idle_for())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64),
        };
        let state = self.config.state_dir.clone();
        let handed =
            tokio::task::spawn_blocking(move || park::hand_to_keeper(&state, &slot, &meta, fd))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
        if let Err(e) = handed {
            let _ = std::fs::rename(&to, &from);
            return Err(e);
        }
        Ok(())
    }
}

//! Parking and adoption: sandboxes that outlive their bridge.
//!
//! A bridge that exits hands a ready pooled sandbox to a keeper (`park_one`), and the next
//! bridge on the same state dir takes it (`adopt_parked`) when it would have made the very same
//! one and it still runs; else it is removed and the call starts its own.
//!
//! Sessions too: at exit, each session that ran code is handed to a keeper (`park_sessions`,
//! one slot per session key) for `session_linger`, still running; the next bridge on the same
//! state dir takes it on the first call that names the session, its interpreter's state as it
//! was (`"resumed": "live"`). The same conditions as the parked pool sandbox (`park::eligible`:
//! runc, `engine_linger`, no inputs), and the same checks when taken (`take_parked`: the same
//! container settings and version, the same engine, still running, within its time), plus one:
//! the keeper's slot and the session it says it served are both the key asked for, so a
//! session is only ever resumed under its own name and, over `serve`, its own identity.
//!
//! `park.rs` is the keeper's side (slots, sockets, the hand-over); this is the bridge's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bridge_core::config::Config;
use bridge_core::identity::SessionKey;

use crate::container::{self, ContainerError, Role};
use crate::engine::{self, Engine};
use crate::name::shown;
use crate::park::{self, ParkError};
use crate::pkgdir;
use crate::pool::Pool;
use crate::readiness::Readiness;
use crate::session::Session;

/// How long a bridge that exits waits for a pooled sandbox still booting, to park it: within
/// what an MCP client waits after closing a server's stdin before it sends SIGTERM (2 s for the
/// official Python SDK; SIGTERM does not cut a shutdown short).
const PARK_WAIT: Duration = Duration::from_millis(1500);

/// The notice of a call that resumed a parked session.
pub(crate) const RESUMED: &str = "resumed this session from the bridge before this one: its variables, imports and files are as that bridge left them";

/// Why a sandbox could not be parked (it is removed with the bridge instead).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ParkFailed {
    /// It was started without a connection of its own (`park::eligible` was off then).
    #[error("it was not attached on a connection of its own")]
    NoConnection,
    /// The engine did not rename it with the parked mark.
    #[error("could not rename it: {0}")]
    Rename(#[source] ContainerError),
    /// It has no package directory to move with it.
    #[error("it has no package directory")]
    NoPackages,
    /// Its package directory could not be moved with it.
    #[error("could not move its package directory: {0}")]
    MovePackages(#[source] std::io::Error),
    /// No keeper took it.
    #[error("{0}")]
    Keeper(#[source] ParkError),
    /// The hand-over's thread was lost (a panic).
    #[error("the hand-over did not finish: {0}")]
    Lost(#[source] tokio::task::JoinError),
}

/// The sandboxes this bridge parks at exit and takes from the bridge before it.
pub(crate) struct Parking {
    config: Arc<Config>,
    ready: Arc<Readiness>,
    pool: Arc<Pool>,
    /// The containers this bridge parked as it shut down: keepers hold them now, so the
    /// shutdown's sweep of this bridge's containers leaves them.
    parked: Mutex<Vec<String>>,
    /// Whether its live sessions are parked when it shuts down (`run` and `serve`, whose clients
    /// come back; not `exec`, whose next call expects a fresh interpreter).
    parks_sessions: AtomicBool,
    /// Whether [`Parking::adopt_parked`] ran (the warm-up runs twice).
    adopt_tried: AtomicBool,
}

impl Parking {
    /// Nothing parked or taken yet; sessions are not parked until `park_sessions_at_exit`.
    pub(crate) fn new(config: Arc<Config>, ready: Arc<Readiness>, pool: Arc<Pool>) -> Parking {
        Parking {
            config,
            ready,
            pool,
            parked: Mutex::new(Vec::new()),
            parks_sessions: AtomicBool::new(false),
            adopt_tried: AtomicBool::new(false),
        }
    }

    /// The containers this bridge parked (the shutdown's sweep leaves them).
    pub(crate) fn parked_ids(&self) -> Vec<String> {
        self.parked.lock().unwrap().clone()
    }

    /// Take the sandbox a bridge before this one parked on the same state dir (`park`), if a
    /// keeper holds one, as a pooled sandbox: the first call waits for it as for a pooled one
    /// being started (counted now, before any call can look). Never fails: a sandbox that
    /// cannot be taken, or was made with other settings, is removed and the call starts its own.
    pub(crate) fn adopt_parked(self: &Arc<Self>) {
        if !park::eligible(&self.config)
            || self.adopt_tried.swap(true, Ordering::SeqCst)
            || !park::socket(&self.config.state_dir).exists()
        {
            return;
        }
        self.pool.reserve();
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            let adopted = this.take_parked(park::Slot::Pool).await;
            if let Some(s) = &adopted {
                this.ready.saw(s);
                tracing::info!(container = %&s.container_id[..12.min(s.container_id.len())], ms = t0.elapsed().as_millis() as u64, "took the sandbox the previous bridge parked");
            }
            this.pool.filled(adopted);
        });
    }

    /// Park its live sessions when it shuts down (`run`, `serve`), with `session_linger`.
    pub(crate) fn park_sessions_at_exit(&self) {
        self.parks_sessions.store(true, Ordering::SeqCst);
    }

    /// Whether this bridge's sessions are parked when it exits: `run` or `serve`, with
    /// `park::sessions_eligible`. Sessions are then attached on connections of their own.
    pub(crate) fn parks_sessions(&self) -> bool {
        self.clients_come_back() && park::sessions_eligible(&self.config)
    }

    /// Whether this bridge's clients come back (`park_sessions_at_exit` was called: `run`,
    /// `serve`): its sessions are parked where they may be, and their states written
    /// (`Carry`).
    pub(crate) fn clients_come_back(&self) -> bool {
        self.parks_sessions.load(Ordering::SeqCst)
    }

    /// At shutdown, when [`Parking::parks_sessions`]: hand each of `candidates` (the live
    /// sessions not running code) to a keeper, for the next bridge. Returns those parked: the
    /// caller takes them out of its table; one that cannot be parked stays there and is closed
    /// with the rest.
    pub(crate) async fn park_sessions(
        &self,
        candidates: Vec<(SessionKey, Arc<Session>)>,
    ) -> Vec<(SessionKey, Arc<Session>)> {
        if !self.parks_sessions() || self.ready.is_revoked() {
            return Vec::new();
        }
        let Some(engine) = self.ready.connected() else {
            return Vec::new();
        };
        let linger = park::session_linger(&self.config);
        let parked = futures::future::join_all(candidates.into_iter().map(|(key, s)| async move {
            let slot = park::Slot::Session(key.to_string());
            let result = self.park(engine, &s, slot, linger).await;
            (key, s, result)
        }))
        .await;
        let mut out = Vec::new();
        for (key, s, result) in parked {
            match result {
                Ok(()) => {
                    self.parked.lock().unwrap().push(s.container_id.clone());
                    tracing::info!(session = %shown(&key), container = %&s.container_id[..12.min(s.container_id.len())], ?linger, "parked the session for the next bridge");
                    out.push((key, s));
                }
                Err(e) => {
                    tracing::info!(session = %shown(&key), "could not park the session (closed with the bridge): {e}");
                }
            }
        }
        out
    }

    /// Whether a keeper's socket for session `key` is there (its keeper may have ended since).
    pub(crate) fn has_parked(&self, key: &SessionKey) -> bool {
        park::sessions_eligible(&self.config)
            && park::socket_of(
                &self.config.state_dir,
                &park::Slot::Session(key.to_string()),
            )
            .exists()
    }

    /// The session `key` that a bridge before this one parked, if a keeper holds it and it may
    /// be taken (`Parking::take_parked`). Called with `starting` held.
    pub(crate) async fn resume_parked(&self, key: &SessionKey) -> Option<Session> {
        if !self.has_parked(key) {
            return None;
        }
        self.take_parked(park::Slot::Session(key.to_string())).await
    }

    /// On a reset: the parked session `key`, if any, is taken and closed, so that it does not
    /// come back later.
    pub(crate) async fn discard_parked(&self, key: &SessionKey) {
        if let Some(s) = self.resume_parked(key).await {
            tracing::info!(session = %shown(key), "closing the parked session: the call asked for a reset");
            s.destroy().await;
        }
    }
    /// Take the sandbox a keeper holds in `slot` (see [`Parking::adopt_parked`]): a pooled sandbox, or
    /// a parked session, which must have served exactly that session.
    async fn take_parked(&self, slot: park::Slot) -> Option<Session> {
        let state = self.config.state_dir.clone();
        let asked = slot.clone();
        let (claimed, engine) = tokio::join!(
            tokio::task::spawn_blocking(move || park::claim(&state, &asked)),
            self.ready.engine()
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
                let _ = tokio::task::spawn_blocking(move || pkgdir::remove(&dir)).await;
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
        let serial = self.ready.next_serial();
        let role = served.map_or(Role::Pool, Role::Session);
        let base = container::container_name(role, serial);
        let name = container::adopted_name(&base, self.ready.owner());
        let suffix = name[base.len()..].to_string();
        let packages = pkgdir::record(&self.config, &name);
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
    pub(crate) async fn park_one(&self) {
        if !park::eligible(&self.config) || !self.pool.is_enabled() || self.ready.is_revoked() {
            return;
        }
        let Some(engine) = self.ready.connected() else {
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
    async fn park(
        &self,
        engine: &Engine,
        s: &Session,
        slot: park::Slot,
        linger: Duration,
    ) -> Result<(), ParkFailed> {
        let fd = s.take_park_fd().ok_or(ParkFailed::NoConnection)?;
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
            .map_err(ParkFailed::Rename)?;
        let from = s
            .interpreter
            .packages
            .clone()
            .ok_or(ParkFailed::NoPackages)?;
        let to = from.with_file_name(format!("{}{expires}-{short}", pkgdir::PARKED));
        std::fs::rename(&from, &to).map_err(ParkFailed::MovePackages)?;
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
                .map_err(ParkFailed::Lost)
                .and_then(|r| r.map_err(ParkFailed::Keeper));
        if let Err(e) = handed {
            let _ = std::fs::rename(&to, &from);
            return Err(e);
        }
        Ok(())
    }
}

//! A session's state carried past its sandbox (`snapshots` is the store): written when the
//! session is closed without a caller (idle timeout, room made under `max_sessions`, the
//! bridge's exit, before it is parked), restored into a new sandbox by the next call that names
//! it (`"resumed": "snapshot"`), and copied into another session by `runtime.fork()`.
//!
//! Only under `run` and `serve` ([`Sandbox::park_sessions_at_exit`]: their clients come back;
//! `exec` expects a fresh interpreter), with `snapshot_max_size` above 0. A snapshot is only
//! ever restored into a sandbox of its own key (identity and name): the store finds it by the
//! key and checks the key it lists. Each step is an audit record (`snapshot`, `restore`, `fork`).

use super::*;
use bridge_core::audit::{SessionStateRecord, StateEvent};
use bridge_core::protocol::{RpcFailure, RpcHandler};
use serde_json::{Value, json};
use snapshots::Listing;

/// The longest the snapshots at the bridge's exit may take together: a client that restarts
/// its server does not wait for ever.
const AT_EXIT: Duration = Duration::from_secs(30);

/// The longest the snapshot of a session closed to make room under `max_sessions` may take: it
/// is written while a start waits for the room (under `starting`), so it has a short bound of
/// its own, not `max_timeout`.
const TO_MAKE_ROOM: Duration = Duration::from_secs(10);

/// Why a session was closed, as its snapshot's listing and audit record say.
#[derive(Debug, Clone, Copy)]
pub(super) enum Closed {
    Idle,
    MaxSessions,
    Exit,
}

impl Closed {
    fn as_str(self) -> &'static str {
        match self {
            Closed::Idle => "idle",
            Closed::MaxSessions => "max_sessions",
            Closed::Exit => "exit",
        }
    }
}

impl Sandbox {
    /// The audit log the session-state records go to (`server` sets it).
    pub fn set_audit(&self, audit: bridge_core::audit::Audit) {
        let _ = self.audit.set(audit);
    }

    fn audit(&self, event: StateEvent, r: SessionStateRecord) {
        if let Some(a) = self.audit.get() {
            a.session_state(event, r);
        }
    }

    /// Whether sessions' states are written and restored (see the module's text).
    pub(super) fn keeps_snapshots(&self) -> bool {
        self.parks_sessions.load(Ordering::SeqCst) && self.config.snapshot_max_size.0 > 0
    }

    /// How long a snapshot of a session closed for `why` may take: `max_timeout` (no lock is
    /// held meanwhile: only a call naming the session waits for it), [`TO_MAKE_ROOM`] for one
    /// closed while a start waits.
    fn snapshot_timeout(&self, why: Closed) -> Duration {
        match why {
            Closed::MaxSessions => self.config.max_timeout.0.min(TO_MAKE_ROOM),
            Closed::Idle | Closed::Exit => self.config.max_timeout.0,
        }
    }

    /// `key`'s stored snapshot, when there is one to restore.
    pub(super) async fn stored_snapshot(&self, key: &SessionKey) -> Option<Listing> {
        if !self.keeps_snapshots() {
            return None;
        }
        let state = self.config.state_dir.clone();
        let k = key.clone();
        tokio::task::spawn_blocking(move || snapshots::find(&state, &k))
            .await
            .ok()
            .flatten()
    }

    /// A session resumed live: its snapshot (written as its bridge exited) is older than it.
    pub(super) async fn drop_snapshot(&self, key: &SessionKey) {
        let state = self.config.state_dir.clone();
        let k = key.clone();
        let _ = tokio::task::spawn_blocking(move || snapshots::remove(&state, &k)).await;
    }

    /// Whether session `key` has a snapshot (for the notices of a session closed).
    pub(super) async fn has_snapshot(&self, key: &SessionKey) -> bool {
        self.keeps_snapshots() && self.stored_snapshot(key).await.is_some()
    }

    /// On a reset: `key`'s snapshot goes too.
    pub(super) async fn discard_snapshot(&self, key: &SessionKey) {
        let state = self.config.state_dir.clone();
        let k = key.clone();
        let removed = tokio::task::spawn_blocking(move || snapshots::remove(&state, &k))
            .await
            .unwrap_or(false);
        if removed {
            tracing::info!(session = %crate::shown(key), "removed the session's snapshot: the call asked for a reset");
            self.audit(
                StateEvent::SessionEnd,
                record(key, "reset", 0, Vec::new(), "ok", None, Duration::ZERO),
            );
        }
    }

    /// Restore `listing` into `s`, the fresh sandbox of session `key`, within `timeout` (the
    /// call's). Called without `starting`: the restore holds no lock another session needs,
    /// only the session's own name (`Busy`), so a call naming it waits and no other does.
    /// `Some` with how `s` starts (restored, or fresh when the snapshot was gone or unreadable);
    /// `None` when the restore failed: `s` is closed (no half-restored interpreter is handed
    /// out), and the snapshot is set aside, named in the notice and never restored again.
    pub(super) async fn restore_into(
        &self,
        key: &SessionKey,
        s: &Arc<Session>,
        listing: Listing,
        timeout: Duration,
        notices: &mut Vec<String>,
    ) -> Option<Start> {
        let t0 = std::time::Instant::now();
        let state = self.config.state_dir.clone();
        let k = key.clone();
        let limit = self.config.snapshot_max_size.0;
        let taken = tokio::task::spawn_blocking(move || snapshots::take(&state, &k, limit))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
        let mut taken = match taken {
            Ok(Some(t)) => t,
            // Another bridge restored it between our look and now: it is that bridge's.
            Ok(None) => {
                notices.push(format!(
                    "session {:?} had a snapshot, but another bridge on this state_dir restored it first; this is a fresh interpreter",
                    key.name()
                ));
                return Some(Start::Fresh);
            }
            Err(e) => {
                notices.push(format!(
                    "session {:?} had a snapshot, but it could not be read ({e}); this is a fresh interpreter",
                    key.name()
                ));
                return Some(Start::Fresh);
            }
        };
        let timeout = timeout.min(self.config.max_timeout.0);
        let restored = match taken.file() {
            Some(file) => s
                .restore(file, taken.size, timeout)
                .await
                .map_err(|e| e.to_string()),
            None => Err("it could not be read".to_string()),
        };
        let took = t0.elapsed();
        let age = bridge_core::clock::now_secs().saturating_sub(listing.written_at);
        match restored {
            Ok(r) => {
                // Restored: the session is live again, and its state is there alone.
                drop(taken);
                let mut lost: Vec<String> = listing.info.lost_names();
                lost.extend(r.lost.iter().map(|l| l.shown()));
                lost.extend(r.modules.iter().map(|m| format!("{m} (module)")));
                tracing::info!(session = %crate::shown(key), bytes = listing.size, names = r.names, lost = lost.len(), ms = took.as_millis() as u64, "restored the session from its snapshot");
                self.audit(
                    StateEvent::Restore,
                    record(
                        key,
                        listing.why.as_str(),
                        listing.size,
                        lost.clone(),
                        "ok",
                        None,
                        took,
                    ),
                );
                let mut notice = format!(
                    "restored this session from its snapshot of {} ago (written when it was closed: {}): {} name(s) are back",
                    ago(age),
                    listing.why,
                    r.names
                );
                if lost.is_empty() {
                    notice.push_str("; nothing was lost. Files under /workspace and installed packages were not kept: write them again if needed");
                } else {
                    // What was left out to fit says so (its size, and the bound).
                    let mut shown: Vec<String> = listing
                        .info
                        .lost
                        .iter()
                        .map(|l| {
                            if l.why.contains("snapshot_max_size") {
                                format!("{} ({})", l.shown(), l.why)
                            } else {
                                l.shown()
                            }
                        })
                        .collect();
                    shown.extend(lost[listing.info.lost.len()..].iter().cloned());
                    let shown: Vec<String> = shown
                        .iter()
                        .map(|l| bridge_core::text::visible(l).into_owned())
                        .collect();
                    notice.push_str(&format!(
                        "; lost (could not be kept): {}. Files under /workspace and installed packages were not kept either",
                        shown.join(", ")
                    ));
                }
                if listing.info.more > 0 {
                    notice.push_str(&format!(
                        " ({} more name(s), kept or lost, are not listed)",
                        listing.info.more
                    ));
                }
                notices.push(notice);
                Some(Start::Restored { lost })
            }
            Err(why) => {
                // Set aside, not put back: a snapshot that failed once (one whose unpickling
                // never ends, say) would fail every call that names the session.
                let aside = why.clone();
                let _ = tokio::task::spawn_blocking(move || taken.set_aside(&aside)).await;
                tracing::warn!(session = %crate::shown(key), "could not restore the session's snapshot (set aside, not restored again): {}", bridge_core::text::visible(&why));
                self.audit(
                    StateEvent::Restore,
                    record(
                        key,
                        listing.why.as_str(),
                        listing.size,
                        Vec::new(),
                        "failed",
                        Some(why.clone()),
                        took,
                    ),
                );
                notices.push(format!(
                    "session {:?} has a snapshot of {} ago, but it could not be restored ({why}); this is a fresh interpreter. The snapshot is set aside and never restored again: `mcp-code-bridge sessions list` shows it, `sessions rm` removes it, and it expires after snapshot_ttl",
                    key.name(),
                    ago(age)
                ));
                s.destroy().await;
                None
            }
        }
    }

    /// Write session `key`'s state before it is closed without a caller; the notice for
    /// whoever closed it (`None`: nothing to say, e.g. snapshots are off or it ran no code).
    pub(super) async fn snapshot_before_close(
        &self,
        key: &SessionKey,
        s: &Session,
        why: Closed,
    ) -> Option<Result<Listing, String>> {
        if !self.keeps_snapshots() || !s.ran_code() || s.is_dead() {
            return None;
        }
        let t0 = std::time::Instant::now();
        let limit = self.config.snapshot_max_size.0;
        let taken = s.snapshot(limit, self.snapshot_timeout(why)).await;
        let kept = match taken {
            Ok(received) => {
                let config = Arc::clone(&self.config);
                let k = key.clone();
                tokio::task::spawn_blocking(move || received.keep(&config, &k, why.as_str()))
                    .await
                    .map_err(std::io::Error::other)
                    .and_then(|r| r)
                    .map_err(|e| {
                        (
                            format!("it could not be stored: {e}"),
                            snapshots::Info::default(),
                        )
                    })
            }
            Err(f) => Err((f.notice(), *f.info)),
        };
        let took = t0.elapsed();
        Some(match kept {
            Ok(listing) => {
                tracing::info!(session = %crate::shown(key), bytes = listing.size, why = why.as_str(), lost = listing.info.lost.len(), ms = took.as_millis() as u64, "wrote the session's snapshot");
                self.audit(
                    StateEvent::Snapshot,
                    record(
                        key,
                        why.as_str(),
                        listing.size,
                        listing.info.lost_names(),
                        "ok",
                        None,
                        took,
                    ),
                );
                Ok(listing)
            }
            Err((why_not, info)) => {
                tracing::warn!(session = %crate::shown(key), "could not write the session's snapshot: {}", bridge_core::text::visible(&why_not));
                let status = if info.largest.is_empty() {
                    "failed"
                } else {
                    "refused"
                };
                self.audit(
                    StateEvent::Snapshot,
                    record(
                        key,
                        why.as_str(),
                        0,
                        info.lost_names(),
                        status,
                        Some(why_not.clone()),
                        took,
                    ),
                );
                Err(why_not)
            }
        })
    }

    /// At the bridge's exit, before sessions are parked or closed: a snapshot of each idle
    /// session that ran code, together, within [`AT_EXIT`].
    pub(super) async fn snapshot_at_exit(&self) {
        if !self.keeps_snapshots() || self.revoked.get().is_some() {
            return;
        }
        let sessions: Vec<(SessionKey, Arc<Session>)> = self
            .sessions
            .lock()
            .await
            .iter()
            .filter(|(_, s)| !s.is_dead() && !s.is_busy() && s.ran_code())
            .map(|(k, s)| (k.clone(), Arc::clone(s)))
            .collect();
        if sessions.is_empty() {
            return;
        }
        let all = futures::future::join_all(
            sessions
                .iter()
                .map(|(k, s)| self.snapshot_before_close(k, s, Closed::Exit)),
        );
        if tokio::time::timeout(AT_EXIT, all).await.is_err() {
            tracing::warn!(
                "the sessions' snapshots at exit took more than {}s; those not written are lost",
                AT_EXIT.as_secs()
            );
        }
    }

    /// `rpc` with `fork` answered here, for the calls of session `key`'s exec in `s`.
    pub(super) fn fork_handler(
        &self,
        key: &SessionKey,
        s: &Arc<Session>,
        rpc: Arc<dyn RpcHandler>,
    ) -> Arc<dyn RpcHandler> {
        match self.this.upgrade() {
            Some(sandbox) => Arc::new(ForkRpc {
                sandbox,
                key: key.clone(),
                session: Arc::clone(s),
                inner: rpc,
            }),
            None => rpc,
        }
    }

    /// `runtime.fork(name, reset=True)`: session `key` goes in every form (live, parked, kept),
    /// unless it is running code. Called with `starting` held.
    async fn replace_for_fork(&self, key: &SessionKey) -> Result<(), String> {
        if self.busy.contains(key) {
            return Err(format!(
                "session {:?} is being started, closed or restored; fork into it once that is done",
                key.name()
            ));
        }
        let live = {
            let mut sessions = self.sessions.lock().await;
            match sessions.get(key) {
                Some(s) if s.is_busy() => {
                    return Err(format!(
                        "session {:?} is running code; fork into it once its call is done",
                        key.name()
                    ));
                }
                Some(_) => sessions.remove(key),
                None => None,
            }
        };
        if let Some(s) = live {
            tracing::info!(session = %crate::shown(key), "closing the session: a fork replaces it");
            s.destroy().await;
        }
        self.discard_parked(key).await;
        Ok(())
    }

    /// Whether session `key` exists in any form: live here, parked by the bridge before, or
    /// kept as a snapshot.
    async fn session_exists(&self, key: &SessionKey) -> bool {
        self.busy.contains(key)
            || self
                .sessions
                .lock()
                .await
                .get(key)
                .is_some_and(|s| !s.is_dead())
            || self.has_parked(key)
            || {
                let state = self.config.state_dir.clone();
                let k = key.clone();
                tokio::task::spawn_blocking(move || snapshots::find(&state, &k).is_some())
                    .await
                    .unwrap_or(true)
            }
    }
}

/// The `fork` RPC of `runtime.fork(name, reset=False)`: `{"session": name, "begin": true}`
/// first (is the target free, and how large may the snapshot be), then the snapshot's `snap`
/// frames (taken by the exec loop into the session), then `{"session": name}` to keep it as
/// `name`'s, under the caller's identity; with `"reset": true` in both, a session `name` that
/// exists is replaced. Any other method goes to `inner`.
struct ForkRpc {
    sandbox: Arc<Sandbox>,
    key: SessionKey,
    session: Arc<Session>,
    inner: Arc<dyn RpcHandler>,
}

impl ForkRpc {
    async fn fork(&self, params: &Value) -> Result<Value, String> {
        let sb = &self.sandbox;
        if !sb.keeps_snapshots() {
            return Err(if sb.config.snapshot_max_size.0 == 0 {
                "snapshots are off (snapshot_max_size = 0), so sessions cannot be forked".into()
            } else {
                "this bridge keeps no session state (only `run` and `serve` do)".into()
            });
        }
        let name = params
            .get("session")
            .and_then(Value::as_str)
            .ok_or("fork needs a session name (a string)")?;
        crate::check_session_name(name).map_err(|e| e.to_string())?;
        let to = SessionKey::new(self.key.owner().clone(), name);
        if to == self.key {
            return Err("a session cannot be forked into itself".into());
        }
        let begin = params
            .get("begin")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let reset = params
            .get("reset")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let exists = || {
            format!(
                "session {name:?} exists; fork into a new name, or replace it with runtime.fork({name:?}, reset=True)"
            )
        };
        if begin {
            // Forget a snapshot an earlier fork sent but never kept.
            drop(self.session.take_forked());
            if !reset && sb.session_exists(&to).await {
                return Err(exists());
            }
            return Ok(json!({"limit": sb.config.snapshot_max_size.0}));
        }
        let t0 = std::time::Instant::now();
        let received = match self.session.take_forked() {
            Some(Ok(r)) => r,
            Some(Err(why)) => return Err(format!("the snapshot was not kept: {why}")),
            None => return Err("no snapshot arrived before the fork call".into()),
        };
        // Under `starting`, as a start is: no session of that name starts meanwhile.
        let _starting = sb.starting.lock().await;
        if reset {
            sb.replace_for_fork(&to).await?;
        } else if sb.session_exists(&to).await {
            return Err(exists());
        }
        let config = Arc::clone(&sb.config);
        let k = to.clone();
        let listing = tokio::task::spawn_blocking(move || received.keep(&config, &k, "fork"))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("the snapshot could not be stored: {e}"))?;
        let lost = listing.info.lost_names();
        let mut r = record(
            &self.key,
            "fork",
            listing.size,
            lost.clone(),
            "ok",
            None,
            t0.elapsed(),
        );
        r.to = Some(name.to_string());
        sb.audit(StateEvent::Fork, r);
        tracing::info!(session = %crate::shown(&self.key), to = %crate::shown(&to), bytes = listing.size, "forked the session");
        Ok(json!({"session": name, "size": listing.size, "lost": lost}))
    }
}

#[async_trait::async_trait]
impl RpcHandler for ForkRpc {
    async fn handle(&self, method: &str, params: Value) -> Result<Value, RpcFailure> {
        if method == "fork" {
            return self.fork(&params).await.map_err(RpcFailure::from);
        }
        self.inner.handle(method, params).await
    }

    fn on_interpreter(&self, interpreter: &bridge_core::protocol::Interpreter) {
        self.inner.on_interpreter(interpreter);
    }
}

fn record(
    key: &SessionKey,
    why: &str,
    size: u64,
    lost: Vec<String>,
    status: &str,
    error: Option<String>,
    took: Duration,
) -> SessionStateRecord {
    SessionStateRecord {
        session: key.name().to_string(),
        identity: key.owner().name().map(str::to_string),
        to: None,
        why: why.to_string(),
        size,
        lost,
        status: status.to_string(),
        error,
        duration_ms: took.as_millis() as u64,
    }
}

/// `secs` as a person says it: `40s`, `12m`, `3h`, `2d`.
fn ago(secs: u64) -> String {
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

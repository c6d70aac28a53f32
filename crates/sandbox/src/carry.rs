//! A session's state carried past its sandbox (`snapshots` is the store): written when the
//! session is closed without a caller (idle timeout, room made under `max_sessions`, the
//! bridge's exit, before it is parked), restored into a new sandbox by the next call that names
//! it (`"resumed": "snapshot"`), and copied into another session by `runtime.fork()`.
//!
//! Only under `run` and `serve` (`Parking::clients_come_back`: their clients come back; `exec`
//! expects a fresh interpreter), with `snapshot_max_size` above 0. A snapshot is only
//! ever restored into a sandbox of its own key (identity and name): the store finds it by the
//! key and checks the key it lists. Each step is an audit record (`snapshot`, `restore`, `fork`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bridge_core::audit::{Audit, SessionStateRecord, StateEvent};
use bridge_core::config::Config;
use bridge_core::identity::SessionKey;

use crate::name::shown;
use crate::parking::Parking;
use crate::session::Session;
use crate::snapshots::{self, Listing};

/// The longest the snapshots at the bridge's exit may take together: a client that restarts
/// its server does not wait for ever.
const AT_EXIT: Duration = Duration::from_secs(30);

/// The longest the snapshot of a session closed to make room under `max_sessions` may take: it
/// is written while a start waits for the room (under `starting`), so it has a short bound of
/// its own, not `max_timeout`.
const TO_MAKE_ROOM: Duration = Duration::from_secs(10);

/// Why a session was closed, as its snapshot's listing and audit record say.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Closed {
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

/// Why a session's state was not written as it closed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotWritten {
    /// The sandbox did not give it (its runtime refused, with its largest values; it is gone;
    /// it did not answer in time): the notice.
    #[error("{0}")]
    Snapshot(String),
    /// The store did not keep what arrived.
    #[error("it could not be stored: {0}")]
    Store(#[source] std::io::Error),
}

/// How a fresh sandbox of a session with a snapshot starts ([`Carry::restore_into`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Restore {
    /// Its snapshot is back: the names that could not be kept or brought back, as
    /// `name (type)`.
    Restored(Vec<String>),
    /// Fresh after all: the snapshot was gone or unreadable (the notice says which).
    Fresh,
}

/// Sessions' states carried past their sandboxes: the store's side of the bridge.
pub(crate) struct Carry {
    config: Arc<Config>,
    /// Where the records of sessions' snapshots, restores and forks go.
    audit: OnceLock<Audit>,
    /// Whose `clients_come_back` says whether states are written at all.
    parking: Arc<Parking>,
}

impl Carry {
    /// Nothing kept until `parking` says this bridge's clients come back.
    pub(crate) fn new(config: Arc<Config>, parking: Arc<Parking>) -> Carry {
        Carry {
            config,
            audit: OnceLock::new(),
            parking,
        }
    }

    /// The audit log the session-state records go to (`server` sets it).
    pub(crate) fn set_audit(&self, audit: Audit) {
        let _ = self.audit.set(audit);
    }

    /// Write `r` to the audit log as `event`.
    pub(crate) fn audit(&self, event: StateEvent, r: SessionStateRecord) {
        if let Some(a) = self.audit.get() {
            a.session_state(event, r);
        }
    }

    /// Whether sessions' states are written and restored (see the module's text).
    pub(crate) fn keeps_snapshots(&self) -> bool {
        self.parking.clients_come_back() && self.config.snapshot_max_size.0 > 0
    }

    /// The largest snapshot kept, in bytes (`snapshot_max_size`; 0: snapshots are off).
    pub(crate) fn max_size(&self) -> u64 {
        self.config.snapshot_max_size.0
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
    pub(crate) async fn stored_snapshot(&self, key: &SessionKey) -> Option<Listing> {
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
    pub(crate) async fn drop_snapshot(&self, key: &SessionKey) {
        let state = self.config.state_dir.clone();
        let k = key.clone();
        let _ = tokio::task::spawn_blocking(move || snapshots::remove(&state, &k)).await;
    }

    /// Whether session `key` has a snapshot (for the notices of a session closed).
    pub(crate) async fn has_snapshot(&self, key: &SessionKey) -> bool {
        self.keeps_snapshots() && self.stored_snapshot(key).await.is_some()
    }

    /// On a reset: `key`'s snapshot goes too.
    pub(crate) async fn discard_snapshot(&self, key: &SessionKey) {
        let state = self.config.state_dir.clone();
        let k = key.clone();
        let removed = tokio::task::spawn_blocking(move || snapshots::remove(&state, &k))
            .await
            .unwrap_or(false);
        if removed {
            tracing::info!(session = %shown(key), "removed the session's snapshot: the call asked for a reset");
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
    pub(crate) async fn restore_into(
        &self,
        key: &SessionKey,
        s: &Arc<Session>,
        listing: Listing,
        timeout: Duration,
        notices: &mut Vec<String>,
    ) -> Option<Restore> {
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
                return Some(Restore::Fresh);
            }
            Err(e) => {
                notices.push(format!(
                    "session {:?} had a snapshot, but it could not be read ({e}); this is a fresh interpreter",
                    key.name()
                ));
                return Some(Restore::Fresh);
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
                tracing::info!(session = %shown(key), bytes = listing.size, names = r.names, lost = lost.len(), ms = took.as_millis() as u64, "restored the session from its snapshot");
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
                Some(Restore::Restored(lost))
            }
            Err(why) => {
                // Set aside, not put back: a snapshot that failed once (one whose unpickling
                // never ends, say) would fail every call that names the session.
                let aside = why.clone();
                let _ = tokio::task::spawn_blocking(move || taken.set_aside(&aside)).await;
                tracing::warn!(session = %shown(key), "could not restore the session's snapshot (set aside, not restored again): {}", bridge_core::text::visible(&why));
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
    pub(crate) async fn snapshot_before_close(
        &self,
        key: &SessionKey,
        s: &Session,
        why: Closed,
    ) -> Option<Result<Listing, NotWritten>> {
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
                    .map_err(|e| (NotWritten::Store(e), snapshots::Info::default()))
            }
            Err(f) => Err((NotWritten::Snapshot(f.notice()), *f.info)),
        };
        let took = t0.elapsed();
        Some(match kept {
            Ok(listing) => {
                tracing::info!(session = %shown(key), bytes = listing.size, why = why.as_str(), lost = listing.info.lost.len(), ms = took.as_millis() as u64, "wrote the session's snapshot");
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
                let said = why_not.to_string();
                tracing::warn!(session = %shown(key), "could not write the session's snapshot: {}", bridge_core::text::visible(&said));
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
                        Some(said),
                        took,
                    ),
                );
                Err(why_not)
            }
        })
    }

    /// At the bridge's exit, before sessions are parked or closed: a snapshot of each of
    /// `sessions` (the live ones not running code) that ran code, together, within [`AT_EXIT`].
    pub(crate) async fn snapshot_at_exit(&self, sessions: Vec<(SessionKey, Arc<Session>)>) {
        if !self.keeps_snapshots() {
            return;
        }
        let sessions: Vec<(SessionKey, Arc<Session>)> =
            sessions.into_iter().filter(|(_, s)| s.ran_code()).collect();
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
}

pub(crate) fn record(
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

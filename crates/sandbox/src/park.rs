//! A ready sandbox handed from a bridge that exits to the next bridge on the same state dir,
//! so that the next bridge's first call finds an interpreter booted and preloaded.
//!
//! A bridge whose pool holds a sandbox (one that never served a session, so no code of anyone's
//! ran in it) parks it when it exits, with `engine_linger` set: the container is renamed with
//! [`container::PARKED_MARK`], and a **keeper** (this binary, `keep-parked`, a process of its
//! own session) holds the container's attach connection (`sandbox::attach`: podman closes a
//! container's stdin when the connection that carried it ends, so the connection itself must
//! outlive the bridge) and listens on a socket in the **keeper directory** ([`keeper_dir`]).
//! The next bridge connects, receives the connection's descriptor
//! (`SCM_RIGHTS`) with what the sandbox said at boot, and uses it as a pooled sandbox of its own,
//! but only if the sandbox was created with exactly the container settings this bridge would
//! use ([`spec_digest`]) on the same engine; otherwise it removes it. Nothing else is trusted
//! from the keeper: it is the user's own process, in the user's own directory.
//!
//! A session that ran code is parked the same way, in a slot of its own ([`Slot::Session`]:
//! its lock and listing `<state_dir>/engine/sessions/<digest of its key>.{lock,json}`), for
//! `session_linger`, and taken by the next bridge's first call that names the session
//! (`sandbox::parking`).
//!
//! A socket's path is at most 107 bytes (`SUN_LEN`), so the keepers' sockets are not in the
//! state dir, whose path may be of any length: they are in a short directory of this user's
//! alone, `$XDG_RUNTIME_DIR/mcp-code-bridge` (or `/run/user/<uid>/mcp-code-bridge`), else
//! `/tmp/mcp-code-bridge-<uid>`, each named by a digest of the state dir and the slot
//! ([`socket_of`]). Other local users may have prepared that directory: it is used only when it
//! is a directory (not a link), owned by this user and of mode 0700, checked before each bind
//! and each connection; otherwise hand-over is off, said at WARN and by `doctor`. Each side
//! checks the other's uid (`SO_PEERCRED`).
//!
//! Bounded: one parked sandbox per slot (a lock the keeper holds), the pool's one and one per
//! session the bridge had (at most `max_sessions`), each for at most `engine_linger`; then the keeper closes the connection (the runtime reads the end of its
//! stdin and exits) and removes the container. A keeper killed meanwhile closes the connection
//! the same way, and the container, no longer running, is reaped by the next bridge
//! (`container::reap_orphans`).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::container::{self, Role};
use crate::fdpass::{peer_uid, recv_fd, send_fd};
pub use crate::keeperdir::{HandOverOff, keeper_dir};
use crate::keeperdir::{keeper_base, keeper_dir_if_there, state_digest};
pub use bridge_core::clock::now_secs;
use bridge_core::config::{Config, Isolation};

/// The hidden command that runs a keeper.
pub const KEEPER_COMMAND: &str = "keep-parked";
/// The descriptors a keeper is started with: the attach connection, the listening socket and
/// the lock that says a sandbox is parked.
const KEEPER_FDS: [RawFd; 3] = [3, 4, 5];
/// What the keeper sends (and is given on stdin) is a small JSON object.
const MAX_META: usize = 64 << 10;
/// How long a claim waits for the keeper's answer.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(2);

/// What the next bridge is told of a parked sandbox.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Meta {
    /// The container's id.
    pub container_id: String,
    /// Its engine-side name while parked.
    pub name: String,
    /// Its interpreter's version.
    pub python: String,
    /// What it said of its interpreter at boot.
    pub target: Option<bridge_core::protocol::Target>,
    /// Its package directory (mounted at `/opt/packages`), renamed with it.
    pub packages: PathBuf,
    /// [`spec_digest`] of the settings it was created with.
    pub spec: String,
    /// The engine it runs on, as `Engine::endpoint` says it.
    pub endpoint: String,
    /// Seconds since the epoch after which the keeper removes it.
    pub expires: u64,
    /// The session it served (its key, as `SessionKey` shows it), for a parked session; none
    /// for a pooled sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The `podman` the keeper removes it with (none on Docker: the keeper asks the engine).
    pub podman: Option<PathBuf>,
    /// Seconds since the epoch when it was parked.
    #[serde(default)]
    pub parked_at: u64,
    /// Milliseconds since the epoch of its last call (sessions parked together are told
    /// apart by it: the least recently used is ended first).
    #[serde(default)]
    pub used_at_ms: u64,
}

/// Whether this bridge's sandboxes may be parked and adopted: with `engine_linger` (the same
/// promise as the engine service's, for the same time), under runc (gVisor's bridges keep a
/// service of their own that goes with them), and with no declared inputs (copied in at start
/// from host files that may have changed since).
pub fn eligible(config: &Config) -> bool {
    !config.engine_linger.0.is_zero()
        && config.isolation == Isolation::Container
        && config.inputs.is_empty()
}

/// Whether this bridge's sessions are parked when it exits, for the next bridge to resume:
/// as [`eligible`], with `session_linger`.
pub fn sessions_eligible(config: &Config) -> bool {
    eligible(config) && !config.session_linger.0.is_zero()
}

/// How long a session stays parked: `session_linger`, within `engine_linger` (the bridge's own
/// podman service, which carries the kept connection, lives no longer).
pub fn session_linger(config: &Config) -> Duration {
    config.session_linger.0.min(config.engine_linger.0)
}

/// Which parked sandbox of a state dir: the pool's one, or a session's (by its key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// The ready pooled sandbox.
    Pool,
    /// A session's sandbox, by its key.
    Session(String),
}

impl Slot {
    /// The key of the session parked in it; none for the pool's.
    pub fn session(&self) -> Option<&str> {
        match self {
            Slot::Pool => None,
            Slot::Session(key) => Some(key),
        }
    }

    /// Its keeper's socket (in the keeper directory) and its lock (in `state_dir`). A
    /// session's are named by digests of its key, so no session name (chosen by the model) is
    /// ever a path.
    fn paths(&self, state_dir: &Path) -> (PathBuf, PathBuf) {
        (
            keeper_base().join(self.socket_name(state_dir)),
            self.lock(state_dir),
        )
    }

    fn lock(&self, state_dir: &Path) -> PathBuf {
        let engine = state_dir.join("engine");
        match self {
            Slot::Pool => engine.join("parked.lock"),
            Slot::Session(key) => engine
                .join("sessions")
                .join(format!("{}.lock", key_digest(key))),
        }
    }

    /// The socket's file name: a digest of the state dir (as the file system resolves it, so
    /// that two spellings of one directory meet) and the slot, 37 bytes whatever their length.
    fn socket_name(&self, state_dir: &Path) -> String {
        let digest = match self {
            Slot::Pool => state_digest(state_dir, &[b"pool"]),
            Slot::Session(key) => state_digest(state_dir, &[b"session\0", key.as_bytes()]),
        };
        format!("{digest}.sock")
    }
}

/// The first 32 hex digits of the digest of a session key.
fn key_digest(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))[..32].to_string()
}

/// The pool's keeper's socket for `state_dir`.
pub fn socket(state_dir: &Path) -> PathBuf {
    Slot::Pool.paths(state_dir).0
}

/// The keeper's socket of `slot` for `state_dir`.
pub fn socket_of(state_dir: &Path, slot: &Slot) -> PathBuf {
    slot.paths(state_dir).0
}

/// The listing of a session parked from `state_dir` (`sandbox::parked`): its [`Meta`], beside
/// its lock.
pub(crate) fn listing_of(state_dir: &Path, key: &str) -> PathBuf {
    Slot::Session(key.to_string())
        .lock(state_dir)
        .with_extension("json")
}

/// The digest of everything a sandbox was made with: the container settings of a pooled
/// sandbox (labels naming the bridge left out), the runtime the boot sent, the packages
/// installed before its first call and this bridge's version. A sandbox is adopted only by a
/// bridge whose digest is the same, so it is exactly the sandbox that bridge would start.
pub fn spec_digest(config: &Config, ids: &crate::engine::HostIds) -> String {
    let mut body = container::spec(config, ids, Role::Pool, "");
    if let Some(labels) = body.labels.as_mut() {
        labels.remove(container::LABEL_OWNER);
    }
    let value = serde_json::to_value(&body).unwrap_or_default();
    let mut h = Sha256::new();
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    h.update([0]);
    canonical(&value, &mut h);
    h.update([0]);
    h.update(super::runtime::boot_line());
    h.update([0]);
    for r in &config.packages.preinstall.0 {
        h.update(r.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

/// `v` with every object's keys in order, whatever map serde_json was built with.
fn canonical(v: &serde_json::Value, h: &mut Sha256) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            h.update(b"{");
            for k in keys {
                h.update(serde_json::to_string(k).unwrap_or_default().as_bytes());
                h.update(b":");
                canonical(&m[k], h);
                h.update(b",");
            }
            h.update(b"}");
        }
        Value::Array(a) => {
            h.update(b"[");
            for x in a {
                canonical(x, h);
                h.update(b",");
            }
            h.update(b"]");
        }
        other => h.update(other.to_string().as_bytes()),
    }
}

/// Why a sandbox could not be handed to a keeper (one is parked already, the keeper did not
/// start or answer).
#[derive(Debug, thiserror::Error)]
pub enum ParkError {
    /// A directory of the state dir (`dir`) could not be made.
    #[error("making {}: {source}", .dir.display())]
    MakeDir {
        /// The directory.
        dir: PathBuf,
        /// Why it could not be made.
        #[source]
        source: std::io::Error,
    },
    /// The keeper directory is not fit for use: hand-over is off.
    #[error("{0}")]
    KeeperDir(HandOverOff),
    /// The slot's parking lock could not be opened.
    #[error("opening the parking lock: {0}")]
    OpenLock(#[source] std::io::Error),
    /// Another keeper holds the slot's lock.
    #[error("a sandbox is parked in this slot of the state dir already")]
    AlreadyParked,
    /// The slot's parking lock could not be taken (not for being held).
    #[error("locking the parking lock: {0}")]
    Lock(#[source] std::io::Error),
    /// The keeper's socket (`path`) could not be listened on.
    #[error("listening on {}: {source}", .path.display())]
    Listen {
        /// The socket's path.
        path: PathBuf,
        /// Why it could not be listened on.
        #[source]
        source: std::io::Error,
    },
    /// This program's own path could not be found.
    #[error("finding this program: {0}")]
    FindProgram(#[source] std::io::Error),
    /// The descriptors the keeper gets could not be duplicated.
    #[error("preparing the keeper's descriptors: {0}")]
    Descriptors(#[source] std::io::Error),
    /// The keeper process could not be started.
    #[error("starting the keeper: {0}")]
    Start(#[source] std::io::Error),
    /// What the keeper is given could not be written as JSON.
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    /// What the keeper keeps could not be written to its stdin.
    #[error("telling the keeper what it keeps: {0}")]
    Tell(#[source] std::io::Error),
}

/// Start a keeper for the sandbox `meta` describes, holding `attach` (its attach connection).
/// Fails when a sandbox is parked in `state_dir` already (its keeper holds the lock) or the
/// keeper cannot be started; the caller then removes the sandbox.
pub fn hand_to_keeper(
    state_dir: &Path,
    slot: &Slot,
    meta: &Meta,
    attach: OwnedFd,
) -> Result<(), ParkError> {
    use std::os::unix::fs::PermissionsExt;
    let (path, lock_path) = slot.paths(state_dir);
    let slot_dir = lock_path.parent().unwrap_or(state_dir).to_path_buf();
    for dir in [state_dir.join("engine"), slot_dir] {
        std::fs::create_dir_all(&dir).map_err(|source| ParkError::MakeDir {
            dir: dir.clone(),
            source,
        })?;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    }
    if let Err(e) = keeper_dir() {
        tracing::warn!("{e}");
        return Err(ParkError::KeeperDir(e));
    }
    let lock = { bridge_core::statefile::open_lock(&lock_path).map_err(ParkError::OpenLock)? };
    match bridge_core::flock::try_lock_exclusive(&lock) {
        Ok(true) => {}
        Ok(false) => {
            return Err(ParkError::AlreadyParked);
        }
        Err(e) => return Err(ParkError::Lock(e)),
    }
    // What is there is a socket a keeper of this slot left (killed); this user's directory
    // holds nothing of anyone else's.
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(|source| ParkError::Listen {
        path: path.clone(),
        source,
    })?;
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    tracing::debug!(socket = %path.display(), "the keeper listens");
    let exe = std::env::current_exe().map_err(ParkError::FindProgram)?;
    // Above the three the child gets, so that moving them into place overwrites none.
    let high: Vec<OwnedFd> = [attach.as_raw_fd(), listener.as_raw_fd(), lock.as_raw_fd()]
        .iter()
        .map(|&fd| {
            // SAFETY: `fd` is borrowed from `attach`, `listener` or `lock`, all open and alive for
            // this call; F_DUPFD_CLOEXEC takes an int and touches no memory of ours.
            let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 64) };
            if d < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                // SAFETY: `d` (>= 0) is a new descriptor fcntl just made; nothing else owns it.
                Ok(unsafe { OwnedFd::from_raw_fd(d) })
            }
        })
        .collect::<Result<_, _>>()
        .map_err(ParkError::Descriptors)?;
    let raw: Vec<RawFd> = high.iter().map(|f| f.as_raw_fd()).collect();
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(KEEPER_COMMAND)
        .arg(&meta.container_id[..12.min(meta.container_id.len())])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    // SAFETY: only async-signal-safe calls between fork and exec, and no allocation (`raw` is
    // moved in and only read; `last_os_error` reads errno): a session of its own (the bridge's
    // process group and terminal are not its), and the descriptors where it expects them
    // (dup2 clears close-on-exec on the copy). The descriptors in `raw` are `high`'s, open until
    // after `spawn` returns; all are >= 64, so no dup2 overwrites a source still to be copied.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            for (from, to) in raw.iter().zip(KEEPER_FDS) {
                if libc::dup2(*from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(ParkError::Start)?;
    let listing = slot.session().map(|key| listing_of(state_dir, key));
    let json = serde_json::to_vec(meta).map_err(ParkError::Encode)?;
    let given = serde_json::to_vec(&KeeperInput {
        meta: meta.clone(),
        listing: listing.clone(),
    })
    .map_err(ParkError::Encode)?;
    let sent = child
        .stdin
        .take()
        .map(|mut s| s.write_all(&given))
        .unwrap_or(Ok(()));
    if let Err(e) = sent {
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(&path);
        return Err(ParkError::Tell(e));
    }
    // Not waited for: it outlives this bridge (its parent becomes init when this one exits).
    drop(child);
    if let Some(listing) = listing {
        // What `sessions list` shows and `max_sessions` counts; the keeper removes it with
        // its socket.
        let _ = bridge_core::statefile::write_private(&listing, &json);
    }
    Ok(())
}

/// Take the sandbox parked in `slot` of `state_dir`, if a keeper there answers: what it said of
/// itself and its attach connection. Blocking (a local socket, answered at once or within
/// [`CLAIM_TIMEOUT`]). A keeper hands its connection to one claimant only, then exits: of two
/// bridges that claim at once, exactly one gets it.
pub fn claim(state_dir: &Path, slot: &Slot) -> Option<(Meta, OwnedFd)> {
    let path = socket_of(state_dir, slot);
    if !path.exists() {
        return None;
    }
    if let Err(e) = keeper_dir_if_there() {
        tracing::warn!("{e}");
        return None;
    }
    let stream = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(socket = %path.display(), "no keeper answers: {e}");
            return None;
        }
    };
    // SAFETY: getuid takes no arguments, cannot fail and touches no memory of ours.
    let me = unsafe { libc::getuid() };
    if let Some(uid) = peer_uid(&stream).filter(|&u| u != me) {
        tracing::warn!(socket = %path.display(), "the keeper's socket is held by uid {uid}, not by this user (uid {me}): refused, the sandbox is not taken");
        return None;
    }
    let _ = stream.set_read_timeout(Some(CLAIM_TIMEOUT));
    let (mut data, fd) = match recv_fd(&stream, MAX_META) {
        Ok(x) => x,
        Err(e) => {
            tracing::info!("could not take the parked sandbox: {e}");
            return None;
        }
    };
    let mut rest = Vec::new();
    let _ = (&stream)
        .take((MAX_META - data.len().min(MAX_META)) as u64)
        .read_to_end(&mut rest);
    data.extend(rest);
    let fd = fd?;
    match serde_json::from_slice::<Meta>(&data) {
        Ok(meta) => Some((meta, fd)),
        Err(e) => {
            tracing::info!("the parked sandbox's keeper said something unreadable: {e}");
            None
        }
    }
}

/// What a keeper is given on stdin: what it keeps, and the listing it removes with its socket
/// (a parked session's).
#[derive(serde::Serialize, serde::Deserialize)]
struct KeeperInput {
    meta: Meta,
    #[serde(default)]
    listing: Option<PathBuf>,
}

/// The keeper (`mcp-code-bridge keep-parked`): started by [`hand_to_keeper`] with the attach
/// connection, the listening socket and the lock on fds 3, 4 and 5, and the sandbox's [`Meta`]
/// on stdin. Hands the connection to the first bridge of the same user that asks, or at
/// `expires` closes it and removes the container. Never runs anything else.
pub fn keeper_main() -> std::process::ExitCode {
    // SAFETY: setting a disposition to SIG_IGN installs no handler, so no code of ours runs in
    // signal context; the previous disposition returned is not used.
    unsafe {
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let mut raw = Vec::new();
    if std::io::stdin()
        .take(MAX_META as u64)
        .read_to_end(&mut raw)
        .is_err()
    {
        return std::process::ExitCode::from(2);
    }
    let Ok(KeeperInput { meta, listing }) = serde_json::from_slice::<KeeperInput>(&raw) else {
        return std::process::ExitCode::from(2);
    };
    let [a, l, k] = KEEPER_FDS;
    // SAFETY: the bridge that started this process put these three there (`hand_to_keeper`);
    // nothing else in this process opened them.
    let (attach, listener, _lock) = unsafe {
        (
            OwnedFd::from_raw_fd(a),
            UnixListener::from_raw_fd(l),
            OwnedFd::from_raw_fd(k),
        )
    };
    let ours = socket_identity(&listener);
    // SAFETY: getuid takes no arguments, cannot fail and touches no memory of ours.
    let me = unsafe { libc::getuid() };
    loop {
        let left = meta.expires.saturating_sub(now_secs());
        if left == 0 {
            break;
        }
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = (left.min(60) * 1000) as libc::c_int;
        // SAFETY: `pfd` is one live, initialised `pollfd` (nfds 1) on `listener`'s descriptor,
        // which stays open for the call; poll only writes its `revents`.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n <= 0 {
            continue;
        }
        let Ok((conn, _)) = listener.accept() else {
            continue;
        };
        // The socket is the user's alone (0600 in a 0700 directory); checked all the same.
        if peer_uid(&conn) != Some(me) {
            continue;
        }
        let json = serde_json::to_vec(&meta).unwrap_or_default();
        if send_fd(&conn, &json, attach.as_raw_fd()).is_ok() {
            unlink_if_ours(&listener, ours, &meta, listing.as_deref());
            return std::process::ExitCode::SUCCESS;
        }
    }
    unlink_if_ours(&listener, ours, &meta, listing.as_deref());
    drop(attach);
    remove_parked(&meta);
    std::process::ExitCode::SUCCESS
}

/// Remove a parked sandbox whose connection is closed: its container ([`remove_container`]),
/// then its package directory (and the mount root, if it was the last).
pub(crate) fn remove_parked(meta: &Meta) {
    remove_container(meta);
    crate::pkgdir::remove_last(&meta.packages);
}

/// Remove the parked container at the end of its time: with `podman rm` on podman (the engine
/// service may have ended, and asking it would keep it up another linger), else through the
/// engine's socket. Best effort: a container left is no longer running (its stdin closed) and
/// the next bridge reaps it.
fn remove_container(meta: &Meta) {
    if let Some(podman) = &meta.podman {
        let _ = std::process::Command::new(podman)
            .args(["rm", "--force", "--time", "0", &meta.container_id])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        return;
    }
    let Some(path) = meta.endpoint.strip_prefix("unix://") else {
        return;
    };
    if let Ok(mut s) = UnixStream::connect(path) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        let req = format!(
            "DELETE /containers/{}?force=true HTTP/1.1\r\nHost: engine\r\nConnection: close\r\n\r\n",
            meta.container_id
        );
        if s.write_all(req.as_bytes()).is_ok() {
            let mut sink = Vec::new();
            let _ = (&s).take(1 << 16).read_to_end(&mut sink);
        }
    }
}

/// A listing, when it is this user's regular file and reads as a [`Meta`].
pub(crate) fn read_listing(path: &Path) -> Option<Meta> {
    bridge_core::statefile::read_own(path, 64 << 10).and_then(|t| serde_json::from_str(&t).ok())
}

/// The (device, inode) of the socket file the listener was bound to, to unlink it only while it
/// is still this keeper's (a later bridge may have parked another there).
fn socket_identity(listener: &UnixListener) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let addr = listener.local_addr().ok()?;
    let m = std::fs::metadata(addr.as_pathname()?).ok()?;
    Some((m.dev(), m.ino()))
}

/// Unlink the keeper's socket while it is still this keeper's, and its listing while it still
/// names this keeper's container.
fn unlink_if_ours(
    listener: &UnixListener,
    ours: Option<(u64, u64)>,
    meta: &Meta,
    listing: Option<&Path>,
) {
    use std::os::unix::fs::MetadataExt;
    if let Some(listing) = listing
        && read_listing(listing).is_some_and(|l| l.container_id == meta.container_id)
    {
        let _ = std::fs::remove_file(listing);
    }
    let Ok(addr) = listener.local_addr() else {
        return;
    };
    let Some(path) = addr.as_pathname() else {
        return;
    };
    if let (Ok(m), Some(ours)) = (std::fs::metadata(path), ours)
        && (m.dev(), m.ino()) == ours
    {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keeperdir::SUN_PATH_MAX;

    #[test]
    fn the_digest_follows_every_container_setting_and_not_the_owner() {
        let c = Config::default();
        let shared = crate::engine::HostIds::Shared("a test".into());
        let spec_digest = |c: &Config| spec_digest(c, &shared);
        let d = spec_digest(&c);
        assert_eq!(d, spec_digest(&c), "stable");
        let own = crate::engine::HostIds::Own {
            owner: "containers".into(),
            sandboxes: 100,
        };
        assert_ne!(d, super::spec_digest(&c, &own), "host ids");
        let mut m = c.clone();
        m.memory = bridge_core::config::Size(c.memory.0 * 2);
        assert_ne!(d, spec_digest(&m), "memory");
        let mut i = c.clone();
        i.image = "another:tag".into();
        assert_ne!(d, spec_digest(&i), "image");
        let mut p = c.clone();
        p.packages.preinstall.0.push("tabulate".into());
        assert_ne!(d, spec_digest(&p), "preinstall");
    }

    #[test]
    fn each_session_key_has_a_slot_of_its_own_that_names_no_session() {
        let dir = Path::new("/state");
        let alice = Slot::Session("alice/work".into()).paths(dir);
        let bob = Slot::Session("bob/work".into()).paths(dir);
        let local = Slot::Session("work".into()).paths(dir);
        let pool = Slot::Pool.paths(dir);
        assert_ne!(alice, bob);
        assert_ne!(alice, local);
        assert_eq!(pool.1, Path::new("/state/engine/parked.lock"));
        for (sock, lock) in [&alice, &bob, &local] {
            assert_eq!(lock.parent(), Some(Path::new("/state/engine/sessions")));
            assert_eq!(
                sock.parent(),
                pool.0.parent(),
                "every socket in the keeper directory"
            );
            for p in [sock, lock] {
                let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                assert_eq!(name.len(), 32);
                assert!(!name.contains("work"), "{name}");
            }
        }
        // A name that would be a path elsewhere is only ever hashed.
        let odd = Slot::Session("../../x".into()).paths(dir);
        assert_eq!(odd.1.parent(), Some(Path::new("/state/engine/sessions")));
        assert_eq!(odd.0.parent(), pool.0.parent());
    }

    #[test]
    fn a_socket_path_is_short_whatever_the_state_dirs_length() {
        let long = PathBuf::from(format!("/{}", "d".repeat(300)));
        for slot in [Slot::Pool, Slot::Session("x".repeat(64))] {
            let sock = socket_of(&long, &slot);
            assert!(sock.as_os_str().len() <= SUN_PATH_MAX, "{}", sock.display());
            assert_ne!(sock, socket_of(Path::new("/other"), &slot), "per state dir");
        }
    }

    #[test]
    fn sessions_park_within_both_lingers_and_never_with_zero() {
        let mut c = Config::default();
        assert!(sessions_eligible(&c), "the defaults park sessions");
        c.engine_linger = bridge_core::config::Secs(Duration::from_secs(30));
        assert_eq!(session_linger(&c), Duration::from_secs(30));
        c.session_linger = bridge_core::config::Secs(Duration::ZERO);
        assert!(!sessions_eligible(&c));
    }

    #[test]
    fn only_runc_with_a_linger_and_no_inputs_parks() {
        let mut c = Config::default();
        assert!(eligible(&c), "the defaults park");
        c.engine_linger = bridge_core::config::Secs(Duration::ZERO);
        assert!(!eligible(&c));
        let g = Config {
            isolation: Isolation::Gvisor,
            ..Config::default()
        };
        assert!(!eligible(&g));
    }
}

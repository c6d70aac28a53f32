//! The bridge's own `podman system service`, for when no engine socket answers: started under
//! a guard that stops it with the bridge however the bridge goes, and the services of bridges
//! that are gone found and stopped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, ChildStderr, ChildStdin, Command};

use crate::keeperdir::{HandOverOff, socket_dir, socket_in, state_digest};

/// The longest name of a bridge's own service's socket, `podman-<pid>.sock` (pids stay under
/// 2^22).
const OWN_NAME_MAX: usize = "podman-4194304.sock".len();

/// Where our own podman service listens: one socket per bridge process, because every bridge
/// of a user shares the state dir, and a second bridge replacing the first one's socket took
/// its engine away (tests/e2e/security_rootless.rs runs two at once). In the state dir, or in
/// the keeper directory when the state dir's path is too long for a socket's (107 bytes).
pub fn own_socket(state_dir: &Path) -> Result<PathBuf, HandOverOff> {
    let name = format!("podman-{}.sock", std::process::id());
    socket_in(state_dir, &name, OWN_NAME_MAX, &name)
}

/// The shell that runs our podman service and stops it when the bridge goes, however it goes.
///
/// Its stdin is a pipe whose writing end only the bridge holds (close-on-exec, so no other child
/// inherits it): EOF there means the bridge closed it ([`Engine::shutdown`], or the engine was
/// dropped) or the bridge died, by any signal, SIGKILL included, or a panic. The bridge starts it
/// as the leader of a process group of its own, which podman joins, and with podman the process
/// rootless podman re-executes inside its user namespace: that inner process is the one holding
/// the socket. On EOF the guard sends the whole group SIGTERM and, five seconds later, SIGKILL;
/// when podman ends by itself (it failed to start, or was killed), the guard kills the rest of
/// the group, itself included. The guard and its reader ignore SIGTERM, and SIGPIPE (their stderr
/// is a pipe to a bridge that may be gone); podman is started before that and keeps the defaults.
/// The group is apart from the bridge's, so a terminal's Ctrl-C reaches the bridge alone, which
/// then removes its containers while the engine is still there.
///
/// `PR_SET_PDEATHSIG` on podman would not do: it fires when the *thread* that forked the child
/// exits, not the process, and it reaches the outer podman only. That one forwards SIGTERM to the
/// inner one but cannot forward SIGKILL, and when podman creates the user namespace afresh (its
/// first run after boot, no pause process yet) the inner one has no parent-death signal of its
/// own: killed outright, the outer podman leaves it serving the socket, reparented to init.
const GUARD: &str = r#"exec 3<&0 </dev/null
"$@" 3<&- &
svc=$!
trap '' TERM PIPE
(
    while read -r _; do :; done
    kill -TERM 0
    sleep 5
    kill -KILL 0
) <&3 &
exec 3<&-
wait "$svc"
echo "podman system service exited with status $?" >&2
kill -KILL 0
"#;

/// The guard of a lingering service ([`Lingering`]): no lifeline, since the service is meant to
/// outlive the bridge that started it; podman's own idle timer (`--time`) ends it, and when it
/// ends (that way or any other) the guard kills what is left of its process group, as [`GUARD`]
/// does. It ignores SIGTERM, SIGHUP and SIGPIPE (its bridge may be gone); podman keeps the
/// defaults, so a SIGTERM to the group stops the service and then the guard.
const LINGER_GUARD: &str = r#"exec </dev/null
"$@" &
svc=$!
trap '' TERM HUP PIPE
wait "$svc"
echo "podman system service exited with status $?" >&2
kill -KILL 0
"#;

/// How long [`OwnService::stop`] waits for the guard (its own grace is 5s) before it kills the
/// group itself.
const GUARD_WAIT: Duration = Duration::from_secs(10);

/// A podman service we started, under its [`GUARD`].
pub(super) struct OwnService {
    pub(super) guard: Child,
    /// Closing this tells the guard to stop the service.
    pub(super) lifeline: Option<ChildStdin>,
}

impl OwnService {
    /// Start `program args` under a [`GUARD`]; the second value is its stderr (the guard's and the
    /// service's).
    pub(super) fn spawn(
        program: &Path,
        args: &[&str],
    ) -> std::io::Result<(OwnService, Option<ChildStderr>)> {
        let mut guard = Command::new("/bin/sh")
            .args(["-c", GUARD, "mcp-code-bridge-podman-guard"])
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()?;
        let stderr = guard.stderr.take();
        let lifeline = guard.stdin.take();
        Ok((OwnService { guard, lifeline }, stderr))
    }

    /// Stop the service and wait until its whole process group is gone.
    pub(super) async fn stop(mut self) {
        drop(self.lifeline.take());
        if tokio::time::timeout(GUARD_WAIT, self.guard.wait())
            .await
            .is_err()
        {
            // Not reaped yet, so its pid still names the group and cannot have been reused.
            if let Some(pid) = self.guard.id() {
                // SAFETY: kill only sends a signal and touches no memory of ours. The guard was
                // spawned with `process_group(0)` and is not reaped (`id()` is `Some`), so `-pid`
                // is its group.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            let _ = self.guard.wait().await;
        }
    }
}

/// The socket URL of a bridge's own service in `state_dir`, as it appears on podman's command
/// line, and the bridge's pid when `url` is one.
pub(super) fn own_socket_pid(state_dir: &Path, url: &str) -> Option<u32> {
    let prefix = format!(
        "unix://{}/podman-",
        socket_dir(state_dir, OWN_NAME_MAX).display()
    );
    url.strip_prefix(&prefix)?
        .strip_suffix(".sock")?
        .parse()
        .ok()
}

/// Whether the bridge `bridge` that a service started at `service_start` names in its socket is
/// gone: not running (a zombie counts as gone), or a process started after the service (the pid
/// was reused).
pub(super) fn bridge_gone(bridge: u32, service_start: u64) -> bool {
    bridge_core::procfs::running_since(bridge).is_none_or(|start| start > service_start)
}

/// Processes of this user that run (or guard) the podman service of a bridge that is gone, on a
/// socket in `state_dir`: `(process, bridge)` pids. Normally there are none, as each service's
/// guard stops it with its bridge; this catches what an older bridge, or a guard killed on its
/// own, left.
fn stale_services(state_dir: &Path) -> Vec<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let me = std::process::id();
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    let uid = unsafe { libc::geteuid() };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if entry.metadata().map(|m| m.uid()).ok() != Some(uid) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_service = args
            .windows(2)
            .any(|w| w == [&b"system"[..], &b"service"[..]]);
        let bridge = args
            .iter()
            .filter_map(|a| std::str::from_utf8(a).ok())
            .find_map(|a| own_socket_pid(state_dir, a));
        if let (true, Some(bridge)) = (is_service, bridge)
            && bridge != me
            && let Some(start) = bridge_core::procfs::running_since(pid)
            && bridge_gone(bridge, start)
        {
            out.push((pid, bridge));
        }
    }
    out
}

/// Stop podman services in `state_dir` left by bridges that are gone (SIGTERM, then SIGKILL after
/// 3s), and remove the sockets of bridges that are gone. Returns how many processes were stopped.
pub(super) async fn reap_stale_services(state_dir: &Path) -> usize {
    let stale = stale_services(state_dir);
    for (pid, bridge) in &stale {
        tracing::info!(
            pid,
            bridge,
            "stopping a podman service left by a bridge that is gone"
        );
        // SAFETY: kill only sends a signal and touches no memory of ours. `pid` is a positive pid
        // read from a `/proc` entry name (never 0 or negative, so never a group or "all").
        unsafe { libc::kill(*pid as i32, libc::SIGTERM) };
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let left: Vec<u32> = stale
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| bridge_core::procfs::is_running(*p))
            .collect();
        if left.is_empty() {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            for p in left {
                // SAFETY: kill only sends a signal and touches no memory of ours. `p` is a
                // positive pid read from a `/proc` entry name (never 0 or negative, so never a
                // group or "all").
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Ok(dir) = std::fs::read_dir(socket_dir(state_dir, OWN_NAME_MAX)) {
        let me = std::process::id();
        for entry in dir.flatten() {
            let url = format!("unix://{}", entry.path().display());
            if let Some(bridge) = own_socket_pid(state_dir, &url)
                && bridge != me
                && !bridge_core::procfs::is_running(bridge)
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    stale.len()
}

/// The podman service that outlives its bridge for `engine_linger`, shared by the user's bridges
/// on one state dir: everything about it is in `<state_dir>/engine/`, a directory of mode 0700:
/// `podman.sock` (mode 0600 once it is up; in the keeper directory, named by a digest of the
/// state dir, when the state dir is too long for a socket's path), `podman.pid` (its guard, the
/// leader of its process group), `podman.log` (its stderr, truncated at each start) and
/// `podman.lock`, held while a bridge looks for it and, finding none that answers, starts one,
/// so that two bridges starting at once start one service.
///
/// Bounded: podman's `--time=<linger>` ends the service once no connection has been active for
/// that long; a bridge keeps it active while it runs ([`keep_alive`]), and a bridge that is
/// gone, however it went, holds no connection any more.
pub(super) struct Lingering {
    pub(super) dir: PathBuf,
    socket: PathBuf,
}

impl Lingering {
    /// The service of `state_dir` (which is there): `Err` when its socket cannot be placed.
    pub(super) fn new(state_dir: &Path) -> Result<Lingering, HandOverOff> {
        const BESIDE: &str = "engine/podman.sock";
        let short = format!("engine-{}.sock", state_digest(state_dir, &[b"engine"]));
        Ok(Lingering {
            dir: state_dir.join("engine"),
            socket: socket_in(state_dir, BESIDE, BESIDE.len(), &short)?,
        })
    }

    pub(super) fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    pub(super) fn url(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// Make `engine/` (mode 0700, this user's, not a link) and take its lock, waiting at most
    /// `wait` for another bridge that is starting the service; released when the file is closed.
    pub(super) async fn lock(&self, wait: Duration) -> std::io::Result<std::fs::File> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        match std::fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let meta = std::fs::symlink_metadata(&self.dir)?;
        // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
        if !meta.is_dir() || meta.uid() != unsafe { libc::geteuid() } {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a directory of this user's", self.dir.display()),
            ));
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let file = bridge_core::statefile::open_lock(&self.dir.join("podman.lock"))?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if bridge_core::flock::try_lock_exclusive(&file)? {
                return Ok(file);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "another bridge held {} for {}s",
                        self.dir.join("podman.lock").display(),
                        wait.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Start `program args` under a [`LINGER_GUARD`], its stderr into `podman.log`, and note
    /// the guard's pid in `podman.pid`. The child is not waited for by anyone once the bridge
    /// is gone: init reaps it.
    pub(super) fn spawn(&self, program: &Path, args: &[&str]) -> std::io::Result<Child> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(self.socket());
        let log = bridge_core::statefile::open(
            &self.dir.join("podman.log"),
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600),
        )?;
        let guard = Command::new("/bin/sh")
            .args(["-c", LINGER_GUARD, "mcp-code-bridge-podman-linger"])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .process_group(0)
            .spawn()?;
        let mut pid = bridge_core::statefile::open(
            &self.dir.join("podman.pid"),
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600),
        )?;
        writeln!(pid, "{}", guard.id().unwrap_or(0))?;
        Ok(guard)
    }

    /// The end of `podman.log`, for an error naming why the service did not come up.
    pub(super) fn log_tail(&self) -> String {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = bridge_core::statefile::open_read(&self.dir.join("podman.log")) else {
            return String::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(2000)));
        let mut buf = Vec::new();
        let _ = f.take(2000).read_to_end(&mut buf);
        bridge_core::text::visible_lines(String::from_utf8_lossy(&buf).trim()).into_owned()
    }

    /// The socket is the user's alone: mode 0600 (the directory is 0700 already).
    pub(super) fn restrict_socket(&self) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(self.socket(), std::fs::Permissions::from_mode(0o600));
    }
}

/// How often a bridge using a lingering service makes a request to it, so that podman's idle
/// timer (`--time = linger`) never ends it under a live bridge: four times per `linger`,
/// within 250 ms to 60 s.
pub(super) fn keep_alive_every(linger: Duration) -> Duration {
    (linger / 4).clamp(Duration::from_millis(250), Duration::from_secs(60))
}

//! The engine's answer about what it can enforce ([`Enforcement`]), kept in the state dir
//! between bridges, so that a bridge started where no engine service runs does not spend the
//! engine's `/info` on its first call's path.
//!
//! Why: podman fills `/info` by running conmon, the OCI runtime and the host's package manager
//! (`dpkg -S`, then `dpkg-query`, on Debian) for their versions: 0.4-0.7 s of a two-core host,
//! the longest part of a cold first call once the container's start overlaps the rest. What
//! the bridge reads from that answer is podman's function of inputs the bridge can read itself
//! in a fraction of a millisecond ([`Facts`]): which engine (the endpoint, or podman's own
//! service) and its version, who runs it, the boot, the cgroup hierarchy with the controllers
//! this user has, and podman's configuration files with the variables that name them.
//!
//! The answer is used only while every one of those facts is the same and for at most
//! [`KEEP_FOR`], and only when it lets the sandbox run (a refusal is always asked afresh). The
//! sandbox asks again [`CHECK_AFTER`] later, off the path, and keeps what it hears; an answer
//! that no longer lets the sandbox run closes what started under the kept one (see
//! `Readiness::check_kept`). The file is the user's (0600, in the 0700 `engine/` directory), read
//! leniently: anything unexpected in it is a miss, never an error.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::enforcement::Enforcement;
use super::kind::{EngineKind, on_path};

/// The longest a kept answer is used, however unchanged its facts.
pub(super) const KEEP_FOR: Duration = Duration::from_secs(24 * 3600);
/// How long after a kept answer was used the engine is asked again: past the first call, while
/// an agent reads its result.
pub const CHECK_AFTER: Duration = Duration::from_secs(2);
/// The file's name in `<state_dir>/engine/`.
const FILE: &str = "enforcement.json";
/// What the file may weigh; a larger one is not read.
const MAX_BYTES: u64 = 256 << 10;
/// The entries read of a configuration directory (`containers.conf.d`).
const MAX_DIR_ENTRIES: usize = 64;
const FORMAT: &str = "mcp-code-bridge engine answer";
const VERSION: u32 = 1;

/// What podman's answer is computed from, as this process reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Facts {
    /// The endpoint, or `own podman service` for one this state dir's bridges start (its socket
    /// differs from one bridge to the next), with the podman it runs.
    engine: String,
    version: String,
    euid: u32,
    boot_id: String,
    /// The cgroup hierarchy: what `/sys/fs/cgroup` holds, and the controllers of this process's
    /// cgroup and of the user's service manager (cgroup v2).
    cgroup: Vec<String>,
    /// The configuration variables podman reads, `NAME=value`.
    env: Vec<String>,
    /// Podman's configuration files and directories' entries: `path size mtime`, or `path -`.
    files: Vec<String>,
}

/// The kept answer's file.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    format: String,
    version: u32,
    /// Seconds since the epoch when the engine gave it.
    at: u64,
    facts: Facts,
    answer: Enforcement,
}

/// The place of one engine's kept answer, with the facts read now.
#[derive(Debug, Clone)]
pub struct Kept {
    path: PathBuf,
    facts: Facts,
}

impl Kept {
    /// For an engine of `kind` at `endpoint` reporting `version` (podman only: Docker's
    /// `/info` costs no process), with the facts read now; `None` when the answer is not kept
    /// for it.
    pub(crate) async fn of(
        kind: EngineKind,
        endpoint: &str,
        version: &str,
        state_dir: &Path,
    ) -> Option<Kept> {
        if kind != EngineKind::Podman {
            return None;
        }
        let own = endpoint
            .strip_prefix("unix://")
            .is_some_and(|p| Path::new(p).starts_with(state_dir));
        let name = if own {
            let podman = on_path("podman").unwrap_or_default();
            format!("own podman service ({})", podman.display())
        } else {
            endpoint.to_string()
        };
        let version = version.to_string();
        let dir = state_dir.join("engine");
        tokio::task::spawn_blocking(move || Kept {
            path: dir.join(FILE),
            facts: Facts::read(name, version, &|k| std::env::var_os(k)),
        })
        .await
        .ok()
    }

    /// The kept answer, if it was given for these facts less than [`KEEP_FOR`] ago.
    pub(crate) async fn answer(&self) -> Option<Enforcement> {
        let k = self.clone();
        tokio::task::spawn_blocking(move || k.answer_now(now()))
            .await
            .ok()
            .flatten()
    }

    fn answer_now(&self, now: u64) -> Option<Enforcement> {
        let text = bridge_core::statefile::read_own(&self.path, MAX_BYTES)?;
        let r: Record = serde_json::from_str(&text).ok()?;
        let fresh = r.at <= now && now - r.at < KEEP_FOR.as_secs();
        (r.format == FORMAT && r.version == VERSION && fresh && r.facts == self.facts)
            .then_some(r.answer)
    }

    /// Keep `answer`, just given by the engine, for these facts. A failure to write is logged:
    /// the next bridge asks the engine.
    pub(crate) async fn keep(&self, answer: &Enforcement) {
        let record = Record {
            format: FORMAT.into(),
            version: VERSION,
            at: now(),
            facts: self.facts.clone(),
            answer: answer.clone(),
        };
        let path = self.path.clone();
        let written = tokio::task::spawn_blocking(move || write(&path, &record)).await;
        if let Ok(Err(e)) = written {
            tracing::debug!(
                "could not keep the engine's answer in {}: {e}",
                self.path.display()
            );
        }
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `record` written whole to `path` (a temporary file of mode 0600 beside it, renamed over it),
/// its directory made 0700 if missing.
fn write(path: &Path, record: &Record) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    bridge_core::statefile::write_private(path, &bytes)
}

/// The variables that move podman's configuration.
const ENV: &[&str] = &[
    "CONTAINERS_CONF",
    "CONTAINERS_CONF_OVERRIDE",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINERS_REGISTRIES_CONF",
    "XDG_CONFIG_HOME",
    "XDG_RUNTIME_DIR",
    "HOME",
];

/// Reads a variable of the environment.
type Var<'a> = &'a dyn Fn(&str) -> Option<std::ffi::OsString>;

impl Facts {
    fn read(engine: String, version: String, var: Var<'_>) -> Facts {
        // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
        let euid = unsafe { libc::geteuid() };
        let env: Vec<String> = ENV
            .iter()
            .filter_map(|k| var(k).map(|v| format!("{k}={}", v.to_string_lossy())))
            .collect();
        let config_home = var("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".config")))
            .map(|d| d.join("containers"));
        let mut files = Vec::new();
        let mut dirs = vec![
            PathBuf::from("/usr/share/containers"),
            PathBuf::from("/etc/containers"),
        ];
        dirs.extend(config_home);
        for d in &dirs {
            for f in [
                "containers.conf",
                "storage.conf",
                "containers.rootless.conf",
            ] {
                files.push(stat_line(&d.join(f)));
            }
            for sub in ["containers.conf.d", "containers.rootless.conf.d"] {
                files.extend(dir_lines(&d.join(sub)));
            }
        }
        for k in [
            "CONTAINERS_CONF",
            "CONTAINERS_CONF_OVERRIDE",
            "CONTAINERS_STORAGE_CONF",
        ] {
            if let Some(p) = var(k) {
                files.push(stat_line(Path::new(&p)));
            }
        }
        Facts {
            engine,
            version,
            euid,
            boot_id: read_small(Path::new("/proc/sys/kernel/random/boot_id")),
            cgroup: cgroup_lines(euid),
            env,
            files,
        }
    }
}

/// `path size mtime` of a file, `path -` when there is none.
fn stat_line(path: &Path) -> String {
    match std::fs::metadata(path) {
        Ok(m) => format!(
            "{} {} {}.{:09}",
            path.display(),
            m.len(),
            m.mtime(),
            m.mtime_nsec()
        ),
        Err(_) => format!("{} -", path.display()),
    }
}

/// The directory's own line and those of its first [`MAX_DIR_ENTRIES`] entries, by name.
fn dir_lines(dir: &Path) -> Vec<String> {
    let mut out = vec![stat_line(dir)];
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut names: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .take(MAX_DIR_ENTRIES)
            .collect();
        names.sort();
        out.extend(names.iter().map(|p| stat_line(p)));
    }
    out
}

/// A short file's first line (a `/proc` or `/sys` value), empty when it cannot be read.
fn read_small(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(4096).read_to_string(&mut s);
    }
    s.trim().to_string()
}

/// The cgroup hierarchy's shape and the controllers this user has: the names `/sys/fs/cgroup`
/// holds (cgroup v1's controllers mounted there, or cgroup v2's files), and on cgroup v2 the
/// controllers of the root, of this process's cgroup and of the user's service manager, which
/// is where podman looks for delegated ones.
fn cgroup_lines(euid: u32) -> Vec<String> {
    let root = Path::new("/sys/fs/cgroup");
    let mut out: Vec<String> = std::fs::read_dir(root)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .take(256)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    let own = read_small(Path::new("/proc/self/cgroup"))
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string));
    // By role, not path: this process's cgroup is another login's scope from one session to
    // the next, and what matters of it is the controllers podman is given, not its name.
    let mut places = vec![("root", root.to_path_buf())];
    places.extend(own.map(|p| ("self", root.join(p.trim_start_matches('/')))));
    places.push((
        "user",
        root.join(format!("user.slice/user-{euid}.slice/user@{euid}.service")),
    ));
    for (role, p) in places {
        let c = p.join("cgroup.controllers");
        if c.exists() {
            out.push(format!("{role}: {}", read_small(&c)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(dir: &Path) -> Kept {
        Kept {
            path: dir.join("engine").join(FILE),
            facts: Facts::read(
                "own podman service (/usr/bin/podman)".into(),
                "4.3.1".into(),
                &|k| std::env::var_os(k),
            ),
        }
    }

    fn answer() -> Enforcement {
        Enforcement {
            rootless: true,
            cgroup_version: "2".into(),
            memory: true,
            pids: true,
            cpu: false,
            runtimes: [("runc".to_string(), "/usr/bin/runc".to_string())].into(),
            userns_remap: false,
        }
    }

    #[tokio::test]
    async fn an_answer_is_used_for_the_same_facts_within_its_time_only() {
        let dir = tempfile::tempdir().unwrap();
        let k = kept(dir.path());
        assert_eq!(k.answer().await, None, "nothing kept yet");
        k.keep(&answer()).await;
        assert_eq!(k.answer().await, Some(answer()));
        let meta = std::fs::metadata(&k.path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(k.path.parent().unwrap()).unwrap().mode() & 0o777,
            0o700
        );
        // Another engine, version, boot or file: a miss.
        for change in [
            |f: &mut Facts| f.engine = "unix:///run/podman/podman.sock".into(),
            |f: &mut Facts| f.version = "5.0.0".into(),
            |f: &mut Facts| f.boot_id = "another boot".into(),
            |f: &mut Facts| f.cgroup.push("memory".into()),
            |f: &mut Facts| f.files[0].push('1'),
            |f: &mut Facts| f.env.push("CONTAINERS_CONF=/x".into()),
        ] {
            let mut other = k.clone();
            change(&mut other.facts);
            assert_eq!(other.answer().await, None, "{:?}", other.facts);
        }
        // Too old, or from the future.
        let at = now();
        assert_eq!(k.answer_now(at + KEEP_FOR.as_secs() + 1), None);
        assert_eq!(k.answer_now(at.saturating_sub(10)), None);
        assert!(k.answer_now(at + KEEP_FOR.as_secs() - 10).is_some());
    }

    #[tokio::test]
    async fn anything_unexpected_in_the_file_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let k = kept(dir.path());
        k.keep(&answer()).await;
        let good = std::fs::read_to_string(&k.path).unwrap();
        for bad in [
            String::new(),
            "{".to_string(),
            good.replace(FORMAT, "another format"),
            good.replace("\"version\":1", "\"version\":2"),
            format!("{good}{}", " ".repeat(MAX_BYTES as usize)),
        ] {
            std::fs::write(&k.path, &bad).unwrap();
            assert_eq!(k.answer().await, None, "{}", &bad[..bad.len().min(80)]);
        }
        // A link to a good answer is not followed.
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::write(&elsewhere, &good).unwrap();
        std::fs::remove_file(&k.path).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &k.path).unwrap();
        assert_eq!(k.answer().await, None);
        // Keeping replaces the link with a file of its own.
        k.keep(&answer()).await;
        assert!(std::fs::symlink_metadata(&k.path).unwrap().is_file());
        assert_eq!(k.answer().await, Some(answer()));
    }

    #[test]
    fn facts_follow_the_configuration_files() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("containers.conf");
        let var = |k: &str| (k == "CONTAINERS_CONF").then(|| conf.clone().into_os_string());
        let before = Facts::read("e".into(), "v".into(), &var);
        std::fs::write(&conf, "[engine]\nruntime = \"runc\"\n").unwrap();
        let after = Facts::read("e".into(), "v".into(), &var);
        assert_ne!(before, after);
        assert!(
            after.env.iter().any(|l| l.starts_with("CONTAINERS_CONF=")),
            "{:?}",
            after.env
        );
        // A file added to a configuration directory is a change too.
        let home = dir.path().join("home");
        let d = home.join(".config/containers/containers.conf.d");
        std::fs::create_dir_all(&d).unwrap();
        let var = |k: &str| (k == "HOME").then(|| home.clone().into_os_string());
        let before = Facts::read("e".into(), "v".into(), &var);
        std::fs::write(d.join("10-runtime.conf"), "x").unwrap();
        assert_ne!(before, Facts::read("e".into(), "v".into(), &var));
        assert!(!after.boot_id.is_empty());
        assert!(!after.cgroup.is_empty());
    }
}

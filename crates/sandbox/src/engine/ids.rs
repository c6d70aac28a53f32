//! The host identity of the sandboxes: whether each container's user is a host uid of its own
//! (podman's `--userns=auto`, from the subordinate ids of `/etc/subuid` and `/etc/subgid`), or
//! every sandbox runs as the same host uid. Per-uid limits of the host's kernel
//! (`RLIMIT_NPROC`, pending signals, inotify instances) and the ownership of what a sandbox
//! writes are per sandbox only in the first case; `container::spec` fits the `nproc` ulimit to
//! which holds, and `doctor` says which.

use std::path::{Path, PathBuf};

use bridge_core::config::{Config, Isolation};

use super::kind::EngineKind;

/// Where podman reads the subordinate ids it gives `--userns=auto` containers.
pub(super) const SUBUID: &str = "/etc/subuid";
/// See [`SUBUID`].
pub(super) const SUBGID: &str = "/etc/subgid";
/// The name whose subordinate ids rootful podman gives `--userns=auto` containers.
pub(super) const ROOTFUL_NAME: &str = "containers";

/// The host identity the sandboxes run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostIds {
    /// Each container its own range of host ids (podman `--userns=auto`): its uid is a host uid
    /// no other sandbox has.
    Own {
        /// Whose subordinate ids (`containers` rootful, the engine's user rootless).
        owner: String,
        /// How many sandboxes the smaller of the two ranges holds at once.
        sandboxes: u64,
    },
    /// Every sandbox the same host uid, and why.
    Shared(String),
}

impl HostIds {
    /// Whether each sandbox gets host ids of its own.
    pub fn own(&self) -> bool {
        matches!(self, HostIds::Own { .. })
    }

    /// What an engine of `kind` at `endpoint` (on the local `socket`, when it is on one) and the
    /// host's subordinate ids give a sandbox of `config`.
    pub fn of(
        kind: EngineKind,
        socket: Option<PathBuf>,
        endpoint: &str,
        config: &Config,
    ) -> HostIds {
        if config.isolation == Isolation::Gvisor {
            return HostIds::Shared(
                "under gVisor every sandbox's kernel (runsc) runs as the host's nobody, whatever \
                 ids the container is given"
                    .into(),
            );
        }
        if kind == EngineKind::Docker {
            return HostIds::Shared(
                "Docker runs every container with the same ids (its userns-remap is one range for \
                 the whole daemon)"
                    .into(),
            );
        }
        let Some(socket) = socket else {
            return HostIds::Shared(format!(
                "podman at {} is not on a local socket: its subordinate ids are not readable here",
                endpoint
            ));
        };
        let (name, uid) = match socket_owner(&socket) {
            Some(0) => (ROOTFUL_NAME.to_string(), None),
            Some(uid) => (user_name(uid).unwrap_or_else(|| uid.to_string()), Some(uid)),
            None => {
                return HostIds::Shared(format!(
                    "the engine's socket {} cannot be read",
                    socket.display()
                ));
            }
        };
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        decide(config, &name, uid, &read(SUBUID), &read(SUBGID))
    }
}

/// The ids one sandbox takes: podman gives a `--userns=auto` container a range that holds the
/// ids it runs as (`container_user`, 65534:65534 by default: 65535 ids).
pub fn ids_per_sandbox(config: &Config) -> u64 {
    let mut parts = config
        .container_user
        .split(':')
        .map(|p| p.parse::<u64>().unwrap_or(65534));
    let uid = parts.next().unwrap_or(65534);
    let gid = parts.next().unwrap_or(uid);
    uid.max(gid) + 1
}

/// How many sandboxes the subordinate ids of `name` (or `uid`) in `subuid` and `subgid` hold at
/// once, and so which identity they get: their own when the ranges hold at least this bridge's
/// sessions and pool, once over.
fn decide(config: &Config, name: &str, uid: Option<u32>, subuid: &str, subgid: &str) -> HostIds {
    let per = ids_per_sandbox(config);
    let ids = count(subuid, name, uid).min(count(subgid, name, uid));
    let sandboxes = ids / per;
    let need = config.max_sessions as u64 + config.pool_size as u64 + 1;
    if sandboxes >= need {
        return HostIds::Own {
            owner: name.to_string(),
            sandboxes,
        };
    }
    let files = format!("{SUBUID} and {SUBGID}");
    HostIds::Shared(if ids == 0 {
        format!(
            "{files} give {name:?} no subordinate ids, so podman's --userns=auto cannot be used"
        )
    } else {
        format!(
            "{files} give {name:?} {ids} subordinate ids: {sandboxes} sandboxes of {per} ids, \
             fewer than max_sessions + pool_size + 1 ({need})"
        )
    })
}

/// The subordinate ids `name` (or its `uid`) has in a subuid(5)/subgid(5) file.
fn count(file: &str, name: &str, uid: Option<u32>) -> u64 {
    let uid = uid.map(|u| u.to_string());
    file.lines()
        .filter_map(|l| {
            let mut f = l.trim().split(':');
            let (who, _start, n) = (f.next()?, f.next()?, f.next()?);
            (who == name || uid.as_deref() == Some(who)).then(|| n.trim().parse::<u64>().ok())?
        })
        .sum()
}

fn socket_owner(socket: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(socket).ok().map(|m| m.uid())
}

fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)? == uid.to_string()).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subordinate_ids_decide_the_identity() {
        let c = Config::default();
        let big = "alice:100000:65536\ncontainers:2147483647:2147483648\n";
        assert_eq!(
            decide(&c, "containers", None, big, big),
            HostIds::Own {
                owner: "containers".into(),
                sandboxes: 2147483648 / 65535
            }
        );
        // The smaller of the two files counts; the user's lines by name or by uid, summed.
        let gid = "containers:2147483647:65536\n";
        assert!(!decide(&c, "containers", None, big, gid).own());
        let split = "1000:100000:655360\nbob:1000000:65536\n";
        assert!(decide(&c, "bob", Some(1000), split, split).own());
        match decide(&c, "alice", Some(1001), big, big) {
            HostIds::Shared(why) => assert!(why.contains("65536 subordinate ids"), "{why}"),
            own => panic!("{own:?}"),
        }
        match decide(&c, "containers", None, "", "") {
            HostIds::Shared(why) => assert!(why.contains("no subordinate ids"), "{why}"),
            own => panic!("{own:?}"),
        }
        let small_user = Config {
            container_user: "1000:1000".into(),
            ..Config::default()
        };
        assert_eq!(ids_per_sandbox(&small_user), 1001);
        assert!(decide(&small_user, "alice", None, big, big).own());
    }
}

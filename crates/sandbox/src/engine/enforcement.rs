//! What the engine can enforce and which isolation it gives, read from its `/info`: the limits a
//! sandbox asks for that would be silently dropped, and the gVisor runtime when it is asked for.

use bollard::Docker;
use bridge_core::boxed::Boxed;

use bridge_core::config::Config;
use bridge_core::error::{Hint, Hinted};

/// Whether `dir` (the engine's storage root) is a local directory owned by this process's
/// user, and that user is not root: the engine runs as us, rootless.
fn storage_is_ours_and_not_root(dir: Option<&str>) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    let uid = unsafe { libc::geteuid() };
    uid != 0
        && dir
            .and_then(|d| std::fs::metadata(d).ok())
            .is_some_and(|m| m.uid() == uid)
}

/// `isolation = "gvisor"` and the engine has no runtime of the name `gvisor_runtime` gives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "isolation = \"gvisor\" needs the engine's runtime {runtime:?}, which it does not have{}; no code runs without it, there is no fallback to runc",
    if .known.is_empty() { String::new() } else { format!(" (it has: {})", .known.join(", ")) }
)]
pub struct SandboxIsolationMissing {
    /// The runtime `gvisor_runtime` names.
    pub runtime: String,
    /// The runtimes the engine has, by name.
    pub known: Vec<String>,
}

impl Hinted for SandboxIsolationMissing {
    fn hint(&self) -> Option<Hint> {
        Some(Hint::sentence(
            "Install and register gVisor: `sudo scripts/setup-debian.sh --isolation gvisor` (runsc, \
         registered with podman under the name runsc), or register it yourself (podman: \
         [engine.runtimes] in containers.conf; Docker: \"runtimes\" in /etc/docker/daemon.json) \
         and set gvisor_runtime to its name; or set isolation = \"container\". Under podman the \
         runtime must be given runsc's --network=none (setup-debian.sh's wrapper does).",
        ))
    }
}

/// What the engine can enforce, from its `/info`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Enforcement {
    /// The engine runs as an unprivileged user.
    pub rootless: bool,
    /// The host's cgroup version as the engine reports it (`1`, `2`).
    pub cgroup_version: String,
    /// A memory limit takes effect.
    pub memory: bool,
    /// A pids limit takes effect.
    pub pids: bool,
    /// A CPU limit takes effect.
    pub cpu: bool,
    /// The OCI runtimes the engine has registered, by name, with the path it reports (podman
    /// lists its built-in candidates too, present or not: a runtime named here may still fail
    /// to start a container).
    pub runtimes: std::collections::BTreeMap<String, String>,
    /// Docker's `userns-remap`: every container in the daemon's one remapped range (for
    /// `doctor`; the sandboxes still share their host uid).
    #[serde(default)]
    pub userns_remap: bool,
}

impl Enforcement {
    /// Ask the engine what it can enforce (its `/info`).
    #[inline(never)]
    pub fn query(docker: &Docker) -> Boxed<'_, Result<Self, bollard::errors::Error>> {
        Box::pin(Self::query_here(docker))
    }

    async fn query_here(docker: &Docker) -> Result<Self, bollard::errors::Error> {
        let info = docker.info().await?;
        // Rootless Docker says so in its security options. Podman's compatible /info does not
        // (and reports MemoryLimit even where rootless cgroup v1 drops every limit), but its
        // storage root gives it away: a local directory owned by us, a non-root user.
        let rootless = info
            .security_options
            .as_ref()
            .is_some_and(|o| o.iter().any(|s| s.contains("rootless")))
            || storage_is_ours_and_not_root(info.docker_root_dir.as_deref());
        let cgroup_version = info
            .cgroup_version
            .map(|v| v.to_string())
            .unwrap_or_default();
        let v1_rootless = rootless && cgroup_version == "1";
        let runtimes = info
            .runtimes
            .unwrap_or_default()
            .into_iter()
            .map(|(name, r)| (name, r.path.unwrap_or_default()))
            .collect();
        let userns_remap = info
            .security_options
            .as_ref()
            .is_some_and(|o| o.iter().any(|s| s.contains("name=userns")));
        Ok(Enforcement {
            userns_remap,
            runtimes,
            rootless,
            memory: info.memory_limit.unwrap_or(false) && !v1_rootless,
            pids: info.pids_limit.unwrap_or(false) && !v1_rootless,
            cpu: info.cpu_cfs_quota.unwrap_or(false) && !v1_rootless,
            cgroup_version,
        })
    }

    /// Whether the isolation the config asks for can be had: `Err` names the runtime missing.
    pub fn isolation(&self, config: &Config) -> Result<(), SandboxIsolationMissing> {
        match config.oci_runtime() {
            Some(rt) if !self.runtimes.contains_key(rt) => Err(SandboxIsolationMissing {
                runtime: rt.to_string(),
                known: self.runtimes.keys().cloned().collect(),
            }),
            _ => Ok(()),
        }
    }

    /// The limits the config asks for that this host cannot enforce, each with the reason.
    pub fn missing(&self, config: &Config) -> Vec<String> {
        let why = if self.rootless && self.cgroup_version == "1" {
            "rootless containers on cgroup v1 cannot have resource limits"
        } else {
            "the engine reports the cgroup controller unavailable (rootless cgroup v2 needs it delegated: see systemd's Delegate=)"
        };
        let mut out = Vec::new();
        if self.rootless && config.isolation == bridge_core::config::Isolation::Gvisor {
            // runsc runs a rootless container only with --ignore-cgroups: every limit dropped,
            // whatever the engine says of its controllers.
            out.push(format!(
                "memory ({}), pids ({}){}: gVisor applies no cgroup limits to a rootless container (runsc --ignore-cgroups)",
                config.memory,
                config.pids,
                config.cpus.map(|c| format!(", cpus ({c})")).unwrap_or_default()
            ));
            return out;
        }
        if !self.memory {
            out.push(format!("memory ({}): {why}", config.memory));
        }
        if !self.pids {
            out.push(format!("pids ({}): {why}", config.pids));
        }
        if config.cpus.is_some() && !self.cpu {
            out.push(format!("cpus ({}): {why}", config.cpus.unwrap_or_default()));
        }
        out
    }
}

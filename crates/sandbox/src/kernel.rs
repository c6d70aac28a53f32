//! Which kernel a sandbox runs on, proved at its boot. The runtime reads it before any code of the
//! user's runs (the `ready` frame's `kernel`: `uname` and `/proc/version`, docs/protocol.md);
//! under `isolation = "gvisor"` a sandbox whose kernel is not gVisor's is removed before it takes
//! a call ([`gvisor`]). The code runs only afterwards, so what it could forge later on the
//! channel (a second `ready` is dropped, `channel.rs`) changes nothing here.

use bridge_core::protocol::KernelSeen;

/// The version gVisor's kernel gives in `uname` and `/proc/version`: a constant of gVisor's
/// (`pkg/abi/linux`, with the release `4.4.0`), the same under every platform (ptrace, kvm,
/// systrap) and in every runsc release since its first. No Linux build of the host prints it.
pub const GVISOR_VERSION: &str = "#1 SMP Sun Jan 10 15:06:54 PST 2016";

/// The host's kernel, as `uname -r` and `uname -v` print it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostKernel {
    /// `uname -r`.
    pub release: String,
    /// `uname -v`.
    pub version: String,
}

/// The kernel the bridge itself runs on.
pub fn host() -> HostKernel {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    HostKernel {
        release: read("/proc/sys/kernel/osrelease"),
        version: read("/proc/sys/kernel/version"),
    }
}

/// Why the kernel a sandbox saw is not gVisor's (the isolation asked for is missing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotGvisor {
    /// The `ready` frame named no kernel, which proves nothing.
    #[error("its runtime reported no kernel")]
    NoKernel,
    /// The sandbox runs on the host's own kernel (`uname` matches the host's).
    #[error("it is the host's kernel ({release} {version})")]
    HostKernel {
        /// `uname -r` in the sandbox.
        release: String,
        /// `uname -v` in the sandbox.
        version: String,
    },
    /// `uname`'s version is not gVisor's.
    #[error(
        "uname says {release:?} {version:?}, not gVisor's version {:?}",
        GVISOR_VERSION
    )]
    Uname {
        /// `uname -r` in the sandbox.
        release: String,
        /// `uname -v` in the sandbox.
        version: String,
    },
    /// `/proc/version` does not name gVisor's version.
    #[error(
        "/proc/version says {proc_version:?}, not gVisor's version {:?}",
        GVISOR_VERSION
    )]
    ProcVersion {
        /// `/proc/version` in the sandbox.
        proc_version: String,
    },
}

/// Whether the kernel a sandbox reported at boot is gVisor's: `Err` says why not. It must say
/// gVisor's version both through `uname` and in `/proc/version`, and not be the host's own.
pub fn gvisor(seen: Option<&KernelSeen>, host: &HostKernel) -> Result<(), NotGvisor> {
    let Some(k) = seen else {
        return Err(NotGvisor::NoKernel);
    };
    if !host.release.is_empty() && k.release == host.release && k.version == host.version {
        return Err(NotGvisor::HostKernel {
            release: k.release.clone(),
            version: k.version.clone(),
        });
    }
    if k.version.trim() != GVISOR_VERSION {
        return Err(NotGvisor::Uname {
            release: k.release.clone(),
            version: k.version.clone(),
        });
    }
    if !k.proc_version.contains(GVISOR_VERSION) {
        return Err(NotGvisor::ProcVersion {
            proc_version: k.proc_version.clone(),
        });
    }
    Ok(())
}

/// How a reported kernel reads in a message: `4.4.0 #1 SMP …`.
pub fn describe(seen: Option<&KernelSeen>) -> String {
    match seen {
        Some(k) => format!("{} {}", k.release, k.version),
        None => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(release: &str, version: &str, proc_version: &str) -> KernelSeen {
        KernelSeen {
            release: release.into(),
            version: version.into(),
            proc_version: proc_version.into(),
        }
    }

    fn host() -> HostKernel {
        HostKernel {
            release: "6.1.0-26-amd64".into(),
            version: "#1 SMP PREEMPT_DYNAMIC Debian 6.1.112-1 (2024-09-30)".into(),
        }
    }

    #[test]
    fn gvisors_kernel_is_recognised_by_uname_and_proc_version() {
        let g = seen(
            "4.4.0",
            GVISOR_VERSION,
            "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016",
        );
        assert_eq!(gvisor(Some(&g), &host()), Ok(()));
    }

    #[test]
    fn the_hosts_kernel_or_any_other_is_refused_and_the_reason_names_it() {
        let h = host();
        let runc = seen(
            &h.release,
            &h.version,
            "Linux version 6.1.0-26-amd64 (debian-kernel@lists.debian.org) ...",
        );
        let why = gvisor(Some(&runc), &h).unwrap_err().to_string();
        assert!(why.contains("the host's kernel (6.1.0-26-amd64"), "{why}");
        // Another kernel (a VM runtime, a wrong registration) is not gVisor's either.
        let kata = seen(
            "5.15.0",
            "#1 SMP Tue Oct 1 2024",
            "Linux version 5.15.0 ...",
        );
        let why = gvisor(Some(&kata), &h).unwrap_err().to_string();
        assert!(why.contains("not gVisor's version"), "{why}");
        // Both sources must agree: uname alone is not enough.
        let half = seen("4.4.0", GVISOR_VERSION, "Linux version 6.1.0-26-amd64 ...");
        let why = gvisor(Some(&half), &h).unwrap_err().to_string();
        assert!(why.starts_with("/proc/version says"), "{why}");
        // A `ready` without the kernel proves nothing.
        assert_eq!(
            gvisor(None, &h).unwrap_err().to_string(),
            "its runtime reported no kernel"
        );
    }

    #[test]
    fn the_host_the_bridge_runs_on_is_read() {
        let h = super::host();
        assert!(!h.release.is_empty() && !h.version.is_empty(), "{h:?}");
        // The machine that runs the tests is no gVisor sandbox.
        assert_ne!(h.version, GVISOR_VERSION);
    }
}

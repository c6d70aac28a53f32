//! Why the sandbox could not run a call at all (the code's own failures are outcomes, not
//! errors). The message says what happened; its [`Hint`] says what to do next.

use super::engine::EngineError;
use super::image::ImageError;
use bridge_core::error::{Hint, Hinted};

/// Why no sandbox could run a call: the engine, the image, the limits, the container's start or
/// the room for a session. Each says what to do next through [`Hinted`].
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// No container engine could be reached or started.
    #[error("{0}")]
    Engine(#[from] EngineError),
    /// The engine answered, but not what it can enforce.
    #[error("could not ask the engine what it can enforce: {0}")]
    EngineQuery(String),
    /// The host would silently drop limits; refused unless `allow_unenforced_limits`.
    #[error(
        "this host cannot enforce these sandbox limits: {}. Refusing to run code with limits silently dropped.",
        .0.join("; ")
    )]
    Unenforceable(Vec<String>),
    /// `isolation = "gvisor"` and the engine has no such runtime: never a fallback.
    #[error("{0}")]
    Isolation(#[from] super::engine::SandboxIsolationMissing),
    /// `isolation = "gvisor"`, and the kernel a sandbox saw at boot was not gVisor's: it was
    /// removed before it took a call.
    #[error(
        "isolation = \"gvisor\", but the sandbox's kernel is not gVisor's: {why}; the sandbox was removed before any code ran in it"
    )]
    NotGvisor {
        /// The OCI runtime the sandbox was started with.
        runtime: String,
        /// What the kernel said of itself, and why that is not gVisor.
        why: String,
    },
    /// The image is missing and could not be loaded or pulled.
    #[error("{0}")]
    Image(#[from] ImageError),
    /// The engine refused to create the container (a bad image name, a setting it rejects).
    #[error("could not create the sandbox container from image {image:?}: {reason}")]
    Create {
        /// The image the container was to run.
        image: String,
        /// The engine's answer.
        reason: String,
    },
    /// The container was created but its stdin/stdout stream could not be attached.
    #[error("could not attach to the sandbox container: {0}")]
    Attach(super::attach::AttachError),
    /// The engine did not start the created container (its runtime failed, a limit it cannot
    /// set); the engine's answer.
    #[error("could not start the sandbox container: {0}")]
    Start(String),
    /// The container ended before the runtime said `ready`; `stderr` is its last lines.
    #[error("{}", exited_at_start(.image, .stderr))]
    ExitedAtStart {
        /// The image it ran.
        image: String,
        /// Its last lines of stderr, as it wrote them.
        stderr: Vec<String>,
    },
    /// The runtime did not say `ready` within the start's bound (seconds): the container is
    /// removed.
    #[error("the sandbox did not become ready within {0}s")]
    NotReady(u64),
    /// The failure of an attempt (to reach the engine, or to make the image present) that this
    /// caller waited for, its hint included: it is not tried twice in a row.
    #[error("{0}")]
    Shared(String),
    /// `max_sessions` (or the identity's `http.max_sessions_per_identity`) are alive and every
    /// one is running code. `busy` names the caller's own sessions only (and counts others').
    #[error(
        "cannot start session {session:?}: all {max} sessions allowed by {key} are running code ({})",
        .busy.join(", ")
    )]
    AllBusy {
        /// The session the call asked for.
        session: String,
        /// The bound that is full.
        max: u32,
        /// The configuration key of that bound.
        key: &'static str,
        /// The caller's own busy sessions by name, and a count of other users'.
        busy: Vec<String>,
    },
    /// The host's available memory is below `memory_reserve`: a new sandbox would take what the
    /// bridge, its engine and the host keep.
    #[error(
        "cannot start session {session:?}: the host has {} MiB of memory available, under memory_reserve = {} MiB (kept free so that the host never runs out and its OOM killer never has to choose a process)",
        .available >> 20, .reserve >> 20
    )]
    MemoryReserve {
        /// The session the call asked for.
        session: String,
        /// The host's available memory, in bytes (`MemAvailable`).
        available: u64,
        /// `memory_reserve`, in bytes.
        reserve: u64,
    },
}

/// Why the sandbox exited before `ready`: the runtime's own refusal when it gave one (it cannot
/// install its seccomp filter, say); else the cause its last stderr lines show ([`Cause`]),
/// named with its fix; else a guess at the image. The stderr lines follow.
fn exited_at_start(image: &str, stderr: &[String]) -> String {
    if let Some(why) = stderr
        .iter()
        .find_map(|l| l.split_once(RUNTIME_REFUSAL).map(|(_, why)| why.trim()))
    {
        return format!("the sandbox's runtime refused to start: {why}");
    }
    let tail = if stderr.is_empty() {
        String::new()
    } else {
        format!(":\n{}", stderr.join("\n"))
    };
    let head = match Cause::of(stderr) {
        Some(Cause::Processes) => "the sandbox exited while starting because a process or thread \
             could not be made (fork failed with EAGAIN, \"Resource temporarily unavailable\"): a \
             limit on processes was reached: the sandbox's `pids` (MCP_BRIDGE_PIDS), its `ulimit -u` \
             (which counts every process of its host uid: one budget for every sandbox where \
             they share it, see `mcp-code-bridge doctor`'s host identity), the limit of the user \
             the engine runs as (`ulimit -u`, systemd's TasksMax), or the machine's \
             (kernel.pid_max). Fix: end the processes that hold them (those of the sandbox's \
             host uid, or of the engine's user), or raise the limit that was reached (`pids`, \
             `ulimit -u`, `systemctl set-property user-<uid>.slice TasksMax=...`)"
            .to_string(),
        Some(Cause::Memory) => "the sandbox exited while starting because memory ran out \
             (\"Cannot allocate memory\" / MemoryError). Fix: raise `memory` \
             (MCP_BRIDGE_MEMORY), or free memory on the host"
            .to_string(),
        Some(Cause::NoPython) => format!(
            "the sandbox exited while starting because image {image:?} has no python3 on its \
             PATH. Fix: use an image with python3 >= 3.9 (`image`), e.g. the bridge's own"
        ),
        None => {
            format!("the sandbox exited while starting (does image {image:?} have python3 >= 3.9?)")
        }
    };
    format!("{head}{tail}")
}

/// What a sandbox's stderr at its start says stopped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// A fork or a thread failed with EAGAIN: the pids cgroup, `RLIMIT_NPROC` or the host's.
    Processes,
    /// ENOMEM, or Python's MemoryError.
    Memory,
    /// The image has no `python3`.
    NoPython,
}

impl Cause {
    fn of(stderr: &[String]) -> Option<Cause> {
        let lower: Vec<String> = stderr.iter().map(|l| l.to_lowercase()).collect();
        let has = |needles: &[&str]| {
            lower
                .iter()
                .any(|l| needles.iter().any(|n| l.contains(&n.to_lowercase())))
        };
        if has(&[
            "Resource temporarily unavailable",
            "failed to fork",
            "fork: retry",
            "can't start new thread",
            "EAGAIN",
            "[Errno 11]",
        ]) {
            Some(Cause::Processes)
        } else if has(&[
            "Cannot allocate memory",
            "MemoryError",
            "out of memory",
            "ENOMEM",
        ]) {
            Some(Cause::Memory)
        } else if has(&[
            "python3: not found",
            "\"python3\": executable file not found",
            "exec: python3",
            "python3: No such file or directory",
        ]) {
            Some(Cause::NoPython)
        } else {
            None
        }
    }
}

/// How the runtime begins the stderr line that says why it will not start.
const RUNTIME_REFUSAL: &str = "mcp-code-bridge runtime: cannot start:";

impl Hinted for SandboxError {
    fn hint(&self) -> Option<Hint> {
        match self {
            SandboxError::Unenforceable(_) => Some(Hint::sentence(
                "Run as a user/host with cgroup v2 delegation, or set MCP_BRIDGE_ALLOW_UNENFORCED_LIMITS=1 to accept it (`mcp-code-bridge doctor` explains).",
            )),
            SandboxError::AllBusy { key, .. } => Some(Hint::sentence(format!(
                "Wait for one to finish, run this code in one of them, or raise {key} ({}).",
                bridge_core::config::env_name(key)
            ))),
            SandboxError::MemoryReserve { .. } => Some(Hint::sentence(format!(
                "Run this code in a session that exists, or close sessions no longer needed (their idle ones close after runtime_idle_timeout), then call again; a host that needs more sessions needs more memory, or a lower memory_reserve ({}).",
                bridge_core::config::env_name("memory_reserve")
            ))),
            SandboxError::Isolation(e) => e.hint(),
            SandboxError::NotGvisor { runtime, .. } => Some(Hint::sentence(format!(
                "The engine's runtime {runtime:?} (gvisor_runtime) did not run it under gVisor: register runsc under that name (`sudo scripts/setup-debian.sh --isolation gvisor`) and check with `mcp-code-bridge doctor`. No code runs until it does; there is no fallback to runc."
            ))),
            SandboxError::Create { .. }
            | SandboxError::Start(_)
            | SandboxError::ExitedAtStart { .. } => Some(Hint::sentence(
                "`mcp-code-bridge doctor` checks the engine, its runtime and the image.",
            )),
            SandboxError::Image(e) => e.hint(),
            SandboxError::Engine(e) => e.hint(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_hints_are_separate() {
        let e = SandboxError::AllBusy {
            session: "b".into(),
            max: 2,
            key: "max_sessions",
            busy: vec!["a".into(), "c".into()],
        };
        assert_eq!(
            e.to_string(),
            "cannot start session \"b\": all 2 sessions allowed by max_sessions are running code (a, c)"
        );
        assert!(
            e.message()
                .ends_with("raise max_sessions (MCP_BRIDGE_MAX_SESSIONS).")
        );
        let e = SandboxError::ExitedAtStart {
            image: "i".into(),
            stderr: vec![],
        };
        assert!(e.to_string().ends_with("python3 >= 3.9?)"), "{e}");
        let e = SandboxError::ExitedAtStart {
            image: "i".into(),
            stderr: vec![
                "mcp-code-bridge runtime: cannot start: the seccomp filter could not be installed (EINVAL)".into(),
            ],
        };
        assert_eq!(
            e.to_string(),
            "the sandbox's runtime refused to start: the seccomp filter could not be installed (EINVAL)"
        );
        assert!(SandboxError::NotReady(60).hint().is_none());
        // A fork that failed with EAGAIN is named as such, with its fix, never as the image.
        let e = SandboxError::ExitedAtStart {
            image: "i".into(),
            stderr: vec![
                "catatonit: failed to fork child: Resource temporarily unavailable".into(),
            ],
        };
        let m = e.to_string();
        assert!(m.contains("a limit on processes was reached"), "{m}");
        assert!(m.contains("ulimit -u") && m.contains("`pids`"), "{m}");
        assert!(!m.contains(">= 3.9"), "{m}");
        assert!(m.ends_with("catatonit: failed to fork child: Resource temporarily unavailable"));
        // As the engine words it when the init's exec is refused for the same limit.
        let e = SandboxError::ExitedAtStart {
            image: "i".into(),
            stderr: vec!["exec /run/podman-init: resource temporarily unavailable".into()],
        };
        assert!(
            e.to_string().contains("a limit on processes was reached"),
            "{e}"
        );
        let e = SandboxError::ExitedAtStart {
            image: "i".into(),
            stderr: vec!["MemoryError".into()],
        };
        assert!(e.to_string().contains("raise `memory`"), "{e}");
        let e = SandboxError::ExitedAtStart {
            image: "busybox".into(),
            stderr: vec!["/bin/sh: 1: exec: python3: not found".into()],
        };
        assert!(e.to_string().contains("has no python3"), "{e}");
        let e = SandboxError::NotGvisor {
            runtime: "runsc".into(),
            why: "it is the host's kernel (6.1.0 #1 SMP)".into(),
        };
        assert_eq!(
            e.to_string(),
            "isolation = \"gvisor\", but the sandbox's kernel is not gVisor's: it is the host's kernel (6.1.0 #1 SMP); the sandbox was removed before any code ran in it"
        );
        let hint = e.hint().unwrap().to_string();
        assert!(
            hint.contains("\"runsc\" (gvisor_runtime)") && hint.contains("no fallback to runc"),
            "{hint}"
        );
    }
}

//! Why no engine could be had ([`EngineError`], with what to do next), and why the engine did
//! not do what was asked of a container ([`ContainerError`]).

use std::path::PathBuf;

use super::enforcement::SandboxIsolationMissing;
use bridge_core::config::Runtime;
use bridge_core::error::{Hint, Hinted};

/// Why no engine could be had. The message says what was tried; [`EngineError::hint`] says what
/// to do next.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// No candidate socket answered and no podman service could be started.
    #[error("no container engine answered (runtime = {:?}). Tried:\n{}", .runtime.to_string(), .tried.join("\n"))]
    NoneAnswered {
        /// The `runtime` setting the candidates came from.
        runtime: Runtime,
        /// One line per candidate: URL, where it came from, why it failed.
        tried: Vec<String>,
    },
    /// The state dir, where our own podman service keeps its socket, cannot be created.
    #[error("cannot create state dir {}: {source}", .dir.display())]
    StateDir {
        /// The directory that could not be made.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The state dir is too long for the bridge's own service's socket, and the keeper directory,
    /// where such sockets go then, cannot be used.
    #[error(
        "the state dir {} is too long for a socket path in it (107 bytes at most), and {}",
        .state_dir.display(),
        .why.problem
    )]
    SocketDir {
        /// The state dir.
        state_dir: PathBuf,
        /// Why the keeper directory cannot be used, and its fix.
        why: crate::keeperdir::HandOverOff,
    },
    /// `podman system service` could not be spawned.
    #[error("could not start {} system service (under /bin/sh): {source}", .podman.display())]
    ServiceSpawn {
        /// The podman program run.
        podman: PathBuf,
        /// Why it could not be spawned.
        source: std::io::Error,
    },
    /// `isolation = "gvisor"`, and podman cannot run the runtime `gvisor_runtime` names.
    #[error("{missing}: podman says {podman_said}")]
    GvisorRuntime {
        /// The runtime that is missing.
        missing: SandboxIsolationMissing,
        /// What podman said when asked to run it.
        podman_said: String,
    },
    /// Our own podman service exited or did not answer in time.
    #[error("podman is installed but no engine answered. Tried:\n{}", .tried.join("\n"))]
    ServiceSilent {
        /// One line per endpoint tried: URL, where it came from, why it failed.
        tried: Vec<String>,
    },
}

impl Hinted for EngineError {
    /// What to do about it: on a line of its own (the message lists what was tried, a line
    /// each), or after `; ` for the state dir.
    fn hint(&self) -> Option<Hint> {
        Some(match self {
            EngineError::NoneAnswered {
                runtime: Runtime::Socket(_),
                ..
            } => Hint::line(
                "Check that the engine behind that socket is running, or set MCP_BRIDGE_RUNTIME=auto.",
            ),
            EngineError::NoneAnswered { .. } => Hint::line(
                "Install podman (Debian/Ubuntu: `sudo apt-get install podman`; Fedora: `sudo dnf install podman`; macOS: `brew install podman && podman machine init && podman machine start`) or start Docker, or point MCP_BRIDGE_RUNTIME at a socket URL.",
            ),
            EngineError::StateDir { .. } => {
                Hint::clause("set MCP_BRIDGE_STATE_DIR to a writable directory")
            }
            EngineError::SocketDir { why, .. } => Hint::line(format!(
                "Fix the keeper directory ({}), or set MCP_BRIDGE_STATE_DIR to a shorter path.",
                why.fix
            )),
            EngineError::ServiceSpawn { .. } => return None,
            EngineError::GvisorRuntime { missing, .. } => Hint::line(missing.hint()?.text()),
            EngineError::ServiceSilent { .. } => Hint::line(
                "Run `podman info` to see what is wrong (on hosts where crun fails, set runtime = \"runc\" in /etc/containers/containers.conf).",
            ),
        })
    }
}

/// Why the engine did not do what was asked of a container (rename, list, inspect).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ContainerError {
    /// No answer within the time the call allows.
    #[error("the engine did not answer within {0}s")]
    NoAnswer(u64),
    /// The engine's own refusal or failure, as it said it.
    #[error("{0}")]
    Engine(String),
}

impl From<String> for ContainerError {
    fn from(s: String) -> Self {
        ContainerError::Engine(s)
    }
}

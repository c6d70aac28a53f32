//! Which engine answered, and where its programs are.

use std::path::PathBuf;

/// Which engine answered: their APIs differ in places (`podman` has its own service, `--userns=auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// Podman's Docker-compatible API.
    Podman,
    /// The Docker daemon.
    Docker,
}

/// Whether an executable named `name` is on PATH.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

//! The rootless test user and the turn its tests take: `tests/e2e/security_rootless.rs` and the
//! rootless lifecycle tests of `faults_lifecycle.rs` share the user's podman (one replaces its
//! pause process, the others count its containers), so they run one at a time.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Held for the whole of a rootless test.
pub static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The test user (`mcb-rootless`, or `MCP_BRIDGE_TEST_ROOTLESS_USER`), created when missing
/// (`useradd -m` gives it the subordinate ids rootless podman needs), and its home; once per
/// test process.
pub fn user() -> (String, PathBuf) {
    static ONCE: std::sync::OnceLock<(String, PathBuf)> = std::sync::OnceLock::new();
    ONCE.get_or_init(create).clone()
}

fn create() -> (String, PathBuf) {
    let name =
        std::env::var("MCP_BRIDGE_TEST_ROOTLESS_USER").unwrap_or_else(|_| "mcb-rootless".into());
    let exists = Command::new("id")
        .args(["-u", &name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    if !exists {
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "user {name} does not exist and only root can create it: `sudo useradd -m {name}` (it needs /etc/subuid and /etc/subgid entries for rootless podman)"
        );
        let ok = Command::new("useradd")
            .args(["-m", "-s", "/bin/sh", &name])
            .status()
            .unwrap()
            .success();
        assert!(ok, "useradd -m {name} failed");
    }
    let out = Command::new("getent")
        .args(["passwd", &name])
        .output()
        .unwrap();
    let home = String::from_utf8_lossy(&out.stdout)
        .trim()
        .split(':')
        .nth(5)
        .unwrap_or_default()
        .to_string();
    assert!(!home.is_empty(), "no home for {name}");
    (name, PathBuf::from(home))
}

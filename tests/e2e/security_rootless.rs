//! Rootless podman on a normal user account: the real binary run as an unprivileged
//! user (created when missing: `mcb-rootless`, or `MCP_BRIDGE_TEST_ROOTLESS_USER`), talking to
//! that user's own podman, driven by rmcp's client. Where the host cannot enforce the limits
//! rootless (cgroup v1), the bridge must refuse to run and name them, and run only when
//! `MCP_BRIDGE_ALLOW_UNENFORCED_LIMITS=1` says so, with every other isolation still in place.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::Outcome;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;

/// A copy of the binary the test user can execute (the build tree may not be readable by it).
fn binary_for(dir: &Path) -> PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("mcp-code-bridge");
    std::fs::copy(common::BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

fn cgroup_v2() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// The rootless tests' turn (`common::rootless::TURN`), held.
type Turn = tokio::sync::MutexGuard<'static, ()>;

struct Rootless {
    _turn: Turn,
    client: RunningService<RoleClient, ()>,
    log: PathBuf,
    user: String,
    before: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Rootless {
    async fn start(extra_env: &[(&str, &str)]) -> Rootless {
        Self::start_in(common::rootless::TURN.lock().await, extra_env).await
    }

    /// Start it within a turn already held (a test of several bridges one after the other).
    async fn start_in(turn: Turn, extra_env: &[(&str, &str)]) -> Rootless {
        let (user, home) = common::rootless::user();
        // Containers an earlier rootless test left (a bridge it killed): not this bridge's.
        let before = containers_of_user(&user);
        let archive = common::image_archive();
        let dir = tempfile::Builder::new()
            .prefix("mcb-rootless-")
            .tempdir()
            .unwrap();
        let bin = binary_for(dir.path());
        // The archive may sit where the test user cannot read it (a root-only cache): copy it.
        let readable = std::process::Command::new("runuser")
            .args(["-u", &user, "--", "test", "-r"])
            .arg(&archive)
            .status()
            .unwrap()
            .success();
        let archive = if readable {
            archive
        } else {
            let copy = dir.path().join("image.tar");
            std::fs::copy(&archive, &copy).unwrap();
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
            copy
        };
        let log = dir.path().join("bridge.log");
        let logf = std::fs::File::create(&log).unwrap();
        let mut env = vec![
            format!("HOME={}", home.display()),
            format!("USER={user}"),
            format!("PATH={}", std::env::var("PATH").unwrap_or_default()),
            format!("MCP_BRIDGE_IMAGE_ARCHIVE={}", archive.display()),
            "MCP_BRIDGE_LOG_LEVEL=debug".into(),
            format!(
                "{}={}",
                common::NO_SYSTEM_CONFIG.0,
                common::NO_SYSTEM_CONFIG.1
            ),
            // Its service goes with it, as every test bridge's (common::private_home_env).
            "MCP_BRIDGE_ENGINE_LINGER=0".to_string(),
        ];
        env.extend(extra_env.iter().map(|(k, v)| format!("{k}={v}")));
        let (transport, _) =
            TokioChildProcess::builder(tokio::process::Command::new("runuser").configure(|c| {
                c.args(["-u", &user, "--", "env", "-i"])
                    .args(&env)
                    .arg(&bin)
                    .arg("run")
                    .current_dir(&dir);
            }))
            .stderr(Stdio::from(logf))
            .spawn()
            .expect("runuser (util-linux) to start the bridge as the test user");
        let client = ().serve(transport).await.expect("MCP initialize");
        Rootless {
            _turn: turn,
            client,
            log,
            user,
            before,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn py(&self, code: &str) -> Outcome {
        let params = CallToolRequestParams::new("run_python")
            .with_arguments(json!({"code": code}).as_object().cloned().unwrap());
        // The first rootless call loads the image into the user's storage (vfs on hosts without
        // fuse-overlayfs: slow), hence the long guard.
        let r = tokio::time::timeout(Duration::from_secs(400), self.client.call_tool(params))
            .await
            .expect("run_python answered")
            .unwrap_or_else(|e| panic!("protocol error {e}\n{}", self.log()));
        Outcome(r)
    }

    /// The user's containers made by a bridge.
    /// The user's containers that were not there before this bridge started (the only bridge
    /// of the user while the turn is held).
    fn containers(&self) -> Vec<String> {
        containers_of_user(&self.user)
            .into_iter()
            .filter(|c| !self.before.contains(c))
            .collect()
    }

    /// Close the client; the bridge removes its containers on the way out. Returns what is left.
    async fn shutdown(self) -> Vec<String> {
        self.shutdown_in_turn().await.0
    }

    /// [`Rootless::shutdown`], keeping the turn for the test's next bridge.
    async fn shutdown_in_turn(self) -> (Vec<String>, Turn) {
        let (user, before) = (self.user.clone(), self.before.clone());
        let Rootless {
            client,
            _turn,
            _dir,
            ..
        } = self;
        let _ = client.cancel().await;
        let left = || -> Vec<String> {
            containers_of_user(&user)
                .into_iter()
                .filter(|c| !before.contains(c))
                .collect()
        };
        for _ in 0..100 {
            if left().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        (left(), _turn)
    }
}

fn containers_of_user(user: &str) -> Vec<String> {
    let out = std::process::Command::new("runuser")
        .args(["-u", user, "--", "podman", "ps", "-a", "-q"])
        .args(["--filter", "label=io.mcp-code-bridge.managed=true"])
        .current_dir("/")
        .output()
        .unwrap();
    // A failed listing is no evidence that no container is left.
    assert!(
        out.status.success(),
        "podman ps as {user} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn rootless_limits_the_host_cannot_enforce_stop_the_run_and_are_named() {
    let b = Rootless::start(&[]).await;
    let r = b.py("print('ran')").await;
    if cgroup_v2() {
        // With delegated controllers the limits hold; without, the run stops. Never silently.
        if r.status() == "ok" {
            let r = b
                .py("print(open('/sys/fs/cgroup/memory.max').read().strip())")
                .await
                .ok();
            assert_eq!(r.stdout(), format!("{}\n", 512u64 << 20));
        } else {
            assert!(r.text().contains("cannot enforce"), "{}", r.text());
        }
    } else {
        assert!(
            r.is_error(),
            "ran with limits dropped: {}\n{}",
            r.text(),
            b.log()
        );
        let text = r.text();
        for want in [
            "cannot enforce these sandbox limits",
            "memory (512m)",
            "pids (128)",
            "rootless containers on cgroup v1",
            "MCP_BRIDGE_ALLOW_UNENFORCED_LIMITS=1",
        ] {
            assert!(text.contains(want), "missing {want:?} in: {text}");
        }
        assert!(b.containers().is_empty(), "a container was created anyway");
    }
    // Refusing is not crashing: the bridge still answers.
    assert_eq!(b.client.list_all_tools().await.unwrap().len(), 1);
    let left = b.shutdown().await;
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rootless_runs_when_unenforced_limits_are_allowed_and_isolation_holds() {
    let b = Rootless::start(&[("MCP_BRIDGE_ALLOW_UNENFORCED_LIMITS", "1")]).await;
    let code = r#"
import os, socket
st = open("/proc/self/status").read()
print("ifaces", [n for _, n in socket.if_nameindex()])
print("uid", os.getuid(), os.getgid())
print("caps", sorted({l.split()[1] for l in st.splitlines() if l.startswith("Cap")}))
print("nnp", [l.split()[1] for l in st.splitlines() if l.startswith("NoNewPrivs")][0])
print("seccomp", [l.split()[1] for l in st.splitlines() if l.startswith("Seccomp:")][0])
mounts = {l.split()[1]: l.split()[3].split(",") for l in open("/proc/mounts")}
print("root_ro", "ro" in mounts["/"])
print("noexec", all("noexec" in mounts[m] for m in ("/tmp", "/workspace", "/var/tmp")))
"#;
    let r = b.py(code).await.ok();
    let out = r.stdout();
    for want in [
        "ifaces ['lo']",
        "uid 65534 65534",
        "caps ['0000000000000000']",
        "nnp 1",
        "seccomp 2",
        "root_ro True",
        "noexec True",
    ] {
        assert!(out.contains(want), "missing {want:?}: {out}");
    }
    if !cgroup_v2() {
        // The opt-in is loud: the log names what is not enforced.
        let log = b.log();
        assert!(
            log.contains("running with limits the host cannot enforce")
                && log.contains("memory (512m)"),
            "{log}"
        );
    }
    let left = b.shutdown().await;
    assert!(left.is_empty(), "containers left: {left:?}");
}

/// The engine's answer the user's bridges keep (`enforcement.json` in the state dir).
fn kept_answer_path(home: &Path) -> PathBuf {
    home.join(".local/state/mcp-code-bridge/engine/enforcement.json")
}

/// A kept answer that allowed what the engine, asked again, refuses (here: one that says the
/// user's podman enforces every limit, on a host where rootless limits are dropped): the bridge
/// used it for its first call, and once the engine answers otherwise it closes the sandbox
/// started under it, refuses every call after, and keeps the engine's answer for the next
/// bridge, which refuses at once.
#[tokio::test(flavor = "multi_thread")]
async fn rootless_a_kept_answer_the_engine_no_longer_gives_closes_what_ran_under_it() {
    let allowed = Rootless::start(&[("MCP_BRIDGE_ALLOW_UNENFORCED_LIMITS", "1")]).await;
    assert_eq!(allowed.py("print('kept')").await.ok().stdout(), "kept\n");
    // The turn is held throughout: another rootless test must not meet the answer made up below.
    let (left, turn) = allowed.shutdown_in_turn().await;
    assert!(left.is_empty(), "containers left: {left:?}");
    let (_, home) = common::rootless::user();
    let path = kept_answer_path(&home);
    let mut kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let real = kept["answer"].clone();
    assert_eq!(real["rootless"], json!(true), "{kept}");
    let enforced = real["memory"] == json!(true) && real["pids"] == json!(true);
    // Rootless on cgroup v1 has no limits: the case this test is for.
    assert!(cgroup_v2() || !enforced, "{kept}");
    for (field, value) in [
        ("rootless", json!(false)),
        ("memory", json!(true)),
        ("pids", json!(true)),
        ("cpu", json!(true)),
    ] {
        kept["answer"][field] = value;
    }
    // Into the same file: it stays the user's, mode 0600.
    std::fs::write(&path, kept.to_string()).unwrap();

    let b = Rootless::start_in(turn, &[]).await;
    let first = b.py("print('ran')").await;
    if enforced {
        // The engine enforces the limits (cgroup v2 with the controllers delegated): the kept
        // answer allowed nothing it refuses, and asked again it only corrects the rest.
        assert_eq!(first.ok().stdout(), "ran\n");
    } else {
        // Under the kept answer the first call ran (or, if the engine was asked again before it
        // was done, its sandbox was closed under it). Then every call is refused, saying why.
        assert!(
            first.status() == "ok" || first.text().contains("cannot enforce"),
            "{}\n{}",
            first.text(),
            b.log()
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let refusal = loop {
            let r = b.py("print('again')").await;
            if r.is_error() {
                break r.text();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "still running under the kept answer:\n{}",
                b.log()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        for want in [
            "cannot enforce these sandbox limits",
            "memory (512m)",
            "asked again",
            "were closed",
        ] {
            assert!(refusal.contains(want), "missing {want:?} in: {refusal}");
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !b.containers().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the sandbox started under the kept answer is still there: {:?}",
                b.containers()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Refusing is not crashing.
        assert_eq!(b.client.list_all_tools().await.unwrap().len(), 1);
    }
    // The engine's own answer is kept again.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        if now["answer"] == real {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the engine's answer was not kept again: {now}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (left, turn) = b.shutdown_in_turn().await;
    assert!(left.is_empty(), "containers left: {left:?}");
    if !enforced {
        // The next bridge refuses at once, starting nothing.
        let next = Rootless::start_in(turn, &[]).await;
        let r = next.py("print('next')").await;
        assert!(
            r.text().contains("cannot enforce these sandbox limits"),
            "{}",
            r.text()
        );
        assert!(next.containers().is_empty(), "{:?}", next.containers());
        let left = next.shutdown().await;
        assert!(left.is_empty(), "containers left: {left:?}");
    }
}

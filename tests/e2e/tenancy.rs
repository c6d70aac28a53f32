//! Many tenants on one host: each sandbox a host identity of its own where the engine can give
//! one (podman's `--userns=auto`), and no per-uid budget that sandboxes share where it cannot.
//! What each test attacks: one identity's sessions holding every task their `pids` allows, then
//! another identity's new session starting and forking over `serve` (the kernel counts
//! `RLIMIT_NPROC` per host uid: with every sandbox the same uid and its `nproc`, one tenant's
//! threads stopped every other sandbox from starting); and what `doctor` says of the host
//! identity against what the host's `/proc` shows of two sandboxes.

use crate::common;

use std::time::{Duration, Instant};

use common::served::Served;
use common::{Bridge, Home, Outcome};
use rmcp::RoleClient;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use serde_json::{Value, json};

const ALICE: &str = "alice-0123456789abcdef0123";
const BOB: &str = "bob-fedcba9876543210fedcba98";

/// The pids limit of these tests' sandboxes: small, so that a few sessions at their limit are
/// what the shared `nproc` of the old spec (`pids × 4`, at least 64) was.
const PIDS: &str = "16";

async fn run(client: &RunningService<RoleClient, ()>, args: Value) -> Outcome {
    let params =
        CallToolRequestParams::new("run_python").with_arguments(args.as_object().cloned().unwrap());
    Outcome(
        tokio::time::timeout(Duration::from_secs(120), client.call_tool(params))
            .await
            .expect("run_python answered within 120 s")
            .expect("run_python over HTTP"),
    )
}

/// Threads started until the sandbox refuses one, kept (they outlive the call), then a fork:
/// it prints how many threads it holds and the errno the fork got.
const HOLD_EVERY_TASK: &str = r#"
import os, threading
held = globals().setdefault("held", [])
stop = threading.Event()
while True:
    try:
        t = threading.Thread(target=stop.wait, daemon=True)
        t.start()
        held.append(t)
    except RuntimeError:
        break
try:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    print("threads", len(held), "fork ok")
except OSError as e:
    print("threads", len(held), "fork refused", e.errno)
"#;

/// A fork, a thread and the child's exit status.
const FORK_AND_THREAD: &str = r#"
import os, threading
pid = os.fork()
if pid == 0:
    os._exit(7)
_, status = os.waitpid(pid, 0)
t = threading.Thread(target=lambda: None)
t.start(); t.join()
print("child exited", os.waitstatus_to_exitcode(status))
"#;

/// Over `serve`: bob's sessions (as many as an identity may have) hold every task their pids
/// limit allows; alice's new session then starts, forks and starts threads, and bob's own
/// sandboxes are at their limit, not below it.
#[tokio::test]
async fn one_identity_at_its_task_limits_cannot_stop_anothers_sandbox() {
    let home = Home::new();
    let tokens = home.path().join("tokens");
    std::fs::write(&tokens, format!("alice:{ALICE}\nbob:{BOB}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let tokens = tokens.display().to_string();
    // No pool: alice's sandbox is started after bob's hold their tasks, not before. Bob opens
    // as many sessions as an identity may (http.max_sessions_per_identity, 4).
    let served = Served::start(
        home,
        &[
            ("MCP_BRIDGE_TOKEN_FILE", &tokens),
            ("MCP_BRIDGE_PIDS", PIDS),
            ("MCP_BRIDGE_POOL_SIZE", "0"),
        ],
        &[],
    );
    let t0 = Instant::now();
    let bob = served.client(Some(BOB)).await;
    let holds = futures::future::join_all((0..4).map(|i| {
        run(
            &bob,
            json!({"code": HOLD_EVERY_TASK, "session": format!("hold-{i}"), "timeout": 60}),
        )
    }))
    .await;
    for (i, held) in holds.into_iter().enumerate() {
        let out = held.ok();
        let words: Vec<&str> = out.stdout().split_whitespace().collect();
        assert!(
            words.len() >= 4 && words[2..4] == ["fork", "refused"],
            "bob's session {i} is not at its pids limit: {}",
            out.stdout()
        );
        let threads: u32 = words[1].parse().unwrap();
        assert!(
            threads >= 8,
            "bob's session {i} held only {threads} threads"
        );
    }
    let alice = served.client(Some(ALICE)).await;
    let mine = run(&alice, json!({"code": FORK_AND_THREAD, "session": "new"})).await;
    assert!(
        !mine.is_error(),
        "alice's new session did not start or fork while bob's sessions held their tasks: {}\nlog:\n{}",
        mine.text(),
        served.home.log()
    );
    assert_eq!(mine.stdout().trim(), "child exited 7");
    eprintln!("the attack and alice's call took {:?}", t0.elapsed());
}

/// Two sandboxes of one bridge: on podman with runc they run as two host uids, neither of
/// them 65534 nor the bridge's, as `doctor` says; where `doctor` says every sandbox shares its
/// host uid (gVisor, Docker), the host shows exactly that.
#[tokio::test]
async fn doctor_says_which_host_identity_the_sandboxes_have_and_the_host_shows_it() {
    let bridge = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_POOL_SIZE", "0")], None).await;
    let mut cmd = bridge.home.command();
    let doctor = cmd.args(["doctor", "--quick"]).output().unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout).into_owned();
    let line = said
        .lines()
        .find(|l| l.contains("host identity:"))
        .unwrap_or_else(|| panic!("doctor says nothing of the host identity:\n{said}"))
        .to_string();
    let runc_on_podman =
        common::engine() == "podman" && common::isolation().as_deref() != Some("gvisor");
    let own = line.contains("a host uid of its own");
    if runc_on_podman {
        assert!(
            own,
            "on podman with runc and the set-up's subordinate ids: {line}"
        );
    } else {
        assert!(line.contains("every sandbox the same host uid"), "{line}");
    }
    for s in ["a", "b"] {
        let out = Outcome(
            bridge
                .call(json!({"code": "import os; print(os.getuid())", "session": s}))
                .await,
        );
        assert_eq!(out.ok().stdout().trim(), "65534", "the container's own uid");
    }
    let ids = common::containers_of(bridge.pid).await;
    assert_eq!(ids.len(), 2, "{ids:?}");
    let mut uids = Vec::new();
    for id in &ids {
        let pid = common::container_pid(id).await;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .unwrap()
            .to_string();
        uids.push(uid);
    }
    if own {
        assert_ne!(uids[0], uids[1], "two sandboxes, one host uid");
        assert!(!uids.contains(&"65534".to_string()), "{uids:?}");
    } else {
        assert_eq!(uids[0], uids[1], "doctor said they share one: {line}");
    }
    bridge.shutdown_clean().await;
}

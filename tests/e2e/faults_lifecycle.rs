//! Lifecycle faults: the bridge terminated or killed, sessions idling out, a hundred
//! sessions coming and going, and the podman service dying under a live session. The invariant
//! under test: no container outlives its session, its idle timeout or its bridge (a killed
//! bridge's containers are reaped by the next one), and the podman service a bridge starts for
//! itself does not outlive the bridge, rootful or rootless, however the bridge ends.

use crate::common;
use common::Service;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Bridge, Home, Outcome, RawBridge};
use serde_json::json;

/// Wait until process `pid` is gone (or a zombie); false when it is still running after `within`.
async fn wait_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while common::process_alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

/// Start two sessions and one call that is still running, so a signal lands mid-work.
async fn busy_bridge() -> (Bridge, tokio::task::JoinHandle<()>) {
    // Counts the session containers exactly: no pool (tests/e2e/pool.rs counts the pool's).
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_POOL_SIZE", "0")], None).await;
    b.py("print(1)").await.ok();
    Outcome(
        b.call(json!({"code": "print(2)", "session": "second"}))
            .await,
    )
    .ok();
    let peer = b.client.peer().clone();
    let running = tokio::spawn(async move {
        let params = rmcp::model::CallToolRequestParams::new("run_python").with_arguments(
            json!({"code": "import time\ntime.sleep(60)", "session": "third", "timeout": 100})
                .as_object()
                .cloned()
                .unwrap(),
        );
        // The bridge dies under this call: any answer or error is fine, a hang is not.
        let _ = tokio::time::timeout(Duration::from_secs(90), peer.call_tool(params)).await;
    });
    // Wait until the third session's container exists and runs the sleep.
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::containers_of(b.pid).await.len() < 3 {
        assert!(Instant::now() < deadline, "third session never started");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    (b, running)
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_sigterm_removes_every_container_before_exit() {
    let (b, running) = busy_bridge().await;
    let pid = b.pid;
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert!(
        wait_gone(pid, Duration::from_secs(30)).await,
        "the bridge ignored SIGTERM"
    );
    // Removed by the bridge itself on the way out, not left for the next start.
    let left = common::containers_of(pid).await;
    assert!(left.is_empty(), "containers survived SIGTERM: {left:?}");
    assert!(b.home.log().contains("SIGTERM: shutting down"));
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the call in flight hung after the bridge exited")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_sigkill_leaves_orphans_the_next_start_reaps() {
    let (b, running) = busy_bridge().await;
    let pid = b.pid;
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert!(wait_gone(pid, Duration::from_secs(10)).await);
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the call in flight hung after the bridge was killed")
        .unwrap();
    assert_eq!(
        common::containers_of(pid).await.len(),
        3,
        "a SIGKILLed bridge cannot clean up; its containers should still be there"
    );
    // The next bridge removes them as soon as it talks to the engine.
    let next = Bridge::start().await;
    next.py("print('next')").await.ok();
    let left = common::containers_of(pid).await;
    assert!(
        left.is_empty(),
        "orphans survived the next start: {left:?}\n{}",
        next.home.log()
    );
    // Every bridge that connects the engine removes what bridges that are gone left, and the
    // tests beside this one share the engine: `next` says it did, unless another test's bridge
    // came first (seen under gVisor, where a removal takes longer). Its log line follows the
    // last removal, so it is waited for.
    let said = "removed containers left by bridges that are gone";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !next.home.log().contains(said) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !next.home.log().contains(said) {
        eprintln!("note: another bridge removed the orphans before this one's look");
    }
    next.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_idle_timeout_removes_every_idle_container() {
    let b = Bridge::start_with(
        Home::new(),
        // Counts the session containers exactly: no pool (tests/e2e/pool.rs counts the pool's).
        &[
            ("MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT", "2s"),
            ("MCP_BRIDGE_POOL_SIZE", "0"),
        ],
        None,
    )
    .await;
    for s in ["a", "b", "c"] {
        Outcome(b.call(json!({"code": "v = 1", "session": s})).await).ok();
    }
    assert_eq!(common::containers_of(b.pid).await.len(), 3);
    // A call busier than the idle timeout keeps its container.
    let r = Outcome(
        b.call(
            json!({"code": "import time\ntime.sleep(4)\nprint('busy done')", "session": "busy"}),
        )
        .await,
    )
    .ok();
    assert_eq!(r.stdout(), "busy done\n");
    let left = common::wait_no_containers(b.pid, Duration::from_secs(15)).await;
    assert!(left.is_empty(), "idle containers left: {left:?}");
    // Its container is gone, its state kept on disk: restored in a new sandbox.
    let r = Outcome(
        b.call(json!({"code": "print('v' in globals())", "session": "a"}))
            .await,
    )
    .ok();
    assert_eq!(r.stdout(), "True\n");
    assert_eq!(r.meta()["resumed"], json!("snapshot"));
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_a_hundred_sessions_are_created_and_reaped() {
    let b = Bridge::start_with(
        Home::new(),
        &[
            ("MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT", "3s"),
            ("MCP_BRIDGE_MAX_SESSIONS", "6"),
            ("MCP_BRIDGE_LOG_LEVEL", "info"),
            // Counts sandbox starts and closes exactly: no pool (tests/e2e/pool.rs covers it).
            ("MCP_BRIDGE_POOL_SIZE", "0"),
        ],
        None,
    )
    .await;
    let b = &b;
    let mut max_alive = 0;
    // Four clients' worth of concurrency; every reply must name its own session.
    for batch in (0..100).collect::<Vec<u32>>().chunks(4) {
        let calls =
            batch.iter().map(|i| async move {
                let r = Outcome(
                b.call(json!({"code": format!("print('session {i}')"), "session": format!("s{i}")}))
                    .await,
            );
                (*i, r)
            });
        for (i, r) in futures::future::join_all(calls).await {
            assert_eq!(r.ok().stdout(), format!("session {i}\n"));
        }
        max_alive = max_alive.max(common::containers_of(b.pid).await.len());
    }
    let left = common::wait_no_containers(b.pid, Duration::from_secs(30)).await;
    let log = b.home.log();
    // What went wrong, if anything did: the bridge's warnings and errors.
    let trouble: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    assert!(left.is_empty(), "not reaped: {left:?}\n{trouble:#?}");
    assert_eq!(log.matches("sandbox ready").count(), 100, "{trouble:#?}");
    // Each one closed once: by the idle reaper or to stay within max_sessions.
    assert_eq!(
        log.matches("removing idle sandbox").count()
            + log
                .matches("closing the least recently used session")
                .count(),
        100,
        "{trouble:#?}"
    );
    assert!(
        max_alive <= 6,
        "{max_alive} containers alive at once, above max_sessions = 6\n{trouble:#?}"
    );
    Outcome(b.call(json!({"code": "print('after')"})).await).ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_podman_service_restarted_under_a_live_session() {
    let dir = tempfile::Builder::new()
        .prefix("mcb-svc-")
        .tempdir()
        .unwrap();
    let service = Service::start(dir.path()).await;
    let url = service.url.clone();
    // An idle timeout of 20s makes the reaper look every 5s.
    let b = Bridge::start_with(
        Home::new(),
        &[
            ("MCP_BRIDGE_RUNTIME", &url),
            ("MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT", "20s"),
            // Counts the session containers exactly: no pool.
            ("MCP_BRIDGE_POOL_SIZE", "0"),
        ],
        None,
    )
    .await;
    b.py("kept = 1").await.ok();
    let first = common::containers_of(b.pid).await;
    assert_eq!(first.len(), 1);

    service.stop().await;
    // Engine gone: the call fails with a message, promptly, and the bridge answers.
    let r = b.py("print(kept)").await;
    assert!(r.is_error(), "{}", r.text());
    assert_ne!(r.status(), "ok");
    let text = r.text();
    assert!(
        text.contains("podman.sock") || text.contains("engine") || text.contains("sandbox"),
        "{text}"
    );
    let tools = b.client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 1);

    // Engine back: the next call runs in a fresh sandbox and the old container is gone.
    let service = Service::start(dir.path()).await;
    let r = b.py("print('kept' in globals())").await;
    let r = if r.status() == "ok" {
        r
    } else {
        // The call that discovers the broken session may report it; the one after must work.
        assert!(r.text().contains("session"), "{}", r.text());
        b.py("print('kept' in globals())").await
    };
    assert_eq!(r.ok().stdout(), "False\n");
    // The old container, which could not be removed while the engine was away, goes at the
    // reaper's next look.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut now = common::containers_of(b.pid).await;
    while now.len() > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        now = common::containers_of(b.pid).await;
    }
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, first, "the old container should have been replaced");
    b.shutdown_clean().await;
    service.stop().await;
}

// ---- The bridge's own podman service never outlives the bridge ----
//
// With no engine socket answering (the harness's private state dir, and no podman.socket on the
// test host), the bridge starts `podman system service` on `<state_dir>/podman-<pid>.sock`. Every
// process of that service carries the socket path on its command line: the guard shell, podman,
// and, rootless, the podman it re-executes inside its user namespace, which is the one holding
// the socket. None may remain once the bridge is gone, however it went.

/// How a test ends the bridge.
#[derive(Debug, Clone, Copy)]
enum End {
    Signal(i32),
    CloseStdin,
}

/// Live processes whose command line contains `needle`, with their `ps` line for messages.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) && common::process_alive(pid) {
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let fields: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            let (ppid, pgid) = (fields.get(1).copied(), fields.get(2).copied());
            let short: String = cmdline.chars().take(200).collect();
            out.push(format!(
                "pid {pid} ppid {} pgid {}: {short}",
                ppid.unwrap_or("?"),
                pgid.unwrap_or("?")
            ));
        }
    }
    out
}

/// Wait until no live process mentions `needle`; returns what is left after `within`.
async fn wait_no_process_mentioning(needle: &str, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let left = processes_mentioning(needle);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The socket of the bridge's own podman service, from its log once the service answered.
fn own_service_socket(log: &str) -> Option<String> {
    let line = log
        .lines()
        .find(|l| l.contains("own podman service is up"))?;
    let url = line.split("unix://").nth(1)?;
    Some(
        url.split(|c: char| c.is_whitespace() || c == '"')
            .next()?
            .to_string(),
    )
}

/// Wait (bounded) for the bridge's own service to be up; panics with the log when it is not.
async fn wait_own_service(log: impl Fn() -> String, pid: u32) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = log();
        if let Some(sock) = own_service_socket(&text) {
            assert!(
                sock.ends_with(&format!("/podman-{pid}.sock")),
                "the service's socket {sock} does not name bridge {pid}"
            );
            return sock;
        }
        assert!(
            !text.contains("container engine found"),
            "this test needs the bridge to start its own podman service, but an engine socket \
             answered (a running podman.socket or docker); stop it (`systemctl stop \
             podman.socket`) for this test:\n{text}"
        );
        assert!(
            Instant::now() < deadline,
            "the bridge's own podman service did not come up:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Send `end` to a bridge: a signal to `pid`, or EOF on its stdin.
fn end_bridge(end: End, pid: u32, stdin: &mut Option<tokio::process::ChildStdin>) {
    match end {
        End::Signal(sig) => {
            assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0, "kill {pid}");
        }
        End::CloseStdin => *stdin = None,
    }
}

/// A bridge (root, rootful podman) runs code on its own podman service, is ended by `end`, and
/// within a few seconds of its exit no process of that service is left.
async fn own_service_dies_with_the_bridge(end: End) {
    let mut b = RawBridge::start(Home::new(), &[]).await;
    let r = b.run_python(1, json!({"code": "print('up')"})).await;
    assert_eq!(
        common::structured(&r["result"])["stdout"],
        json!("up\n"),
        "{r}\n{}",
        b.home.log()
    );
    let sock = wait_own_service(|| b.home.log(), b.pid).await;
    let running = processes_mentioning(&sock);
    assert!(
        running.iter().any(|p| p.contains(" system service ")),
        "no podman service process for {sock}: {running:?}"
    );
    end_bridge(end, b.pid, &mut b.stdin);
    let status = b.wait_exit(Duration::from_secs(60)).await;
    assert!(status.is_some(), "the bridge did not exit after {end:?}");
    let left = wait_no_process_mentioning(&sock, Duration::from_secs(10)).await;
    assert!(
        left.is_empty(),
        "the podman service outlived its bridge ({end:?}):\n{}\nbridge log:\n{}",
        left.join("\n"),
        b.home.log()
    );
    // A killed bridge leaves its container for the next one to reap; do it here.
    for id in common::containers_of(b.pid).await {
        let _ = tokio::process::Command::new("podman")
            .args(["rm", "-f", &id])
            .output()
            .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn own_service_dies_with_a_sigkilled_bridge() {
    own_service_dies_with_the_bridge(End::Signal(libc::SIGKILL)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn own_service_dies_with_a_sigtermed_bridge() {
    own_service_dies_with_the_bridge(End::Signal(libc::SIGTERM)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn own_service_dies_with_a_siginted_bridge() {
    own_service_dies_with_the_bridge(End::Signal(libc::SIGINT)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn own_service_dies_with_a_bridge_whose_stdin_closed() {
    own_service_dies_with_the_bridge(End::CloseStdin).await;
}

/// A `podman system service` in a bridge's state dir whose bridge is gone (one a guard did not stop:
/// the guard killed along with its bridge, or a bridge without one) is stopped by the next bridge,
/// and its socket removed.
#[tokio::test(flavor = "multi_thread")]
async fn a_service_left_by_a_dead_bridge_is_stopped_by_the_next() {
    let home = Home::new();
    let state = home.path().join(".local/state/mcp-code-bridge");
    std::fs::create_dir_all(&state).unwrap();
    // A pid no process has now: one that just exited and was reaped.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let dead = gone.id();
    let sock = state.join(format!("podman-{dead}.sock"));
    let url = format!("unix://{}", sock.display());
    let mut stale = tokio::process::Command::new("podman")
        .args(["system", "service", "--time=0", &url])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("podman system service");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(
            Instant::now() < deadline,
            "the stale service did not listen"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stale_pid = stale.id().unwrap();
    let b = Bridge::start_with(home, &[], None).await;
    b.py("print('next')").await.ok();
    tokio::time::timeout(Duration::from_secs(10), stale.wait())
        .await
        .expect("the stale service was left running")
        .unwrap();
    let log = b.home.log();
    assert!(
        log.lines().any(
            |l| l.contains("stopping a podman service left by a bridge that is gone")
                && l.contains(&format!("pid={stale_pid} bridge={dead}"))
        ),
        "{log}"
    );
    assert!(processes_mentioning(&url).is_empty());
    assert!(!sock.exists(), "the stale socket was not removed");
    // The bridge's own service is not taken for a stale one.
    let own = wait_own_service(|| b.home.log(), b.pid).await;
    assert!(!processes_mentioning(&own).is_empty());
    b.shutdown_clean().await;
    let left = wait_no_process_mentioning(&own, Duration::from_secs(10)).await;
    assert!(left.is_empty(), "{}", left.join("\n"));
}

// ---- engine_linger: the service outlives its bridge for a bounded idle period ----

/// The linger the tests give the service: short, so that its end is seen within the test.
const LINGER: &str = "3s";

/// The lingering service's socket and its guard's pid (the leader of its process group), as
/// the bridge of `home` recorded them.
fn lingering_service(home: &Home) -> (String, u32) {
    let dir = home.path().join(".local/state/mcp-code-bridge/engine");
    let pid = std::fs::read_to_string(dir.join("podman.pid"))
        .unwrap_or_else(|e| panic!("no podman.pid in {}: {e}\n{}", dir.display(), home.log()));
    let sock = dir.join("podman.sock");
    (
        sock.display().to_string(),
        pid.trim().parse().expect("podman.pid holds a pid"),
    )
}

/// Mode bits of `path`.
fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// With `engine_linger`, the bridge's own podman service stays after its bridge exits; the next
/// bridge on the same state dir finds it and starts none; while that bridge lives (idle, for
/// several lingers) the service stays; once the last bridge is gone the service ends by itself
/// within the linger, and with it every process of its group. The socket is the user's alone.
#[tokio::test(flavor = "multi_thread")]
async fn own_service_linger_the_next_bridge_reuses_the_service_which_ends_when_idle() {
    // Its session is not parked (`session_linger`, tests/e2e/resume.rs): this is the service's.
    let env = [
        ("MCP_BRIDGE_ENGINE_LINGER", LINGER),
        ("MCP_BRIDGE_SESSION_LINGER", "0"),
    ];
    let first = Bridge::start_with(Home::new(), &env, None).await;
    assert_eq!(first.out("print('first')").await, "first\n");
    let (sock, guard) = lingering_service(&first.home);
    let dir = Path::new(&sock).parent().unwrap().to_path_buf();
    assert_eq!(mode_of(&dir), 0o700, "the engine directory");
    assert_eq!(mode_of(Path::new(&sock)), 0o600, "the socket");
    let first_pid = first.pid;
    let home = first.shutdown_clean().await;
    assert!(wait_gone(first_pid, Duration::from_secs(20)).await);
    assert!(
        common::process_alive(guard),
        "the service went with its bridge despite engine_linger:\n{}",
        home.log()
    );
    assert!(
        processes_mentioning(&sock)
            .iter()
            .any(|p| p.contains(" system service ")),
        "no podman service on {sock}"
    );

    let second = Bridge::start_with(home, &env, None).await;
    assert_eq!(second.out("print('second')").await, "second\n");
    let log = second.home.log();
    assert!(
        log.contains("found the podman service an earlier bridge left"),
        "{log}"
    );
    assert!(
        !log.contains("starting the bridge's own `podman system service`"),
        "{log}"
    );
    assert_eq!(
        lingering_service(&second.home).1,
        guard,
        "another service started"
    );
    // Idle for three lingers: the bridge keeps the service from idling out under it.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(
        common::process_alive(guard),
        "the service idled out under a live bridge"
    );
    assert_eq!(second.out("print('still')").await, "still\n");

    let home = second.shutdown_clean().await;
    let left = wait_no_process_mentioning(&sock, Duration::from_secs(20)).await;
    assert!(
        left.is_empty(),
        "the lingering service outlived its idle period:\n{}\nlog:\n{}",
        left.join("\n"),
        home.log()
    );
    assert!(
        wait_gone(guard, Duration::from_secs(5)).await,
        "its guard is left"
    );
}

/// A bridge killed outright (SIGKILL) leaves the lingering service, which still ends after its
/// idle period: nothing of the bridge holds it open.
#[tokio::test(flavor = "multi_thread")]
async fn own_service_linger_a_sigkilled_bridge_leaves_no_service_past_its_idle_period() {
    let mut b = RawBridge::start(
        Home::new(),
        &[
            ("MCP_BRIDGE_ENGINE_LINGER", LINGER),
            ("MCP_BRIDGE_SESSION_LINGER", "0"),
        ],
    )
    .await;
    let r = b.run_python(1, json!({"code": "print('up')"})).await;
    assert_eq!(
        common::structured(&r["result"])["stdout"],
        json!("up\n"),
        "{r}\n{}",
        b.home.log()
    );
    let (sock, guard) = lingering_service(&b.home);
    end_bridge(End::Signal(libc::SIGKILL), b.pid, &mut b.stdin);
    assert!(b.wait_exit(Duration::from_secs(30)).await.is_some());
    // Its container, which the next bridge would reap, goes first: the idle period counts
    // from then (a running container's attach stream was the last connection).
    for id in common::containers_of(b.pid).await {
        let _ = tokio::process::Command::new("podman")
            .args(["rm", "-f", &id])
            .output()
            .await;
    }
    let left = wait_no_process_mentioning(&sock, Duration::from_secs(20)).await;
    assert!(
        left.is_empty(),
        "the service outlived its idle period after a SIGKILLed bridge:\n{}\nlog:\n{}",
        left.join("\n"),
        b.home.log()
    );
    assert!(
        wait_gone(guard, Duration::from_secs(5)).await,
        "its guard is left"
    );
}

/// `doctor` and `exec` leave the service lingering as a bridge does, and `doctor` says so: the
/// `exec` after it finds the same service, and once both are gone it ends within its idle period.
#[tokio::test(flavor = "multi_thread")]
async fn own_service_linger_doctor_and_exec_leave_the_service_for_the_next_and_doctor_says_so() {
    let home = Home::new();
    let run = |args: &[&str]| {
        let out = home
            .command()
            .args(args)
            .env("MCP_BRIDGE_ENGINE_LINGER", LINGER)
            .env("MCP_BRIDGE_LOG_LEVEL", "info")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}\n{stdout}\n{stderr}");
        (stdout, stderr)
    };
    let (stdout, _) = run(&["doctor"]);
    assert!(
        stdout.contains(&format!(
            "this podman service is the bridge's own: it stays for {LINGER} after the last bridge"
        )),
        "{stdout}"
    );
    let (sock, guard) = lingering_service(&home);
    assert!(
        common::process_alive(guard),
        "the service went with doctor despite engine_linger"
    );
    let (stdout, stderr) = run(&["exec", "print('after doctor')"]);
    assert_eq!(stdout, "after doctor\n", "{stderr}");
    assert!(
        stderr.contains("found the podman service an earlier bridge left"),
        "{stderr}"
    );
    assert_eq!(lingering_service(&home).1, guard, "another service started");
    let left = wait_no_process_mentioning(&sock, Duration::from_secs(20)).await;
    assert!(
        left.is_empty(),
        "the service doctor and exec left outlived its idle period:\n{}",
        left.join("\n")
    );
    assert!(
        wait_gone(guard, Duration::from_secs(5)).await,
        "its guard is left"
    );
}

// ---- a ready sandbox parked for the next bridge (`sandbox::park`) ----

/// How long the parking tests give a parked sandbox (`engine_linger`): long enough for the next
/// bridge to start, short enough to see its end.
const PARK_LINGER: &str = "8s";
/// The settings of the bridges that park: the linger and a pool of one; their sessions are not
/// parked (`session_linger`, tests/e2e/resume.rs), only the pooled sandbox.
const PARK_ENV: [(&str, &str); 3] = [
    ("MCP_BRIDGE_ENGINE_LINGER", PARK_LINGER),
    ("MCP_BRIDGE_POOL_SIZE", "1"),
    ("MCP_BRIDGE_SESSION_LINGER", "0"),
];

/// The `container=<id>` of the first log line containing `what`.
fn logged_container(log: &str, what: &str) -> Option<String> {
    let line = log.lines().find(|l| l.contains(what))?;
    let at = line.find("container=")? + "container=".len();
    Some(
        line[at..]
            .trim_start_matches('"')
            .chars()
            .take_while(|c| c.is_ascii_hexdigit())
            .collect(),
    )
}

/// Whether the bridge whose log this is holds a ready pooled sandbox: more pooled sandboxes
/// booted than sessions took (one taken from the bridge before counts as booted).
fn pool_holds_one(log: &str) -> bool {
    let booted = log.matches("sandbox ready session=\"pool-").count()
        + log.matches("sandbox ready session=pool-").count()
        + log
            .matches("took the sandbox the previous bridge parked")
            .count();
    booted > log.matches("a pooled sandbox serves the session").count()
}

/// Wait (bounded) until the bridge in `home` holds a ready pooled sandbox.
async fn wait_pool_holds_one(home: &Home) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pool_holds_one(&home.log()) {
        assert!(
            Instant::now() < deadline,
            "the pool did not refill:\n{}",
            home.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A bridge whose pool holds a ready sandbox, shut down cleanly: that sandbox is parked. Returns
/// its home and the parked container's short id.
async fn bridge_that_parks(env: &[(&str, &str)]) -> (Home, String, String) {
    let first = Bridge::start_with(Home::new(), env, None).await;
    assert_eq!(first.out("print('first')").await, "first\n");
    let log = first.home.log();
    let used = logged_container(&log, "serves the session")
        .or_else(|| logged_container(&log, "sandbox ready session=\"default\""))
        .or_else(|| logged_container(&log, "sandbox ready session=default"))
        .unwrap_or_else(|| panic!("no container served the first call:\n{log}"));
    wait_pool_holds_one(&first.home).await;
    let pid = first.pid;
    let home = first.shutdown_clean().await;
    assert!(wait_gone(pid, Duration::from_secs(20)).await);
    let log = home.log();
    let parked = logged_container(&log, "parked a ready sandbox for the next bridge")
        .unwrap_or_else(|| panic!("nothing parked:\n{log}"));
    assert!(
        !used.starts_with(&parked) && !parked.starts_with(&used),
        "the sandbox that ran code was parked ({used})"
    );
    (home, parked, used)
}

/// The socket of the keeper the last bridge of `home` started (in the keeper directory).
fn parked_socket(home: &Home) -> std::path::PathBuf {
    let log = home.log();
    crate::resume::logged_keeper_sockets(&log)
        .pop()
        .unwrap_or_else(|| panic!("no keeper was started:\n{log}"))
}

/// `podman inspect`'s `{{.State.Status}} {{.Name}}` of container `id`; empty when it is gone.
async fn container_state(id: &str) -> String {
    let out = tokio::process::Command::new("podman")
        .args(["inspect", "--format", "{{.State.Status}} {{.Name}}", id])
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn wait_container_gone(id: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let state = container_state(id).await;
        if state.is_empty() || Instant::now() > deadline {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// With `engine_linger`, a bridge that exits parks its pooled sandbox (never one that ran code):
/// a keeper of its own session holds it, the socket is the user's alone, and no reaper takes it.
/// The next bridge's first call runs in it (pandas already imported by the pool's preload), under
/// a name that makes this bridge its owner; the keeper is then gone. The next bridge parks one
/// in turn, and that one is removed, with its keeper and package directory, at the end of its
/// time.
#[tokio::test(flavor = "multi_thread")]
async fn own_service_linger_a_parked_sandbox_serves_the_next_bridge_and_ends_with_its_time() {
    let env = PARK_ENV;
    let (home, parked, _) = bridge_that_parks(&env).await;
    let sock = parked_socket(&home);
    assert_eq!(mode_of(&sock), 0o600, "the keeper's socket");
    let keeper = processes_mentioning(&format!("keep-parked {parked}"));
    assert_eq!(keeper.len(), 1, "one keeper: {keeper:?}");
    let state = container_state(&parked).await;
    assert!(
        state.starts_with("running ") && state.contains(".parked-"),
        "{state}"
    );
    // Another bridge's reaper (on another state dir) leaves it: its keeper holds it.
    let other = Bridge::start_with(Home::new(), &[], None).await;
    assert_eq!(other.out("print(1)").await, "1\n");
    other.shutdown_clean().await;
    assert!(container_state(&parked).await.starts_with("running "));

    let second = Bridge::start_with(home, &env, None).await;
    let r = second
        .out("import sys; print('pandas' in sys.modules, sys.version_info[:2] >= (3, 11))")
        .await;
    assert_eq!(r, "True True\n");
    let log = second.home.log();
    let took = logged_container(&log, "took the sandbox the previous bridge parked")
        .unwrap_or_else(|| panic!("the parked sandbox was not taken:\n{log}"));
    assert_eq!(took, parked, "{log}");
    // Renamed for its new owner, in the background.
    let mark = format!(".adopted-by-{}_", second.pid);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = container_state(&parked).await;
        if state.contains(&mark) {
            break;
        }
        assert!(Instant::now() < deadline, "{state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        wait_no_process_mentioning(&format!("keep-parked {parked}"), Duration::from_secs(5))
            .await
            .is_empty(),
        "the keeper outlived its hand-over"
    );
    // The session is this bridge's as any other: it keeps state, and goes with the bridge.
    assert_eq!(second.out("x = 41").await, "");
    assert_eq!(second.out("print(x + 1)").await, "42\n");
    // Its package directory was renamed for this bridge and is still what the sandbox mounts.
    let dirs: Vec<String> = std::fs::read_dir(
        second
            .home
            .path()
            .join(".local/state/mcp-code-bridge/packages/sandboxes"),
    )
    .unwrap()
    .flatten()
    .map(|e| e.file_name().to_string_lossy().into_owned())
    .collect();
    assert!(
        dirs.iter()
            .any(|d| d.contains(&format!(".adopted-by-{}_", second.pid))),
        "{dirs:?}"
    );
    assert!(dirs.iter().all(|d| !d.starts_with("parked-")), "{dirs:?}");

    // The second bridge parks one of its own, which ends with its time.
    wait_pool_holds_one(&second.home).await;
    let second_pid = second.pid;
    let home = second.shutdown_clean().await;
    assert!(wait_gone(second_pid, Duration::from_secs(20)).await);
    assert_eq!(
        wait_container_gone(&parked, Duration::from_secs(20)).await,
        "",
        "the adopted sandbox outlived its bridge"
    );
    let log = home.log();
    let again = logged_container(
        &log[log.find("took the sandbox").unwrap()..],
        "parked a ready sandbox for the next bridge",
    )
    .unwrap_or_else(|| panic!("the second bridge parked nothing:\n{log}"));
    assert!(container_state(&again).await.starts_with("running "));
    let left = wait_container_gone(&again, Duration::from_secs(40)).await;
    assert_eq!(left, "", "the parked sandbox outlived its time");
    assert!(
        wait_no_process_mentioning(&format!("keep-parked {again}"), Duration::from_secs(10))
            .await
            .is_empty(),
        "its keeper outlived its time"
    );
    assert!(
        !parked_socket(&home).exists(),
        "the keeper's socket is left"
    );
    let sandboxes = home
        .path()
        .join(".local/state/mcp-code-bridge/packages/sandboxes");
    let parked_dirs: Vec<_> = std::fs::read_dir(&sandboxes)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("parked-"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    assert!(parked_dirs.is_empty(), "{parked_dirs:?}");
}

/// A parked sandbox is taken only by a bridge that would have made the very same one: another
/// memory limit, and the next bridge removes it and starts its own. A keeper killed outright
/// closes the sandbox's stdin: the runtime exits, and the next bridge's reaper removes it.
#[tokio::test(flavor = "multi_thread")]
async fn own_service_linger_a_parked_sandbox_of_other_settings_or_a_killed_keeper_is_removed() {
    let env = PARK_ENV;
    let (home, parked, _) = bridge_that_parks(&env).await;
    let other = [
        ("MCP_BRIDGE_ENGINE_LINGER", PARK_LINGER),
        ("MCP_BRIDGE_POOL_SIZE", "1"),
        ("MCP_BRIDGE_SESSION_LINGER", "0"),
        ("MCP_BRIDGE_MEMORY", "384m"),
    ];
    let second = Bridge::start_with(home, &other, None).await;
    assert_eq!(second.out("print('own')").await, "own\n");
    let log = second.home.log();
    assert!(
        log.contains(
            "removing the sandbox the previous bridge parked: it was made with other settings"
        ),
        "{log}"
    );
    assert!(
        !log.contains("took the sandbox the previous bridge parked"),
        "{log}"
    );
    assert_eq!(
        wait_container_gone(&parked, Duration::from_secs(20)).await,
        ""
    );
    wait_pool_holds_one(&second.home).await;
    let home = second.shutdown_clean().await;
    let log = home.log();
    let again = logged_container(
        &log[log.find("other settings").unwrap()..],
        "parked a ready sandbox for the next bridge",
    )
    .unwrap_or_else(|| panic!("nothing parked:\n{log}"));
    // Its keeper killed: the sandbox's stdin closes with the connection, and the runtime exits.
    let keeper = processes_mentioning(&format!("keep-parked {again}"));
    let pid: i32 = keeper
        .first()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no keeper: {keeper:?}"));
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state = container_state(&again).await;
        if !state.starts_with("running ") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still running after its keeper died: {state}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The next bridge finds no keeper, starts its own, and its reaper removes the stopped one.
    let third = Bridge::start_with(home, &other, None).await;
    assert_eq!(third.out("print('third')").await, "third\n");
    assert_eq!(
        wait_container_gone(&again, Duration::from_secs(20)).await,
        "",
        "{}",
        third.home.log()
    );
    assert!(!third.home.log().contains("took the sandbox"));
    third.shutdown().await;
}

/// A parked sandbox whose container something else removed (`podman rm`, a prune) while its
/// keeper still holds the connection: the next bridge does not take it, and its first call
/// answers normally in a sandbox of its own, never `SandboxCrashed`.
#[tokio::test(flavor = "multi_thread")]
async fn own_service_linger_a_parked_sandbox_removed_behind_its_keeper_is_not_taken() {
    let env = PARK_ENV;
    let (home, parked, _) = bridge_that_parks(&env).await;
    // As a user would: podman 4.3's own removal can race the container's exit clean-up
    // (`unlinkat .../userdata/shm: device or resource busy`), and is then run again.
    let mut tries = Vec::new();
    for _ in 0..10 {
        let out = tokio::process::Command::new("podman")
            .args(["rm", "--force", "--time", "0", &parked])
            .output()
            .await
            .unwrap();
        tries.push(out);
        if container_state(&parked).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(container_state(&parked).await, "", "{tries:?}");
    let second = Bridge::start_with(home, &env, None).await;
    let r = second.py("print('fresh')").await;
    assert_eq!(r.status(), "ok", "{}", r.text());
    assert_eq!(r.stdout(), "fresh\n", "{}", r.text());
    let log = second.home.log();
    assert!(
        log.contains(
            "removing the sandbox the previous bridge parked: its container is gone or not running"
        ),
        "{log}"
    );
    assert!(
        !log.contains("took the sandbox the previous bridge parked"),
        "{log}"
    );
    assert_eq!(second.out("x = 2").await, "");
    assert_eq!(second.out("print(x * 21)").await, "42\n");
    second.shutdown().await;
}

/// The pid of a child of `parent`, waited for (bounded).
async fn child_of(parent: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .nth(1);
            if ppid == Some(&parent.to_string()) {
                return pid;
            }
        }
        assert!(Instant::now() < deadline, "{parent} has no child");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The bridge run as the rootless test user, through `runuser` (as an MCP client configured
/// with another account would), sent one `run_python` (id 1) so that it starts its own rootless
/// podman service.
struct RootlessBridge {
    _turn: tokio::sync::MutexGuard<'static, ()>,
    runuser: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    replies: tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
    /// The bridge itself, `runuser`'s child.
    pid: u32,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl RootlessBridge {
    /// Start it; with `podman` given, that executable is found first on the bridge's PATH; with
    /// `fresh_namespace`, podman creates the user namespace anew ([`fresh_user_namespace`]).
    async fn start(podman: Option<&str>, fresh_namespace: bool) -> RootlessBridge {
        use std::os::unix::fs::PermissionsExt;
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let turn = common::rootless::TURN.lock().await;
        if fresh_namespace {
            fresh_user_namespace();
        }
        let (user, home) = common::rootless::user();
        let dir = tempfile::Builder::new()
            .prefix("mcb-rootless-svc-")
            .tempdir()
            .unwrap();
        let exe = |path: &Path| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap()
        };
        exe(dir.path());
        let bin = dir.path().join("mcp-code-bridge");
        std::fs::copy(common::BIN, &bin).unwrap();
        exe(&bin);
        let mut path = std::env::var("PATH").unwrap_or_default();
        if let Some(script) = podman {
            let wrapper = dir.path().join("bin");
            std::fs::create_dir(&wrapper).unwrap();
            exe(&wrapper);
            std::fs::write(wrapper.join("podman"), script).unwrap();
            exe(&wrapper.join("podman"));
            path = format!("{}:{path}", wrapper.display());
        }
        let log = dir.path().join("bridge.log");
        let mut runuser = tokio::process::Command::new("runuser")
            .args(["-u", &user, "--", "env", "-i"])
            .arg(format!("HOME={}", home.display()))
            .arg(format!("USER={user}"))
            .arg(format!("PATH={path}"))
            .arg(format!(
                "MCP_BRIDGE_IMAGE_ARCHIVE={}",
                common::image_archive().display()
            ))
            .arg("MCP_BRIDGE_LOG_LEVEL=debug")
            // No system config file either, as for every bridge a test starts.
            .arg("MCP_BRIDGE_SYSTEM_CONFIG=none")
            // Its own service, which goes with it (the lingering one is tested rootful).
            .arg("MCP_BRIDGE_ENGINE_LINGER=0")
            .arg(&bin)
            .arg("run")
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .kill_on_drop(true)
            .spawn()
            .expect("runuser (util-linux) to start the bridge as the test user");
        let pid = child_of(runuser.id().unwrap()).await;
        let mut stdin = runuser.stdin.take();
        let mut lines = tokio::io::BufReader::new(runuser.stdout.take().unwrap()).lines();
        let (tx, replies) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str(&l) {
                    let _ = tx.send(v);
                }
            }
        });
        let w = stdin.as_mut().unwrap();
        for msg in [
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            // The first call starts the service. Its answer does not matter to most tests
            // (rootless on cgroup v1 refuses to run for want of limits, after the service is up).
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "run_python", "arguments": {"code": "print(1)"}}}),
        ] {
            w.write_all(format!("{msg}\n").as_bytes()).await.unwrap();
        }
        w.flush().await.unwrap();
        RootlessBridge {
            _turn: turn,
            runuser,
            stdin,
            replies,
            pid,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The reply to request `id`.
    async fn reply(&mut self, id: i64, within: Duration) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let next = tokio::time::timeout_at(deadline, self.replies.recv()).await;
            match next {
                Ok(Some(v)) if v["id"] == json!(id) => return v,
                Ok(Some(_)) => continue,
                _ => panic!("no reply to {id} within {within:?}:\n{}", self.log()),
            }
        }
    }

    /// End the bridge and wait for it (and `runuser`) to exit.
    async fn end(&mut self, end: End) {
        end_bridge(end, self.pid, &mut self.stdin);
        let status = tokio::time::timeout(Duration::from_secs(60), self.runuser.wait()).await;
        assert!(
            status.is_ok(),
            "the bridge did not exit after {end:?}:\n{}",
            self.log()
        );
    }
}

/// Ended by `end` once its own rootless podman service is up, the bridge leaves no process of
/// that service behind.
async fn rootless_own_service_dies_with_the_bridge(end: End) {
    let mut b = RootlessBridge::start(None, false).await;
    let sock = wait_own_service(|| b.log(), b.pid).await;
    let running = processes_mentioning(&sock);
    // The podman started in the user's namespace and the one it re-executed in a new one.
    assert!(
        running
            .iter()
            .filter(|p| p.contains(" system service "))
            .count()
            >= 2,
        "expected rootless podman's two processes for {sock}: {running:?}"
    );
    b.end(end).await;
    let left = wait_no_process_mentioning(&sock, Duration::from_secs(10)).await;
    assert!(
        left.is_empty(),
        "the rootless podman service outlived its bridge ({end:?}):\n{}\nbridge log:\n{}",
        left.join("\n"),
        b.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rootless_own_service_dies_with_a_sigkilled_bridge() {
    rootless_own_service_dies_with_the_bridge(End::Signal(libc::SIGKILL)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rootless_own_service_dies_with_a_sigtermed_bridge() {
    rootless_own_service_dies_with_the_bridge(End::Signal(libc::SIGTERM)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rootless_own_service_dies_with_a_bridge_whose_stdin_closed() {
    rootless_own_service_dies_with_the_bridge(End::CloseStdin).await;
}

/// A rootless service that never answers on the bridge's socket (this podman listens beside it)
/// is stopped, both of its processes, when the bridge gives up on it after 60s; the bridge lives
/// on and says why. The user namespace is created afresh, as by the first podman after boot, where
/// the re-executed podman has no parent-death signal.
#[tokio::test(flavor = "multi_thread")]
async fn rootless_service_that_never_answers_is_stopped_when_the_bridge_gives_up() {
    let real = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("podman"))
        .find(|p| p.is_file())
        .expect("podman on PATH");
    let script = format!(
        "#!/bin/sh\n# Listens beside the socket the bridge asked for.\nexec {} \"$1\" \"$2\" \"$3\" \"$4.beside\"\n",
        real.display()
    );
    let mut b = RootlessBridge::start(Some(&script), true).await;
    let needle = format!("/podman-{}.sock", b.pid);
    // Both podman processes run, listening where the bridge does not look.
    let deadline = Instant::now() + Duration::from_secs(20);
    while processes_mentioning(&format!("{needle}.beside"))
        .iter()
        .filter(|p| !p.contains("/bin/sh "))
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "the wrapped podman did not start: {:?}\n{}",
            processes_mentioning(&needle),
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = b.reply(1, Duration::from_secs(120)).await;
    assert!(
        r.to_string().contains("no answer within 60s"),
        "{r}\n{}",
        b.log()
    );
    let left = wait_no_process_mentioning(&needle, Duration::from_secs(10)).await;
    assert!(
        left.is_empty(),
        "the service the bridge gave up on is still running:\n{}\n{}",
        left.join("\n"),
        b.log()
    );
    assert!(common::process_alive(b.pid), "the bridge died: {}", b.log());
    b.end(End::CloseStdin).await;
}

/// When the outer podman is killed outright (SIGKILL cannot be forwarded), the process it
/// re-executed in a user namespace created afresh, which holds the socket and has no parent-death
/// signal, goes with it at once; then the bridge still ends cleanly.
#[tokio::test(flavor = "multi_thread")]
async fn rootless_killing_podman_takes_its_user_namespace_child_down() {
    let mut b = RootlessBridge::start(None, true).await;
    let sock = wait_own_service(|| b.log(), b.pid).await;
    let outer = outer_podman(&sock);
    assert_eq!(unsafe { libc::kill(outer as i32, libc::SIGKILL) }, 0);
    let left = wait_no_process_mentioning(&sock, Duration::from_secs(5)).await;
    assert!(
        left.is_empty(),
        "podman's user-namespace child outlived it:\n{}",
        left.join("\n")
    );
    assert!(common::process_alive(b.pid), "the bridge died: {}", b.log());
    b.end(End::CloseStdin).await;
}

/// The pid of the podman started for `sock` (rootless, the outer one: the podman whose parent is
/// not a podman).
fn outer_podman(sock: &str) -> u32 {
    let procs = processes_mentioning(sock);
    let field = |line: &str, n: usize| -> u32 {
        line.split_whitespace()
            .nth(n)
            .and_then(|f| f.parse().ok())
            .unwrap()
    };
    let podmans: Vec<&String> = procs
        .iter()
        .filter(|l| l.contains(" system service ") && !l.contains("/bin/sh "))
        .collect();
    let pids: Vec<u32> = podmans.iter().map(|l| field(l, 1)).collect();
    podmans
        .iter()
        .find(|l| !pids.contains(&field(l, 3)))
        .map(|l| field(l, 1))
        .unwrap_or_else(|| panic!("no podman for {sock}: {procs:?}"))
}

/// Make the test user's next podman create its user namespace afresh, as the first podman after
/// boot does, by stopping the user's pause process (which podman otherwise joins). In that path
/// the process podman re-executes in the new namespace gets no parent-death signal, so only a
/// group kill takes it down with the outer podman. Processes already in the old namespace keep
/// it; podman starts a new pause process.
fn fresh_user_namespace() {
    let (user, _) = common::rootless::user();
    let out = std::process::Command::new("id")
        .args(["-u", &user])
        .output()
        .unwrap();
    let uid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        use std::os::unix::fs::MetadataExt;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if entry.metadata().map(|m| m.uid()).ok() != Some(uid) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let pause = (args[0].ends_with(b"catatonit") && args.contains(&&b"-P"[..]))
            || args.starts_with(&[b"podman", b"pause"]);
        if pause {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// `run` with nothing on stdin (a first try without a client, or a client that leaves before
/// `initialize`) is not an error: it exits 0, and logs no ERROR or WARN line.
#[test]
fn lifecycle_stdin_closed_before_initialize_is_a_quiet_exit() {
    let home = Home::new();
    let out = home
        .command()
        .arg("run")
        .stdin(Stdio::null())
        .output()
        .expect("run the bridge");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(
        out.stdout.is_empty(),
        "stdout is the MCP channel: {:?}",
        out.stdout
    );
    for level in [" ERROR ", " WARN "] {
        assert!(!stderr.contains(level), "{level:?} logged: {stderr}");
    }
    assert!(
        stderr.contains("stdin closed before initialize"),
        "{stderr}"
    );
}

/// The engine's answer about what it can enforce, as the bridge kept it in `home`'s state dir.
fn kept_answer_path(home: &Path) -> PathBuf {
    home.join(".local/state/mcp-code-bridge/engine/enforcement.json")
}

fn kept_answer(home: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(kept_answer_path(home)).unwrap_or_else(|e| {
        panic!("no kept answer in {}: {e}", home.display());
    });
    serde_json::from_str(&text).unwrap()
}

/// The kept answer with `field` of what the engine said set to `value`, facts and time kept.
fn tamper_kept_answer(home: &Path, field: &str, value: serde_json::Value) {
    let mut kept = kept_answer(home);
    kept["answer"][field] = value;
    // Written into the same file: its owner and mode stay the bridge's.
    std::fs::write(kept_answer_path(home), kept.to_string()).unwrap();
}

/// A bridge keeps the engine's answer about what it can enforce (podman spends 0.4-0.7 s on
/// it), the next bridge in the same state dir uses it without asking, asks again off the path
/// and keeps the engine's answer over a kept one that differs; a kept answer that would refuse
/// is never used (the engine is asked), and one whose facts changed is not either.
#[tokio::test(flavor = "multi_thread")]
async fn kept_engine_answer_serves_the_next_bridge_is_checked_again_and_never_refuses() {
    let no_pool = [("MCP_BRIDGE_POOL_SIZE", "0")];
    let first = Bridge::start_with(Home::new(), &no_pool, None).await;
    assert_eq!(first.out("print('first')").await, "first\n");
    let home = first.shutdown_clean().await;
    let path = kept_answer_path(home.path());
    let kept = kept_answer(home.path());
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", path.display());
    assert_eq!(kept["answer"]["memory"], json!(true), "{kept}");
    assert_eq!(kept["answer"]["pids"], json!(true), "{kept}");
    // Given for an engine: the bridge's own podman service, or a socket that answered.
    assert!(
        kept["facts"]["engine"]
            .as_str()
            .is_some_and(|e| e.starts_with("own podman service") || e.starts_with("unix://")),
        "{kept}"
    );

    // A kept answer that lets the sandbox run is used as it is: here one that says the memory
    // limit cannot be enforced, with unenforced limits allowed, which the bridge then says.
    tamper_kept_answer(home.path(), "memory", json!(false));
    let allow = [
        ("MCP_BRIDGE_POOL_SIZE", "0"),
        ("MCP_BRIDGE_ALLOW_UNENFORCED_LIMITS", "1"),
    ];
    let second = Bridge::start_with(home, &allow, None).await;
    assert_eq!(second.out("print('second')").await, "second\n");
    let log = second.home.log();
    assert!(
        log.contains("running with limits the host cannot enforce")
            && log.contains("memory (512m)"),
        "the kept answer was not used:\n{log}"
    );
    // Asked again off the path: the engine's own answer replaces the kept one.
    let deadline = Instant::now() + Duration::from_secs(30);
    while kept_answer(second.home.path())["answer"]["memory"] != json!(true) {
        assert!(
            Instant::now() < deadline,
            "the engine was not asked again:\n{}",
            second.home.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        second.home.log().contains("the engine's answer changed"),
        "{}",
        second.home.log()
    );
    second.still_serving().await;
    let home = second.shutdown_clean().await;

    // A kept answer that would refuse is not trusted: the engine is asked, and it runs.
    tamper_kept_answer(home.path(), "memory", json!(false));
    let third = Bridge::start_with(home, &no_pool, None).await;
    assert_eq!(third.out("print('third')").await, "third\n");
    assert_eq!(
        kept_answer(third.home.path())["answer"]["memory"],
        json!(true)
    );
    let home = third.shutdown_clean().await;

    // Facts that changed (here the engine it was given for): not used, the engine is asked.
    let mut kept = kept_answer(home.path());
    kept["answer"]["memory"] = json!(false);
    kept["facts"]["engine"] = json!("unix:///elsewhere.sock");
    std::fs::write(kept_answer_path(home.path()), kept.to_string()).unwrap();
    let fourth = Bridge::start_with(home, &allow, None).await;
    assert_eq!(fourth.out("print('fourth')").await, "fourth\n");
    let log = fourth.home.log();
    assert!(
        !log.contains("running with limits the host cannot enforce"),
        "an answer for other facts was used:\n{log}"
    );
    assert_eq!(
        kept_answer(fourth.home.path())["answer"]["memory"],
        json!(true)
    );
    fourth.shutdown().await;
}

fn runtime_code_file(home: &Path) -> PathBuf {
    let dir = home.join(".local/state/mcp-code-bridge/runtime-code");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("no kept runtime code in {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

/// Whether the log says a sandbox booted with the runtime code `how` ("compiled" or "kept").
fn booted_with(log: &str, how: &str) -> bool {
    log.contains(&format!("runtime_code={how}")) || log.contains(&format!("runtime_code=\"{how}\""))
}

/// The runtime's compiled code: the first sandbox compiles and sends it, the bridge keeps it
/// (0600), the next bridge's sandbox boots with it and compiles nothing. Code the model's code
/// forges through the runtime's own channel is not taken. A kept copy that makes the runtime
/// exit at boot costs one start, not the call: it is dropped, the sandbox started again
/// compiling, and fresh code kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runtime_code_is_kept_for_the_next_boots_never_taken_from_the_code_and_a_bad_copy_costs_a_start()
 {
    let no_pool = [("MCP_BRIDGE_POOL_SIZE", "0")];
    let first = Bridge::start_with(Home::new(), &no_pool, None).await;
    assert_eq!(first.out("print('first')").await, "first\n");
    let log = first.home.log();
    assert!(booted_with(&log, "compiled"), "{log}");
    let home = first.shutdown_clean().await;
    let path = runtime_code_file(home.path());
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", path.display());
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let modules = kept["code"]["modules"].as_object().unwrap();
    assert!(
        modules.contains_key("boot") && modules.contains_key("execute"),
        "{modules:?}"
    );
    let magic = kept["code"]["magic"].as_str().unwrap().to_string();

    // The next bridge boots with it.
    let second = Bridge::start_with(home, &no_pool, None).await;
    assert_eq!(second.out("print('second')").await, "second\n");
    let log = second.home.log();
    assert!(
        booted_with(&log, "kept") && !booted_with(&log, "compiled"),
        "{log}"
    );
    // The model's code sends a `code` frame of its own through the runtime's channel, with a
    // module that would run in every later sandbox before its seccomp filter: not taken.
    let before = std::fs::read(&path).unwrap();
    let forged = second
        .out(&format!(
            "import sys, marshal, binascii\n\
             ch = sys.modules['__mcp_bridge_runtime__.channel']\n\
             evil = binascii.b2a_base64(marshal.dumps(compile('raise SystemExit(7)', 'x', 'exec')), newline=False).decode()\n\
             names = [k[len('__mcp_bridge_runtime__.'):] for k in sys.modules if k.startswith('__mcp_bridge_runtime__.')]\n\
             print(ch.send({{'type': 'code', 'magic': {magic:?}, 'modules': {{n: evil for n in names}}}}))\n\
             print(evil)"
        ))
        .await;
    let mut lines = forged.lines();
    assert_eq!(lines.next(), Some("True"), "{forged}");
    let exits = lines.next().unwrap().to_string();
    assert_eq!(second.out("print('still')").await, "still\n");
    let home = second.shutdown_clean().await;
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "forged code was kept"
    );

    // A kept copy whose `boot` exits at once (as damaged code could): the call still runs.
    let mut bad = kept.clone();
    bad["code"]["modules"]["boot"] = json!(exits);
    std::fs::write(&path, bad.to_string()).unwrap();
    let third = Bridge::start_with(home, &no_pool, None).await;
    assert_eq!(third.out("print('third')").await, "third\n");
    let log = third.home.log();
    assert!(
        log.contains("did not start") && log.contains("dropping that code"),
        "{log}"
    );
    assert!(booted_with(&log, "compiled"), "{log}");
    let home = third.shutdown_clean().await;
    let fresh: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(runtime_code_file(home.path())).unwrap())
            .unwrap();
    assert_ne!(
        fresh["code"]["modules"]["boot"],
        json!(exits),
        "the bad copy was kept"
    );
    assert_eq!(fresh["code"]["magic"], json!(magic));
}

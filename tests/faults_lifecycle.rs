//! Issue 6, lifecycle faults: the bridge terminated or killed, sessions idling out, a hundred
//! sessions coming and going, and the podman service dying under a live session. The invariant
//! under test: no container outlives its session, its idle timeout or its bridge (a killed
//! bridge's containers are reaped by the next one).

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Bridge, Home, Outcome};
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
    let b = Bridge::start().await;
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
    assert!(
        next.home
            .log()
            .contains("removed containers left by bridges that are gone"),
        "{}",
        next.home.log()
    );
    next.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_idle_timeout_removes_every_idle_container() {
    let b = Bridge::start_with(
        Home::new(),
        &[("MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT", "2s")],
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
    let r = Outcome(
        b.call(json!({"code": "print('v' in globals())", "session": "a"}))
            .await,
    )
    .ok();
    assert_eq!(r.stdout(), "False\n");
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
    assert!(left.is_empty(), "not reaped: {left:?}");
    let log = b.home.log();
    assert_eq!(log.matches("sandbox ready").count(), 100);
    // Each one closed once: by the idle reaper or to stay within max_sessions.
    assert_eq!(
        log.matches("removing idle sandbox").count()
            + log
                .matches("closing the least recently used session")
                .count(),
        100
    );
    assert!(
        max_alive <= 6,
        "{max_alive} containers alive at once, above max_sessions = 6"
    );
    Outcome(b.call(json!({"code": "print('after')"})).await).ok();
}

/// A `podman system service` the test owns, on a socket in `dir`.
struct Service {
    child: tokio::process::Child,
    url: String,
}

impl Service {
    async fn start(dir: &Path) -> Service {
        let sock = dir.join("podman.sock");
        let _ = std::fs::remove_file(&sock);
        let url = format!("unix://{}", sock.display());
        let child = tokio::process::Command::new("podman")
            .args(["system", "service", "--time=0", &url])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("podman system service (podman must be installed)");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(
                Instant::now() < deadline,
                "podman system service did not listen"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Service { child, url }
    }

    async fn stop(mut self) {
        unsafe { libc::kill(self.child.id().unwrap() as i32, libc::SIGTERM) };
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
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

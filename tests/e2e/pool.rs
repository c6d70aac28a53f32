//! The pool of ready sandboxes and the warm-up after `initialize`, against the real engine and
//! image: a new session gets a pooled container (seen by its id, which is the sandbox's
//! hostname, not by timing), preloaded and indistinguishable from a fresh one; the pool refills
//! within `max_sessions`, empties when the bridge is idle, and leaves nothing at shutdown.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::json;

/// A container of bridge `pid` started for the pool: its short id, its name, and whether it
/// still waits in the pool (a session's renames it).
#[derive(Debug, Clone)]
struct Pooled {
    id: String,
    waiting: bool,
}

async fn pooled_of(pid: u32) -> Vec<Pooled> {
    common::owned_containers(
        pid,
        "label=io.mcp-code-bridge.pool=true",
        "{{.ID}} {{.Names}} {{.Labels}}",
    )
    .await
    .iter()
    .map(|l| {
        let mut w = l.split_whitespace();
        let id = w.next().unwrap_or("").to_string();
        let name = w.next().unwrap_or("");
        Pooled {
            id,
            waiting: name.contains(".pool-"),
        }
    })
    .collect()
}

/// Wait (bounded) until bridge `pid` has a pooled container waiting that is not in `seen`.
async fn wait_for_pooled(pid: u32, seen: &[String]) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(p) = pooled_of(pid)
            .await
            .into_iter()
            .find(|p| p.waiting && !seen.contains(&p.id))
        {
            return p.id;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no pooled sandbox within 120s; containers: {:?}",
            pooled_of(pid).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The hostname of the sandbox serving `session`: the engine's short container id.
async fn host_of(b: &Bridge, session: &str, extra: &str) -> Outcome {
    Outcome(
        b.call(json!({
            "code": format!("import socket, sys\nprint(socket.gethostname())\n{extra}"),
            "session": session,
        }))
        .await,
    )
    .ok()
}

fn first_line(o: &Outcome) -> String {
    o.stdout().lines().next().unwrap_or("").trim().to_string()
}

#[tokio::test]
async fn pool_first_call_gets_the_warmed_up_preloaded_sandbox_and_the_pool_refills() {
    // `this` prints the Zen of Python when imported: output a pooled sandbox writes before a
    // session takes it must reach nobody.
    let b = Bridge::start_with(
        Home::new(),
        &[("MCP_BRIDGE_PRELOAD", "numpy,pandas,this")],
        None,
    )
    .await;
    // Warm-up after initialize: no call has been made, yet a sandbox is started.
    let first = wait_for_pooled(b.pid, &[]).await;
    let o = host_of(
        &b,
        "default",
        "print(sorted(m for m in ('pandas', 'numpy', 'this') if m in sys.modules))\nprint(sorted(k for k in ('pd', 'np', 'pandas', 'numpy', 'this') if k in globals()))",
    )
    .await;
    assert_eq!(first_line(&o), first, "{}", o.text());
    assert!(
        o.stdout().contains("['numpy', 'pandas', 'this']"),
        "preloaded modules are imported before the first call: {}",
        o.text()
    );
    assert!(
        o.stdout().contains("\n[]\n"),
        "preloading binds no name in the session: {}",
        o.text()
    );
    assert!(
        !o.text().contains("Beautiful is better"),
        "output written before hand-out reached the session: {}",
        o.text()
    );
    // The pool refills; the sandbox the session uses is no longer waiting in it.
    let second = wait_for_pooled(b.pid, std::slice::from_ref(&first)).await;
    assert_ne!(second, first);
    let pooled = pooled_of(b.pid).await;
    assert!(
        pooled.iter().any(|p| p.id == first && !p.waiting),
        "{pooled:?}"
    );
    // A new session gets the refilled one, fresh: nothing of the first session.
    b.py("secret = 42").await.ok();
    let o = host_of(&b, "other", "print('secret' in globals())").await;
    assert_eq!(first_line(&o), second, "{}", o.text());
    assert!(o.stdout().contains("False"), "{}", o.text());
    b.shutdown_clean().await;
}

#[tokio::test]
async fn pool_reset_takes_a_pooled_sandbox() {
    let b = Bridge::start().await;
    let first = wait_for_pooled(b.pid, &[]).await;
    let o = host_of(&b, "default", "x = 1").await;
    assert_eq!(first_line(&o), first);
    let second = wait_for_pooled(b.pid, std::slice::from_ref(&first)).await;
    let o = Outcome(
        b.call(json!({
            "code": "import socket\nprint(socket.gethostname(), 'x' in globals())",
            "reset": true,
        }))
        .await,
    )
    .ok();
    assert_eq!(o.stdout().trim(), format!("{second} False"), "{}", o.text());
    assert!(
        o.text().contains("fresh interpreter (reset)"),
        "{}",
        o.text()
    );
    // The reset session's old container is gone, never pooled again.
    let left = containers_of(b.pid).await;
    assert!(
        !left.iter().any(|id| id.starts_with(&first)),
        "{left:?} still holds {first}"
    );
    b.shutdown_clean().await;
}

#[tokio::test]
async fn pool_and_sessions_stay_within_max_sessions() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_MAX_SESSIONS", "2")], None).await;
    let p1 = wait_for_pooled(b.pid, &[]).await;
    assert_eq!(first_line(&host_of(&b, "a", "").await), p1);
    let p2 = wait_for_pooled(b.pid, std::slice::from_ref(&p1)).await;
    assert_eq!(first_line(&host_of(&b, "b", "").await), p2);
    // Two sessions: no room for a pooled one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = containers_of(b.pid).await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(
        !pooled_of(b.pid).await.iter().any(|p| p.waiting),
        "a pooled sandbox beyond max_sessions"
    );
    // A third session closes the least recently used one, as without a pool.
    let o = host_of(&b, "c", "").await;
    assert!(o.text().contains("max_sessions = 2"), "{}", o.text());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = containers_of(b.pid).await;
    assert_eq!(all.len(), 2, "{all:?}");
    b.shutdown_clean().await;
}

#[tokio::test]
async fn pool_drains_after_the_idle_timeout_and_comes_back_with_a_call() {
    let b = Bridge::start_with(
        Home::new(),
        &[("MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT", "4s")],
        None,
    )
    .await;
    let first = wait_for_pooled(b.pid, &[]).await;
    b.py("print(1)").await.ok();
    wait_for_pooled(b.pid, &[first]).await;
    // No call: the session and the pool go.
    let left = wait_no_containers(b.pid, Duration::from_secs(30)).await;
    assert!(left.is_empty(), "an idle bridge still holds {left:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        containers_of(b.pid).await.is_empty(),
        "the idle pool refilled"
    );
    assert!(b.home.log().contains("removing a pooled sandbox"));
    // A call brings it back: it runs, and the pool refills after it.
    assert_eq!(b.py("print(6*7)").await.ok().stdout().trim(), "42");
    let pooled = wait_for_pooled(b.pid, &[]).await;
    assert!(!pooled.is_empty());
    b.shutdown_clean().await;
}

#[tokio::test]
async fn pool_a_failing_preload_is_logged_and_skipped() {
    let b = Bridge::start_with(
        Home::new(),
        &[("MCP_BRIDGE_PRELOAD", "no_such_module_xyz,wave")],
        None,
    )
    .await;
    let first = wait_for_pooled(b.pid, &[]).await;
    let o = host_of(
        &b,
        "default",
        "print('wave' in sys.modules, 'no_such_module_xyz' in sys.modules)",
    )
    .await;
    assert_eq!(first_line(&o), first);
    assert!(o.stdout().contains("True False"), "{}", o.text());
    let log = b.home.log();
    assert!(
        log.contains("WARN") && log.contains("could not import no_such_module_xyz"),
        "{log}"
    );
    b.shutdown_clean().await;
}

#[tokio::test]
async fn pool_size_zero_starts_on_demand_as_before() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_POOL_SIZE", "0")], None).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        containers_of(b.pid).await.is_empty(),
        "a container before any call"
    );
    let o = b
        .py("import sys\nprint('pandas' in sys.modules)")
        .await
        .ok();
    assert_eq!(o.stdout().trim(), "False");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(containers_of(b.pid).await.len(), 1);
    assert!(pooled_of(b.pid).await.is_empty());
    b.shutdown_clean().await;
}

#[tokio::test]
async fn pool_warm_start_false_waits_for_the_first_call_then_pools() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_WARM_START", "false")], None).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(containers_of(b.pid).await.is_empty());
    let log = b.home.log();
    // The log is this bridge's, written since its start: what it lacks, it did not do.
    assert!(log.contains("no upstream MCP servers configured"), "{log}");
    assert!(
        !log.contains("warm-up"),
        "warmed up although warm_start = false"
    );
    b.py("print(1)").await.ok();
    let pooled = wait_for_pooled(b.pid, &[]).await;
    assert_eq!(first_line(&host_of(&b, "second", "").await), pooled);
    b.shutdown_clean().await;
}

#[tokio::test]
async fn pool_shutdown_leaves_no_container_even_while_filling() {
    // Shut down right after initialize, while the pool is being filled.
    let b = Bridge::start().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.shutdown_clean().await;
    // And with a session and a ready pooled sandbox.
    let b = Bridge::start().await;
    let first = wait_for_pooled(b.pid, &[]).await;
    b.py("print(1)").await.ok();
    wait_for_pooled(b.pid, &[first]).await;
    assert_eq!(containers_of(b.pid).await.len(), 2);
    b.shutdown_clean().await;
}

/// New sessions' sandboxes start side by side, not one after another: in the bridge's own log
/// a start begins while another is under way (an order of lines, not a timing).
#[tokio::test]
async fn pool_new_sessions_start_side_by_side() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_POOL_SIZE", "0")], None).await;
    // The engine connected and the image present before: the starts alone are compared.
    b.py("pass").await.ok();
    let calls = (0..4)
        .map(|i| b.call(json!({"code": format!("print('s{i}')"), "session": format!("s{i}")})));
    for (i, r) in futures::future::join_all(calls)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(Outcome(r).ok().stdout(), format!("s{i}\n"));
    }
    let log = b.home.log();
    let (mut under_way, mut most, mut started) = (0usize, 0usize, 0usize);
    for line in log.lines() {
        if line.contains("starting a sandbox for the session") {
            under_way += 1;
            most = most.max(under_way);
        } else if line.contains("started a sandbox for the session") {
            under_way = under_way.saturating_sub(1);
            started += 1;
        }
    }
    assert_eq!(started, 5, "five sandboxes started on demand:\n{log}");
    assert!(
        most >= 2,
        "each start ended before the next began (at most {most} under way at once):\n{log}"
    );
    b.shutdown_clean().await;
}

/// The pool follows the new sessions: after three, it holds three ready sandboxes, more than
/// `pool_size = 1`, within `max_sessions`.
#[tokio::test]
async fn pool_grows_to_the_new_sessions_of_the_last_minutes() {
    let b = Bridge::start().await;
    let mut seen = vec![wait_for_pooled(b.pid, &[]).await];
    for i in 0..3 {
        let o = host_of(&b, &format!("s{i}"), "").await;
        seen.push(first_line(&o));
    }
    let waiting = async || {
        pooled_of(b.pid)
            .await
            .iter()
            .filter(|p| p.waiting && !seen.contains(&p.id))
            .count()
    };
    wait_until(
        "three pooled sandboxes ready",
        Duration::from_secs(120),
        async || waiting().await >= 3,
    )
    .await;
    // And no more: three sessions in the last minutes, three ready.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(waiting().await, 3, "{:?}", pooled_of(b.pid).await);
    b.shutdown_clean().await;
}

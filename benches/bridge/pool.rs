//! Section 8: the first call, warm-up and the pool of ready sandboxes.

use super::*;

/// The model's thinking time before a call, as the bench gives it: the warm-up and the pool's
/// refill happen in it.
pub(crate) const THINK: Duration = Duration::from_millis(1500);

/// A call's round trip in ms (after `THINK`), on a bridge whose engine and image are ready.
pub(crate) async fn first_calls(o: &Opts, pool: &str, t: &mut Table) {
    let env = [("MCP_BRIDGE_POOL_SIZE", pool)];
    let label = if pool == "0" {
        "pool_size = 0".to_string()
    } else {
        format!("pool_size = {pool}")
    };
    let mut fresh = Vec::new();
    for _ in 0..o.pool_fresh {
        let live = Live::start_with(Home::new(&[]), &env).await;
        tokio::time::sleep(THINK).await;
        fresh.push(live.ok(json!({"code": "print(1+1)"})).await.1);
        live.shutdown().await;
    }
    t.samples(
        &format!(
            "first `print(1+1)` {:.1} s after `initialize`, fresh bridge ({label})",
            THINK.as_secs_f64()
        ),
        &fresh,
        Unit::Ms,
        if pool == "0" {
            Target::None
        } else {
            Target::AtMost(50.0)
        },
    );
    let live = Live::start_with(Home::new(&[]), &env).await;
    live.ok(json!({"code": "pass"})).await;
    let tag = std::process::id();
    let (mut new, mut pandas) = (Vec::new(), Vec::new());
    for i in 0..o.pool_sessions {
        tokio::time::sleep(THINK).await;
        new.push(
            live.ok(json!({"code": "print(1+1)", "session": format!("pool-new-{tag}-{pool}-{i}")}))
                .await
                .1,
        );
        tokio::time::sleep(THINK).await;
        pandas.push(
            live.ok(
                json!({"code": "import pandas", "session": format!("pool-pd-{tag}-{pool}-{i}")}),
            )
            .await
            .1,
        );
    }
    let target = if pool == "0" {
        Target::None
    } else {
        Target::AtMost(50.0)
    };
    t.samples(
        &format!("first `print(1+1)` of a new session ({label})"),
        &new,
        Unit::Ms,
        target,
    );
    t.samples(
        &format!("`import pandas` in a new session ({label})"),
        &pandas,
        Unit::Ms,
        target,
    );
    live.shutdown().await;
}

/// The first call sent as soon as `initialize` is answered, as an agent that has its code
/// already sends it: on a cold host, where no engine service runs (its bridge stopped it:
/// `engine_linger` 0), in a state dir an earlier bridge used (the engine's answer about what it
/// can enforce is kept there) and in one never used (the engine is asked); and right after
/// another bridge ran in the same state dir and exited (its podman service lingers for
/// `engine_linger`, 60 s here, and the next bridge takes it, with the sandbox it parked). The
/// figure is the `tools/call` round trip; `initialize` takes a few ms more (section 2).
pub(crate) async fn no_pause(o: &Opts, pool: &str, t: &mut Table) {
    const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);
    let linger = "60s";
    let cold_env = [
        ("MCP_BRIDGE_POOL_SIZE", pool),
        ("MCP_BRIDGE_ENGINE_LINGER", "0"),
    ];
    let (mut cold, mut never_used) = (Vec::new(), Vec::new());
    for _ in 0..o.pool_fresh {
        // A cold host is an idle one: what the bridge before left to finish in the engine (its
        // containers' clean-up, its service's exit) is given a moment first.
        tokio::time::sleep(SETTLE).await;
        let live = Live::start_with(Home::new(&[]), &cold_env).await;
        never_used.push(live.ok(json!({"code": "print(1+1)"})).await.1);
        let home = live.shutdown().await;
        tokio::time::sleep(SETTLE).await;
        // The same state dir again: its service went with its bridge.
        let live = Live::start_with(home, &cold_env).await;
        cold.push(live.ok(json!({"code": "print(1+1)"})).await.1);
        live.shutdown().await;
    }
    t.samples(
        &format!(
            "first `print(1+1)` with no pause after `initialize`, cold host: no engine service running, a state dir used before (pool_size = {pool})"
        ),
        &cold,
        Unit::Ms,
        Target::AtMost(400.0),
    );
    t.samples(
        &format!(
            "the same in a state dir never used: the engine asked what it can enforce (pool_size = {pool})"
        ),
        &never_used,
        Unit::Ms,
        Target::None,
    );
    // The pool's parked sandbox alone: the session of the first bridge is not parked.
    let env = [
        ("MCP_BRIDGE_POOL_SIZE", pool),
        ("MCP_BRIDGE_ENGINE_LINGER", linger),
        ("MCP_BRIDGE_SESSION_LINGER", "0"),
    ];
    // A first bridge runs once and exits; each sample is the next bridge in the same state dir.
    let live = Live::start_with(Home::new(&[]), &env).await;
    live.ok(json!({"code": "pass"})).await;
    let mut home = live.shutdown().await;
    let mut recent = Vec::new();
    for _ in 0..o.pool_fresh {
        let live = Live::start_with(home, &env).await;
        recent.push(live.ok(json!({"code": "print(1+1)"})).await.1);
        home = live.shutdown().await;
    }
    t.samples(
        &format!(
            "first `print(1+1)` with no pause after `initialize`, a bridge ran and exited just before (engine_linger = {linger}; pool_size = {pool})"
        ),
        &recent,
        Unit::Ms,
        Target::AtMost(50.0),
    );
    // A session the bridge before parked (`session_linger`): the next bridge's first call
    // naming it resumes it, its state there (`x` grows by one a bridge).
    let env = [
        ("MCP_BRIDGE_POOL_SIZE", pool),
        ("MCP_BRIDGE_ENGINE_LINGER", linger),
        ("MCP_BRIDGE_SESSION_LINGER", linger),
    ];
    let live = Live::start_with(home, &env).await;
    live.ok(json!({"code": "x = 0", "session": "kept"})).await;
    home = live.shutdown().await;
    let mut resumed = Vec::new();
    for i in 0..o.pool_fresh {
        let live = Live::start_with(home, &env).await;
        let (stdout, ms) = live
            .ok(json!({"code": "x += 1\nprint(x)", "session": "kept"}))
            .await;
        assert_eq!(
            stdout,
            format!("{}\n", i + 1),
            "bridge {i} did not resume the session"
        );
        resumed.push(ms);
        home = live.shutdown().await;
    }
    t.samples(
        &format!(
            "first call of a bridge on a session the bridge before it parked, resumed live (session_linger = {linger}; pool_size = {pool})"
        ),
        &resumed,
        Unit::Ms,
        Target::AtMost(50.0),
    );
    stop_lingering_service(&home).await;
}

/// The engine service a bench bridge left lingering in `home`, stopped rather than left to
/// its idle timeout: the bench leaves nothing running behind it.
pub(crate) async fn stop_lingering_service(home: &Home) {
    let state = home.path().join(".local/state/mcp-code-bridge/engine");
    let Ok(pid) = std::fs::read_to_string(state.join("podman.pid")) else {
        return;
    };
    // Not 0 (the bench's own group) nor what cannot be negated.
    if let Ok(pid) = pid.trim().parse::<i32>()
        && pid > 0
    {
        // SAFETY: kill only sends a signal and touches no memory of ours, whatever `pid` is.
        // The guard leads the service's process group (a stale pid file would name another).
        unsafe { libc::kill(-pid, libc::SIGTERM) };
    }
}

pub(crate) async fn pool_section(o: &Opts, t: &mut Table) {
    if !o.wants("pool") {
        // `BENCH_ONLY=first-call`: the rows with no pause alone.
        t.section(8, "8. First calls: warm-up and the pool");
        no_pause(o, "1", t).await;
        no_pause(o, "0", t).await;
        return;
    }
    t.section(
        8,
        &format!(
            "8. First calls: warm-up and the pool (each after {:.1} s of model think time)",
            THINK.as_secs_f64()
        ),
    );
    first_calls(o, "1", t).await;
    first_calls(o, "0", t).await;
    no_pause(o, "1", t).await;
    no_pause(o, "0", t).await;
}

//! Section 14: the isolation levels side by side, runc and gVisor in one run
//! (`BENCH_ONLY=isolation`; needs the engine's runtime `runsc`, as `isolation = "gvisor"` does).

use super::*;

/// A thinking time long enough for a pooled gVisor sandbox to be ready.
const THINK_LONG: std::time::Duration = std::time::Duration::from_secs(5);

/// The rows of one isolation level: `level` is `container` or `gvisor`.
async fn level_rows(o: &Opts, fx: &Fixtures, level: &str, t: &mut Table) {
    let name = if level == "gvisor" { "gVisor" } else { "runc" };
    // The targets are gVisor's (runc's rows are there to compare with).
    let target = |ms: f64| {
        if level == "gvisor" {
            Target::AtMost(ms)
        } else {
            Target::None
        }
    };
    let iso = [("MCP_BRIDGE_ISOLATION", level)];
    // The first call of a fresh bridge with the pool, after the model's thinking time (as in
    // section 8): what the pool hides of a start.
    let pooled = [
        ("MCP_BRIDGE_ISOLATION", level),
        ("MCP_BRIDGE_POOL_SIZE", "1"),
    ];
    // At section 8's thinking time, and at a longer one: a pooled gVisor sandbox boots (and
    // preloads numpy and pandas) in seconds on ptrace, so the pool hides its start only when
    // the model thinks that long.
    for think in [THINK, THINK_LONG] {
        let mut fresh = Vec::new();
        for _ in 0..o.pool_fresh {
            let live = Live::start_with(Home::new(&[]), &pooled).await;
            tokio::time::sleep(think).await;
            fresh.push(live.ok(json!({"code": "print(1+1)"})).await.1);
            live.shutdown().await;
        }
        t.samples(
            &format!(
                "{name}: first `print(1+1)` {:.1} s after `initialize`, fresh bridge (pool_size = 1)",
                think.as_secs_f64()
            ),
            &fresh,
            Unit::Ms,
            target(50.0),
        );
    }
    // New sessions of a running bridge with the pool, and without it (the start itself).
    let tag = std::process::id();
    for (pool, env) in [("1", &pooled[..]), ("0", &iso[..])] {
        let live = Live::start_with(Home::new(&[]), env).await;
        live.ok(json!({"code": "pass"})).await;
        let mut new = Vec::new();
        for i in 0..o.new_session.min(10) {
            if pool == "1" {
                tokio::time::sleep(THINK).await;
            }
            let s = format!("iso-{level}-{pool}-{tag}-{i}");
            new.push(live.ok(json!({"code": "print(1+1)", "session": s})).await.1);
        }
        t.samples(
            &format!("{name}: first `print(1+1)` of a new session (pool_size = {pool})"),
            &new,
            Unit::Ms,
            Target::None,
        );
        live.shutdown().await;
    }
    // Warm calls, a proxied call and `import pandas` in one bridge with the `everything` server
    // (no pool: every session here is started on demand).
    let everything: Vec<ServerDef> = fx
        .real()
        .into_iter()
        .filter(|(n, _, _)| n == "everything")
        .collect();
    let live = Live::start_with(Home::new(&everything), &iso).await;
    for _ in 0..3 {
        live.ok(json!({"code": "pass"})).await;
    }
    let cpu0 = cpu_ms(live.pid);
    let mut warm = Vec::new();
    for _ in 0..o.warm {
        warm.push(live.ok(json!({"code": "pass"})).await.1);
    }
    let warm_cpu = 1e3 * (cpu_ms(live.pid) - cpu0) / o.warm as f64;
    t.samples(
        &format!("{name}: warm `pass`"),
        &warm,
        Unit::Ms,
        target(3.0),
    );
    t.row(
        &format!("{name}: bridge CPU per warm `pass` (mean over the N calls)"),
        "1".into(),
        warm_cpu,
        warm_cpu,
        Unit::Us,
        Target::None,
    );
    let n = o.proxy_calls;
    let code = echo_loop(n);
    let (mut proxied, mut proxied_cpu) = (Vec::new(), Vec::new());
    for _ in 0..o.proxy_runs.min(3) {
        let (ts, cpu) = sandbox_loop(&live, &code, "proxy").await;
        proxied.extend(ts);
        proxied_cpu.push(cpu / n as f64);
    }
    t.samples(
        &format!("{name}: proxied call from the code (`await mcp_everything.echo(...)`)"),
        &proxied,
        Unit::Ms,
        target(5.0),
    );
    t.samples(
        &format!("{name}: bridge CPU per proxied call (per loop of {n})"),
        &proxied_cpu,
        Unit::Us,
        Target::None,
    );
    let mut pandas = Vec::new();
    for i in 0..o.pandas {
        let s = format!("iso-pd-{level}-{tag}-{i}");
        // The session is started first: the row is the import alone, on that kernel.
        live.ok(json!({"code": "pass", "session": s})).await;
        pandas.push(
            live.ok(json!({"code": "import pandas", "session": s}))
                .await
                .1,
        );
    }
    t.samples(
        &format!("{name}: first `import pandas` of a started session (not preloaded)"),
        &pandas,
        Unit::Ms,
        Target::None,
    );
    live.shutdown().await;
}

pub(crate) async fn isolation_section(o: &Opts, fx: &Fixtures, t: &mut Table) {
    t.section(
        14,
        "14. Isolation side by side: runc and gVisor (the registered runsc, its platform as setup chose)",
    );
    // The probe the bridge makes before it runs code under gVisor: podman fails at once for a
    // runtime it cannot find. Without runsc the section says so instead of failing the bench.
    let runsc = std::process::Command::new("podman")
        .args([
            "--runtime",
            "runsc",
            "info",
            "--format",
            "{{.Host.OCIRuntime.Name}}",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success());
    if !runsc {
        t.note(
            "section 14 not run: podman has no runtime `runsc` (`sudo scripts/setup-debian.sh --isolation gvisor` registers it)".into(),
        );
        return;
    }
    for level in ["container", "gvisor"] {
        eprintln!("bench: isolation = {level}…");
        level_rows(o, fx, level, t).await;
    }
}

//! Section 3: execution.

use super::*;

/// Run one timing loop in the "proxy" session: its per-call times in ms (the code prints them as
/// a JSON list of seconds), and the bridge's CPU over the whole call in µs.
pub(crate) async fn sandbox_loop(live: &Live, code: &str, what: &str) -> (Vec<f64>, f64) {
    let cpu0 = cpu_ms(live.pid);
    let (out, _) = live
        .ok(json!({"code": code, "servers": ["everything"], "session": "proxy", "timeout": 120}))
        .await;
    let cpu = 1e3 * (cpu_ms(live.pid) - cpu0);
    let ts: Vec<f64> = serde_json::from_str(out.trim()).unwrap_or_else(|e| {
        fail(&format!(
            "{what} loop output is not a JSON list ({e}): {out}"
        ))
    });
    (ts.iter().map(|s| s * 1e3).collect(), cpu)
}

pub(crate) async fn execution(o: &Opts, live: &Live, t: &mut Table) {
    t.section(3, "3. Execution (round trip seen by the MCP client)");
    let tag = std::process::id();
    // Make sure the engine is connected and the image present before timing sessions.
    live.ok(json!({"code": "pass"})).await;
    let mut first = Vec::new();
    for i in 0..o.new_session {
        let (_, el) = live
            .ok(json!({"code": "pass", "session": format!("new-{tag}-{i}")}))
            .await;
        first.push(el);
    }
    t.samples(
        "first run_python of a new session (container start + runtime injection)",
        &first,
        Unit::Ms,
        Target::None,
    );
    let warm = |code: &'static str, n: usize| async move {
        let mut v = Vec::new();
        for _ in 0..3 {
            live.ok(json!({"code": code})).await;
        }
        for _ in 0..n {
            v.push(live.ok(json!({"code": code})).await.1);
        }
        v
    };
    let cpu0 = cpu_ms(live.pid);
    let pass = warm("pass", o.warm).await;
    let pass_cpu = 1e3 * (cpu_ms(live.pid) - cpu0) / (o.warm + 3) as f64;
    t.samples("warm `pass`", &pass, Unit::Ms, Target::None);
    t.row(
        "bridge CPU per warm `pass` (mean over the N calls)",
        "1".into(),
        pass_cpu,
        pass_cpu,
        Unit::Us,
        Target::None,
    );
    // Loading servers: the bridge binds the 53 tools' metadata per call; the session's first call
    // sends it and builds the proxies, the warm ones (timed) send it only if it changed.
    let mut loaded = Vec::new();
    for _ in 0..3 {
        live.ok(json!({"code": "pass", "servers": ALL5, "timeout": 120}))
            .await;
    }
    let cpu0 = cpu_ms(live.pid);
    for _ in 0..o.warm {
        loaded.push(
            live.ok(json!({"code": "pass", "servers": ALL5, "timeout": 120}))
                .await
                .1,
        );
    }
    let loaded_cpu = 1e3 * (cpu_ms(live.pid) - cpu0) / o.warm as f64;
    t.samples(
        "warm `pass` with the 5 real servers loaded (53 tools bound; metadata unchanged, not resent)",
        &loaded,
        Unit::Ms,
        Target::None,
    );
    t.row(
        "bridge CPU per such call (mean over the N calls)",
        "1".into(),
        loaded_cpu,
        loaded_cpu,
        Unit::Us,
        Target::None,
    );
    let print = warm("print('hello')", o.warm).await;
    t.samples(
        "warm `print('hello')`",
        &print,
        Unit::Ms,
        Target::AtMost(5.0),
    );
    let big = warm("print('x' * 999_999)", o.big_output).await;
    t.samples(
        "warm 1 MB of output (`print('x' * 999_999)`)",
        &big,
        Unit::Ms,
        Target::None,
    );
    let (mut cold_pd, mut warm_pd) = (Vec::new(), Vec::new());
    for i in 0..o.pandas {
        let s = format!("pandas-{tag}-{i}");
        cold_pd.push(
            live.ok(json!({"code": "import pandas", "session": s}))
                .await
                .1,
        );
        warm_pd.push(
            live.ok(json!({"code": "import pandas", "session": s}))
                .await
                .1,
        );
    }
    t.samples(
        "`import pandas`, new session (container start + import)",
        &cold_pd,
        Unit::Ms,
        Target::None,
    );
    t.samples(
        "`import pandas`, existing session that imported it",
        &warm_pd,
        Unit::Ms,
        Target::None,
    );
}

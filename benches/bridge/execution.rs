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
    // Files out: a call whose /workspace/out is as the last copy left it costs no copy (the
    // runtime's digest says so); one that touched a file there pays one archive request (the
    // bytes compared, nothing announced); one that writes a new 1 MiB file is copied and linked.
    live.ok(json!({"code": "import os\nos.makedirs('/workspace/out', exist_ok=True)\nopen('/workspace/out/keep.csv', 'w').write('a,b\\n' * 1000)"}))
        .await;
    let kept = warm("pass", o.warm).await;
    t.samples(
        "warm `pass`, a file left in /workspace/out (unchanged: not copied)",
        &kept,
        Unit::Ms,
        Target::None,
    );
    let touched = warm("import os\nos.utime('/workspace/out/keep.csv')", o.warm).await;
    t.samples(
        "warm call that touches that file (one archive copy, nothing new)",
        &touched,
        Unit::Ms,
        Target::None,
    );
    let written = warm(
        "import os\nopen('/workspace/out/new.bin', 'wb').write(os.urandom(1 << 20))",
        o.warm / 4,
    )
    .await;
    t.samples(
        "warm call writing a new 1 MiB file to /workspace/out (copied, linked)",
        &written,
        Unit::Ms,
        Target::None,
    );
    // `/workspace/out` is a mount point (sandbox::files::OUT_DIR): what is in it goes, not it.
    live.ok(json!({"code": "import os, shutil\nfor e in os.scandir('/workspace/out'):\n    shutil.rmtree(e.path) if e.is_dir(follow_symlinks=False) else os.remove(e.path)"}))
        .await;
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

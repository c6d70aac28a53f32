//! Section 15: a session's state on disk (`BENCH_ONLY=snapshots`): the snapshot a fork writes
//! and the restore of the first call that names the copy, for an empty session (the floor) and
//! for one holding a 1,000,000-row, 10-column DataFrame and a few numpy arrays.

use super::*;

/// Code that leaves the state measured, by name.
const STATES: [(&str, &str); 2] = [
    ("an empty session", "pass"),
    (
        "a 1,000,000 × 10 DataFrame and 3 numpy arrays (1,000,000 float64 each)",
        "import numpy as np, pandas as pd\n\
         rng = np.random.default_rng(7)\n\
         df = pd.DataFrame(rng.random((1_000_000, 10)), columns=[f'c{i}' for i in range(10)])\n\
         a, b, c = (rng.random(1_000_000) for _ in range(3))",
    ),
];

pub(crate) async fn snapshots_section(o: &Opts, t: &mut Table) {
    t.section(15, "15. Sessions kept on disk: snapshot and restore");
    let runs = if o.quick { 2 } else { 5 };
    for (what, setup) in STATES {
        // The default limits (memory 512m, snapshot_max_size 256m), and the pool a new
        // session takes its sandbox from, as a user runs it.
        let live = Live::start_with(Home::new(&[]), &[("MCP_BRIDGE_POOL_SIZE", "1")]).await;
        live.ok(json!({"code": setup, "session": "source", "timeout": 120}))
            .await;
        let (mut taken, mut sizes, mut restored) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..runs {
            // The fork writes the snapshot (timed in the sandbox, the store included: the `fork`
            // call returns once the bridge kept it), into a session of a new name.
            let fork = format!(
                "from mcp import runtime\nimport time\nt0 = time.perf_counter()\nr = await runtime.fork('copy-{i}')\nprint((time.perf_counter() - t0) * 1000, r['size'])"
            );
            let (stdout, _) = live
                .ok(json!({"code": fork, "session": "source", "timeout": 120}))
                .await;
            let mut parts = stdout.split_whitespace();
            taken.push(parts.next().unwrap().parse::<f64>().unwrap());
            sizes.push(parts.next().unwrap().parse::<f64>().unwrap());
            // A pause for the pool's sandbox to be ready, as a model's thinking gives it.
            tokio::time::sleep(THINK).await;
            let copy = format!("copy-{i}");
            restored.push(
                live.ok(json!({"code": "pass", "session": copy, "timeout": 120}))
                    .await
                    .1,
            );
            // Its memory back before the next run (untimed): a reset leaves a fresh interpreter.
            live.ok(json!({"code": "pass", "session": copy, "reset": true}))
                .await;
            tokio::time::sleep(THINK).await;
        }
        t.samples(
            &format!("size of the snapshot of {what}"),
            &sizes,
            Unit::Bytes,
            Target::None,
        );
        t.samples(
            &format!("snapshot of {what} (`runtime.fork`, written and kept)"),
            &taken,
            Unit::Ms,
            Target::None,
        );
        t.samples(
            &format!(
                "restore of {what}: first call naming the copy (pooled sandbox, restore, call)"
            ),
            &restored,
            Unit::Ms,
            Target::AtMost(1500.0),
        );
        let home = live.shutdown().await;
        stop_lingering_service(&home).await;
    }
}

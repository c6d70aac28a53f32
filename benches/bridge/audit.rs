//! Section 10: the audit log's cost. The writer alone (1,000 `exec` records handed over and
//! written, in this process), and warm `run_python` calls of two bridges, audit on and off,
//! called in turn so both see the same machine.

use super::*;

use mcp_code_bridge::audit::{Audit, Exec};
use mcp_code_bridge::config::Config;

/// Records per writer run.
const RECORDS: usize = 1000;

pub(crate) async fn audit_section(o: &Opts, t: &mut Table) {
    t.section(10, "10. Audit log");
    let runs = if o.quick { 5 } else { 30 };
    let (mut per_record, mut on_disk, mut dropped) = (Vec::new(), Vec::new(), 0);
    let code = "import json\nprint(json.dumps({'a': 1}))\n".repeat(4);
    let servers = vec!["time".to_string()];
    for _ in 0..runs {
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            state_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        let audit = Audit::open(&config);
        let started = Instant::now();
        for i in 0..RECORDS {
            audit.exec(Exec {
                session: "bench",
                identity: None,
                code: &code,
                servers: &servers,
                status: if i % 10 == 0 { "error" } else { "ok" },
                error_type: (i % 10 == 0).then_some("ValueError"),
                duration: Duration::from_millis(3),
            });
        }
        let handed = started.elapsed();
        if !audit.flush(Duration::from_secs(30)) {
            fail("the audit writer did not flush 1,000 records within 30 s");
        }
        on_disk.push(ms(started.elapsed()));
        per_record.push(ms(handed));
        dropped += audit.dropped();
    }
    t.samples(
        "1,000 exec records handed over (the callers' cost: digest, queue; ms per 1,000 = µs per record)",
        &per_record,
        Unit::Ms,
        Target::None,
    );
    t.samples(
        &format!("1,000 exec records handed over and on disk (writer thread; {dropped} dropped in all runs)"),
        &on_disk,
        Unit::Ms,
        Target::None,
    );

    // The same warm call through two bridges, audit off and on, in turn.
    let off = Live::start_with(Home::new(&[]), &[("MCP_BRIDGE_AUDIT_PATH", "off")]).await;
    let on = Live::start(Home::new(&[])).await;
    for _ in 0..3 {
        off.ok(json!({"code": "pass"})).await;
        on.ok(json!({"code": "pass"})).await;
    }
    let (mut t_off, mut t_on) = (Vec::new(), Vec::new());
    for _ in 0..o.warm {
        t_off.push(off.ok(json!({"code": "pass"})).await.1);
        t_on.push(on.ok(json!({"code": "pass"})).await.1);
    }
    t.samples("warm `pass`, audit off", &t_off, Unit::Ms, Target::None);
    t.samples(
        "warm `pass`, audit on (one exec record per call)",
        &t_on,
        Unit::Ms,
        Target::None,
    );
    off.shutdown().await;
    on.shutdown().await;
}

//! Section 10: the audit log's cost. The writer alone (1,000 `exec` records handed over and
//! written, in this process); warm `run_python` calls of two bridges, audit on and off, called
//! in turn so both see the same machine; and a loop of 1,000 proxied calls (one `tool_call`
//! record each) in the same two bridges.

use super::*;

use bridge_core::audit::{Audit, Exec};
use bridge_core::config::Config;

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
    let everything = || {
        vec![(
            "everything".to_string(),
            server_bin("mcp-server-everything"),
            Vec::new(),
        )]
    };
    let off = Live::start_with(
        Home::new(&everything()),
        &[("MCP_BRIDGE_AUDIT_PATH", "off")],
    )
    .await;
    let on = Live::start(Home::new(&everything())).await;
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

    // 1,000 proxied calls in one run_python call, each bridge in turn.
    let loop_code = format!(
        "await mcp_everything.echo(message='warm')\n\
         for i in range({RECORDS}):\n    await mcp_everything.echo(message=f'm{{i}}')"
    );
    let call = json!({"code": loop_code, "servers": ["everything"], "timeout": 120});
    off.ok(call.clone()).await;
    on.ok(call.clone()).await;
    let (mut l_off, mut l_on) = (Vec::new(), Vec::new());
    for _ in 0..(if o.quick { 3 } else { 10 }) {
        l_off.push(off.ok(call.clone()).await.1);
        l_on.push(on.ok(call.clone()).await.1);
    }
    t.samples(
        "1,000 proxied calls (everything.echo) in one call, audit off",
        &l_off,
        Unit::Ms,
        Target::None,
    );
    t.samples(
        "1,000 proxied calls, audit on (a tool_call record each, plus the exec's)",
        &l_on,
        Unit::Ms,
        Target::None,
    );
    // The table's own median, so the difference is of the two rows above (negative: the
    // difference is within the machine's noise).
    let (m_off, m_on) = (pct(&l_off, 0.5), pct(&l_on, 0.5));
    t.fact(
        "audit cost per proxied call (median on minus median off, / 1,000)",
        &l_on.len().to_string(),
        format!("{:+.1} µs", (m_on - m_off) * 1000.0 / RECORDS as f64),
        "",
        "",
    );
    off.shutdown().await;
    on.shutdown().await;
}

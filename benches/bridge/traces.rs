//! Section 16: what traces cost a call. Two bridges, one sending traces to a real OTLP receiver
//! (tests/fixtures/otlp_receiver.py, decoding every span) and one with none, called in turn so
//! both see the same machine: the warm `print` call (target: at most 5 % more with traces on),
//! and 200 proxied calls in one call (a span each).

use super::*;

/// Proxied calls per loop.
const CALLS: usize = 200;

pub(crate) async fn tracing_section(o: &Opts, t: &mut Table) {
    t.section(16, "16. Traces (OTLP)");
    let mut receiver = std::process::Command::new(server_bin("mcp-python"))
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/otlp_receiver.py"
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("the OTLP receiver did not start: {e}")));
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(receiver.stdout.take().unwrap()));
    let port = lines
        .next()
        .and_then(Result::ok)
        .and_then(|l| l.strip_prefix("PORT ").map(str::to_string))
        .unwrap_or_else(|| fail("the OTLP receiver did not say its port"));
    let spans = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = spans.clone();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            if l.starts_with('{') {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let endpoint = format!("http://127.0.0.1:{port}");
    let everything = || {
        vec![(
            "everything".to_string(),
            server_bin("mcp-server-everything"),
            Vec::new(),
        )]
    };
    let off = Live::start(Home::new(&everything())).await;
    let on = Live::start_with(
        Home::new(&everything()),
        &[("MCP_BRIDGE_OTEL_ENDPOINT", endpoint.as_str())],
    )
    .await;
    let print = json!({"code": "print(1)"});
    for _ in 0..3 {
        off.ok(print.clone()).await;
        on.ok(print.clone()).await;
    }
    let (mut t_off, mut t_on) = (Vec::new(), Vec::new());
    for _ in 0..o.warm {
        t_off.push(off.ok(print.clone()).await.1);
        t_on.push(on.ok(print.clone()).await.1);
    }
    t.samples(
        "warm `print(1)`, traces off",
        &t_off,
        Unit::Ms,
        Target::None,
    );
    t.samples(
        "warm `print(1)`, traces on (2 spans a call, to the receiver)",
        &t_on,
        Unit::Ms,
        Target::None,
    );
    let (m_off, m_on) = (pct(&t_off, 0.5), pct(&t_on, 0.5));
    let ratio = m_on / m_off;
    t.fact(
        "warm `print(1)`: median on / median off",
        &t_on.len().to_string(),
        format!("{ratio:.3}"),
        "≤ 1.05",
        if ratio <= 1.05 { "yes" } else { "no" },
    );

    let loop_code = format!(
        "await mcp_everything.echo(message='warm')\n\
         for i in range({CALLS}):\n    await mcp_everything.echo(message=f'm{{i}}')"
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
        &format!("{CALLS} proxied calls (everything.echo) in one call, traces off"),
        &l_off,
        Unit::Ms,
        Target::None,
    );
    t.samples(
        &format!("{CALLS} proxied calls, traces on (a span each)"),
        &l_on,
        Unit::Ms,
        Target::None,
    );
    let (p_off, p_on) = (pct(&l_off, 0.5), pct(&l_on, 0.5));
    t.fact(
        "traces' cost per proxied call (median on minus median off, / calls)",
        &l_on.len().to_string(),
        format!("{:+.1} µs", (p_on - p_off) * 1000.0 / CALLS as f64),
        "",
        "",
    );
    off.shutdown().await;
    on.shutdown().await;
    // The exporter sends at the bridge's exit what it had not yet.
    std::thread::sleep(Duration::from_secs(1));
    t.fact(
        "spans the receiver decoded",
        "1",
        spans.load(Ordering::Relaxed).to_string(),
        "",
        "",
    );
    let _ = receiver.kill();
    let _ = receiver.wait();
}

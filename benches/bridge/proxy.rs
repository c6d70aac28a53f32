//! Section 4: proxy overhead.

use super::*;

/// Code that times `n` proxied `echo` calls to the `everything` server from inside the sandbox
/// (after one untimed call) and prints their durations in seconds as JSON.
pub(crate) fn echo_loop(n: usize) -> String {
    format!(
        "import time, json\n\
         await mcp_everything.echo(message='warm')\n\
         ts = []\n\
         for i in range({n}):\n    \
             t0 = time.perf_counter()\n    \
             await mcp_everything.echo(message=f'm{{i}}')\n    \
             ts.append(time.perf_counter() - t0)\n\
         print(json.dumps(ts))"
    )
}

pub(crate) async fn proxy(o: &Opts, live: &Live, t: &mut Table) {
    let n = o.proxy_calls;
    let code = echo_loop(n);
    // The sandbox <-> bridge channel alone: an RPC the bridge answers itself.
    let channel_code = format!(
        "import time, json\n\
         from mcp import runtime\n\
         await runtime.list_servers()\n\
         ts = []\n\
         for i in range({n}):\n    \
             t0 = time.perf_counter()\n    \
             await runtime.list_servers()\n    \
             ts.append(time.perf_counter() - t0)\n\
         print(json.dumps(ts))"
    );
    // The same calls by rmcp's client, straight to the same server.
    let cmd = server_bin("mcp-server-everything");
    let transport = TokioChildProcess::builder(Command::new(&cmd).configure(|_| {}))
        .stderr(Stdio::null())
        .spawn()
        .map(|(t, _)| t)
        .unwrap_or_else(|e| fail(&format!("spawn {cmd}: {e}")));
    let client = ()
        .serve(transport)
        .await
        .unwrap_or_else(|e| fail(&format!("initialize server-everything directly: {e}")));
    let echo = |m: String| {
        CallToolRequestParams::new("echo")
            .with_arguments(json!({"message": m}).as_object().cloned().unwrap())
    };
    client.call_tool(echo("warm".into())).await.unwrap();
    // Bridge and direct loops alternate, so drift in the machine's load hits both alike; the
    // overhead is taken per pair of runs (median of one minus median of the other).
    let (mut rtt, mut rate, mut drtt, mut drate, mut over) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut chan, mut chan_cpu, mut echo_cpu, mut direct_cpu) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.proxy_runs {
        let (ts, cpu) = sandbox_loop(live, &channel_code, "channel").await;
        chan.extend(ts);
        chan_cpu.push(cpu / n as f64);
        let (ts, cpu) = sandbox_loop(live, &code, "proxy").await;
        echo_cpu.push(cpu / n as f64);
        rate.push(1e3 * ts.len() as f64 / ts.iter().sum::<f64>());
        let mut d = Vec::new();
        let cpu0 = cpu_ms(std::process::id());
        for i in 0..n {
            let t0 = Instant::now();
            client
                .call_tool(echo(format!("m{i}")))
                .await
                .unwrap_or_else(|e| fail(&format!("direct echo: {e}")));
            d.push(ms(t0.elapsed()));
        }
        direct_cpu.push(1e3 * (cpu_ms(std::process::id()) - cpu0) / n as f64);
        drate.push(1e3 * d.len() as f64 / d.iter().sum::<f64>());
        over.push(pct(&ts, 0.5) - pct(&d, 0.5));
        rtt.extend(ts);
        drtt.extend(d);
    }
    let _ = client.cancel().await;

    t.section(4, "4. Proxy (server-everything `echo`)");
    t.samples(
        &format!("round trip from inside the sandbox (per call; {n} sequential calls per run)"),
        &rtt,
        Unit::Ms,
        Target::None,
    );
    t.samples(
        "calls/s in that loop (per run)",
        &rate,
        Unit::PerSec,
        Target::None,
    );
    t.samples(
        "round trip of an RPC the bridge answers itself (`runtime.list_servers()`, per call)",
        &chan,
        Unit::Ms,
        Target::None,
    );
    t.samples(
        "bridge CPU per proxied `echo` call (all its threads, per run)",
        &echo_cpu,
        Unit::Us,
        Target::None,
    );
    t.samples(
        "bridge CPU per host-answered RPC (per run)",
        &chan_cpu,
        Unit::Us,
        Target::None,
    );
    t.samples(
        "round trip, rmcp client → server directly (per call)",
        &drtt,
        Unit::Ms,
        Target::None,
    );
    t.samples(
        "CPU of that rmcp client per call (the bench process, per run)",
        &direct_cpu,
        Unit::Us,
        Target::None,
    );
    t.samples(
        "calls/s, rmcp client directly (per run)",
        &drate,
        Unit::PerSec,
        Target::None,
    );
    t.samples(
        "bridge overhead per call (median sandbox − median direct, per pair of runs)",
        &over,
        Unit::Ms,
        Target::AtMost(0.5),
    );
}

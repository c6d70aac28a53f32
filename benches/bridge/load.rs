//! Section 6: the load test.

use super::*;

pub(crate) struct LoadRun {
    pub(crate) wall: f64,
    pub(crate) latencies: Vec<f64>,
    pub(crate) lost: usize,
    pub(crate) mismatched: usize,
    pub(crate) failed: usize,
    pub(crate) rss: Vec<f64>,
}

pub(crate) async fn load_run(o: &Opts, live: &Live, run: usize) -> LoadRun {
    let nonce = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let sessions: Vec<String> = (0..o.load_sessions).map(|s| format!("load-{s}")).collect();
    // Start the sessions (not timed): the test is about calls, not container starts.
    futures::future::join_all(
        sessions
            .iter()
            .map(|s| live.ok(json!({"code": "pass", "session": s, "servers": ["everything"]}))),
    )
    .await;
    let (stop, sampler) = sample_rss(live.pid);
    let t0 = Instant::now();
    let per_session = sessions.iter().enumerate().map(|(k, s)| {
        let nonce = nonce.clone();
        async move {
            let mut v = Vec::new();
            for i in 0..o.load_calls {
                // Bracketed, so no token is a prefix of another.
                let tok = format!("[tok-{nonce}-{run}-{k}-{i}]");
                let code = format!("r = await mcp_everything.echo(message={tok:?})\nprint(r)");
                let t = Instant::now();
                let r = live
                    .call(json!({"code": code, "session": s, "servers": ["everything"], "timeout": 120}))
                    .await;
                v.push((tok, r, ms(t.elapsed())));
            }
            v
        }
    });
    let results = futures::future::join_all(per_session).await;
    let wall = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let rss = sampler.await.unwrap_or_default();
    let mut lr = LoadRun {
        wall,
        latencies: Vec::new(),
        lost: 0,
        mismatched: 0,
        failed: 0,
        rss,
    };
    let mut reported = 0;
    for (tok, r, el) in results.into_iter().flatten() {
        lr.latencies.push(el);
        match r {
            Err(e) => {
                lr.lost += 1;
                if reported < 5 {
                    reported += 1;
                    eprintln!("bench: load test: {tok}: lost: {e}");
                }
            }
            Ok(r) => {
                let out = sc(&r, "stdout");
                let own = out.matches(tok.as_str()).count();
                if out.matches("[tok-").count() > own {
                    lr.mismatched += 1;
                    if reported < 5 {
                        reported += 1;
                        eprintln!("bench: load test: {tok}: mismatched reply: {out:?}");
                    }
                } else if sc(&r, "status") != "ok" || own == 0 {
                    lr.failed += 1;
                    if reported < 5 {
                        reported += 1;
                        eprintln!("bench: load test: {tok}: failed: {}", text(&r));
                    }
                }
            }
        }
    }
    lr
}

/// The load test against `live`; `over` names its transport in the rows ("stdio" opens the
/// section, "HTTP" adds its rows to it: `serve` and rmcp's Streamable HTTP client, same calls).
pub(crate) async fn load_test(o: &Opts, live: &Live, t: &mut Table, over: &str) -> Vec<f64> {
    let mut runs = Vec::new();
    for run in 0..o.load_runs {
        runs.push(load_run(o, live, run).await);
    }
    let calls = o.load_sessions * o.load_calls;
    if over == "stdio" {
        t.section(
            6,
            &format!(
            "6. Load test: {} concurrent sessions × {} calls, each calling server-everything `echo` with a unique token; over stdio, then over HTTP (`serve`)",
                o.load_sessions, o.load_calls
            ),
        );
    }
    let rate: Vec<f64> = runs.iter().map(|r| calls as f64 / r.wall).collect();
    t.samples(
        &format!("{over}: calls/s (per run)"),
        &rate,
        Unit::PerSec,
        Target::None,
    );
    let lat: Vec<f64> = runs.iter().flat_map(|r| r.latencies.clone()).collect();
    let (p50, p99) = (pct(&lat, 0.5), pct(&lat, 0.99));
    t.fact(
        &format!("{over}: latency per call: p50 (median column) / p99 (p95 column)"),
        &lat.len().to_string(),
        String::new(),
        "",
        "",
    );
    if let Some(r) = t.rows.last_mut() {
        r.1.median = format!("p50 {}", fmt(p50, Unit::Ms));
        r.1.p95 = format!("p99 {}", fmt(p99, Unit::Ms));
    }
    let counts: [(&str, usize); 3] = [
        (
            "lost replies (no reply / protocol error)",
            runs.iter().map(|r| r.lost).sum(),
        ),
        (
            "mismatched replies (another call's token)",
            runs.iter().map(|r| r.mismatched).sum(),
        ),
        (
            "failed calls (error status, token missing)",
            runs.iter().map(|r| r.failed).sum(),
        ),
    ];
    for (what, total) in counts {
        t.fact(
            &format!("{over}: {what}, total over all runs"),
            &(runs.len() * calls).to_string(),
            total.to_string(),
            "= 0",
            if total == 0 { "yes" } else { "**no**" },
        );
    }
    runs.iter().flat_map(|r| r.rss.clone()).collect()
}

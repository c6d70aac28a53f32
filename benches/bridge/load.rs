//! Section 6: the load test. Its driver (workers, each a client and a session making sequential
//! calls, judged by a unique token per call) also drives section 11's load over HTTP.

use super::*;

/// What a call of the load runs; each prints its call's unique token.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// `print` of the token: the sandbox channel and the bridge alone.
    Print,
    /// A small DataFrame summed with pandas (imported again: cached after the session's first).
    Pandas,
    /// server-everything's `echo` of the token, proxied through the bridge.
    Echo,
}

impl Kind {
    pub(crate) const ALL: [Kind; 3] = [Kind::Print, Kind::Pandas, Kind::Echo];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Print => "print",
            Kind::Pandas => "pandas",
            Kind::Echo => "echo",
        }
    }

    /// The `run_python` arguments of a call of this kind in `session` that prints `tok`.
    pub(crate) fn args(self, tok: &str, session: &str) -> Value {
        match self {
            Kind::Print => {
                json!({"code": format!("print({tok:?})"), "session": session, "timeout": 120})
            }
            Kind::Pandas => json!({
                "code": format!(
                    "import pandas as pd\ndf = pd.DataFrame({{'a': range(1000)}})\nprint({tok:?}, int(df['a'].sum()))"
                ),
                "session": session,
                "timeout": 120,
            }),
            Kind::Echo => json!({
                "code": format!("r = await mcp_everything.echo(message={tok:?})\nprint(r)"),
                "session": session,
                "servers": ["everything"],
                "timeout": 120,
            }),
        }
    }
}

/// One stream of sequential calls: a client and the session it names.
pub(crate) struct Worker<'a> {
    pub(crate) client: &'a RunningService<RoleClient, ()>,
    pub(crate) session: String,
}

/// When a worker stops.
#[derive(Clone, Copy)]
pub(crate) enum Stop {
    /// After this many calls.
    Calls(usize),
    /// At the first call that would start this long after the run began.
    For(Duration),
}

/// What the workers call and for how long.
pub(crate) struct Plan {
    /// Worker `w`'s call `i` is of kind `kinds[(w + i) % len]`, so the kinds interleave.
    pub(crate) kinds: Vec<Kind>,
    pub(crate) stop: Stop,
    /// A worker whose call was refused (no sandbox could be had) waits this long before its
    /// next call, as an agent that read the refusal would.
    pub(crate) after_refusal: Duration,
}

/// What became of a call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Fate {
    Ok,
    /// No reply, or a protocol error.
    Lost,
    /// The output carries another call's token.
    Mismatched,
    /// Not ok, or its own token missing (and not a refusal).
    Failed,
    /// No sandbox for it: the bridge's "cannot start session" (`max_sessions` or the identity's
    /// bound, every session running code).
    Refused,
}

/// One call of the load.
pub(crate) struct Rec {
    pub(crate) kind: Kind,
    pub(crate) fate: Fate,
    pub(crate) ms: f64,
    /// The call ran in a fresh interpreter because its session had been closed or reset since
    /// its last reply (the bridge says so in a notice).
    pub(crate) fresh: bool,
    /// The call closed another session to make room for its own (a notice says so).
    pub(crate) closed_other: bool,
    /// The text of the reply (for refusals and failures), cut to 600 characters.
    pub(crate) text: String,
}

/// Judge one reply by its call's token.
pub(crate) fn judge(kind: Kind, tok: &str, r: Res<CallToolResult>, ms: f64) -> Rec {
    let mut rec = Rec {
        kind,
        fate: Fate::Ok,
        ms,
        fresh: false,
        closed_other: false,
        text: String::new(),
    };
    match r {
        Err(e) => {
            rec.fate = Fate::Lost;
            rec.text = e;
        }
        Ok(r) => {
            let out = sc(&r, "stdout");
            let all = text(&r);
            rec.fresh = all.contains("runs in a fresh interpreter");
            rec.closed_other = all.contains("was closed to stay within");
            let own = out.matches(tok).count();
            rec.fate = if out.matches("[tok-").count() > own {
                Fate::Mismatched
            } else if sc(&r, "status") == "unavailable" && all.contains("cannot start session") {
                Fate::Refused
            } else if sc(&r, "status") != "ok" || own == 0 {
                Fate::Failed
            } else {
                Fate::Ok
            };
            if rec.fate != Fate::Ok || rec.fresh || rec.closed_other {
                rec.text = all.chars().take(600).collect();
            }
        }
    }
    rec
}

/// Run `plan` on `workers` at once; tokens are `[tok-<tag>-<worker>-<call>]`. Returns the wall
/// time from the first call to the last reply, and every call.
pub(crate) async fn drive(workers: &[Worker<'_>], plan: &Plan, tag: &str) -> (f64, Vec<Rec>) {
    let t0 = Instant::now();
    let per_worker = workers.iter().enumerate().map(|(w, worker)| async move {
        let mut v = Vec::new();
        for i in 0.. {
            match plan.stop {
                Stop::Calls(n) if i >= n => break,
                Stop::For(d) if t0.elapsed() >= d => break,
                _ => {}
            }
            let kind = plan.kinds[(w + i) % plan.kinds.len()];
            // Bracketed, so no token is a prefix of another.
            let tok = format!("[tok-{tag}-{w}-{i}]");
            let t = Instant::now();
            let r = call_with(worker.client, kind.args(&tok, &worker.session)).await;
            let rec = judge(kind, &tok, r, ms(t.elapsed()));
            if rec.fate == Fate::Refused {
                tokio::time::sleep(plan.after_refusal).await;
            }
            v.push(rec);
        }
        v
    });
    let recs = futures::future::join_all(per_worker)
        .await
        .into_iter()
        .flatten()
        .collect();
    (t0.elapsed().as_secs_f64(), recs)
}

/// The first few calls that were not ok, for stderr.
pub(crate) fn report_bad(recs: &[Rec], what: &str) {
    for r in recs
        .iter()
        .filter(|r| !matches!(r.fate, Fate::Ok | Fate::Refused))
        .take(5)
    {
        eprintln!(
            "bench: {what}: {} call {:?}: {}",
            r.kind.name(),
            r.fate,
            r.text
        );
    }
}

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
    let workers: Vec<Worker> = sessions
        .iter()
        .map(|s| Worker {
            client: &live.client,
            session: s.clone(),
        })
        .collect();
    let plan = Plan {
        kinds: vec![Kind::Echo],
        stop: Stop::Calls(o.load_calls),
        after_refusal: Duration::ZERO,
    };
    let (stop, sampler) = sample_rss(live.pid);
    let (wall, recs) = drive(&workers, &plan, &format!("{nonce}-{run}")).await;
    stop.store(true, Ordering::Relaxed);
    let rss = sampler.await.unwrap_or_default();
    report_bad(&recs, "load test");
    let count = |f: Fate| recs.iter().filter(|r| r.fate == f).count();
    LoadRun {
        wall,
        latencies: recs.iter().map(|r| r.ms).collect(),
        lost: count(Fate::Lost),
        mismatched: count(Fate::Mismatched),
        // A refusal is a failed call here: section 6 never runs out of sessions.
        failed: count(Fate::Failed) + count(Fate::Refused),
        rss,
    }
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

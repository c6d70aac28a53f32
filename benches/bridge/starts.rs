//! Section 11's starts row (`BENCH_ONLY=capacity-starts`): a team's first calls. 20 identities
//! × 2 sessions over `serve`, none started before the run, each session making 20 sequential
//! mixed calls (print, pandas, a proxied `echo`) with the bridge's default pool: every session's
//! first call starts its sandbox while the other sessions call theirs.

use super::*;

const IDS: usize = 20;
const CALLS: usize = 20;

pub(crate) async fn starts_row(fx: &Fixtures, t: &mut Table) {
    starts_run(fx, t, 1).await;
    // The same with a pool as large as the team, filled before its first calls.
    starts_run(fx, t, IDS * SESSIONS_PER_IDENTITY).await;
}

async fn starts_run(fx: &Fixtures, t: &mut Table, pool: usize) {
    let home = Home::new(&fx.real()[..1]);
    let (child, pid, url, tokens) =
        serve_team(&home, IDS, ROOMY_MAX_SESSIONS, &pool.to_string()).await;
    let clients = team_clients(&home, &url, &tokens).await;
    let workers = team_workers(&clients);
    // The bridge up and warmed (engine, image, its pool), as before a team's first calls.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t0 = Instant::now();
    while pool > 1
        && containers_of(pid).await.len() < pool
        && t0.elapsed() < Duration::from_secs(180)
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let pooled = containers_of(pid).await.len();
    eprintln!(
        "bench: capacity: a team's first calls, {IDS} identities × {SESSIONS_PER_IDENTITY} sessions × {CALLS} calls…"
    );
    let plan = Plan {
        kinds: Kind::ALL.to_vec(),
        stop: Stop::Calls(CALLS),
        after_refusal: AFTER_REFUSAL,
    };
    let tag = format!("{}-starts", std::process::id());
    let (wall, recs) = drive(&workers, &plan, &tag).await;
    report_bad(&recs, "a team's first calls");
    // `drive` returns each worker's calls in order, worker after worker.
    let first: Vec<f64> = recs
        .chunks(CALLS)
        .filter_map(|c| c.first())
        .filter(|r| r.fate == Fate::Ok)
        .map(|r| r.ms)
        .collect();
    let ok: Vec<f64> = recs
        .iter()
        .filter(|r| r.fate == Fate::Ok)
        .map(|r| r.ms)
        .collect();
    let count = |f: &dyn Fn(&Rec) -> bool| recs.iter().filter(|r| f(r)).count();
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    let row = vec![
        format!(
            "{IDS} identities × {SESSIONS_PER_IDENTITY} sessions × {CALLS} calls, none started before; pool_size = {pool} ({pooled} ready)"
        ),
        recs.len().to_string(),
        format!("{wall:.1}"),
        format!("{:.0}/s", ok.len() as f64 / wall),
        fmt(pct(&ok, 0.5), Unit::Ms),
        fmt(pct(&ok, 0.99), Unit::Ms),
        fmt(max(&ok), Unit::Ms),
        format!(
            "{} / {}",
            fmt(pct(&first, 0.5), Unit::Ms),
            fmt(max(&first), Unit::Ms)
        ),
        count(&|r| matches!(r.fate, Fate::Lost | Fate::Mismatched | Fate::Failed)).to_string(),
        count(&|r| r.fate == Fate::Refused).to_string(),
    ];
    t.wide(
        "11d. A team's first calls over `serve` (latencies of the calls answered ok; \"not ok\" is lost + mismatched + failed)",
        &[
            "load",
            "calls",
            "s",
            "ok calls/s",
            "p50",
            "p99",
            "max",
            "first call of each session: p50 / max",
            "not ok",
            "refused",
        ],
        vec![row],
    );
    // The bridge's own account of each start for a session (its log): how long it took.
    let log = home.log();
    let starts: Vec<f64> = log
        .lines()
        .filter(|l| l.contains("started a sandbox for the session"))
        .filter_map(|l| {
            l.split(" ms=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    t.note(format!(
        "11d: sandboxes started for sessions (the bridge's log): {}, each {} at p50, {} at most",
        starts.len(),
        fmt(pct(&starts, 0.5), Unit::Ms),
        fmt(max(&starts), Unit::Ms)
    ));
    t.note(format!(
        "settings of 11d: max_sessions = {ROOMY_MAX_SESSIONS}, the rest as section 11's load; the bridge warmed up for 5 s before the first call (and until its pool was full, with pool_size > 1)"
    ));
    drop(workers);
    for c in clients {
        let _ = c.cancel().await;
    }
    stop_serve(child, pid).await;
}

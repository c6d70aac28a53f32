//! Section 7: discovery with a persisted catalog.

use super::*;

/// Live `mcp-server-time` processes started by the bridge `pid` (its direct children).
pub(crate) fn upstream_children(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let after = stat.rsplit(')').next().unwrap_or("");
            let mut fields = after.split_whitespace();
            let state = fields.next().unwrap_or("Z");
            let ppid: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
            ppid == pid
                && state != "Z"
                && std::fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("mcp-server-time"))
        })
        .count()
}

/// One bridge in `home`: the first `search_tool_docs` of its first call (timed inside the
/// sandbox, so the container's start is not in it), then the upstream processes alive and the
/// bridge's RSS right after. Returns the home for the next bridge.
pub(crate) async fn first_search(home: Home) -> (f64, f64, f64, Home) {
    let live = Live::start(home).await;
    let code = "import time\nfrom mcp import runtime\nt = time.perf_counter()\nhits = await runtime.search_tool_docs('timezone conversion')\nprint((time.perf_counter() - t) * 1000)";
    let (out, _) = live.ok(json!({"code": code, "timeout": 120})).await;
    let took: f64 = out
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(f64::NAN);
    let alive = upstream_children(live.pid) as f64;
    let rss = rss_mib(live.pid);
    (took, alive, rss, live.shutdown().await)
}

/// First search across 1, 10 and 30 configured copies of `mcp-server-time`, with a cold
/// catalog (a new home) and a warm one (a second bridge in the same home).
pub(crate) async fn catalog_figures(o: &Opts, t: &mut Table) {
    t.section(
        7,
        "7. First search of a fresh bridge (N copies of mcp-server-time; persisted catalog)",
    );
    for n in [1usize, 10, 30] {
        let servers: Vec<ServerDef> = (0..n)
            .map(|i| {
                (
                    format!("time-{i:02}"),
                    server_bin("mcp-server-time"),
                    vec![],
                )
            })
            .collect();
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        let (mut cold_alive, mut warm_alive) = (Vec::new(), Vec::new());
        let (mut cold_rss, mut warm_rss) = (Vec::new(), Vec::new());
        for run in 0..o.catalog_runs {
            eprintln!("bench: catalog, {n} server(s), run {}…", run + 1);
            let (ms, alive, rss, home) = first_search(Home::new(&servers)).await;
            cold.push(ms);
            cold_alive.push(alive);
            cold_rss.push(rss);
            let (ms, alive, rss, _) = first_search(home).await;
            warm.push(ms);
            warm_alive.push(alive);
            warm_rss.push(rss);
        }
        let target = if n == 30 {
            Target::AtMost(20.0)
        } else {
            Target::None
        };
        t.samples(
            &format!("first search, {n} server(s), cold catalog"),
            &cold,
            Unit::Ms,
            Target::None,
        );
        t.samples(
            &format!("first search, {n} server(s), warm catalog"),
            &warm,
            Unit::Ms,
            target,
        );
        t.samples(
            &format!("upstream processes alive after it, {n} server(s), cold"),
            &cold_alive,
            Unit::Tokens,
            Target::None,
        );
        t.samples(
            &format!("upstream processes alive after it, {n} server(s), warm"),
            &warm_alive,
            Unit::Tokens,
            Target::AtMost(0.0),
        );
        t.samples(
            &format!("bridge RSS after it, {n} server(s), cold"),
            &cold_rss,
            Unit::MiB,
            Target::None,
        );
        t.samples(
            &format!("bridge RSS after it, {n} server(s), warm"),
            &warm_rss,
            Unit::MiB,
            Target::None,
        );
    }
}

//! Section 11e (`BENCH_ONLY=capacity-sessions`): how many sessions this host really carries.
//! Idle sessions that imported pandas are started one after another in one bridge, up to the
//! figure docs/scaling.md gives this host or to the first that fails; then every one is asked
//! to answer again. What each holds, and why the first failure failed.

use super::*;

/// docs/scaling.md's typical runc figure for the measured host (2 vCPU, 23 GiB).
const TARGET: usize = 402;

fn mem_available_mib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let l = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
            l.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// The real uid of host process `pid`.
fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u32>().ok())
}

/// The host's tasks (threads) whose real uid is `uid`: what `RLIMIT_NPROC` counts.
fn tasks_of_uid(uid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|&pid| uid_of(pid) == Some(uid))
        .map(|pid| std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count()))
        .sum()
}

pub(crate) async fn sessions_row(t: &mut Table) {
    let max = (TARGET + 8).to_string();
    let live = Live::start_with(
        Home::new(&[]),
        &[
            ("MCP_BRIDGE_POOL_SIZE", "0"),
            ("MCP_BRIDGE_MAX_SESSIONS", max.as_str()),
            ("MCP_BRIDGE_MEMORY", "512m"),
            ("MCP_BRIDGE_SESSION_LINGER", "0"),
            ("MCP_BRIDGE_SNAPSHOT_MAX_SIZE", "0"),
        ],
    )
    .await;
    live.ok(json!({"code": "pass", "session": "base"})).await;
    let avail0 = mem_available_mib();
    let t0 = Instant::now();
    let mut started = 0;
    let mut failure = None;
    for i in 0..TARGET {
        let r = live
            .call(json!({"code": "import pandas\nprint('ok')", "session": format!("c{i}"), "timeout": 120}))
            .await;
        match r {
            Ok(r) if sc(&r, "status") == "ok" => started += 1,
            Ok(r) => {
                failure = Some(text(&r));
                break;
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
        if i % 20 == 19 {
            eprintln!("bench: capacity: {} sessions started…", i + 1);
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    // The host uids the sandboxes run as (one each under podman's --userns=auto, 65534 for all
    // without it), and the most tasks any one of them has on the host: what RLIMIT_NPROC counts.
    let avail1 = mem_available_mib();
    let ctrs = containers_inspected(live.pid).await;
    let mems: Vec<f64> = ctrs.iter().map(|c| ctr_mem(c).usage).collect();
    let mut uids: Vec<u32> = ctrs.iter().filter_map(|c| uid_of(c.pid)).collect();
    uids.sort_unstable();
    uids.dedup();
    let most_tasks = uids.iter().map(|&u| tasks_of_uid(u)).max().unwrap_or(0);
    // Each started session asked again, 8 at a time.
    let mut answering = 0;
    for chunk in (0..started).collect::<Vec<_>>().chunks(8) {
        let rs = futures::future::join_all(chunk.iter().map(|i| {
            live.call(json!({"code": "print(pandas.__name__)", "session": format!("c{i}")}))
        }))
        .await;
        answering += rs
            .iter()
            .filter(|r| matches!(r, Ok(r) if sc(r, "status") == "ok"))
            .count();
    }
    // The sandbox's own last words, from the bridge's log, when it said why.
    let log = live.home.log();
    let said = log
        .lines()
        .find(|l| l.contains("Resource temporarily unavailable") || l.contains("Cannot allocate"))
        .map(|l| {
            format!(
                " (the bridge's log: {})",
                l.chars().take(200).collect::<String>()
            )
        })
        .unwrap_or_default();
    let cause = failure.as_deref().map_or("none".to_string(), |f| {
        format!(
            "{}{said}",
            f.chars().take(300).collect::<String>().replace('\n', " ")
        )
    });
    t.wide(
        "11e. Idle sessions (pandas imported) started one after another in one bridge, up to docs/scaling.md's figure for this host or the first failure",
        &[
            "wanted",
            "started",
            "s",
            "still answering",
            "cgroup usage per session (p50)",
            "host MemAvailable used per session",
            "host uids of the sandboxes",
            "most host tasks of one uid",
            "first failure",
        ],
        vec![vec![
            TARGET.to_string(),
            started.to_string(),
            format!("{wall:.0}"),
            answering.to_string(),
            fmt(pct(&mems, 0.5), Unit::MiB),
            format!("{:.1} MiB", (avail0 - avail1) / started.max(1) as f64),
            uids.len().to_string(),
            most_tasks.to_string(),
            cause,
        ]],
    );
    live.shutdown().await;
}

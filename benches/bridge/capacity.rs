//! Section 11: capacity. What one sandbox costs the host (the memory of an idle session, of one
//! that imported pandas and of a pooled one; the CPU of an idle pooled one), and `serve` under a
//! team's load: 1, 5 and 20 identities with 2 sessions each making mixed calls for a bounded
//! time, then 20 identities with `max_sessions` at half their sessions.
//!
//! Every limit in force is set here explicitly (not left to the defaults), and named in the notes.

use super::*;

/// The sandbox memory limit of every bridge here (the default, written out).
const MEMORY: &str = "512m";
/// Sessions each identity keeps under `serve`, and what it may keep (`http.max_sessions_per_identity`).
pub(crate) const SESSIONS_PER_IDENTITY: usize = 2;
const MAX_SESSIONS_PER_IDENTITY: &str = "4";
/// Requests of one identity in flight (`http.max_requests_per_identity`): its 2 workers use 2.
const MAX_REQUESTS_PER_IDENTITY: &str = "8";
/// `max_sessions` of the load runs that have room for every session (20 identities × 2 and 8 spare).
pub(crate) const ROOMY_MAX_SESSIONS: usize = 48;
/// How long a worker whose call was refused waits before its next call.
pub(crate) const AFTER_REFUSAL: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------------------------------------
// One sandbox
// ---------------------------------------------------------------------------------------------

/// The memory of N sandboxes in one state, and what each added to the bridge and its engine
/// service (RSS growth over the N, divided by N).
struct MemState {
    label: String,
    mems: Vec<CtrMem>,
    bridge_share: f64,
    service_share: f64,
}

fn service_rss(bridge: u32) -> f64 {
    engine_service(bridge).map_or(f64::NAN, rss_mib)
}

fn service_cpu_ms(bridge: u32) -> f64 {
    engine_service(bridge).map_or(f64::NAN, proc_cpu_ms)
}

/// Let freed memory and background work settle before a reading.
async fn settle() {
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// N idle sessions (after `pass`), then the same N after `import pandas`, in one bridge
/// without a pool. The bridge's and engine service's share is taken against a first session
/// started before them (the engine's connection and the image check are not a session's).
async fn session_memory(o: &Opts, isolation: &str) -> (MemState, MemState) {
    let n = o.capacity_sandboxes.max(1);
    let live = Live::start_with(
        Home::new(&[]),
        &[
            ("MCP_BRIDGE_POOL_SIZE", "0"),
            ("MCP_BRIDGE_MAX_SESSIONS", "16"),
            ("MCP_BRIDGE_MEMORY", MEMORY),
            ("MCP_BRIDGE_ISOLATION", isolation),
        ],
    )
    .await;
    live.ok(json!({"code": "pass", "session": "base"})).await;
    settle().await;
    let (b0, s0) = (rss_mib(live.pid), service_rss(live.pid));
    for i in 0..n {
        live.ok(json!({"code": "pass", "session": format!("mem-{i}")}))
            .await;
    }
    settle().await;
    let ours = async || -> Vec<CtrMem> {
        containers_inspected(live.pid)
            .await
            .iter()
            .filter(|c| c.name.contains("-mem-"))
            .map(ctr_mem)
            .collect()
    };
    let idle = MemState {
        label: format!("session, idle (after `pass`){}", under(isolation)),
        mems: ours().await,
        bridge_share: (rss_mib(live.pid) - b0) / n as f64,
        service_share: (service_rss(live.pid) - s0) / n as f64,
    };
    for i in 0..n {
        live.ok(json!({"code": "import pandas", "session": format!("mem-{i}")}))
            .await;
    }
    settle().await;
    let pandas = MemState {
        label: format!("session after `import pandas`{}", under(isolation)),
        mems: ours().await,
        bridge_share: (rss_mib(live.pid) - b0) / n as f64,
        service_share: (service_rss(live.pid) - s0) / n as f64,
    };
    live.shutdown().await;
    (idle, pandas)
}

/// Times the log says a pooled sandbox is ready.
fn pooled_ready(live: &Live) -> usize {
    live.home
        .log()
        .lines()
        .filter(|l| l.contains("sandbox ready") && l.contains("pool-"))
        .count()
}

async fn wait_pooled(live: &Live, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while pooled_ready(live) < n {
        if Instant::now() > deadline {
            fail(&format!(
                "the pool did not fill to {n} within 180 s\n{}",
                live.home.log()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How a row names its isolation level: nothing for the default (`container`).
fn under(isolation: &str) -> &'static str {
    if isolation == "gvisor" {
        ", gVisor"
    } else {
        ""
    }
}

/// CPU over an idle window, per minute.
struct IdleCpu {
    isolation: &'static str,
    sandboxes: Vec<f64>,
    conmons: Vec<f64>,
    bridge: f64,
    service: f64,
    secs: f64,
}

/// N pooled sandboxes (`pool_size` = N, the default preload: numpy and pandas): their memory,
/// then their CPU, the bridge's and its engine service's over `idle_secs` without a call.
async fn pooled(o: &Opts, isolation: &str) -> (MemState, IdleCpu) {
    let n = o.capacity_sandboxes.max(2);
    let size = n.to_string();
    let live = Live::start_with(
        Home::new(&[]),
        &[
            ("MCP_BRIDGE_POOL_SIZE", size.as_str()),
            ("MCP_BRIDGE_MAX_SESSIONS", "16"),
            ("MCP_BRIDGE_MEMORY", MEMORY),
            ("MCP_BRIDGE_ISOLATION", isolation),
        ],
    )
    .await;
    // The warm-up fills the pool one sandbox at a time after `initialize`. The share is what
    // the bridge grew by from the first ready one to the last, over the N - 1 between.
    wait_pooled(&live, 1).await;
    let (b1, s1) = (rss_mib(live.pid), service_rss(live.pid));
    wait_pooled(&live, n).await;
    settle().await;
    let ctrs: Vec<Ctr> = containers_inspected(live.pid)
        .await
        .into_iter()
        .filter(|c| c.name.contains(".pool-"))
        .collect();
    let state = MemState {
        label: format!(
            "pooled, ready (numpy and pandas preloaded){}",
            under(isolation)
        ),
        mems: ctrs.iter().map(ctr_mem).collect(),
        bridge_share: (rss_mib(live.pid) - b1) / (n - 1) as f64,
        service_share: (service_rss(live.pid) - s1) / (n - 1) as f64,
    };
    eprintln!(
        "bench: capacity: {} pooled sandboxes idle for {} s…",
        ctrs.len(),
        o.idle_secs
    );
    let cpu0: Vec<(f64, f64)> = ctrs
        .iter()
        .map(|c| (ctr_cpu_ms(c), proc_cpu_ms(c.conmon)))
        .collect();
    let (b0, s0) = (proc_cpu_ms(live.pid), service_cpu_ms(live.pid));
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(o.idle_secs as u64)).await;
    let secs = t0.elapsed().as_secs_f64();
    let per_min = 60.0 / secs;
    let cpu = IdleCpu {
        sandboxes: ctrs
            .iter()
            .zip(&cpu0)
            .map(|(c, (s, _))| (ctr_cpu_ms(c) - s) * per_min)
            .collect(),
        conmons: ctrs
            .iter()
            .zip(&cpu0)
            .map(|(c, (_, m))| (proc_cpu_ms(c.conmon) - m) * per_min)
            .collect(),
        bridge: (proc_cpu_ms(live.pid) - b0) * per_min,
        service: (service_cpu_ms(live.pid) - s0) * per_min,
        secs,
        isolation: under(isolation),
    };
    if pooled_ready(&live) > n {
        eprintln!("bench: WARNING: the pool was refilled during the idle window");
    }
    live.shutdown().await;
    (state, cpu)
}

fn mib_med(v: &[f64]) -> String {
    fmt(pct(v, 0.5), Unit::MiB).replace(" MiB", "")
}

async fn sandbox_figures(o: &Opts, t: &mut Table) {
    let mut levels = vec!["container"];
    if o.capacity_gvisor {
        levels.push("gvisor");
    }
    let mut states = Vec::new();
    let mut cpus = Vec::new();
    for isolation in levels {
        eprintln!("bench: capacity: memory of sessions (isolation = {isolation})…");
        let (idle, pandas) = session_memory(o, isolation).await;
        eprintln!("bench: capacity: the pool (isolation = {isolation})…");
        let (pool, cpu) = pooled(o, isolation).await;
        states.extend([idle, pandas, pool]);
        cpus.push(cpu);
    }
    let rows = states
        .iter()
        .map(|s| {
            let col = |f: fn(&CtrMem) -> f64| mib_med(&s.mems.iter().map(f).collect::<Vec<_>>());
            vec![
                s.label.clone(),
                s.mems.len().to_string(),
                col(|m| m.usage),
                col(|m| m.anon),
                col(|m| m.rss),
                col(|m| m.pss),
                col(|m| m.conmon),
                format!("{:.2}", s.bridge_share),
                format!("{:.2}", s.service_share),
            ]
        })
        .collect();
    t.wide(
        &format!(
            "11a. One sandbox's memory (MiB, median over N containers; cgroup {} figures of the container's cgroup; RSS and PSS summed over its processes, from /proc; the shares are RSS growth of the bridge and of its `podman system service` per sandbox)",
            cgroup_version()
        ),
        &[
            "sandbox",
            "N",
            "cgroup usage",
            "cgroup anon",
            "RSS of its processes",
            "PSS of its processes",
            "its conmon's RSS",
            "bridge's share",
            "engine service's share",
        ],
        rows,
    );
    for cpu in cpus {
        let iso = cpu.isolation;
        t.samples(
            &format!(
                "idle pooled sandbox{iso}: CPU of its cgroup per minute (over {:.0} s without a call; 60 ms = 0.1 % of one core)",
                cpu.secs
            ),
            &cpu.sandboxes,
            Unit::Ms,
            Target::AtMost(60.0),
        );
        t.samples(
            &format!("idle pooled sandbox{iso}: CPU of its conmon per minute"),
            &cpu.conmons,
            Unit::Ms,
            Target::None,
        );
        t.row(
            &format!(
                "bridge CPU per minute while {} pooled sandboxes{iso} sit idle",
                cpu.sandboxes.len()
            ),
            "1".into(),
            cpu.bridge,
            cpu.bridge,
            Unit::Ms,
            Target::None,
        );
        t.row(
            "its engine service's (`podman system service`) CPU per minute meanwhile",
            "1".into(),
            cpu.service,
            cpu.service,
            Unit::Ms,
            Target::None,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// `serve` under a team's load
// ---------------------------------------------------------------------------------------------

/// 24 random bytes as hex: a token of `token_file`.
fn random_token() -> String {
    use std::io::Read as _;
    let mut b = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .unwrap_or_else(|e| fail(&format!("/dev/urandom: {e}")));
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn who(ids: usize) -> String {
    if ids == 1 {
        "1 identity".into()
    } else {
        format!("{ids} identities")
    }
}

/// `serve` for `ids` identities (`user-00`, … with a bearer token each in a `token_file`) with
/// `max_sessions` and the section's other settings: its child, pid, URL and the tokens.
pub(crate) async fn serve_team(
    home: &Home,
    ids: usize,
    max_sessions: usize,
    pool_size: &str,
) -> (Child, u32, String, Vec<(String, String)>) {
    let tokens: Vec<(String, String)> = (0..ids)
        .map(|i| (format!("user-{i:02}"), random_token()))
        .collect();
    let token_file = home.path().join("tokens");
    std::fs::write(
        &token_file,
        tokens
            .iter()
            .map(|(n, t)| format!("{n}:{t}\n"))
            .collect::<String>(),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let max = max_sessions.to_string();
    let tf = token_file.display().to_string();
    let env = [
        ("MCP_BRIDGE_TOKEN_FILE", tf.as_str()),
        ("MCP_BRIDGE_MAX_SESSIONS", max.as_str()),
        ("MCP_BRIDGE_POOL_SIZE", pool_size),
        ("MCP_BRIDGE_MEMORY", MEMORY),
        (
            "MCP_BRIDGE_HTTP_MAX_SESSIONS_PER_IDENTITY",
            MAX_SESSIONS_PER_IDENTITY,
        ),
        (
            "MCP_BRIDGE_HTTP_MAX_REQUESTS_PER_IDENTITY",
            MAX_REQUESTS_PER_IDENTITY,
        ),
    ];
    let (child, pid, url) = spawn_serve(home, &env).await;
    (child, pid, url, tokens)
}

/// SIGTERM to `serve` (it lets calls in flight finish, closes the MCP sessions and removes its
/// containers), and a warning for any container left.
pub(crate) async fn stop_serve(mut child: Child, pid: u32) {
    // SAFETY: kill only sends a signal and touches no memory of ours. `pid` is `child`'s (from
    // `spawn_serve`), not yet reaped, so it still names that process.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    if tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .is_err()
    {
        eprintln!("bench: serve {pid} did not exit within 60 s of SIGTERM; killing it");
        let _ = child.kill().await;
    }
    let left = containers_of(pid).await;
    if !left.is_empty() {
        eprintln!("bench: WARNING: serve {pid} left containers behind: {left:?}");
    }
}

/// One load run's figures.
struct LoadFigures {
    label: String,
    sessions: usize,
    wall: f64,
    recs: Vec<Rec>,
    bridge_rss: Vec<f64>,
    bridge_cpu: f64,
    service_cpu: f64,
    service_rss: f64,
    sandboxes: Vec<CtrMem>,
    /// CPU of the sandboxes started before the run (NaN when sessions come and go in it).
    sandbox_cpu: f64,
    host_busy: f64,
    cpus: usize,
    client_cpu: f64,
}

impl LoadFigures {
    fn ok_ms(&self, kind: Option<Kind>) -> Vec<f64> {
        self.recs
            .iter()
            .filter(|r| r.fate == Fate::Ok && kind.is_none_or(|k| r.kind == k))
            .map(|r| r.ms)
            .collect()
    }
    fn count(&self, f: impl Fn(&Rec) -> bool) -> usize {
        self.recs.iter().filter(|r| f(r)).count()
    }
    fn not_ok(&self) -> usize {
        self.count(|r| r.fate != Fate::Ok)
    }
    fn lost_or_mismatched(&self) -> usize {
        self.count(|r| matches!(r.fate, Fate::Lost | Fate::Mismatched))
    }
    /// % of one core over the run.
    fn core_pct(&self, ms: f64) -> String {
        format!("{:.1} %", ms / (self.wall * 1e3) * 100.0)
    }
}

/// One rmcp client per identity of [`serve_team`] (its `url` and `tokens`), connected.
pub(crate) async fn team_clients(
    home: &Home,
    url: &str,
    tokens: &[(String, String)],
) -> Vec<RunningService<RoleClient, ()>> {
    futures::future::join_all(tokens.iter().map(|(_, t)| http_client(url, Some(t))))
        .await
        .into_iter()
        .map(|c| c.unwrap_or_else(|e| fail(&format!("{e}\n{}", home.log()))))
        .collect()
}

/// Each identity's sessions (`SESSIONS_PER_IDENTITY`) as load workers on its client.
pub(crate) fn team_workers(clients: &[RunningService<RoleClient, ()>]) -> Vec<Worker<'_>> {
    clients
        .iter()
        .flat_map(|c| {
            (0..SESSIONS_PER_IDENTITY).map(move |s| Worker {
                client: c,
                session: format!("s{s}"),
            })
        })
        .collect()
}

/// `serve` with `ids` identities (bearer tokens), each with 2 sessions making mixed calls
/// (print, pandas, a proxied `echo`) for `capacity_secs`. With `max_sessions` given, the sessions
/// are not started first and the bridge has fewer sandboxes than sessions: what waits, what is
/// refused and what is closed is counted.
async fn http_load(
    o: &Opts,
    fx: &Fixtures,
    ids: usize,
    max_sessions: Option<usize>,
) -> LoadFigures {
    let home = Home::new(&fx.real()[..1]);
    let (child, pid, url, tokens) =
        serve_team(&home, ids, max_sessions.unwrap_or(ROOMY_MAX_SESSIONS), "0").await;
    let clients = team_clients(&home, &url, &tokens).await;
    let workers = team_workers(&clients);
    let label = match max_sessions {
        None => format!("{} × {SESSIONS_PER_IDENTITY} sessions", who(ids)),
        Some(m) => format!(
            "{} × {SESSIONS_PER_IDENTITY} sessions, max_sessions = {m}",
            who(ids)
        ),
    };
    if max_sessions.is_none() {
        // Start every session and import pandas in it (not timed): the run is about calls.
        let started = futures::future::join_all(workers.iter().map(|w| {
            call_with(
                w.client,
                json!({"code": "import pandas as pd\nprint('ready')", "session": w.session, "timeout": 120}),
            )
        }))
        .await;
        for r in started {
            match r {
                Ok(r) if sc(&r, "status") == "ok" => {}
                Ok(r) => fail(&format!(
                    "a session of the load did not start: {}\n{}",
                    text(&r),
                    home.log()
                )),
                Err(e) => fail(&format!(
                    "a session of the load did not start: {e}\n{}",
                    home.log()
                )),
            }
        }
        settle().await;
    }
    eprintln!(
        "bench: capacity: HTTP load, {label}, {} s…",
        o.capacity_secs
    );
    let before = containers_inspected(pid).await;
    let ctr_cpu0: Vec<f64> = before.iter().map(ctr_cpu_ms).collect();
    let me = std::process::id();
    let (b0, s0, c0) = (proc_cpu_ms(pid), service_cpu_ms(pid), proc_cpu_ms(me));
    let (h0, cpus) = host_busy_ms();
    let (stop, sampler) = sample_rss(pid);
    let plan = Plan {
        kinds: Kind::ALL.to_vec(),
        stop: Stop::For(Duration::from_secs(o.capacity_secs as u64)),
        after_refusal: AFTER_REFUSAL,
    };
    let tag = format!("{me}-{ids}-{}", max_sessions.unwrap_or(0));
    let (wall, recs) = drive(&workers, &plan, &tag).await;
    stop.store(true, Ordering::Relaxed);
    let bridge_rss = sampler.await.unwrap_or_default();
    let (b1, s1, c1) = (proc_cpu_ms(pid), service_cpu_ms(pid), proc_cpu_ms(me));
    let (h1, _) = host_busy_ms();
    let sandbox_cpu = if max_sessions.is_none() {
        before
            .iter()
            .zip(&ctr_cpu0)
            .map(|(c, c0)| ctr_cpu_ms(c) - c0)
            .sum()
    } else {
        f64::NAN
    };
    let after = containers_inspected(pid).await;
    report_bad(&recs, &format!("HTTP load, {label}"));
    let fig = LoadFigures {
        label,
        sessions: ids * SESSIONS_PER_IDENTITY,
        wall,
        recs,
        bridge_rss,
        bridge_cpu: b1 - b0,
        service_cpu: s1 - s0,
        service_rss: service_rss(pid),
        sandboxes: after.iter().map(ctr_mem).collect(),
        sandbox_cpu,
        host_busy: h1 - h0,
        cpus,
        client_cpu: c1 - c0,
    };
    drop(workers);
    for c in clients {
        let _ = c.cancel().await;
    }
    stop_serve(child, pid).await;
    fig
}

fn ms_col(v: &[f64], p: f64) -> String {
    fmt(pct(v, p), Unit::Ms)
}

fn load_tables(runs: &[LoadFigures], t: &mut Table) {
    let rows = runs
        .iter()
        .map(|r| {
            let ok = r.ok_ms(None);
            let refused: Vec<f64> = r
                .recs
                .iter()
                .filter(|x| x.fate == Fate::Refused)
                .map(|x| x.ms)
                .collect();
            vec![
                r.label.clone(),
                r.sessions.to_string(),
                format!("{:.0}", r.wall),
                r.recs.len().to_string(),
                format!("{:.0}/s", ok.len() as f64 / r.wall),
                ms_col(&ok, 0.5),
                ms_col(&ok, 0.99),
                ms_col(&r.ok_ms(Some(Kind::Print)), 0.5),
                ms_col(&r.ok_ms(Some(Kind::Pandas)), 0.5),
                ms_col(&r.ok_ms(Some(Kind::Echo)), 0.5),
                r.count(|x| matches!(x.fate, Fate::Lost | Fate::Mismatched | Fate::Failed))
                    .to_string(),
                if refused.is_empty() {
                    "0".into()
                } else {
                    format!("{} (in {})", refused.len(), ms_col(&refused, 0.5))
                },
                r.count(|x| x.fresh).to_string(),
                r.count(|x| x.closed_other).to_string(),
            ]
        })
        .collect();
    t.wide(
        "11b. `serve` under load: calls over the run (latencies of the calls answered ok; \"not ok\" is lost + mismatched + failed; a refusal is answered in the time given, p50)",
        &[
            "load",
            "sessions",
            "s",
            "calls",
            "ok calls/s",
            "p50",
            "p99",
            "p50 print",
            "p50 pandas",
            "p50 echo",
            "not ok",
            "refused",
            "ran in a fresh interpreter",
            "closed a session to make room",
        ],
        rows,
    );
    let rows = runs
        .iter()
        .map(|r| {
            let usage: Vec<f64> = r.sandboxes.iter().map(|m| m.usage).collect();
            let total: f64 = usage.iter().filter(|v| !v.is_nan()).sum();
            vec![
                r.label.clone(),
                format!(
                    "{} / {}",
                    mib_med(&r.bridge_rss),
                    mib_med(&[r.bridge_rss.iter().cloned().fold(f64::NAN, f64::max)])
                ),
                r.core_pct(r.bridge_cpu),
                format!("{:.0} µs", r.bridge_cpu * 1e3 / r.recs.len().max(1) as f64),
                r.core_pct(r.service_cpu),
                mib_med(&[r.service_rss]),
                format!("{} × {} = {:.0}", r.sandboxes.len(), mib_med(&usage), total),
                if r.sandbox_cpu.is_nan() {
                    "n/a".into()
                } else {
                    r.core_pct(r.sandbox_cpu)
                },
                format!("{:.2} of {}", r.host_busy / (r.wall * 1e3), r.cpus),
                r.core_pct(r.client_cpu),
            ]
        })
        .collect();
    t.wide(
        "11c. `serve` under load: what the host spent (RSS in MiB; CPU over the run as % of one core; sandboxes' memory is the cgroup usage of the containers alive at the end, count × median = total)",
        &[
            "load",
            "bridge RSS p50 / max",
            "bridge CPU",
            "bridge CPU per call",
            "engine service CPU",
            "engine service RSS",
            "sandboxes' memory",
            "sandboxes' CPU",
            "host CPUs busy",
            "load client CPU",
        ],
        rows,
    );
    for r in runs {
        if max_of(r) {
            continue;
        }
        let n = r.not_ok();
        t.fact(
            &format!(
                "HTTP load, {}, {:.0} s: calls not answered ok",
                r.label, r.wall
            ),
            &r.recs.len().to_string(),
            n.to_string(),
            "= 0",
            if n == 0 { "yes" } else { "**no**" },
        );
    }
    for r in runs.iter().filter(|r| max_of(r)) {
        let n = r.lost_or_mismatched();
        t.fact(
            &format!(
                "HTTP load, {}, {:.0} s: lost or mismatched replies",
                r.label, r.wall
            ),
            &r.recs.len().to_string(),
            n.to_string(),
            "= 0",
            if n == 0 { "yes" } else { "**no**" },
        );
        let first = |f: &dyn Fn(&Rec) -> bool, what: &str| {
            r.recs
                .iter()
                .find(|x| f(x))
                .map(|x| format!("{what} ({}): `{}`", r.label, one_line(&x.text)))
        };
        for note in [
            first(&|x| x.fate == Fate::Refused, "a refusal"),
            first(&|x| x.fresh, "a call whose session had been closed"),
            first(
                &|x| x.closed_other && !x.fresh && x.fate == Fate::Ok,
                "a call that closed another session",
            ),
            first(&|x| x.fate == Fate::Failed, "a failed call"),
        ]
        .into_iter()
        .flatten()
        {
            t.note(note);
        }
    }
}

fn max_of(r: &LoadFigures) -> bool {
    r.label.contains("max_sessions")
}

/// The `[bridge]` lines of a reply (its notices), on one line; else the text, cut.
fn one_line(text: &str) -> String {
    let notices: Vec<&str> = text.lines().filter(|l| l.starts_with("[bridge]")).collect();
    let s = if notices.is_empty() {
        text.lines().collect::<Vec<_>>().join(" ")
    } else {
        notices.join(" ")
    };
    s.replace('|', "\\|").chars().take(400).collect()
}

/// The bounds reached on purpose, one at a time, in a `serve` with `max_sessions` = 4 and three
/// identities: a new session while all 4 run code (refused), a call to a session busy with
/// another (it waits), more requests of one identity in flight than
/// `http.max_requests_per_identity` (429), and a new session once the 4 are idle (the least
/// recently used one is closed, and its owner's next call is told).
async fn bounds_probe(t: &mut Table) {
    const MAX: usize = 4;
    /// How long the 4 sessions run code.
    const HOLD: Duration = Duration::from_secs(6);
    eprintln!("bench: capacity: the bounds, one at a time…");
    let home = Home::new(&[]);
    let (child, pid, url, tokens) = serve_team(&home, 3, MAX, "0").await;
    let mut clients = Vec::new();
    for (_, tok) in &tokens {
        clients.push(
            http_client(&url, Some(tok))
                .await
                .unwrap_or_else(|e| fail(&format!("{e}\n{}", home.log()))),
        );
    }
    let (a, b, c) = (&clients[0], &clients[1], &clients[2]);
    let run = async |client, session: &str, code: &str| -> (Res<CallToolResult>, f64) {
        let t0 = Instant::now();
        let r = call_with(
            client,
            json!({"code": code, "session": session, "timeout": 60}),
        )
        .await;
        (r, ms(t0.elapsed()))
    };
    // a0, a1 (user-00) and b0, b1 (user-01): the 4 sandboxes max_sessions allows.
    for (cl, s) in [(a, "a0"), (a, "a1"), (b, "b0"), (b, "b1")] {
        if let (Err(e), _) = run(cl, s, "pass").await {
            fail(&format!("bounds probe: {s}: {e}\n{}", home.log()));
        }
    }
    let hold_code = format!("import time; time.sleep({})", HOLD.as_secs());
    let holding = futures::future::join_all(
        [(a, "a0"), (a, "a1"), (b, "b0"), (b, "b1")].map(|(cl, s)| run(cl, s, &hold_code)),
    );
    let probing = async {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        // 1. A new session of user-02 while all 4 run code.
        let refused = run(c, "c0", "print(1)").await;
        // 2. A call to a0 (busy) and 3. 8 more of user-00 in flight at once, on a1 (busy too):
        // with its 2 running calls, 11 requests of one identity.
        let queued = run(a, "a0", "print('queued')");
        let many = futures::future::join_all((0..8).map(|_| run(a, "a1", "print('more')")));
        let (queued, many) = tokio::join!(queued, many);
        (refused, queued, many)
    };
    let (_, (refused, queued, many)) = tokio::join!(holding, probing);
    // 4. Once the 4 are idle: user-02's new session closes the least recently used one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let made_room = run(c, "c0", "print(1)").await;
    // 5. The owner of the session that was closed calls it again.
    let mut told = None;
    for (cl, s) in [(a, "a0"), (a, "a1"), (b, "b0"), (b, "b1")] {
        if let (Ok(r), ms) = run(cl, s, "print(1)").await
            && text(&r).contains("runs in a fresh interpreter")
        {
            told = Some((s, ms, text(&r)));
            break;
        }
    }
    let describe = |r: &(Res<CallToolResult>, f64)| -> (String, String) {
        match &r.0 {
            Ok(r) => (sc(r, "status"), one_line(&text(r))),
            Err(e) => ("no reply".into(), one_line(e)),
        }
    };
    let (status, msg) = describe(&refused);
    t.fact(
        &format!(
            "bounds: a new session while all max_sessions = {MAX} run code: `{status}`, answered in"
        ),
        "1",
        fmt(refused.1, Unit::Ms),
        "refused at once (≤ 1 s)",
        if status == "unavailable" && refused.1 < 1000.0 {
            "yes"
        } else {
            "**no**"
        },
    );
    t.note(format!(
        "refused, a new session while all max_sessions = {MAX} run code: `{msg}`"
    ));
    let (status, _) = describe(&queued);
    t.fact(
        &format!(
            "bounds: a call to a session running another ({}s left of {} s): `{status}` after (it waits in line)",
            HOLD.as_secs() - 1,
            HOLD.as_secs()
        ),
        "1",
        fmt(queued.1, Unit::Ms),
        "",
        "",
    );
    let too_many: Vec<&(Res<CallToolResult>, f64)> = many.iter().filter(|r| r.0.is_err()).collect();
    let ok = many
        .iter()
        .filter(|r| matches!(&r.0, Ok(x) if sc(x, "status") == "ok"))
        .count();
    t.fact(
        &format!(
            "bounds: 8 more calls of one identity with 3 in flight (http.max_requests_per_identity = {MAX_REQUESTS_PER_IDENTITY}): refused / ok"
        ),
        "8",
        format!("{} / {ok}", too_many.len()),
        "3 refused",
        if too_many.len() == 3 && ok == 5 { "yes" } else { "**no**" },
    );
    if let Some(r) = too_many.first() {
        t.note(format!(
            "refused, a request beyond http.max_requests_per_identity (as rmcp's client reports it): `{}`",
            describe(r).1
        ));
    }
    let (status, msg) = describe(&made_room);
    t.fact(
        "bounds: that new session once the 4 are idle (the least recently used one is closed)",
        "1",
        format!("`{status}` in {}", fmt(made_room.1, Unit::Ms)),
        "",
        "",
    );
    t.note(format!(
        "a new session beyond max_sessions = {MAX}, all idle: `{msg}`"
    ));
    match told {
        Some((s, ms, text)) => t.note(format!(
            "the next call of the session closed for it (`{s}`, {}): `{}`",
            fmt(ms, Unit::Ms),
            one_line(&text)
        )),
        None => t.note("no session's next call said it had been closed".into()),
    }
    drop(clients);
    stop_serve(child, pid).await;
}

pub(crate) async fn capacity(o: &Opts, fx: &Fixtures, t: &mut Table) {
    t.section(
        11,
        "11. Capacity (one host: a sandbox's memory and CPU; `serve` under a team's load)",
    );
    if !o.wants("capacity") {
        // `BENCH_ONLY=capacity-sandboxes` and `capacity-bounds`: one part alone.
        if o.wants("capacity-sandboxes") {
            sandbox_figures(o, t).await;
        }
        if o.wants("capacity-bounds") {
            bounds_probe(t).await;
        }
        if o.wants("capacity-max-sessions") {
            // The load run with max_sessions below the sessions wanted, alone.
            let ids = 20;
            let run = http_load(o, fx, ids, Some(ids * SESSIONS_PER_IDENTITY / 2)).await;
            load_tables(&[run], t);
        }
        if o.wants("capacity-starts") {
            starts_row(fx, t).await;
        }
        if o.wants("capacity-sessions") {
            sessions_row(t).await;
        }
        return;
    }
    sandbox_figures(o, t).await;
    let mut runs = Vec::new();
    for ids in [1, 5, 20] {
        runs.push(http_load(o, fx, ids, None).await);
    }
    let ids = 20;
    runs.push(http_load(o, fx, ids, Some(ids * SESSIONS_PER_IDENTITY / 2)).await);
    load_tables(&runs, t);
    starts_row(fx, t).await;
    bounds_probe(t).await;
    t.note(format!(
        "settings of section 11: memory = {MEMORY} per sandbox, no cpus limit, pool_size = 0 for sessions and the load (pool_size = N for the pooled rows), max_sessions = 16 for 11a, {ROOMY_MAX_SESSIONS} for the load runs unless named; under `serve` http.max_sessions_per_identity = {MAX_SESSIONS_PER_IDENTITY}, http.max_requests_per_identity = {MAX_REQUESTS_PER_IDENTITY}, one bearer token per identity, one MCP client per identity with its 2 sessions named s0 and s1; a refused call is retried after {} ms; each load run {} s",
        AFTER_REFUSAL.as_millis(),
        o.capacity_secs
    ));
}

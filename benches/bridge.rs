//! The bridge benchmark and its load test: starts the real release binary,
//! drives it with rmcp's real client and raw JSON-RPC, against real podman and the real MCP
//! reference servers, and prints ONE Markdown table. Every figure is a median and a p95 over the
//! N repetitions named in its row; nothing here is asserted, the table is the product.
//!
//! ```text
//! cargo build --release && cargo bench --bench bridge            # full run (~2 min on 2 cores)
//! BENCH_QUICK=1 cargo bench --bench bridge                       # few repetitions, CI smoke (~40 s)
//! BENCH_ONLY=proxy,load cargo bench --bench bridge               # a subset of the sections
//! BENCH_ONLY=catalog cargo bench --bench bridge                  # first search, cold and warm catalog (also CATALOG_RUNS)
//! BENCH_ONLY=pool cargo bench --bench bridge                      # first calls with and without the pool
//! BENCH_PROXY_RUNS=50 BENCH_ONLY=proxy cargo bench --bench bridge # more of one (also LOAD_RUNS, LOAD_CALLS, WARM)
//! ```
//!
//! Needs what the integration tests need: `MCP_BRIDGE_TEST_IMAGE_ARCHIVE` (the sandbox image
//! archive) and `MCP_BRIDGE_TEST_SERVERS_BIN` (where `mcp-server-everything`,
//! `mcp-server-filesystem`, `mcp-server-time` and `mcp-server-git` are), plus `podman`, `git` and
//! `python3` on PATH. A missing prerequisite stops the bench with a message; nothing is skipped.
//! The 50 "generated" servers are `benches/fixtures/catalog_server.py` started with 50 names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

type Res<T> = Result<T, String>;

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

/// Repetition counts; quick mode keeps every section but runs each a few times.
struct Opts {
    quick: bool,
    only: Option<Vec<String>>,
    /// Spawns per configuration for start-up and tokens.
    startup: usize,
    /// Cold bridges (process start to first run_python).
    cold: usize,
    /// New sessions in a running bridge.
    new_session: usize,
    warm: usize,
    big_output: usize,
    pandas: usize,
    /// Proxy loops of `proxy_calls` calls each.
    proxy_runs: usize,
    proxy_calls: usize,
    warm_rss: usize,
    image_load: usize,
    load_runs: usize,
    load_sessions: usize,
    load_calls: usize,
    /// Cold/warm bridge pairs per server count in the catalog rows.
    catalog_runs: usize,
    /// Fresh bridges per configuration for the first call after `initialize`.
    pool_fresh: usize,
    /// New sessions per configuration (section 8).
    pool_sessions: usize,
}

impl Opts {
    fn from_env() -> Opts {
        let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
            || std::env::args().any(|a| a == "--quick");
        let only = std::env::var("BENCH_ONLY")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
        if quick {
            Opts {
                quick,
                only,
                startup: 5,
                cold: 2,
                new_session: 3,
                warm: 30,
                big_output: 5,
                pandas: 2,
                proxy_runs: 2,
                proxy_calls: 200,
                warm_rss: 1,
                image_load: 1,
                load_runs: 1,
                load_sessions: 8,
                load_calls: 50,
                catalog_runs: 1,
                pool_fresh: 2,
                pool_sessions: 3,
            }
        } else {
            Opts {
                quick,
                only,
                startup: 20,
                cold: 10,
                new_session: 20,
                warm: 200,
                big_output: 20,
                pandas: 10,
                proxy_runs: 10,
                proxy_calls: 200,
                warm_rss: 5,
                image_load: 3,
                load_runs: 3,
                load_sessions: 8,
                load_calls: 200,
                catalog_runs: 3,
                pool_fresh: 5,
                pool_sessions: 10,
            }
        }
    }

    /// `BENCH_<NAME>=count` overrides one repetition count (for profiling runs).
    fn with_overrides(mut self) -> Opts {
        let get = |k: &str| {
            std::env::var(format!("BENCH_{k}"))
                .ok()?
                .parse::<usize>()
                .ok()
        };
        for (k, f) in [
            ("PROXY_RUNS", &mut self.proxy_runs),
            ("LOAD_RUNS", &mut self.load_runs),
            ("LOAD_CALLS", &mut self.load_calls),
            ("WARM", &mut self.warm),
            ("CATALOG_RUNS", &mut self.catalog_runs),
        ] {
            if let Some(v) = get(k) {
                *f = v;
            }
        }
        self
    }

    fn wants(&self, section: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|s| s == section))
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics and the table
// ---------------------------------------------------------------------------------------------

/// Nearest-rank percentile of `v` (`p` in 0..=1).
fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if s.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

struct Row {
    metric: String,
    n: String,
    median: String,
    p95: String,
    target: String,
    met: String,
}

/// Rows grouped by section number, printed in section order whatever order they were measured in.
#[derive(Default)]
struct Table {
    cur: u32,
    rows: Vec<(u32, Row)>,
}

/// How a figure is printed.
#[derive(Clone, Copy)]
enum Unit {
    Ms,
    Us,
    S,
    MiB,
    Tokens,
    Pct,
    PerSec,
}

fn fmt(v: f64, u: Unit) -> String {
    if v.is_nan() {
        return "n/a".into();
    }
    match u {
        Unit::Ms if v < 10.0 => format!("{v:.2} ms"),
        Unit::Ms => format!("{v:.1} ms"),
        Unit::Us => format!("{v:.0} µs"),
        Unit::S => format!("{v:.2} s"),
        Unit::MiB => format!("{v:.1} MiB"),
        Unit::Tokens => format!("{v:.0}"),
        Unit::Pct => format!("{v:.1} %"),
        Unit::PerSec => format!("{v:.0}/s"),
    }
}

/// A target: the limit and whether lower is better.
#[derive(Clone, Copy)]
enum Target {
    None,
    AtMost(f64),
    AtLeast(f64),
}

impl Table {
    /// Make `sec` the current section, adding its heading once.
    fn section(&mut self, sec: u32, title: &str) {
        self.cur = sec;
        if self.rows.iter().any(|(s, r)| *s == sec && r.n.is_empty()) {
            return;
        }
        self.push(Row {
            metric: format!("**{title}**"),
            n: String::new(),
            median: String::new(),
            p95: String::new(),
            target: String::new(),
            met: String::new(),
        });
    }

    fn push(&mut self, r: Row) {
        self.rows.push((self.cur, r));
    }

    /// A row from samples (median and p95 over them); the target is judged on the median.
    fn samples(&mut self, metric: &str, v: &[f64], u: Unit, target: Target) {
        let med = pct(v, 0.5);
        self.row(metric, v.len().to_string(), med, pct(v, 0.95), u, target);
    }

    fn row(&mut self, metric: &str, n: String, med: f64, p95: f64, u: Unit, target: Target) {
        let (t, met) = match target {
            Target::None => (String::new(), String::new()),
            Target::AtMost(x) => (
                format!("≤ {}", fmt(x, u)),
                if med <= x { "yes" } else { "**no**" }.into(),
            ),
            Target::AtLeast(x) => (
                format!("≥ {}", fmt(x, u)),
                if med >= x { "yes" } else { "**no**" }.into(),
            ),
        };
        self.push(Row {
            metric: metric.into(),
            n,
            median: fmt(med, u),
            p95: fmt(p95, u),
            target: t,
            met,
        });
    }

    /// A row whose value is a fact, not a distribution (same text in both columns).
    fn fact(&mut self, metric: &str, n: &str, value: String, target: &str, met: &str) {
        self.push(Row {
            metric: metric.into(),
            n: n.into(),
            median: value.clone(),
            p95: value,
            target: target.into(),
            met: met.into(),
        });
    }

    fn print(&self) {
        println!("| metric | N | median | p95 | target | met |");
        println!("|---|---:|---:|---:|---|---|");
        let mut rows: Vec<&(u32, Row)> = self.rows.iter().collect();
        rows.sort_by_key(|(s, _)| *s);
        for (_, r) in rows {
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                r.metric, r.n, r.median, r.p95, r.target, r.met
            );
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------------------------
// Prerequisites
// ---------------------------------------------------------------------------------------------

/// The release binary: cargo builds it for this bench (the bench profile inherits `release`, so
/// this is `target/release/mcp-code-bridge`); `MCP_BRIDGE_BENCH_BIN` points elsewhere.
fn bridge_bin() -> PathBuf {
    std::env::var_os("MCP_BRIDGE_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mcp-code-bridge")))
}

fn image_archive() -> PathBuf {
    let p = std::env::var_os("MCP_BRIDGE_TEST_IMAGE_ARCHIVE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            fail("MCP_BRIDGE_TEST_IMAGE_ARCHIVE is not set: build the sandbox image with `image/build-debian.sh --output FILE` and point this variable at it")
        });
    if !p.is_file() {
        fail(&format!(
            "MCP_BRIDGE_TEST_IMAGE_ARCHIVE={} does not exist",
            p.display()
        ));
    }
    p
}

fn server_bin(name: &str) -> String {
    let mut dirs = Vec::new();
    if let Some(v) = std::env::var_os("MCP_BRIDGE_TEST_SERVERS_BIN") {
        dirs.extend(std::env::split_paths(&v));
    }
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    for d in dirs {
        let c = d.join(name);
        if c.is_file() {
            return c.to_string_lossy().into_owned();
        }
    }
    fail(&format!(
        "{name} not found in MCP_BRIDGE_TEST_SERVERS_BIN or PATH; install the test servers: \
         npm install -g @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem; \
         pip install mcp-server-time mcp-server-git (and put the venv's bin/ in MCP_BRIDGE_TEST_SERVERS_BIN)"
    ))
}

fn fail(msg: &str) -> ! {
    eprintln!("bench: {msg}");
    std::process::exit(2)
}

fn fixture() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/fixtures/catalog_server.py"
    )
    .into()
}

// ---------------------------------------------------------------------------------------------
// Servers and homes
// ---------------------------------------------------------------------------------------------

/// One configured stdio server: name, command, arguments.
type ServerDef = (String, String, Vec<String>);

/// Directories the real servers work on (kept for the whole run).
struct Fixtures {
    _dir: TempDir,
    files: PathBuf,
    docs: PathBuf,
    repo: PathBuf,
}

impl Fixtures {
    fn new() -> Fixtures {
        let dir = tempfile::Builder::new()
            .prefix("mcb-bench-")
            .tempdir()
            .unwrap();
        let root = dir.path().canonicalize().unwrap();
        let (files, docs, repo) = (root.join("files"), root.join("docs"), root.join("repo"));
        for d in [&files, &docs, &repo] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(files.join("hello.txt"), "hello\n").unwrap();
        std::fs::write(docs.join("README.md"), "# docs\n").unwrap();
        let ok = std::process::Command::new("git")
            .args(["init", "-q"])
            .arg(&repo)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            fail("`git init` failed: git is needed for mcp-server-git's repository");
        }
        Fixtures {
            _dir: dir,
            files,
            docs,
            repo,
        }
    }

    /// The five real servers: name -> (command, args).
    fn real(&self) -> Vec<ServerDef> {
        let p = |x: &Path| x.to_string_lossy().into_owned();
        vec![
            (
                "everything".into(),
                server_bin("mcp-server-everything"),
                vec![],
            ),
            (
                "filesystem".into(),
                server_bin("mcp-server-filesystem"),
                vec![p(&self.files)],
            ),
            (
                "docs".into(),
                server_bin("mcp-server-filesystem"),
                vec![p(&self.docs)],
            ),
            ("time".into(), server_bin("mcp-server-time"), vec![]),
            (
                "git".into(),
                server_bin("mcp-server-git"),
                vec!["--repository".into(), p(&self.repo)],
            ),
        ]
    }

    /// `count` generated servers.
    fn generated(count: usize) -> Vec<ServerDef> {
        (0..count)
            .map(|i| {
                let name = format!("gen-{i:02}");
                (
                    name.clone(),
                    "python3".to_string(),
                    vec![fixture(), name, i.to_string()],
                )
            })
            .collect()
    }
}

/// A private HOME/XDG tree with an `mcpServers` file, as a user would configure servers.
struct Home {
    dir: TempDir,
}

impl Home {
    fn new(servers: &[ServerDef]) -> Home {
        let dir = tempfile::Builder::new()
            .prefix("mcb-bench-home-")
            .tempdir()
            .unwrap();
        for d in [".config/mcp", ".local/state", ".cache"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        if !servers.is_empty() {
            let map: serde_json::Map<String, Value> = servers
                .iter()
                .map(|(n, c, a)| (n.clone(), json!({"command": c, "args": a})))
                .collect();
            std::fs::write(
                dir.path().join(".config/mcp/mcp.json"),
                serde_json::to_string_pretty(&json!({ "mcpServers": map })).unwrap(),
            )
            .unwrap();
        }
        Home { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn env(&self) -> Vec<(String, String)> {
        let h = self.path();
        vec![
            // Nothing of the machine's /etc/mcp-code-bridge/config.toml.
            ("MCP_BRIDGE_SYSTEM_CONFIG".into(), "none".into()),
            ("HOME".into(), h.display().to_string()),
            (
                "XDG_CONFIG_HOME".into(),
                h.join(".config").display().to_string(),
            ),
            (
                "XDG_STATE_HOME".into(),
                h.join(".local/state").display().to_string(),
            ),
            (
                "XDG_CACHE_HOME".into(),
                h.join(".cache").display().to_string(),
            ),
            ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
            (
                "MCP_BRIDGE_IMAGE_ARCHIVE".into(),
                image_archive().display().to_string(),
            ),
            // The bench opens more sessions than the default cap; closing old ones to make room
            // would be timed as part of a new session's start.
            ("MCP_BRIDGE_MAX_SESSIONS".into(), "64".into()),
            // Sections 2-6 time sandboxes started on demand, back to back; section 8 times the
            // pool (and sets this again), with the think time a pool needs to refill.
            ("MCP_BRIDGE_POOL_SIZE".into(), "0".into()),
        ]
    }

    fn command(&self) -> Command {
        let mut c = Command::new(bridge_bin());
        c.arg("run")
            .env_clear()
            .envs(self.env())
            .current_dir(self.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(self.path().join("bridge.log")).unwrap(),
            ))
            .kill_on_drop(true);
        c
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("bridge.log")).unwrap_or_default()
    }
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// CPU time the process has used, in ms: the sum of its threads' `schedstat` run times
/// (nanosecond resolution; threads that already exited are not counted, tokio's workers live on).
fn cpu_ms(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return f64::NAN;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e6
}

// ---------------------------------------------------------------------------------------------
// A raw JSON-RPC client over a child's stdio (exact bytes, no client library in the timing)
// ---------------------------------------------------------------------------------------------

struct Raw {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
    next: u64,
}

impl Raw {
    fn spawn(mut cmd: Command) -> Res<Raw> {
        let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Ok(Raw {
            child,
            stdin,
            lines,
            next: 1,
        })
    }

    async fn send(&mut self, msg: Value) -> Res<()> {
        let mut line = serde_json::to_vec(&msg).unwrap();
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .await
            .map_err(|e| format!("write: {e}"))?;
        self.stdin.flush().await.map_err(|e| format!("flush: {e}"))
    }

    /// Send a request and return its `result`.
    async fn request(&mut self, method: &str, params: Value) -> Res<Value> {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        let wait = async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .map_err(|e| format!("read: {e}"))?
                    .ok_or_else(|| format!("stdout closed before the reply to {method}"))?;
                let Ok(msg) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if msg.get("method").is_some() {
                    if let Some(rid) = msg.get("id") {
                        // A request from the server (roots/list...): we offer nothing.
                        let rid = rid.clone();
                        self.send(json!({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "not supported"}}))
                            .await?;
                    }
                    continue;
                }
                if msg.get("id") == Some(&json!(id)) {
                    if let Some(e) = msg.get("error") {
                        return Err(format!("{method} failed: {e}"));
                    }
                    return Ok(msg["result"].clone());
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .map_err(|_| format!("no reply to {method} within 60s"))?
    }

    async fn initialize(&mut self) -> Res<Value> {
        let r = self
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "mcp-code-bridge-bench", "version": "1"}}),
            )
            .await?;
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        Ok(r)
    }

    /// Close stdin and wait for the process to exit (killing it after 30 s).
    async fn close(mut self) {
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The bridge driven by rmcp's client
// ---------------------------------------------------------------------------------------------

struct Live {
    client: RunningService<RoleClient, ()>,
    child: Child,
    pid: u32,
    home: Home,
}

impl Live {
    async fn start(home: Home) -> Live {
        Self::start_with(home, &[]).await
    }

    /// Start with extra environment (configuration keys as `MCP_BRIDGE_*`).
    async fn start_with(home: Home, env: &[(&str, &str)]) -> Live {
        let mut cmd = home.command();
        cmd.envs(env.iter().copied());
        Live::spawn(home, cmd).await
    }

    /// Start the bridge from `cmd` (the home's command, with extra settings).
    async fn spawn(home: Home, mut cmd: Command) -> Live {
        let mut child = cmd.spawn().expect("spawn the bridge");
        let pid = child.id().unwrap_or(0);
        let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
        let client = match ().serve(io).await {
            Ok(c) => c,
            Err(e) => fail(&format!(
                "MCP initialize with the bridge failed: {e}\n{}",
                home.log()
            )),
        };
        Live {
            client,
            child,
            pid,
            home,
        }
    }

    async fn call(&self, args: Value) -> Res<CallToolResult> {
        let params = CallToolRequestParams::new("run_python")
            .with_arguments(args.as_object().cloned().unwrap());
        match tokio::time::timeout(Duration::from_secs(240), self.client.call_tool(params)).await {
            Err(_) => Err("no reply within 240 s".into()),
            Ok(Err(e)) => Err(format!("protocol error: {e}")),
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// Run code and insist on success; returns stdout and the wall time of the round trip.
    async fn ok(&self, args: Value) -> (String, f64) {
        let t = Instant::now();
        let r = self.call(args.clone()).await;
        let el = ms(t.elapsed());
        match r {
            Ok(r) if sc(&r, "status") == "ok" => (sc(&r, "stdout"), el),
            Ok(r) => fail(&format!(
                "run_python {args} did not succeed: {}\n{}",
                text(&r),
                self.home.log()
            )),
            Err(e) => fail(&format!(
                "run_python {args} failed: {e}\n{}",
                self.home.log()
            )),
        }
    }

    /// Close the client (stdin EOF: the bridge removes its containers) and wait for the exit;
    /// the home is handed back (a later bridge may start in it).
    async fn shutdown(self) -> Home {
        let Live {
            client,
            mut child,
            pid,
            home,
        } = self;
        let _ = client.cancel().await;
        if tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .is_err()
        {
            eprintln!("bench: bridge {pid} did not exit within 60 s of stdin EOF; killing it");
            let _ = child.kill().await;
        }
        let left = containers_of(pid).await;
        if !left.is_empty() {
            eprintln!(
                "bench: WARNING: bridge {pid} left containers behind: {left:?}\n{}",
                home.log()
            );
        }
        home
    }
}

fn sc(r: &CallToolResult, key: &str) -> String {
    r.structured_content
        .as_ref()
        .and_then(|v| v.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn containers_of(pid: u32) -> Vec<String> {
    let out = Command::new("podman")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=io.mcp-code-bridge.managed=true",
            "--format",
            "{{.ID}} {{.Labels}}",
        ])
        .output()
        .await;
    let Ok(out) = out else { return vec![] };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("io.mcp-code-bridge.owner:{pid}:")))
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect()
}

/// Samples the bridge's RSS every 50 ms until stopped.
fn sample_rss(pid: u32) -> (Arc<AtomicBool>, tokio::task::JoinHandle<Vec<f64>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let h = tokio::spawn(async move {
        let mut v = Vec::new();
        while !s.load(Ordering::Relaxed) {
            let r = rss_mib(pid);
            if !r.is_nan() {
                v.push(r);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        v
    });
    (stop, h)
}

// ---------------------------------------------------------------------------------------------
// 1 + 2 + idle RSS: tools/list tokens and start-up
// ---------------------------------------------------------------------------------------------

fn tokens(bpe: &tiktoken_rs::CoreBPE, v: &Value) -> usize {
    bpe.encode_ordinary(&serde_json::to_string(v).unwrap())
        .len()
}

/// `tools/list` result of a server started directly (what a client connected to it would get).
async fn direct_tools_list(command: &str, args: &[String]) -> Res<Value> {
    let mut c = Command::new(command);
    c.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut raw = Raw::spawn(c)?;
    raw.initialize().await?;
    let r = raw.request("tools/list", json!({})).await?;
    let _ = raw.child.start_kill();
    Ok(r)
}

struct StartupSample {
    init_ms: f64,
    list_ms: f64,
    result: Value,
    rss_idle: Option<f64>,
}

async fn bridge_startup(home: &Home, idle_rss: bool) -> Res<StartupSample> {
    let t0 = Instant::now();
    let mut raw = Raw::spawn(home.command())?;
    raw.initialize().await?;
    let init_ms = ms(t0.elapsed());
    let result = raw.request("tools/list", json!({})).await?;
    let list_ms = ms(t0.elapsed());
    let rss_idle = if idle_rss {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Some(rss_mib(raw.child.id().unwrap_or(0)))
    } else {
        None
    };
    raw.close().await;
    Ok(StartupSample {
        init_ms,
        list_ms,
        result,
        rss_idle,
    })
}

async fn context_and_startup(o: &Opts, fx: &Fixtures, t: &mut Table) {
    let bpe = tiktoken_rs::cl100k_base().expect("cl100k vocabulary");
    let real = fx.real();
    let generated = Fixtures::generated(50);
    let configs: [(&str, Vec<ServerDef>); 3] = [
        ("0", vec![]),
        ("5", real.clone()),
        ("50", generated.clone()),
    ];
    let mut toks: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut bodies = std::collections::BTreeSet::new();
    let (mut init, mut list, mut idle) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.startup {
        for (label, servers) in &configs {
            let home = Home::new(servers);
            let s = bridge_startup(&home, *label == "5")
                .await
                .unwrap_or_else(|e| fail(&format!("bridge start-up: {e}\n{}", home.log())));
            toks.entry(label)
                .or_default()
                .push(tokens(&bpe, &s.result) as f64);
            bodies.insert(serde_json::to_string(&s.result).unwrap());
            if *label == "5" {
                init.push(s.init_ms);
                list.push(s.list_ms);
                idle.extend(s.rss_idle);
            }
        }
    }
    // What the same servers' own tools/list replies cost a client connected to each directly.
    let mut direct = BTreeMap::new();
    for (label, servers) in [("5", &real), ("50", &generated)] {
        let mut sum = 0usize;
        for (name, cmd, args) in servers {
            let r = direct_tools_list(cmd, args)
                .await
                .unwrap_or_else(|e| fail(&format!("tools/list of {name} directly: {e}")));
            sum += tokens(&bpe, &r);
        }
        direct.insert(label, sum as f64);
    }

    t.section(
        1,
        "1. Context cost (cl100k tokens of the tools/list result)",
    );
    let same = if bodies.len() == 1 {
        "identical bytes for 0/5/50"
    } else {
        "DIFFERENT bytes across configurations"
    };
    for label in ["0", "5", "50"] {
        let v = &toks[label];
        t.samples(
            &format!("bridge tools/list, {label} servers configured ({same})"),
            v,
            Unit::Tokens,
            Target::AtMost(250.0),
        );
    }
    for (label, what) in [
        ("5", "5 real servers (everything, filesystem ×2, time, git)"),
        ("50", "50 generated servers (12 tools each)"),
    ] {
        let d = direct[label];
        t.fact(
            &format!("direct tools/list of {what}, summed"),
            "1 (deterministic)",
            fmt(d, Unit::Tokens),
            "",
            "",
        );
        let b = pct(&toks[label], 0.5);
        let red = 100.0 * (1.0 - b / d);
        let target = if label == "5" {
            Target::AtLeast(95.0)
        } else {
            Target::None
        };
        t.row(
            &format!("reduction, {label} servers"),
            toks[label].len().to_string(),
            red,
            100.0 * (1.0 - pct(&toks[label], 0.95) / d),
            Unit::Pct,
            target,
        );
    }

    t.section(2, "2. Start-up (5 servers configured, none started)");
    t.samples(
        "process start → initialize reply",
        &init,
        Unit::Ms,
        Target::AtMost(50.0),
    );
    t.samples(
        "process start → first tools/list reply",
        &list,
        Unit::Ms,
        Target::None,
    );
    // Cold: a fresh bridge's first run_python (engine connect: its own podman service, orphan
    // reaping, image check, container start, runtime injection).
    let mut cold = Vec::new();
    for _ in 0..o.cold {
        let t0 = Instant::now();
        let live = Live::start(Home::new(&[])).await;
        let (_, _) = live.ok(json!({"code": "pass"})).await;
        cold.push(ms(t0.elapsed()));
        live.shutdown().await;
    }
    t.samples(
        "process start → first run_python reply (cold: engine connect + container)",
        &cold,
        Unit::Ms,
        Target::None,
    );
    t.section(5, "5. Footprint");
    t.samples(
        "bridge RSS idle (after initialize + tools/list, 5 servers configured)",
        &idle,
        Unit::MiB,
        Target::AtMost(20.0),
    );
}

// ---------------------------------------------------------------------------------------------
// 3: execution
// ---------------------------------------------------------------------------------------------

/// Run one timing loop in the "proxy" session: its per-call times in ms (the code prints them as
/// a JSON list of seconds), and the bridge's CPU over the whole call in µs.
async fn sandbox_loop(live: &Live, code: &str, what: &str) -> (Vec<f64>, f64) {
    let cpu0 = cpu_ms(live.pid);
    let (out, _) = live
        .ok(json!({"code": code, "servers": ["everything"], "session": "proxy", "timeout": 120}))
        .await;
    let cpu = 1e3 * (cpu_ms(live.pid) - cpu0);
    let ts: Vec<f64> = serde_json::from_str(out.trim()).unwrap_or_else(|e| {
        fail(&format!(
            "{what} loop output is not a JSON list ({e}): {out}"
        ))
    });
    (ts.iter().map(|s| s * 1e3).collect(), cpu)
}

async fn execution(o: &Opts, live: &Live, t: &mut Table) {
    t.section(3, "3. Execution (round trip seen by the MCP client)");
    let tag = std::process::id();
    // Make sure the engine is connected and the image present before timing sessions.
    live.ok(json!({"code": "pass"})).await;
    let mut first = Vec::new();
    for i in 0..o.new_session {
        let (_, el) = live
            .ok(json!({"code": "pass", "session": format!("new-{tag}-{i}")}))
            .await;
        first.push(el);
    }
    t.samples(
        "first run_python of a new session (container start + runtime injection)",
        &first,
        Unit::Ms,
        Target::None,
    );
    let warm = |code: &'static str, n: usize| async move {
        let mut v = Vec::new();
        for _ in 0..3 {
            live.ok(json!({"code": code})).await;
        }
        for _ in 0..n {
            v.push(live.ok(json!({"code": code})).await.1);
        }
        v
    };
    let cpu0 = cpu_ms(live.pid);
    let pass = warm("pass", o.warm).await;
    let pass_cpu = 1e3 * (cpu_ms(live.pid) - cpu0) / (o.warm + 3) as f64;
    t.samples("warm `pass`", &pass, Unit::Ms, Target::None);
    t.row(
        "bridge CPU per warm `pass` (mean over the N calls)",
        "1".into(),
        pass_cpu,
        pass_cpu,
        Unit::Us,
        Target::None,
    );
    // Loading servers: the bridge binds the 53 tools' metadata per call; the session's first call
    // sends it and builds the proxies, the warm ones (timed) send it only if it changed.
    let mut loaded = Vec::new();
    for _ in 0..3 {
        live.ok(json!({"code": "pass", "servers": ALL5, "timeout": 120}))
            .await;
    }
    let cpu0 = cpu_ms(live.pid);
    for _ in 0..o.warm {
        loaded.push(
            live.ok(json!({"code": "pass", "servers": ALL5, "timeout": 120}))
                .await
                .1,
        );
    }
    let loaded_cpu = 1e3 * (cpu_ms(live.pid) - cpu0) / o.warm as f64;
    t.samples(
        "warm `pass` with the 5 real servers loaded (53 tools bound; metadata unchanged, not resent)",
        &loaded,
        Unit::Ms,
        Target::None,
    );
    t.row(
        "bridge CPU per such call (mean over the N calls)",
        "1".into(),
        loaded_cpu,
        loaded_cpu,
        Unit::Us,
        Target::None,
    );
    let print = warm("print('hello')", o.warm).await;
    t.samples(
        "warm `print('hello')`",
        &print,
        Unit::Ms,
        Target::AtMost(5.0),
    );
    let big = warm("print('x' * 999_999)", o.big_output).await;
    t.samples(
        "warm 1 MB of output (`print('x' * 999_999)`)",
        &big,
        Unit::Ms,
        Target::None,
    );
    let (mut cold_pd, mut warm_pd) = (Vec::new(), Vec::new());
    for i in 0..o.pandas {
        let s = format!("pandas-{tag}-{i}");
        cold_pd.push(
            live.ok(json!({"code": "import pandas", "session": s}))
                .await
                .1,
        );
        warm_pd.push(
            live.ok(json!({"code": "import pandas", "session": s}))
                .await
                .1,
        );
    }
    t.samples(
        "`import pandas`, new session (container start + import)",
        &cold_pd,
        Unit::Ms,
        Target::None,
    );
    t.samples(
        "`import pandas`, existing session that imported it",
        &warm_pd,
        Unit::Ms,
        Target::None,
    );
}

// ---------------------------------------------------------------------------------------------
// 4: proxy overhead
// ---------------------------------------------------------------------------------------------

async fn proxy(o: &Opts, live: &Live, t: &mut Table) {
    let n = o.proxy_calls;
    let code = format!(
        "import time, json\n\
         await mcp_everything.echo(message='warm')\n\
         ts = []\n\
         for i in range({n}):\n    \
             t0 = time.perf_counter()\n    \
             await mcp_everything.echo(message=f'm{{i}}')\n    \
             ts.append(time.perf_counter() - t0)\n\
         print(json.dumps(ts))"
    );
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

// ---------------------------------------------------------------------------------------------
// 5: footprint
// ---------------------------------------------------------------------------------------------

/// Calls one tool of each of the five real servers in one run_python (all five loaded).
fn warm_all_code(fx: &Fixtures) -> String {
    format!(
        "await mcp_everything.echo(message='hi')\n\
         await mcp_filesystem.list_allowed_directories()\n\
         await mcp_docs.list_allowed_directories()\n\
         await mcp_time.get_current_time(timezone='UTC')\n\
         await mcp_git.git_status(repo_path={:?})\n\
         print('warm')",
        fx.repo.to_string_lossy()
    )
}

const ALL5: [&str; 5] = ["everything", "filesystem", "docs", "time", "git"];

/// RSS of fresh bridges after one call to each of the five real servers (each its own bridge,
/// so the figure is not inflated by what earlier sections did to a long-lived one).
async fn warm_rss(o: &Opts, fx: &Fixtures) -> Vec<f64> {
    let mut v = Vec::new();
    let code = warm_all_code(fx);
    for _ in 0..o.warm_rss {
        let live = Live::start(Home::new(&fx.real())).await;
        live.ok(json!({"code": code, "servers": ALL5, "timeout": 120}))
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        v.push(rss_mib(live.pid));
        live.shutdown().await;
    }
    v
}

async fn image_figures(o: &Opts, t: &mut Table) {
    let image = "mcp-code-bridge-sandbox:latest";
    let out = Command::new("podman")
        .args(["image", "inspect", "--format", "{{.Size}}", image])
        .output()
        .await
        .unwrap_or_else(|e| fail(&format!("podman image inspect: {e}")));
    let size: f64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(f64::NAN);
    let archive = image_archive();
    let archive_mib = std::fs::metadata(&archive)
        .map(|m| m.len() as f64 / 1048576.0)
        .unwrap_or(f64::NAN);
    t.fact(
        &format!("image size (`podman image inspect {image}`); archive {archive_mib:.0} MiB"),
        "1 (deterministic)",
        fmt(size / 1048576.0, Unit::MiB),
        "",
        "",
    );
    let mut load = Vec::new();
    for i in 0..o.image_load {
        let tag = format!(
            "localhost/mcp-code-bridge-bench-load-{}-{i}:latest",
            std::process::id()
        );
        let home = Home::new(&[]);
        let t0 = Instant::now();
        let out = Command::new(bridge_bin())
            .args(["image", "load"])
            .env_clear()
            .envs(home.env())
            .env("MCP_BRIDGE_IMAGE", &tag)
            .current_dir(home.path())
            .output()
            .await
            .unwrap_or_else(|e| fail(&format!("mcp-code-bridge image load: {e}")));
        let el = t0.elapsed().as_secs_f64();
        if !out.status.success() {
            fail(&format!(
                "mcp-code-bridge image load failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        load.push(el);
        let _ = Command::new("podman").args(["rmi", &tag]).output().await;
    }
    t.samples(
        "first-run image load (`mcp-code-bridge image load` under a fresh tag, process wall time)",
        &load,
        Unit::S,
        Target::None,
    );
}

// ---------------------------------------------------------------------------------------------
// 6: the load test
// ---------------------------------------------------------------------------------------------

struct LoadRun {
    wall: f64,
    latencies: Vec<f64>,
    lost: usize,
    mismatched: usize,
    failed: usize,
    rss: Vec<f64>,
}

async fn load_run(o: &Opts, live: &Live, run: usize) -> LoadRun {
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

async fn load_test(o: &Opts, live: &Live, t: &mut Table) -> Vec<f64> {
    let mut runs = Vec::new();
    for run in 0..o.load_runs {
        runs.push(load_run(o, live, run).await);
    }
    let calls = o.load_sessions * o.load_calls;
    t.section(
        6,
        &format!(
        "6. Load test: {} concurrent sessions × {} calls, each calling server-everything `echo` with a unique token",
            o.load_sessions, o.load_calls
        ),
    );
    let rate: Vec<f64> = runs.iter().map(|r| calls as f64 / r.wall).collect();
    t.samples("calls/s (per run)", &rate, Unit::PerSec, Target::None);
    let lat: Vec<f64> = runs.iter().flat_map(|r| r.latencies.clone()).collect();
    let (p50, p99) = (pct(&lat, 0.5), pct(&lat, 0.99));
    t.fact(
        "latency per call: p50 (median column) / p99 (p95 column)",
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
            &format!("{what}, total over all runs"),
            &(runs.len() * calls).to_string(),
            total.to_string(),
            "= 0",
            if total == 0 { "yes" } else { "**no**" },
        );
    }
    runs.iter().flat_map(|r| r.rss.clone()).collect()
}

// ---------------------------------------------------------------------------------------------
// Discovery with a persisted catalog
// ---------------------------------------------------------------------------------------------

/// Live `mcp-server-time` processes started by the bridge `pid` (its direct children).
fn upstream_children(pid: u32) -> usize {
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
async fn first_search(home: Home) -> (f64, f64, f64, Home) {
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
async fn catalog_figures(o: &Opts, t: &mut Table) {
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

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// The hostile sandbox: what code attacking the host makes the bridge hold and write
// ---------------------------------------------------------------------------------------------

/// Python that finds the runtime and its real stdout (the frame channel), as `tests/hostile.rs`.
const RT: &str = "import sys, os, json, threading, time\nrt = sys.modules['__mcp_bridge_runtime__']\nfd = rt._state.frame_out\n";

/// Peak RSS of `pid` since its last reset, in MiB (`VmHWM`).
fn peak_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// Start a new peak: writing 5 to `clear_refs` resets `VmHWM` to the current RSS (Linux ≥ 4.0;
/// the bench runs as the bridge's user).
fn reset_peak(pid: u32) {
    if let Err(e) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5") {
        fail(&format!(
            "cannot reset the peak RSS of the bridge ({pid}): {e}"
        ));
    }
}

/// Bytes `pid` caused to be written to storage (`write_bytes` of `/proc/<pid>/io`).
fn disk_writes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("write_bytes:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// The documented bound (SECURITY.md): what one session can make the bridge hold above idle, with
/// the default output cap.
const SESSION_BOUND_MIB: f64 = 64.0;

fn peak_row(t: &mut Table, metric: &str, p: f64) {
    t.row(
        metric,
        "1".into(),
        p,
        p,
        Unit::MiB,
        Target::AtMost(SESSION_BOUND_MIB),
    );
}

/// A battery of attacks, one session, one after another; for each, the bridge's peak RSS above
/// what it held idle. Then what the whole battery made the host write: the bridge's own disk
/// writes and those of the container's monitor (conmon, which would write an engine log), the
/// container log's size, and the growth of the bridge's log. The bounds are SECURITY.md's.
async fn hostile(_fx: &Fixtures, t: &mut Table) {
    let server: ServerDef = (
        "fx".into(),
        "python3".into(),
        vec![
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/misbehaving_server.py"
            )
            .into(),
            "normal".into(),
        ],
    );
    let home = Home::new(&[server]);
    let mut cmd = home.command();
    cmd.env("MCP_BRIDGE_UPSTREAM_CALL_TIMEOUT", "3s");
    let live = Live::spawn(home, cmd).await;
    let pid = live.pid;
    live.ok(json!({"code": "print(1)"})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = rss_mib(pid);
    let ids = containers_of(pid).await;
    let Some(id) = ids.first() else {
        fail("the hostile battery's session has no container")
    };
    let inspect = |f: &'static str| {
        let id = id.clone();
        async move {
            let out = Command::new("podman")
                .args(["inspect", "--format", f, &id])
                .output()
                .await
                .expect("podman inspect");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        }
    };
    let conmon: u32 = inspect("{{.State.ConmonPid}}").await.parse().unwrap_or(0);
    let log_path = inspect("{{.LogPath}}").await;
    let written0 = disk_writes(pid) + disk_writes(conmon);
    let log0 = live.home.log().len();

    t.section(
        9,
        "9. Hostile sandbox (one session attacking the host; peaks above the idle bridge)",
    );
    t.fact(
        "bridge RSS, idle after one call",
        "1",
        fmt(idle, Unit::MiB),
        "",
        "",
    );
    let attack = async |label: &str, code: String, servers: Value| {
        reset_peak(pid);
        let started = Instant::now();
        let r = live
            .call(json!({"code": code, "servers": servers, "timeout": 120}))
            .await;
        if let Err(e) = &r {
            fail(&format!(
                "hostile attack {label:?}: {e}\n{}",
                live.home.log()
            ));
        }
        (started.elapsed(), peak_mib(pid) - idle)
    };

    // 1. 64 MiB of lines that are not frames, on the real stdout.
    let (_, p) = attack(
        "junk",
        format!(
            "{RT}line = b'x' * 1023 + b'\\n'\nfor _ in range(64 * 1024):\n    os.write(fd, line)"
        ),
        json!([]),
    )
    .await;
    peak_row(t, "peak: 64 MiB of junk lines on the channel", p);

    // 2. 1 GiB of well-formed 8 MiB output frames for a finished call, sent between calls.
    let flood = format!(
        "{RT}eid = rt._state.running.id\nframe = (json.dumps({{'type': 'output', 'id': eid, 'stream': 'stdout', 'data': 'y' * (8 << 20)}}) + '\\n').encode()\n\
def flood():\n    time.sleep(0.3)\n    for _ in range(128):\n        rt._send_bytes(frame)\n    open('/tmp/flood-done', 'w').close()\n\
threading.Thread(target=flood, daemon=True).start()"
    );
    reset_peak(pid);
    live.ok(json!({"code": flood})).await;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (out, _) = live
            .ok(json!({"code": "import os\nprint(os.path.exists('/tmp/flood-done'))"}))
            .await;
        if out == "True\n" {
            break;
        }
        if Instant::now() > deadline {
            fail("the stale-frame flood did not finish within 180 s");
        }
    }
    let p = peak_mib(pid) - idle;
    peak_row(t, "peak: 1 GiB of stale 8 MiB frames between calls", p);

    // 3. 200 tool calls of 1 MiB arguments each to a tool that never answers.
    let (_, p) = attack(
        "pending",
        "import asyncio\nfrom mcp import runtime\npad = 'z' * (1 << 20)\n\
async def one():\n    try:\n        await runtime.call_tool('fx', 'hang', {'pad': pad})\n    except Exception:\n        pass\n\
await asyncio.gather(*[one() for _ in range(200)])"
            .into(),
        json!(["fx"]),
    )
    .await;
    peak_row(t, "peak: 200 × 1 MiB arguments to a hanging tool", p);

    // 4. Output at the cap, 16 images of 6 MiB and 16 MiB of forged display frames.
    let (_, p) = attack(
        "reply",
        format!(
            "{RT}import base64\neid = rt._state.running.id\nprint('o' * (64 << 20))\n\
png = base64.b64encode(b'\\x89PNG\\r\\n\\x1a\\n' + b'\\0' * ((6 << 20) - 8)).decode()\n\
for _ in range(16):\n    os.write(fd, (json.dumps({{'type': 'display', 'id': eid, 'mime': 'image/png', 'data': png}}) + '\\n').encode())\n\
junk = (json.dumps({{'type': 'display', 'id': eid, 'mime': 'image/svg+xml', 'data': 'PHN2Zz4='}}) + '\\n').encode()\n\
for _ in range(200000):\n    os.write(fd, junk)"
        ),
        json!([]),
    )
    .await;
    peak_row(
        t,
        "peak: a reply at the output cap with 16 × 6 MiB images and 200 000 refused ones",
        p,
    );

    // 5. 20 000 lines on PID 1's stderr and 20 000 forged log frames.
    attack(
        "logs",
        format!(
            "{RT}err = os.open('/proc/1/fd/2', os.O_WRONLY)\nfor i in range(20000):\n    os.write(err, b'junk line %d\\n' % i)\n\
for i in range(20000):\n    os.write(fd, (json.dumps({{'type': 'log', 'level': 'warning', 'message': 'forged %d' % i}}) + '\\n').encode())"
        ),
        json!([]),
    )
    .await;

    // 6. A sandbox that stops reading its stdin, then a 3 MiB code with a 2 s timeout.
    live.ok(json!({"code": "import os, signal, threading, time\n\
def stop():\n    time.sleep(0.5)\n    os.kill(os.getpid(), signal.SIGSTOP)\n\
threading.Thread(target=stop, daemon=True).start()"}))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    let big = format!("x = '{}'\nprint(len(x))", "a".repeat(3 << 20));
    let _ = live.call(json!({"code": big, "timeout": 2})).await;
    let stopped = started.elapsed();

    // 7. Code that swallows every KeyboardInterrupt, 1 s timeout: interrupted, interrupted again,
    // then killed at the grace period's end.
    let started = Instant::now();
    let _ = live
        .call(json!({"code": "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass", "timeout": 1}))
        .await;
    let ignored = started.elapsed();

    tokio::time::sleep(Duration::from_millis(500)).await;
    let written = (disk_writes(pid) + disk_writes(conmon)).saturating_sub(written0);
    let engine_log = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
    let log_grown = live.home.log().len().saturating_sub(log0);
    t.fact(
        "reply to a 2 s call whose sandbox stopped reading its stdin",
        "1",
        fmt(ms(stopped), Unit::Ms),
        "≤ 6 s (timeout + 3 s grace + 1 s)",
        if stopped <= Duration::from_secs(6) {
            "yes"
        } else {
            "**no**"
        },
    );
    t.fact(
        "reply to a 1 s call whose code swallows every interrupt (killed after the grace)",
        "1",
        fmt(ms(ignored), Unit::Ms),
        "≤ 5 s (timeout + 3 s grace + 1 s)",
        if ignored <= Duration::from_secs(5) {
            "yes"
        } else {
            "**no**"
        },
    );
    t.fact(
        "host disk written by the bridge and conmon over the battery (≥ 1.4 GiB sent)",
        "1",
        fmt(written as f64 / 1048576.0, Unit::MiB),
        "",
        "",
    );
    t.fact(
        "engine log of the container after the battery",
        "1",
        format!("{engine_log} B"),
        "0 B",
        if engine_log == 0 { "yes" } else { "**no**" },
    );
    t.fact(
        "bridge log growth over the battery (40 000 junk lines among it)",
        "1",
        format!("{:.1} KiB", log_grown as f64 / 1024.0),
        "",
        "",
    );
    live.shutdown().await;
}
// 7. The first call: warm-up and the pool of ready sandboxes
// ---------------------------------------------------------------------------------------------

/// The model's thinking time before a call, as the bench gives it: the warm-up and the pool's
/// refill happen in it.
const THINK: Duration = Duration::from_millis(1500);

/// A call's round trip in ms (after `THINK`), on a bridge whose engine and image are ready.
async fn first_calls(o: &Opts, pool: &str, t: &mut Table) {
    let env = [("MCP_BRIDGE_POOL_SIZE", pool)];
    let label = if pool == "0" {
        "pool_size = 0".to_string()
    } else {
        format!("pool_size = {pool}")
    };
    let mut fresh = Vec::new();
    for _ in 0..o.pool_fresh {
        let live = Live::start_with(Home::new(&[]), &env).await;
        tokio::time::sleep(THINK).await;
        fresh.push(live.ok(json!({"code": "print(1+1)"})).await.1);
        live.shutdown().await;
    }
    t.samples(
        &format!(
            "first `print(1+1)` {:.1} s after `initialize`, fresh bridge ({label})",
            THINK.as_secs_f64()
        ),
        &fresh,
        Unit::Ms,
        if pool == "0" {
            Target::None
        } else {
            Target::AtMost(50.0)
        },
    );
    let live = Live::start_with(Home::new(&[]), &env).await;
    live.ok(json!({"code": "pass"})).await;
    let tag = std::process::id();
    let (mut new, mut pandas) = (Vec::new(), Vec::new());
    for i in 0..o.pool_sessions {
        tokio::time::sleep(THINK).await;
        new.push(
            live.ok(json!({"code": "print(1+1)", "session": format!("pool-new-{tag}-{pool}-{i}")}))
                .await
                .1,
        );
        tokio::time::sleep(THINK).await;
        pandas.push(
            live.ok(
                json!({"code": "import pandas", "session": format!("pool-pd-{tag}-{pool}-{i}")}),
            )
            .await
            .1,
        );
    }
    let target = if pool == "0" {
        Target::None
    } else {
        Target::AtMost(50.0)
    };
    t.samples(
        &format!("first `print(1+1)` of a new session ({label})"),
        &new,
        Unit::Ms,
        target,
    );
    t.samples(
        &format!("`import pandas` in a new session ({label})"),
        &pandas,
        Unit::Ms,
        target,
    );
    live.shutdown().await;
}

async fn pool_section(o: &Opts, t: &mut Table) {
    t.section(
        8,
        &format!(
            "8. First calls: warm-up and the pool (each after {:.1} s of model think time)",
            THINK.as_secs_f64()
        ),
    );
    first_calls(o, "1", t).await;
    first_calls(o, "0", t).await;
}

// ---------------------------------------------------------------------------------------------

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let o = Opts::from_env().with_overrides();
    let started = Instant::now();
    let bin = bridge_bin();
    if !bin.is_file() {
        fail(&format!(
            "{} does not exist: run `cargo build --release`",
            bin.display()
        ));
    }
    image_archive();
    eprintln!(
        "bench: {} mode, binary {}",
        if o.quick { "quick" } else { "full" },
        bin.display()
    );
    let fx = Fixtures::new();
    let mut t = Table::default();

    if o.wants("catalog") {
        eprintln!("bench: first search with a cold and a warm catalog…");
        catalog_figures(&o, &mut t).await;
    }

    if o.wants("tokens") || o.wants("startup") {
        eprintln!("bench: context cost and start-up…");
        context_and_startup(&o, &fx, &mut t).await;
    }
    if o.wants("pool") {
        eprintln!("bench: first calls and the pool…");
        pool_section(&o, &mut t).await;
    }
    let needs_live = ["exec", "proxy", "footprint", "load"]
        .iter()
        .any(|s| o.wants(s));
    if needs_live {
        let live = Live::start(Home::new(&fx.real())).await;
        eprintln!("bench: bridge under test: pid {}", live.pid);
        if o.wants("exec") {
            eprintln!("bench: execution…");
            execution(&o, &live, &mut t).await;
        }
        if o.wants("proxy") {
            eprintln!("bench: proxy…");
            proxy(&o, &live, &mut t).await;
        }
        let mut warm = Vec::new();
        if o.wants("footprint") {
            eprintln!("bench: footprint…");
            warm = warm_rss(&o, &fx).await;
        }
        let mut under_load = Vec::new();
        if o.wants("load") {
            eprintln!("bench: load test…");
            under_load = load_test(&o, &live, &mut t).await;
        }
        if o.wants("footprint") {
            t.section(5, "5. Footprint");
            t.samples(
                "bridge RSS with 5 warm upstreams (fresh bridge, one call to each made)",
                &warm,
                Unit::MiB,
                Target::None,
            );
            if !under_load.is_empty() {
                t.samples(
                    "bridge RSS under the load test (sampled every 50 ms)",
                    &under_load,
                    Unit::MiB,
                    Target::None,
                );
            }
            image_figures(&o, &mut t).await;
        }
        live.shutdown().await;
    }
    if o.wants("hostile") {
        eprintln!("bench: hostile sandbox…");
        hostile(&fx, &mut t).await;
    }
    println!();
    println!(
        "mcp-code-bridge bench ({} mode; N = samples per row; bridge RSS is the bridge process only)",
        if o.quick { "quick" } else { "full" }
    );
    println!();
    t.print();
    println!();
    println!("total bench time: {:.0} s", started.elapsed().as_secs_f64());
}

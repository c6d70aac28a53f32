//! Prerequisites, the servers' fixtures, private homes, and the bridge driven by rmcp's client.

use super::*;

/// The release binary: cargo builds it for this bench (the bench profile inherits `release`, so
/// this is `target/release/mcp-code-bridge`); `MCP_BRIDGE_BENCH_BIN` points elsewhere.
pub(crate) fn bridge_bin() -> PathBuf {
    std::env::var_os("MCP_BRIDGE_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mcp-code-bridge")))
}

pub(crate) fn image_archive() -> PathBuf {
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

pub(crate) fn server_bin(name: &str) -> String {
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

pub(crate) fn fail(msg: &str) -> ! {
    eprintln!("bench: {msg}");
    std::process::exit(2)
}

pub(crate) fn fixture() -> String {
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
pub(crate) type ServerDef = (String, String, Vec<String>);

/// Directories the real servers work on (kept for the whole run).
pub(crate) struct Fixtures {
    pub(crate) _dir: TempDir,
    pub(crate) files: PathBuf,
    pub(crate) docs: PathBuf,
    pub(crate) repo: PathBuf,
}

impl Fixtures {
    pub(crate) fn new() -> Fixtures {
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
    pub(crate) fn real(&self) -> Vec<ServerDef> {
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
    pub(crate) fn generated(count: usize) -> Vec<ServerDef> {
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
pub(crate) struct Home {
    pub(crate) dir: TempDir,
}

impl Home {
    pub(crate) fn new(servers: &[ServerDef]) -> Home {
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

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let mut env = common::private_home_env(self.path());
        env.extend([
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
            // A bench bridge's sessions go with it: sessions parked for the next bridge would
            // run beside the later rows. The row that times resuming one sets it again.
            ("MCP_BRIDGE_SESSION_LINGER".into(), "0".into()),
        ]);
        env
    }

    pub(crate) fn command(&self) -> Command {
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

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("bridge.log")).unwrap_or_default()
    }
}

pub(crate) fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// A `/proc/<pid>/status` field in MiB; NaN when it cannot be read.
pub(crate) fn status_mib(pid: u32, key: &str) -> f64 {
    common::proc_status_kib(pid, key).map_or(f64::NAN, |kb| kb as f64 / 1024.0)
}

/// CPU time the process has used, in ms: the sum of its threads' `schedstat` run times
/// (nanosecond resolution; threads that already exited are not counted, tokio's workers live on).
pub(crate) fn cpu_ms(pid: u32) -> f64 {
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

/// CPU time process `pid` has used (user + system, its exited threads included), in ms; NaN when
/// it cannot be read. Clock-tick resolution (10 ms): for windows of seconds, not single calls.
pub(crate) fn proc_cpu_ms(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // The fields after the command (which may hold spaces) start at its closing parenthesis.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    // utime and stime are fields 14 and 15 of stat; `rest` starts at field 3.
    // SAFETY: sysconf takes a name constant, cannot fail unsafely and touches no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) * 1e3 / hz
}

pub(crate) struct Live {
    pub(crate) client: RunningService<RoleClient, ()>,
    pub(crate) child: Child,
    pub(crate) pid: u32,
    pub(crate) home: Home,
}

impl Live {
    pub(crate) async fn start(home: Home) -> Live {
        Self::start_with(home, &[]).await
    }

    /// Start with extra environment (configuration keys as `MCP_BRIDGE_*`).
    pub(crate) async fn start_with(home: Home, env: &[(&str, &str)]) -> Live {
        let mut cmd = home.command();
        cmd.envs(env.iter().copied());
        Live::spawn(home, cmd).await
    }

    /// Start the bridge from `cmd` (the home's command, with extra settings).
    pub(crate) async fn spawn(home: Home, mut cmd: Command) -> Live {
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

    /// `serve` on a loopback port with the home's settings, and rmcp's Streamable HTTP client
    /// of it (no authentication: loopback).
    pub(crate) async fn serve(home: Home) -> Live {
        let (child, pid, url) = spawn_serve(&home, &[]).await;
        let client = match http_client(&url, None).await {
            Ok(c) => c,
            Err(e) => fail(&format!("{e}\n{}", home.log())),
        };
        Live {
            client,
            child,
            pid,
            home,
        }
    }

    pub(crate) async fn call(&self, args: Value) -> Res<CallToolResult> {
        call_with(&self.client, args).await
    }

    /// Run code and insist on success; returns stdout and the wall time of the round trip.
    pub(crate) async fn ok(&self, args: Value) -> (String, f64) {
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
    pub(crate) async fn shutdown(self) -> Home {
        let Live {
            client,
            mut child,
            pid,
            home,
        } = self;
        let _ = client.cancel().await;
        // `serve` outlives its clients: it ends on SIGTERM (`run` ends with its stdin).
        if child.try_wait().ok().flatten().is_none()
            && std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split('\0').nth(1) == Some("serve"))
        {
            // SAFETY: kill only sends a signal and touches no memory of ours. `pid` is `child`'s,
            // not reaped (`try_wait` saw it running), and its cmdline was just checked as `serve`.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
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

/// `run_python` with `args` through `client`: its result, or why there was none (no reply
/// within 240 s, a protocol error).
pub(crate) async fn call_with(
    client: &RunningService<RoleClient, ()>,
    args: Value,
) -> Res<CallToolResult> {
    let params =
        CallToolRequestParams::new("run_python").with_arguments(args.as_object().cloned().unwrap());
    match tokio::time::timeout(Duration::from_secs(240), client.call_tool(params)).await {
        Err(_) => Err("no reply within 240 s".into()),
        Ok(Err(e)) => Err(format!("protocol error: {e}")),
        Ok(Ok(r)) => Ok(r),
    }
}

/// `serve` on a loopback port the kernel picks, with the home's settings and `env` (configuration
/// keys as `MCP_BRIDGE_*`): its child, pid and `/mcp` URL, once it says where it serves.
pub(crate) async fn spawn_serve(home: &Home, env: &[(&str, &str)]) -> (Child, u32, String) {
    let mut cmd = Command::new(bridge_bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .env_clear()
        .envs(home.env())
        .envs(env.iter().copied())
        .current_dir(home.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(home.path().join("bridge.log")).unwrap(),
        ))
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn serve");
    let pid = child.id().unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = loop {
        let log = home.log();
        if let Some(i) = log.find("serving MCP at ") {
            let rest = &log[i + "serving MCP at ".len()..];
            break rest[..rest.find([' ', ';', '\n']).unwrap_or(rest.len())].to_string();
        }
        if let Ok(Some(status)) = child.try_wait() {
            fail(&format!("serve exited ({status}) before serving\n{log}"));
        }
        if Instant::now() > deadline {
            fail(&format!("serve did not start within 60 s\n{log}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    (child, pid, url)
}

/// rmcp's Streamable HTTP client of `url`, with `token` as its bearer when given; initialized.
pub(crate) async fn http_client(
    url: &str,
    token: Option<&str>,
) -> Res<RunningService<RoleClient, ()>> {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(t) = token {
        config = config.auth_header(t);
    }
    let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
    ().serve(transport)
        .await
        .map_err(|e| format!("MCP initialize over HTTP failed: {e}"))
}

/// `key` (`status`, `stdout`, ...) of a `run_python` result read as one object: its metadata
/// with its parts (`common::structured`); "" when it has none.
pub(crate) fn sc(r: &CallToolResult, key: &str) -> String {
    let v = serde_json::to_value(r).unwrap_or(Value::Null);
    super::common::structured(&v)
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

pub(crate) fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The bridge `pid`'s containers, as the tests see them.
pub(crate) use super::common::containers_of;

/// Samples the bridge's RSS every 50 ms until stopped.
pub(crate) fn sample_rss(pid: u32) -> (Arc<AtomicBool>, tokio::task::JoinHandle<Vec<f64>>) {
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

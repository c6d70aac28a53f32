//! Test harness: the real `mcp-code-bridge` binary over stdio, driven by rmcp's real client,
//! against the real container engine. Nothing here fakes the bridge, the engine or the image:
//! when the image archive is not provided the tests fail, they never skip.
#![allow(dead_code)]

pub mod oidc;
pub mod rootless;
pub mod sdk_tasks;
pub mod served;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tempfile::TempDir;

pub const BIN: &str = env!("CARGO_BIN_EXE_mcp-code-bridge");

/// The sandbox image archive the tests load on first use. Required.
pub fn image_archive() -> PathBuf {
    let p = std::env::var_os("MCP_BRIDGE_TEST_IMAGE_ARCHIVE").map(PathBuf::from).expect(
        "MCP_BRIDGE_TEST_IMAGE_ARCHIVE is not set: build the sandbox image with `image/build-debian.sh --output FILE` \
         and point this variable at it (scripts/test.sh does both)",
    );
    assert!(
        p.is_file(),
        "MCP_BRIDGE_TEST_IMAGE_ARCHIVE={} does not exist",
        p.display()
    );
    p
}

/// What keeps the machine's system config file (`/etc/mcp-code-bridge/config.toml`, which
/// `scripts/setup-debian.sh --configure` writes) away from every bridge a test starts. Every
/// environment built for a bridge here has it; so must any other.
pub const NO_SYSTEM_CONFIG: (&str, &str) = ("MCP_BRIDGE_SYSTEM_CONFIG", "none");

/// A private HOME/XDG tree so no user configuration leaks into a test, and no system one either.
pub struct Home {
    pub dir: TempDir,
}

impl Home {
    pub fn new() -> Home {
        let dir = tempfile::Builder::new()
            .prefix("mcb-test-")
            .tempdir()
            .unwrap();
        for d in [".config", ".local/state", ".cache"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        Home { dir }
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    /// The log of the bridge started in this home (`bridge.log`). Panics when it cannot be
    /// read: an assertion that the log lacks something must never pass on a log that is not there.
    pub fn log(&self) -> String {
        let path = self.path().join("bridge.log");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read the bridge's log {}: {e}", path.display()))
    }
    /// The log for a failure message, where the bridge may not have logged to this home (a
    /// client that started it itself): the file, or a line saying why there is none.
    pub fn log_if_any(&self) -> String {
        let path = self.path().join("bridge.log");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| format!("(no bridge log at {}: {e})", path.display()))
    }
    /// This home with the misbehaving fixture server configured as `fx`, in `mode` (see
    /// [`misbehaving_server`]).
    pub fn with_fx(mode: &str, extra_args: &[&str]) -> Home {
        let home = Home::new();
        write_servers(&home, json!({"fx": misbehaving_server(mode, extra_args)}));
        home
    }
    /// `mcp-code-bridge` (no arguments yet) with only this home's environment, run in it.
    pub fn command(&self) -> std::process::Command {
        let mut c = std::process::Command::new(BIN);
        c.env_clear().envs(self.env()).current_dir(self.path());
        c
    }
    /// The environment a bridge process gets: only this tree, the image archive, and PATH.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = self.base_env();
        env.extend([
            (
                "MCP_BRIDGE_IMAGE_ARCHIVE".into(),
                image_archive().display().to_string(),
            ),
            ("MCP_BRIDGE_LOG_LEVEL".into(), "debug".into()),
        ]);
        // The isolation level the suite runs under: scripts/test.sh runs some modules a second
        // time with `MCP_BRIDGE_TEST_ISOLATION=gvisor`.
        if let Some(level) = isolation() {
            env.push(("MCP_BRIDGE_ISOLATION".into(), level));
        }
        // The engine: scripts/test.sh runs some modules again against a Docker daemon.
        if engine() == "docker" {
            env.push(("MCP_BRIDGE_RUNTIME".into(), "docker".into()));
        }
        env
    }
    /// The environment without an image: this tree (HOME, XDG), PATH, and no system config.
    pub fn base_env(&self) -> Vec<(String, String)> {
        private_home_env(self.path())
    }
}

/// `MCP_BRIDGE_TEST_ENGINE`: the engine every bridge of this test run talks to, `podman` (unset)
/// or `docker` (a Docker daemon on its default socket: `runtime = "docker"`), and the command
/// line the tests ask it with.
pub fn engine() -> &'static str {
    match std::env::var("MCP_BRIDGE_TEST_ENGINE").as_deref() {
        Ok("docker") => "docker",
        Ok("podman" | "") | Err(_) => "podman",
        Ok(other) => panic!("MCP_BRIDGE_TEST_ENGINE={other}: podman or docker"),
    }
}

/// `MCP_BRIDGE_TEST_ISOLATION`: the isolation level every bridge of this test run gets
/// (`container` when unset).
pub fn isolation() -> Option<String> {
    std::env::var("MCP_BRIDGE_TEST_ISOLATION")
        .ok()
        .filter(|v| !v.is_empty())
}

/// The environment of a bridge that sees nothing of the machine's or the user's configuration:
/// HOME and the XDG directories under `h` (which must hold `.config`, `.local/state` and
/// `.cache`), PATH, and no system config file. The tests and the bench both start bridges so.
/// Their podman service goes with its bridge (`engine_linger = 0`): every test has a state dir
/// of its own, so a lingering service would never be found again, only left running; the tests
/// of the linger (`own_service_linger_*`) and the bench's rows set it themselves.
pub fn private_home_env(h: &Path) -> Vec<(String, String)> {
    vec![
        (NO_SYSTEM_CONFIG.0.into(), NO_SYSTEM_CONFIG.1.into()),
        ("MCP_BRIDGE_ENGINE_LINGER".into(), "0".into()),
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
    ]
}

/// A running bridge with a connected MCP client.
pub struct Bridge {
    pub client: RunningService<RoleClient, ()>,
    pub home: Home,
    pub pid: u32,
}

impl Bridge {
    pub async fn start() -> Bridge {
        Self::start_with(Home::new(), &[], None).await
    }

    /// Start with extra environment and, optionally, a working directory.
    pub async fn start_with(home: Home, env: &[(&str, &str)], cwd: Option<&Path>) -> Bridge {
        let transport = transport_in(&home, env, cwd.unwrap_or(home.path()));
        // Without it, every check of "this bridge's containers" or "its memory" would look at
        // no process and pass.
        let pid = transport.id().expect("the bridge's process id");
        let client = ().serve(transport).await.expect("MCP initialize with the bridge");
        Bridge { client, home, pid }
    }

    /// Call `run_python` with the given arguments object.
    pub async fn call(&self, args: Value) -> CallToolResult {
        let params = CallToolRequestParams::new("run_python")
            .with_arguments(args.as_object().cloned().unwrap());
        tokio::time::timeout(Duration::from_secs(240), self.client.call_tool(params))
            .await
            .expect("run_python answered within 240s")
            .unwrap_or_else(|e| {
                panic!(
                    "run_python failed at the protocol level: {e}\nbridge log:\n{}",
                    self.home.log()
                )
            })
    }

    /// Run code in the default session; returns the result.
    pub async fn py(&self, code: &str) -> Outcome {
        Outcome(self.call(json!({"code": code})).await)
    }

    pub async fn shutdown(self) {
        let _ = self.client.cancel().await;
    }

    /// Shut down and assert that the bridge removed every container it made. Returns the home,
    /// for a test that reads what the bridge left there (dropping it removes the directory).
    pub async fn shutdown_clean(self) -> Home {
        let Bridge { client, home, pid } = self;
        let _ = client.cancel().await;
        // Under gVisor (ptrace) the engine's removal of a sandbox that held many tasks (a fork
        // bomb's) can outlast 20 s while another gVisor test runs beside it: a removal the
        // bridge asked for and the engine is still doing is given longer, never skipped.
        let within = if isolation().as_deref() == Some("gvisor") {
            60
        } else {
            20
        };
        let left = wait_no_containers(pid, Duration::from_secs(within)).await;
        if !left.is_empty() {
            let state = std::process::Command::new(engine())
                .args([
                    "ps",
                    "-a",
                    "--format",
                    "{{.ID}} {{.State}} {{.Status}} {{.Names}}",
                ])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let log = home.log_if_any();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "containers left behind {within}s after the bridge was closed: {left:?}\nthe engine's containers:\n{state}\nthe bridge's last log lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        home
    }

    /// Run code with the misbehaving fixture server `fx` loaded (see `misbehaving_server`).
    pub async fn fx(&self, code: &str) -> Outcome {
        Outcome(
            self.call(json!({"code": code, "servers": ["fx"], "timeout": 110}))
                .await,
        )
    }

    /// Run code in the default session, require `ok`, and return its stdout.
    pub async fn out(&self, code: &str) -> String {
        self.py(code).await.ok().stdout().to_string()
    }

    /// Run a probe (code printing `key value...` lines, see [`probe_lines`]) and return its
    /// lines as a map.
    pub async fn probe(&self, code: &str) -> BTreeMap<String, String> {
        probe_lines(&self.out(code).await)
    }

    /// The default session runs in a new interpreter: the `kept` an earlier call defined is gone.
    pub async fn assert_kept_is_gone(&self) {
        let r = self.py("print('kept' in globals())").await.ok();
        assert_eq!(r.stdout(), "False\n", "the interpreter was not replaced");
    }

    /// The bridge still answers, and the session still runs code.
    pub async fn still_serving(&self) {
        let r = self.py("print('still serving')").await;
        assert!(
            r.status() == "ok" && r.stdout() == "still serving\n",
            "the bridge stopped serving: {}\nlog:\n{}",
            r.text(),
            self.home.log()
        );
    }

    /// The end of an attack: the bridge still serves, then it is shut down.
    pub async fn shutdown_still_serving(self) {
        self.still_serving().await;
        self.shutdown().await;
    }
}

/// Lines `key value...` printed by a probe, as a map (a line without a space is no entry).
pub fn probe_lines(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every one of `keys` is in the probe's map with the value `want` (a missing key fails, naming
/// it: a probe that printed nothing cannot pass).
pub fn assert_each(p: &BTreeMap<String, String>, keys: &[&str], want: &str) {
    assert!(!keys.is_empty(), "no keys to check");
    for k in keys {
        match p.get(*k) {
            Some(v) => assert_eq!(v, want, "{k}: {p:?}"),
            None => panic!("the probe printed no {k:?}: {p:?}"),
        }
    }
}

/// Wait (polling every 50 ms) until `f` holds; fails naming `what` when `timeout` passes first.
pub async fn wait_until(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> bool) {
    let start = std::time::Instant::now();
    while !f().await {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `_meta` key of a `run_python` result's metadata (status, session, error, counts, ...).
pub const RESULT_META: &str = "mcp-code-bridge/result";
/// The `_meta` key naming the part a text block of a `run_python` result carries.
pub const PART_META: &str = "mcp-code-bridge/part";

/// The part a content block (JSON) carries, from its `_meta`.
fn part_of(block: &Value) -> Option<&str> {
    block.get("_meta")?.get(PART_META)?.as_str()
}

/// A `run_python` result (JSON, the `result` of a `tools/call` reply) as one object: its
/// metadata (`_meta["mcp-code-bridge/result"]`) with the text parts of its content added,
/// `stdout`, `stderr` (without its `[stderr]` line), `value`, `notices` (a list, without the
/// `[bridge] ` of each) and `error.traceback` (when the error block is more than "Kind: message").
/// A field or part that is not there has no key (a result without metadata, or no result at
/// all, gives an object of its parts alone: what is read from it is then null).
pub fn structured(result: &Value) -> Value {
    let mut sc = match result.get("_meta").and_then(|m| m.get(RESULT_META)) {
        Some(Value::Object(m)) => m.clone(),
        _ => serde_json::Map::new(),
    };
    let blocks = result["content"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    for block in blocks {
        let (Some(part), Some(text)) = (part_of(block), block["text"].as_str()) else {
            continue;
        };
        match part {
            "stdout" | "value" => {
                sc.insert(part.into(), text.into());
            }
            "stderr" => {
                let t = text.strip_prefix("[stderr]\n").unwrap_or(text);
                sc.insert(part.into(), t.into());
            }
            "notices" => {
                let mut notices: Vec<String> = Vec::new();
                for line in text.split('\n') {
                    match (line.strip_prefix("[bridge] "), notices.last_mut()) {
                        (Some(n), _) => notices.push(n.to_string()),
                        (None, Some(last)) => {
                            last.push('\n');
                            last.push_str(line);
                        }
                        (None, None) => notices.push(line.to_string()),
                    }
                }
                sc.insert(part.into(), json!(notices));
            }
            "error" => {
                let Some(Value::Object(e)) = sc.get_mut("error") else {
                    continue;
                };
                let kind = e.get("type").and_then(Value::as_str).unwrap_or("");
                let message = e.get("message").and_then(Value::as_str).unwrap_or("");
                let plain = [
                    format!("{kind}: {message}"),
                    kind.to_string(),
                    format!("[bridge] {message}"),
                ];
                if !plain.iter().any(|p| p == text) {
                    e.insert("traceback".into(), text.into());
                }
            }
            _ => {}
        }
    }
    Value::Object(sc)
}

/// A `run_python` result with accessors for its metadata and its parts.
pub struct Outcome(pub CallToolResult);

impl Outcome {
    /// The result's metadata (`_meta["mcp-code-bridge/result"]`). Panics when it has none.
    pub fn meta(&self) -> &Value {
        self.0
            .meta
            .as_ref()
            .and_then(|m| m.0.get(RESULT_META))
            .unwrap_or_else(|| panic!("no _meta[{RESULT_META:?}] in the result: {:?}", self.0))
    }
    /// The text of the block carrying `part`, exactly as sent.
    pub fn part(&self, part: &str) -> Option<&str> {
        self.0
            .content
            .iter()
            .filter_map(|c| c.as_text())
            .find(|t| {
                t.meta
                    .as_ref()
                    .and_then(|m| m.0.get(PART_META))
                    .and_then(Value::as_str)
                    == Some(part)
            })
            .map(|t| t.text.as_str())
    }
    /// The result as one object: see [`structured`]. Panics when the result has no metadata.
    pub fn sc(&self) -> Value {
        self.meta();
        structured(&serde_json::to_value(&self.0).expect("a result serializes"))
    }
    pub fn status(&self) -> &str {
        self.meta()["status"].as_str().unwrap_or("")
    }
    pub fn stdout(&self) -> &str {
        self.part("stdout").unwrap_or("")
    }
    pub fn stderr(&self) -> &str {
        self.part("stderr")
            .map(|t| t.strip_prefix("[stderr]\n").unwrap_or(t))
            .unwrap_or("")
    }
    pub fn text(&self) -> String {
        self.0
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join("\n")
    }
    pub fn error_type(&self) -> &str {
        self.meta()["error"]["type"].as_str().unwrap_or("")
    }
    pub fn is_error(&self) -> bool {
        self.0.is_error == Some(true)
    }
    /// Panics with the whole result when the run did not succeed; when no engine answered,
    /// with the host's podman processes too (what may have held the lock the service waited for).
    pub fn ok(self) -> Self {
        let engines = if self.status() == "unavailable" {
            let ps = std::process::Command::new("ps")
                .args(["-eo", "pid,etimes,stat,wchan:24,args"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let lines: Vec<&str> = ps
                .lines()
                .filter(|l| l.contains("podman") || l.contains("conmon") || l.contains("runc"))
                .collect();
            format!("\nthe host's podman processes:\n{}", lines.join("\n"))
        } else {
            String::new()
        };
        assert_eq!(self.status(), "ok", "run failed: {}{engines}", self.text());
        self
    }
}

/// `podman ARGS`' stdout (`docker ARGS`' under `MCP_BRIDGE_TEST_ENGINE=docker`). A command that
/// fails fails the test: its empty output is no answer (an empty `ps` is not "no container
/// left").
pub async fn engine_cli(args: &[&str]) -> String {
    let out = tokio::process::Command::new(engine())
        .args(args)
        .output()
        .await
        .expect("the engine's command line");
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}): {}",
        engine(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether the engine has image `tag` (`podman image exists`, `docker image inspect`: 0 yes, 1
/// no). Any other answer fails the test: an engine that cannot be asked has not shown that an
/// image is absent.
pub fn image_exists(tag: &str) -> bool {
    let ask: &[&str] = if engine() == "docker" {
        &["image", "inspect", "--format", "{{.Id}}"]
    } else {
        &["image", "exists"]
    };
    let out = std::process::Command::new(engine())
        .args(ask)
        .arg(tag)
        .output()
        .expect("the engine's command line");
    match out.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!(
            "{} {ask:?} {tag} failed ({}): {}",
            engine(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// `podman ps -a` lines (in `format`) of the containers labelled `label` that bridge process
/// `pid` owns (owner label `pid:starttime`; podman prints labels as `key:value`, docker as
/// `key=value`).
pub async fn owned_containers(pid: u32, label: &str, format: &str) -> Vec<String> {
    let sep = if engine() == "docker" { '=' } else { ':' };
    let owner = format!("io.mcp-code-bridge.owner{sep}{pid}:");
    engine_cli(&["ps", "-a", "--filter", label, "--format", format])
        .await
        .lines()
        .filter(|l| l.contains(&owner))
        .map(str::to_string)
        .collect()
}

/// Containers the engine has for this bridge process (by owner label prefix `pid:`), but for
/// one it parked as it exited (`engine_linger`): a keeper holds that one for the next bridge,
/// and removes it at the end of its time.
pub async fn containers_of(pid: u32) -> Vec<String> {
    owned_containers(
        pid,
        "label=io.mcp-code-bridge.managed=true",
        "{{.ID}} {{.Names}} {{.Labels}}",
    )
    .await
    .iter()
    .filter(|l| {
        let name = l.split_whitespace().nth(1).unwrap_or("");
        !name.contains(".parked-")
    })
    .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
    .collect()
}

/// The bridge as an rmcp transport, for tests that need their own client handler.
pub fn transport(home: &Home, env: &[(&str, &str)]) -> TokioChildProcess {
    transport_in(home, env, home.path())
}

/// `mcp-code-bridge run` in `cwd` with the home's environment plus `env`; its stderr (the log)
/// goes to `bridge.log` in the home.
fn transport_in(home: &Home, env: &[(&str, &str)], cwd: &Path) -> TokioChildProcess {
    let log = std::fs::File::create(home.path().join("bridge.log")).unwrap();
    let mut all = home.env();
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let (transport, _) =
        TokioChildProcess::builder(tokio::process::Command::new(BIN).configure(|c| {
            c.arg("run")
                .env_clear()
                .envs(all.iter().map(|(k, v)| (k, v)))
                .current_dir(cwd);
        }))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn the bridge");
    transport
}

// ---- Helpers for the security and fault suites (tests/e2e/security.rs, tests/e2e/faults*.rs) ----

/// A file under `tests/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    assert!(p.is_file(), "fixture {} is missing", p.display());
    p
}

/// Configure upstream servers for a bridge started with `home`, as the user would: an
/// `mcpServers` file at `$XDG_CONFIG_HOME/mcp/mcp.json`.
pub fn write_servers(home: &Home, servers: Value) {
    let dir = home.path().join(".config/mcp");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("mcp.json"),
        serde_json::to_vec_pretty(&json!({ "mcpServers": servers })).unwrap(),
    )
    .unwrap();
}

/// An `mcpServers` entry running `tests/fixtures/misbehaving_server.py` in `mode`.
pub fn misbehaving_server(mode: &str, extra_args: &[&str]) -> Value {
    let mut args = vec![
        fixture("misbehaving_server.py").display().to_string(),
        mode.to_string(),
    ];
    args.extend(extra_args.iter().map(|s| s.to_string()));
    json!({"command": "python3", "args": args})
}

/// Wait (bounded) until the bridge `pid` owns no container; returns what is left.
pub async fn wait_no_containers(pid: u32, within: Duration) -> Vec<String> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = containers_of(pid).await;
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether a process exists and is not a zombie. A `/proc` entry that exists but cannot be read
/// is a failure, never "gone".
pub fn process_alive(pid: u32) -> bool {
    assert_ne!(pid, 0, "process_alive of pid 0");
    let path = format!("/proc/{pid}/stat");
    match std::fs::read_to_string(&path) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        // ESRCH: the process went while its entry was read.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ESRCH) =>
        {
            false
        }
        Err(e) => panic!("cannot read {path}: {e}"),
    }
}

/// The bridge driven byte by byte over its stdin/stdout, for what rmcp's client will not send
/// (malformed JSON, unknown methods) and for closing stdin on purpose.
pub struct RawBridge {
    pub child: tokio::process::Child,
    pub stdin: Option<tokio::process::ChildStdin>,
    lines: tokio::sync::mpsc::UnboundedReceiver<Value>,
    pub home: Home,
    pub pid: u32,
}

impl RawBridge {
    /// Spawn `run` and complete the MCP handshake.
    pub async fn start(home: Home, env: &[(&str, &str)]) -> RawBridge {
        use tokio::io::AsyncBufReadExt;
        let log = std::fs::File::create(home.path().join("bridge.log")).unwrap();
        let mut all = home.env();
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut child = tokio::process::Command::new(BIN)
            .arg("run")
            .env_clear()
            .envs(all.iter().map(|(k, v)| (k, v)))
            .current_dir(home.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the bridge");
        let pid = child.id().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut r = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(l)) = r.next_line().await {
                let v: Value = serde_json::from_str(&l)
                    .unwrap_or_else(|e| panic!("the bridge wrote a non-JSON line ({e}): {l}"));
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut b = RawBridge {
            child,
            stdin,
            lines,
            home,
            pid,
        };
        b.send_json(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw-test-client", "version": "0"}}}),
        )
        .await;
        let init = b.response(0, Duration::from_secs(30)).await;
        assert!(init.get("result").is_some(), "initialize failed: {init}");
        b.send_json(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        b
    }

    /// Write one line (a newline is appended).
    pub async fn send_line(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(bytes).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    pub async fn send_json(&mut self, v: Value) {
        self.send_line(&serde_json::to_vec(&v).unwrap()).await;
    }

    /// The next message the bridge writes, or `None` when nothing comes within `wait`.
    pub async fn next(&mut self, wait: Duration) -> Option<Value> {
        tokio::time::timeout(wait, self.lines.recv())
            .await
            .ok()
            .flatten()
    }

    /// The response to request `id` (notifications in between are skipped).
    pub async fn response(&mut self, id: i64, wait: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(v) if v.get("id") == Some(&json!(id)) => return v,
                Some(v) if v.get("id").is_some() && v.get("method").is_none() => {
                    panic!("a response for another request arrived while waiting for {id}: {v}")
                }
                Some(_) => continue,
                None => panic!(
                    "no response to request {id} within {wait:?}\nbridge log:\n{}",
                    self.home.log()
                ),
            }
        }
    }

    /// `tools/call run_python` with `args`, returning the whole response.
    pub async fn run_python(&mut self, id: i64, args: Value) -> Value {
        self.send_json(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "run_python", "arguments": args}}))
            .await;
        self.response(id, Duration::from_secs(240)).await
    }

    /// Close stdin (EOF for the bridge).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Wait for the process to exit; `None` when it is still running after `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(within, self.child.wait())
            .await
            .ok()
            .map(|r| r.unwrap())
    }
}

/// The executable of a real test MCP server (`mcp-server-everything`, `mcp-server-time`, ...),
/// looked up in `MCP_BRIDGE_TEST_SERVERS_BIN` (a directory or a `:`-separated list) and then
/// `PATH`. Missing means failure, never a skip.
pub fn server_bin(name: &str) -> PathBuf {
    let mut dirs = Vec::new();
    if let Some(v) = std::env::var_os("MCP_BRIDGE_TEST_SERVERS_BIN") {
        dirs.extend(std::env::split_paths(&v));
    }
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|c| c.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found in MCP_BRIDGE_TEST_SERVERS_BIN or PATH; install the test servers \
             (scripts/setup-debian.sh --test-deps does), or: npm install -g \
             @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem; \
             pip install mcp-server-time mcp-server-git (and put the venv's bin/ in \
             MCP_BRIDGE_TEST_SERVERS_BIN)"
            )
        })
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS:`, `VmHWM:`, …); `None` when the process or the
/// field is gone.
pub fn proc_status_kib(pid: u32, key: &str) -> Option<u64> {
    read_proc_status_kib(pid, key).ok()
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS:`, `VmHWM:`, …), measured: panics with the path
/// and the error when it cannot be read, so a bound on it never passes without a measurement.
pub fn vm_kib(pid: u32, key: &str) -> u64 {
    read_proc_status_kib(pid, key).unwrap_or_else(|e| panic!("{e}"))
}

fn read_proc_status_kib(pid: u32, key: &str) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{path} has no {key} line with a number:\n{status}"))
}

/// File `v1` of `controller` (cgroup v1), or `v2` of the unified hierarchy where v1 has no such
/// controller, for the cgroup host process `pid` is in: what the host's kernel enforces and
/// counts for a container, whatever the sandbox shows inside (gVisor shows no cgroup files).
pub fn host_cgroup(pid: u32, controller: &str, v1: &str, v2: &str) -> String {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let mut unified = None;
    let mut file = None;
    for l in cg.lines() {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        if ctrls.is_empty() {
            unified = Some(format!("/sys/fs/cgroup{path}/{v2}"));
        } else if ctrls.split(',').any(|c| c == controller) {
            file = Some(format!("/sys/fs/cgroup/{ctrls}{path}/{v1}"));
            break;
        }
    }
    let file = file
        .or(unified)
        .unwrap_or_else(|| panic!("no {controller} cgroup: {cg}"));
    std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .trim()
        .to_string()
}

/// The host pid of container `id`'s first process.
pub async fn container_pid(id: &str) -> u32 {
    let pid = engine_cli(&["inspect", "--format", "{{.State.Pid}}", id]).await;
    pid.trim().parse().unwrap()
}

/// A `podman system service` the test owns, on a socket in `dir`.
pub struct Service {
    child: tokio::process::Child,
    pub url: String,
}

impl Service {
    pub async fn start(dir: &Path) -> Service {
        let sock = dir.join("podman.sock");
        let _ = std::fs::remove_file(&sock);
        let url = format!("unix://{}", sock.display());
        // Under gVisor, a service whose default runtime is gVisor's: podman's API ignores a
        // container's own runtime, so the bridge takes no other (SECURITY.md).
        let runtime: &[&str] = if isolation().as_deref() == Some("gvisor") {
            &["--runtime", "runsc"]
        } else {
            &[]
        };
        let child = tokio::process::Command::new("podman")
            .args(runtime)
            .args(["system", "service", "--time=0", &url])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("podman system service (podman must be installed)");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "podman system service did not listen"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Service { child, url }
    }

    pub async fn stop(mut self) {
        unsafe { libc::kill(self.child.id().unwrap() as i32, libc::SIGTERM) };
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

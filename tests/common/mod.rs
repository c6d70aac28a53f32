//! Test harness: the real `mcp-code-bridge` binary over stdio, driven by rmcp's real client,
//! against the real container engine. Nothing here fakes the bridge, the engine or the image:
//! when the image archive is not provided the tests fail, they never skip.
#![allow(dead_code)]

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

/// A private HOME/XDG tree so no user configuration leaks into a test.
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
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("bridge.log")).unwrap_or_default()
    }
    /// The environment a bridge process gets: only this tree, the image archive, and PATH.
    pub fn env(&self) -> Vec<(String, String)> {
        let h = self.path();
        vec![
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
            ("MCP_BRIDGE_LOG_LEVEL".into(), "debug".into()),
        ]
    }
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
        let log = std::fs::File::create(home.path().join("bridge.log")).unwrap();
        let mut all = home.env();
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let cwd = cwd
            .map(Path::to_path_buf)
            .unwrap_or_else(|| home.path().to_path_buf());
        let (transport, _) =
            TokioChildProcess::builder(tokio::process::Command::new(BIN).configure(|c| {
                c.arg("run")
                    .env_clear()
                    .envs(all.iter().map(|(k, v)| (k, v)))
                    .current_dir(&cwd);
            }))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn the bridge");
        let pid = transport.id().unwrap_or(0);
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
}

/// A `run_python` result with accessors for its structured content.
pub struct Outcome(pub CallToolResult);

impl Outcome {
    pub fn sc(&self) -> &Value {
        self.0
            .structured_content
            .as_ref()
            .expect("structuredContent present")
    }
    pub fn status(&self) -> &str {
        self.sc()["status"].as_str().unwrap_or("")
    }
    pub fn stdout(&self) -> &str {
        self.sc()["stdout"].as_str().unwrap_or("")
    }
    pub fn stderr(&self) -> &str {
        self.sc()["stderr"].as_str().unwrap_or("")
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
        self.sc()["error"]["type"].as_str().unwrap_or("")
    }
    pub fn is_error(&self) -> bool {
        self.0.is_error == Some(true)
    }
    /// Panics with the whole result when the run did not succeed.
    pub fn ok(self) -> Self {
        assert_eq!(self.status(), "ok", "run failed: {}", self.text());
        self
    }
}

/// Containers the engine has for this bridge process (by owner label prefix `pid:`).
pub async fn containers_of(pid: u32) -> Vec<String> {
    let out = tokio::process::Command::new("podman")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=io.mcp-code-bridge.managed=true",
            "--format",
            "{{.ID}} {{.Labels}}",
        ])
        .output()
        .await
        .expect("podman ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("io.mcp-code-bridge.owner:{pid}:")))
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect()
}

/// The bridge as an rmcp transport, for tests that need their own client handler.
pub fn transport(home: &Home, env: &[(&str, &str)]) -> TokioChildProcess {
    let log = std::fs::File::create(home.path().join("bridge.log")).unwrap();
    let mut all = home.env();
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let cwd = home.path().to_path_buf();
    let (transport, _) = TokioChildProcess::builder(tokio::process::Command::new(BIN).configure(|c| {
        c.arg("run").env_clear().envs(all.iter().map(|(k, v)| (k, v))).current_dir(&cwd);
    }))
    .stderr(Stdio::from(log))
    .spawn()
    .expect("spawn the bridge");
    transport
}

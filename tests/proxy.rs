//! Issue 3 end to end: the user's MCP servers proxied into the sandbox, through the real bridge
//! binary, rmcp's real client, real podman and the real reference servers
//! (`@modelcontextprotocol/server-everything` and `server-filesystem` from npm, `mcp-server-time`
//! and `mcp-server-git` from PyPI).
//!
//! The servers' executables are looked up in `MCP_BRIDGE_TEST_SERVERS_BIN` (one directory or a
//! `:`-separated list) and then `PATH`; a missing one fails the test (see tests/upstream_real.rs
//! for how to install them). Servers are configured the way users configure them: `[servers.x]`
//! tables in the bridge's TOML config in the private HOME, or `mcpServers` JSON files.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Bridge, Home, Outcome};
use serde_json::{Value, json};

/// The executable of a test server.
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
    panic!(
        "{name} not found in MCP_BRIDGE_TEST_SERVERS_BIN or PATH; install the test servers: \
         npm install -g @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem; \
         pip install mcp-server-time mcp-server-git (and put the venv's bin/ in MCP_BRIDGE_TEST_SERVERS_BIN)"
    )
}

/// A stdio server entry (JSON, as both the TOML tables and the `mcpServers` files take it).
fn stdio(bin: &str, args: &[&str]) -> Value {
    json!({"command": server_bin(bin), "args": args})
}

/// Write `[servers.<name>]` tables into the bridge's own config file of this HOME.
fn write_toml_servers(home: &Home, servers: &Value) {
    let dir = home.path().join(".config/mcp-code-bridge");
    std::fs::create_dir_all(&dir).unwrap();
    let text = toml::to_string(&json!({ "servers": servers })).expect("servers as TOML");
    std::fs::write(dir.join("config.toml"), text).unwrap();
}

/// A bridge whose TOML config defines `servers`.
async fn bridge_with(servers: Value) -> Bridge {
    let home = Home::new();
    write_toml_servers(&home, &servers);
    Bridge::start_with(home, &[], None).await
}

/// `run_python` with servers loaded (and the bridge's maximum timeout).
async fn py_with(b: &Bridge, servers: &[&str], code: &str) -> Outcome {
    Outcome(
        b.call(json!({"code": code, "servers": servers, "timeout": 120}))
            .await,
    )
}

/// Python string literal of a path.
fn pystr(p: &Path) -> String {
    serde_json::to_string(&p.to_string_lossy()).unwrap()
}

fn canonical_tempdir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("mcb-proxy-")
        .tempdir()
        .unwrap();
    let path = dir.path().canonicalize().unwrap();
    (dir, path)
}

/// Pids of the bridge's child processes whose command line contains `needle`.
fn children_matching(bridge_pid: u32, needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{bridge_pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) && !out.contains(&pid) {
                out.push(pid);
            }
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The last line of stdout parsed as JSON (tests print their findings as one JSON line).
fn last_json(o: &Outcome) -> Value {
    let line = o.stdout().lines().last().unwrap_or("");
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("last stdout line is not JSON ({e}):\n{}", o.text()))
}

// ------------------------------------------------------------------------------------------------

/// The workflow of the issue in ONE call: list a directory through the filesystem server, read
/// each CSV through it, combine them with pandas, print a summary.
#[tokio::test(flavor = "multi_thread")]
async fn csv_workflow_in_one_call_through_the_filesystem_server() {
    let (_dir, root) = canonical_tempdir();
    std::fs::write(
        root.join("north.csv"),
        "item,qty,price\napple,3,0.5\npear,2,0.75\nplum,10,0.2\n",
    )
    .unwrap();
    std::fs::write(
        root.join("south.csv"),
        "item,qty,price\napple,7,0.5\nfig,4,1.25\n",
    )
    .unwrap();
    std::fs::write(
        root.join("west.csv"),
        "item,qty,price\npear,6,0.75\nplum,5,0.2\nfig,1,1.25\napple,1,0.5\n",
    )
    .unwrap();
    std::fs::write(root.join("notes.txt"), "not a csv").unwrap();
    let b = bridge_with(json!({
        "filesystem": stdio("mcp-server-filesystem", &[root.to_str().unwrap()]),
    }))
    .await;

    let code = format!(
        r#"
import io, json
import pandas as pd
root = {root}
listing = await mcp_filesystem.list_directory(path=root)
text = listing["content"] if isinstance(listing, dict) else str(listing)
names = sorted(l.split("] ", 1)[1] for l in text.splitlines() if l.startswith("[FILE]") and l.endswith(".csv"))
frames = []
for name in names:
    body = await mcp_filesystem.read_text_file(path=root + "/" + name)
    body = body["content"] if isinstance(body, dict) else body
    df = pd.read_csv(io.StringIO(body))
    df["region"] = name[:-4]
    frames.append(df)
all_ = pd.concat(frames, ignore_index=True)
all_["revenue"] = all_["qty"] * all_["price"]
by_item = all_.groupby("item")["qty"].sum().to_dict()
by_region = all_.groupby("region")["revenue"].sum().round(2).to_dict()
print(json.dumps({{"files": names, "rows": len(all_), "qty": int(all_["qty"].sum()),
                  "revenue": round(float(all_["revenue"].sum()), 2),
                  "by_item": {{k: int(v) for k, v in by_item.items()}}, "by_region": by_region}}))
"#,
        root = pystr(&root)
    );
    let r = py_with(&b, &["filesystem"], &code).await.ok();
    let v = last_json(&r);
    assert_eq!(v["files"], json!(["north.csv", "south.csv", "west.csv"]));
    assert_eq!(v["rows"], 9);
    assert_eq!(v["qty"], 39);
    // north 1.5+1.5+2.0=5.0, south 3.5+5.0=8.5, west 4.5+1.0+1.25+0.5=7.25
    assert_eq!(v["revenue"], 20.75);
    assert_eq!(
        v["by_item"],
        json!({"apple": 11, "fig": 5, "pear": 8, "plum": 15})
    );
    assert_eq!(
        v["by_region"],
        json!({"north": 5.0, "south": 8.5, "west": 7.25})
    );
    b.shutdown().await;
}


/// Every tool of server-everything is reachable from Python: listed from inside, called with
/// real arguments, results as Python values (dicts, images, resources), `help()` shows the
/// signature, a wrong argument is a TypeError raised before any RPC, and tools the bridge's client
/// cannot serve fail with a clear McpError instead of hanging.
#[tokio::test(flavor = "multi_thread")]
async fn every_everything_tool_is_reachable_from_python() {
    let b = bridge_with(json!({"everything": stdio("mcp-server-everything", &[])})).await;
    let code = r#"
import json
from mcp import runtime
listed = [t["name"] for t in runtime.list_tools_sync("everything")]
docs = {d["tool"]: d for d in runtime.query_tool_docs_sync("everything", detail="full")}
ARGS = {
    "echo": {"message": "hello bridge"},
    "get-annotated-message": {"messageType": "success", "includeImage": True},
    "get-env": {},
    "get-resource-links": {"count": 3},
    "get-resource-reference": {"resourceType": "Text", "resourceId": 1},
    "get-structured-content": {"location": "Chicago"},
    "get-sum": {"a": 2, "b": 3.5},
    "get-tiny-image": {},
    "gzip-file-as-resource": {"name": "hello.gz", "data": "data:text/plain;base64,aGVsbG8=", "outputType": "resource"},
    "toggle-simulated-logging": {},
    "toggle-subscriber-updates": {},
    "trigger-long-running-operation": {"duration": 2, "steps": 2},
}
results, failed = {}, {}
for name in listed:
    try:
        results[name] = await runtime.call_tool("everything", name, ARGS.get(name, {}))
    except runtime.McpError as e:
        failed[name] = "%s: %s" % (type(e).__name__, e)
out = {"listed": listed, "failed": failed,
       "schemas": sorted(n for n, d in docs.items() if isinstance(d.get("inputSchema"), dict))}

echo = results["echo"]
out["echo"] = [echo, isinstance(echo, str), echo.mcp_result["content"][0]["type"]]
# The proxy objects: attribute, mcp_servers[...], and the import form give the same function.
from mcp.servers.everything import get_sum, echo as echo_fn
out["same_fn"] = echo_fn is mcp_everything.echo is mcp_servers["everything"].echo
out["proxy_echo"] = await mcp_everything.echo(message="via proxy")
out["sum"] = await get_sum(1, b=2)
s = results["get-structured-content"]
out["structured"] = [type(s).__name__, isinstance(s, dict), s["temperature"], s.mcp_result["structuredContent"] == dict(s)]
imgs = [x for x in results["get-tiny-image"] if isinstance(x, runtime.Image)]
out["image"] = [len(imgs), imgs[0].mime, imgs[0].data[:8] == b"\x89PNG\r\n\x1a\n", repr(imgs[0])] if imgs else None
ann = results["get-annotated-message"]
out["annotated"] = [type(x).__name__ for x in ann]
links = [x for x in results["get-resource-links"] if isinstance(x, runtime.Resource)]
out["links"] = [[l.type, l.uri] for l in links]
ref = [x for x in results["get-resource-reference"] if isinstance(x, runtime.Resource)]
out["embedded"] = [ref[0].type, ref[0].uri, ref[0].text.startswith("Resource 1")] if ref else None
gz = results["gzip-file-as-resource"]
import gzip
out["gzip"] = [type(gz).__name__, gz.uri, gzip.decompress(gz.blob).decode()]
out["long"] = str(results["trigger-long-running-operation"])
out["env_is_dict"] = isinstance(results["get-env"], dict)
out["others"] = {n: type(results[n]).__name__ for n in ("toggle-simulated-logging", "toggle-subscriber-updates")}

# Wrong arguments: TypeError when the function is called, before any coroutine (so any RPC) exists.
errors = []
for bad in (lambda: mcp_everything.echo(msg="x"), lambda: mcp_everything.echo(),
            lambda: mcp_everything.get_sum(1, 2, 3)):
    try:
        bad()
        errors.append("no error")
    except TypeError as e:
        errors.append("TypeError: %s" % e)
out["type_errors"] = errors
# A tool error is an exception carrying the server's message.
try:
    await mcp_everything.get_structured_content(location="Atlantis")
    out["tool_error"] = None
except runtime.McpToolError as e:
    out["tool_error"] = [type(e).__name__, str(e)[:300], e.mcp_result.get("isError")]
print(json.dumps(out))
"#;
    let r = py_with(&b, &["everything"], code).await.ok();
    let v = last_json(&r);
    let listed: BTreeSet<&str> = v["listed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for tool in [
        "echo",
        "get-annotated-message",
        "get-env",
        "get-resource-links",
        "get-resource-reference",
        "get-structured-content",
        "get-sum",
        "get-tiny-image",
        "gzip-file-as-resource",
        "toggle-simulated-logging",
        "toggle-subscriber-updates",
        "trigger-long-running-operation",
    ] {
        assert!(listed.contains(tool), "{tool} not listed: {listed:?}");
        assert!(
            v["failed"].get(tool).is_none(),
            "{tool} failed: {}",
            v["failed"][tool]
        );
    }
    assert_eq!(
        v["schemas"].as_array().unwrap().len(),
        listed.len(),
        "full docs carry every input schema: {v}"
    );
    // Tools needing client capabilities the bridge does not offer (tasks, elicitation,
    // sampling, roots) fail with a clear McpError naming the reason: they do not hang.
    for (tool, err) in v["failed"].as_object().unwrap() {
        let err = err.as_str().unwrap();
        assert!(err.starts_with("McpToolError: ") || err.starts_with("McpError: "));
        assert!(
            err.contains("task")
                || err.contains("sampling")
                || err.contains("elicitation")
                || err.contains("roots"),
            "{tool}: {err}"
        );
    }
    assert_eq!(v["echo"], json!(["Echo: hello bridge", true, "text"]));
    assert_eq!(v["same_fn"], true);
    assert_eq!(v["proxy_echo"], "Echo: via proxy");
    assert_eq!(v["sum"], "The sum of 1 and 2 is 3.");
    assert_eq!(v["structured"], json!(["ToolDict", true, 36, true]));
    assert_eq!(
        v["image"],
        json!([1, "image/png", true, "<Image image/png, 4033 bytes 20x20>"])
    );
    assert_eq!(v["annotated"], json!(["str", "Image"]));
    assert_eq!(v["links"].as_array().unwrap().len(), 3, "{}", v["links"]);
    for l in v["links"].as_array().unwrap() {
        assert_eq!(l[0], "resource_link");
        assert!(l[1].as_str().unwrap().starts_with("demo://resource/"), "{l}");
    }
    assert_eq!(v["embedded"][0], "resource");
    assert_eq!(v["embedded"][1], "demo://resource/dynamic/text/1");
    assert_eq!(v["embedded"][2], true);
    assert_eq!(
        v["gzip"],
        json!(["Resource", "demo://resource/session/hello.gz", "hello"])
    );
    assert!(
        v["long"]
            .as_str()
            .unwrap()
            .starts_with("Long running operation completed"),
        "{}",
        v["long"]
    );
    assert_eq!(v["env_is_dict"], true);
    assert_eq!(
        v["others"],
        json!({"toggle-simulated-logging": "ToolStr", "toggle-subscriber-updates": "ToolStr"})
    );
    let te = v["type_errors"].as_array().unwrap();
    assert!(
        te[0].as_str().unwrap().contains("unexpected keyword argument 'msg'"),
        "{te:?}"
    );
    assert!(
        te[1].as_str().unwrap().contains("missing 1 required") && te[1].as_str().unwrap().contains("'message'"),
        "{te:?}"
    );
    assert!(te[2].as_str().unwrap().starts_with("TypeError"), "{te:?}");
    assert_eq!(v["tool_error"][0], "McpToolError");
    assert!(
        v["tool_error"][1].as_str().unwrap().contains("location"),
        "the server's message is carried: {}",
        v["tool_error"]
    );
    assert_eq!(v["tool_error"][2], true);

    // help() shows the real signature and the parameter docs.
    let r = py_with(&b, &["everything"], "help(mcp_everything.echo)\nhelp(mcp_everything.get_sum)")
        .await
        .ok();
    let out = r.stdout();
    assert!(out.contains("async echo(message: str)"), "{out}");
    assert!(out.contains("message (str, required): Message to echo"), "{out}");
    assert!(out.contains("get_sum(a: float, b: float)"), "{out}");

    // display() of a tool's Image puts an MCP image into the run_python result.
    let r = py_with(
        &b,
        &["everything"],
        "from mcp import runtime\nimg = [x for x in await mcp_everything.get_tiny_image() if isinstance(x, runtime.Image)][0]\ndisplay(img)\nprint('shown')",
    )
    .await
    .ok();
    assert!(r.stdout().contains("shown"));
    let images: Vec<_> = r.0.content.iter().filter_map(|c| c.as_image()).collect();
    assert_eq!(images.len(), 1, "{:?}", r.0.content);
    assert_eq!(images[0].mime_type, "image/png");
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD
        .decode(&images[0].data)
        .expect("base64 image data");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(png.len(), 4033);
    b.shutdown().await;
}

/// mcp-server-time and mcp-server-git (PyPI) through the bridge.
#[tokio::test(flavor = "multi_thread")]
async fn time_and_git_servers_through_the_bridge() {
    let (_dir, repo) = canonical_tempdir();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .args(["-c", "user.name=Bridge Test", "-c", "user.email=t@example.com"])
            .args(args)
            .current_dir(&repo)
            .status()
            .unwrap();
        assert!(ok.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(repo.join("tracked.txt"), "one\n").unwrap();
    git(&["add", "tracked.txt"]);
    git(&["commit", "-q", "-m", "first commit through the bridge test"]);
    std::fs::write(repo.join("tracked.txt"), "one\ntwo\n").unwrap();
    std::fs::write(repo.join("untracked_file.txt"), "x").unwrap();

    let b = bridge_with(json!({
        "time": stdio("mcp-server-time", &["--local-timezone", "UTC"]),
        "git": stdio("mcp-server-git", &["--repository", repo.to_str().unwrap()]),
    }))
    .await;
    let code = format!(
        r#"
import json
repo = {repo}
now = await mcp_time.get_current_time(timezone="Europe/Warsaw")
conv = await mcp_time.convert_time(source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")
status = await mcp_git.git_status(repo_path=repo)
log = await mcp_git.git_log(repo_path=repo, max_count=5)
diff = await mcp_git.git_diff_unstaged(repo_path=repo)
print(json.dumps({{"now": [type(now).__name__, now.get("timezone"), "datetime" in now],
                  "tokyo": conv["target"]["datetime"][11:16],
                  "status": str(status), "log": str(log), "diff": str(diff)}}))
"#,
        repo = pystr(&repo)
    );
    let r = py_with(&b, &["time", "git"], &code).await.ok();
    let v = last_json(&r);
    assert_eq!(v["now"], json!(["ToolDict", "Europe/Warsaw", true]));
    assert_eq!(v["tokyo"], "21:00");
    let status = v["status"].as_str().unwrap();
    assert!(
        status.contains("untracked_file.txt") && status.contains("tracked.txt"),
        "{status}"
    );
    assert!(
        v["log"]
            .as_str()
            .unwrap()
            .contains("first commit through the bridge test"),
        "{}",
        v["log"]
    );
    assert!(v["diff"].as_str().unwrap().contains("+two"), "{}", v["diff"]);
    b.shutdown().await;
}

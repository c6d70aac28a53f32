//! The user's MCP servers proxied into the sandbox, through the real bridge
//! binary, rmcp's real client, real podman and the real reference servers
//! (`@modelcontextprotocol/server-everything` and `server-filesystem` from npm, `mcp-server-time`
//! and `mcp-server-git` from PyPI).
//!
//! The servers' executables are looked up in `MCP_BRIDGE_TEST_SERVERS_BIN` (one directory or a
//! `:`-separated list) and then `PATH`; a missing one fails the test (see tests/e2e/upstream_real.rs
//! for how to install them). Servers are configured the way users configure them: `[servers.x]`
//! tables in the bridge's TOML config in the private HOME, or `mcpServers` JSON files.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Bridge, Home, Outcome, process_alive as alive, server_bin, wait_until};
use serde_json::{Value, json};

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
    // The bridge must be there to be asked: no answer is not "no children".
    let tasks = std::fs::read_dir(format!("/proc/{bridge_pid}/task"))
        .unwrap_or_else(|e| panic!("cannot list the bridge's threads (pid {bridge_pid}): {e}"));
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
    "simulate-research-query": {"topic": "bridges"},
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
# A value the tool's schema forbids is refused by the bridge, naming the allowed ones (a tool's
# own error, McpToolError, is tests/e2e/schemas.rs's).
try:
    await mcp_everything.get_structured_content(location="Atlantis")
    out["tool_error"] = None
except runtime.McpError as e:
    out["tool_error"] = [type(e).__name__, str(e)[:300]]
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
    // Tools needing client capabilities the bridge does not offer (tasks, sampling, roots)
    // fail with a clear McpError naming the reason: they do not hang. (Elicitation is relayed
    // to the bridge's client, which here declares none: the server gets a decline.)
    // (`simulate-research-query` is registered after the handshake, so it may or may not be in
    // the first listing; when it is, it requires task augmentation.)
    if listed.contains("simulate-research-query") {
        let e = v["failed"]["simulate-research-query"]
            .as_str()
            .unwrap_or("");
        assert!(e.contains("requires task augmentation"), "{v}");
    }
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
        assert!(
            l[1].as_str().unwrap().starts_with("demo://resource/"),
            "{l}"
        );
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
        te[0]
            .as_str()
            .unwrap()
            .contains("unexpected keyword argument 'msg'"),
        "{te:?}"
    );
    assert!(
        te[1].as_str().unwrap().contains("missing 1 required")
            && te[1].as_str().unwrap().contains("'message'"),
        "{te:?}"
    );
    assert!(te[2].as_str().unwrap().starts_with("TypeError"), "{te:?}");
    assert_eq!(v["tool_error"][0], "McpError");
    assert!(
        v["tool_error"][1]
            .as_str()
            .unwrap()
            .contains("location: 'Atlantis' is not one of 'New York', 'Chicago', 'Los Angeles'"),
        "the allowed values are named: {}",
        v["tool_error"]
    );

    // help() shows the real signature and the parameter docs.
    let r = py_with(
        &b,
        &["everything"],
        "help(mcp_everything.echo)\nhelp(mcp_everything.get_sum)",
    )
    .await
    .ok();
    let out = r.stdout();
    assert!(out.contains("async echo(message: str)"), "{out}");
    assert!(
        out.contains("message (str, required): Message to echo"),
        "{out}"
    );
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
            .args([
                "-c",
                "user.name=Bridge Test",
                "-c",
                "user.email=t@example.com",
            ])
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
    assert!(
        v["diff"].as_str().unwrap().contains("+two"),
        "{}",
        v["diff"]
    );
    b.shutdown().await;
}

/// Discovery from inside the sandbox: every configured server is listed (loaded or not, from the
/// TOML and from `mcpServers` JSON files), search is ranked and fuzzy, full docs carry the input
/// schema, and a call to a server not loaded for this call says how to load it.
#[tokio::test(flavor = "multi_thread")]
async fn discovery_and_search_from_inside_the_sandbox() {
    let (_dir, root) = canonical_tempdir();
    let home = Home::new();
    write_toml_servers(
        &home,
        &json!({
            "time": stdio("mcp-server-time", &["--local-timezone", "UTC"]),
            "everything": stdio("mcp-server-everything", &[]),
        }),
    );
    // JSON discovery files in the temporary HOME and project directory.
    let mcps = home.path().join("MCPs");
    std::fs::create_dir_all(&mcps).unwrap();
    std::fs::write(
        mcps.join("files.json"),
        json!({"mcpServers": {"file-system": stdio("mcp-server-filesystem", &[root.to_str().unwrap()])}})
            .to_string(),
    )
    .unwrap();
    let project = home.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join(".mcp.json"),
        json!({"mcpServers": {"git": stdio("mcp-server-git", &[])}}).to_string(),
    )
    .unwrap();
    let b = Bridge::start_with(home, &[], Some(&project)).await;

    let code = r#"
import json
from mcp import runtime
out = {"discovered": list(runtime.discovered_servers()), "loaded": list(runtime.list_servers_sync()),
       "proxies": sorted(k for k in globals() if k.startswith("mcp_") and k != "mcp_servers")}
hits = await runtime.search_tool_docs("current time in a timezone")
out["hits"] = [[h["server"], h["tool"]] for h in hits]
out["hit0"] = hits[0]
out["fuzzy"] = [[h["server"], h["tool"]] for h in runtime.search_tool_docs_sync("curent tme in a timezon", limit=3)]
out["dir"] = [[h["server"], h["tool"]] for h in await runtime.search_tool_docs("list the files of a directory", limit=2)]
full = await runtime.query_tool_docs("time", detail="full")
out["full"] = {d["tool"]: sorted((d.get("inputSchema") or {}).get("properties", {})) for d in full}
summary = runtime.query_tool_docs_sync("time", tool="convert_time")
out["summary"] = [sorted(d) for d in summary]
out["by_alias"] = [d["tool"] for d in await runtime.query_tool_docs("file_system", tool="list_directory")]
out["list_tools"] = sorted(t["name"] for t in runtime.list_tools_sync("time"))
out["summary_text"] = runtime.capability_summary()
try:
    await runtime.call_tool("time", "get_current_time", {"timezone": "UTC"})
    out["call"] = None
except runtime.McpError as e:
    out["call"] = str(e)
try:
    from mcp.servers.time import get_current_time
    out["import"] = None
except ImportError as e:
    out["import"] = str(e)
try:
    runtime.describe_server("time")
    out["describe"] = None
except runtime.McpError as e:
    out["describe"] = str(e)
print(json.dumps(out))
"#;
    let r = py_with(&b, &[], code).await.ok();
    let v = last_json(&r);
    assert_eq!(
        v["discovered"],
        json!(["everything", "file-system", "git", "time"])
    );
    assert_eq!(v["loaded"], json!([]));
    assert_eq!(v["proxies"], json!([]));
    assert_eq!(v["hits"][0], json!(["time", "get_current_time"]), "{v}");
    assert_eq!(v["hit0"]["serverAlias"], "time");
    assert_eq!(v["hit0"]["toolAlias"], "get_current_time");
    assert!(v["hit0"]["score"].as_f64().unwrap() > 0.0);
    assert!(v["hit0"]["description"].as_str().unwrap().contains("time"));
    assert_eq!(
        v["fuzzy"][0],
        json!(["time", "get_current_time"]),
        "a misspelled query still ranks the time tool first: {}",
        v["fuzzy"]
    );
    assert_eq!(
        v["dir"][0],
        json!(["file-system", "list_directory"]),
        "{}",
        v["dir"]
    );
    assert_eq!(v["full"]["get_current_time"], json!(["timezone"]));
    assert_eq!(
        v["full"]["convert_time"],
        json!(["source_timezone", "target_timezone", "time"])
    );
    assert_eq!(
        v["summary"],
        json!([[
            "description",
            "parameters",
            "server",
            "serverAlias",
            "tool",
            "toolAlias"
        ]])
    );
    assert_eq!(v["by_alias"], json!(["list_directory"]));
    assert_eq!(v["list_tools"], json!(["convert_time", "get_current_time"]));
    let summary = v["summary_text"].as_str().unwrap();
    assert!(
        summary.contains("4 MCP server(s) discovered: everything, file-system, git, time"),
        "{summary}"
    );
    for key in ["call", "import", "describe"] {
        let e = v[key].as_str().unwrap_or_else(|| panic!("{key}: no error"));
        assert!(
            e.contains("not loaded") && e.contains(r#""servers": ["time"]"#),
            "{key}: {e}"
        );
    }

    // Loaded: the proxy exists for this call only.
    let r = py_with(
        &b,
        &["time"],
        "from mcp import runtime\nprint(sorted(await runtime.list_servers()), (await mcp_time.get_current_time(timezone='UTC'))['timezone'])",
    )
    .await
    .ok();
    assert_eq!(r.stdout().trim(), "['time'] UTC");
    let r = py_with(&b, &[], "print('mcp_time' in globals())")
        .await
        .ok();
    assert_eq!(r.stdout().trim(), "False");
    // The same server by its alias.
    let r = py_with(
        &b,
        &["file_system"],
        "print(type(mcp_file_system).__name__, 'list_directory' in dir(mcp_file_system))",
    )
    .await
    .ok();
    assert_eq!(r.stdout().trim(), "mcp_file_system True");
    // An unknown server is a clear error and the bridge keeps serving.
    let r = py_with(&b, &["nope"], "print(1)").await;
    assert!(r.is_error());
    let text = r.text();
    assert!(
        text.contains("'nope'") && text.contains("everything, file-system, git, time"),
        "{text}"
    );
    assert_eq!(r.sc()["error"]["type"], "UnknownServer", "{text}");
    let r = b.py("print(2)").await.ok();
    assert_eq!(r.stdout().trim(), "2");
    b.shutdown().await;
}

/// The standing context does not grow with the servers: `tools/list` is the same bytes with 0, 1
/// and 20 servers configured, and listing starts none of them.
#[tokio::test(flavor = "multi_thread")]
async fn tools_list_is_identical_for_0_1_and_20_servers() {
    let mut replies = Vec::new();
    for n in [0usize, 1, 20] {
        let servers: serde_json::Map<String, Value> = (0..n)
            .map(|i| {
                (
                    format!("time{i:02}"),
                    stdio("mcp-server-time", &["--local-timezone", "UTC"]),
                )
            })
            .collect();
        let b = bridge_with(Value::Object(servers)).await;
        let tools = b.client.list_all_tools().await.expect("tools/list");
        replies.push(serde_json::to_string(&tools).unwrap());
        // The servers are configured (the capabilities resource names them) but none started.
        let caps = b
            .client
            .read_resource(rmcp::model::ReadResourceRequestParams::new(
                "resource://mcp-code-bridge/capabilities",
            ))
            .await
            .unwrap();
        let caps = serde_json::to_string(&caps).unwrap();
        assert_eq!(caps.matches("(alias `mcp_time").count(), n, "{caps}");
        assert!(
            children_matching(b.pid, "mcp-server-time").is_empty(),
            "tools/list started an upstream server"
        );
        b.shutdown().await;
    }
    assert!(replies[0].contains("run_python"));
    assert_eq!(replies[0], replies[1]);
    assert_eq!(replies[0], replies[2]);
}

/// An upstream's secrets (`env`, `env_file`) reach the upstream and nothing in the sandbox:
/// not its environment, not the exec metadata, not /proc, not any readable file.
#[tokio::test(flavor = "multi_thread")]
async fn upstream_secrets_never_enter_the_sandbox() {
    let nonce = format!("{:x}", std::process::id() as u64 * 7919 + 12345);
    let secret = format!("s3cr3t-env-{nonce}");
    let file_secret = format!("s3cr3t-file-{nonce}");
    let (_dir, secrets_dir) = canonical_tempdir();
    let env_file = secrets_dir.join("everything.env");
    std::fs::write(&env_file, format!("FILE_TOKEN={file_secret}\n")).unwrap();
    let mut entry = stdio("mcp-server-everything", &[]);
    entry["env"] = json!({"SECRET_TOKEN": secret});
    entry["env_file"] = json!(env_file);
    entry["description"] = json!("reference server with secrets");
    let b = bridge_with(json!({"everything": entry})).await;

    // The code never spells the secrets (they are built reversed), so finding them anywhere
    // means they leaked.
    let rev = |s: &str| s.chars().rev().collect::<String>();
    let code = format!(
        r#"
import json, os, subprocess
from mcp import runtime
secrets = [{a}[::-1], {b}[::-1]]
found = []
def check(what, text):
    for s in secrets:
        if s in text:
            found.append(what)
check("os.environ", json.dumps(dict(os.environ)))
check("describe_server", json.dumps(runtime.describe_server("everything")))
check("metadata", json.dumps(runtime.list_loaded_server_metadata()))
check("docs", json.dumps(await runtime.query_tool_docs("everything", detail="full")))
check("capability_summary", runtime.capability_summary())
check("proxy doc", repr(mcp_everything) + (type(mcp_everything).__doc__ or ""))
environs = 0
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                check("/proc/%s/environ" % pid, f.read().decode("utf-8", "replace"))
            environs += 1
        except OSError:
            pass
with open("/proc/self/environ", "rb") as f:
    check("/proc/self/environ", f.read().decode("utf-8", "replace"))
with open("/proc/self/cmdline", "rb") as f:
    check("/proc/self/cmdline", f.read().decode("utf-8", "replace"))
# A canary proves the grep reads the tree (and the secrets' patterns work).
canary = "yranac-" + secrets[0][::-1][:8]
with open("/tmp/mcb-canary.txt", "w") as f:
    f.write(canary[::-1] + "\n")
tops = ["/" + d for d in sorted(os.listdir("/")) if d not in ("proc", "sys")]
args = ["grep", "-rlsF", "--devices=skip", "-e", canary[::-1]]
for s in secrets:
    args += ["-e", s]
g = subprocess.run(args + tops, capture_output=True, text=True)
hits = g.stdout.splitlines()
found += ["file " + l for l in hits if l != "/tmp/mcb-canary.txt"]
print(json.dumps({{"found": found, "environs": environs, "canary": "/tmp/mcb-canary.txt" in hits, "tops": tops}}))
"#,
        a = serde_json::to_string(&rev(&secret)).unwrap(),
        b = serde_json::to_string(&rev(&file_secret)).unwrap(),
    );
    let r = py_with(&b, &["everything"], &code).await.ok();
    let v = last_json(&r);
    assert_eq!(v["found"], json!([]), "secrets leaked into the sandbox");
    assert!(v["environs"].as_u64().unwrap() >= 1);
    assert_eq!(v["canary"], true, "the grep did not scan: {}", r.text());
    assert!(v["tops"].as_array().unwrap().contains(&json!("/usr")));
    let all = serde_json::to_string(&r.0).unwrap();
    assert!(!all.contains(&secret) && !all.contains(&file_secret));

    // The upstream itself got both: its get-env tool reports them (a tool result is the one
    // thing that may carry them in).
    let r = py_with(
        &b,
        &["everything"],
        "env = await mcp_everything.get_env()\nprint(env.get('SECRET_TOKEN', '')[:6], env.get('FILE_TOKEN', '')[:6], len(env.get('SECRET_TOKEN', '')))",
    )
    .await
    .ok();
    assert_eq!(r.stdout().trim(), format!("s3cr3t s3cr3t {}", secret.len()));
    let pids = children_matching(b.pid, "server-everything");
    assert_eq!(pids.len(), 1, "one everything child");
    let environ = std::fs::read(format!("/proc/{}/environ", pids[0])).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.contains(&format!("SECRET_TOKEN={secret}")));
    assert!(environ.contains(&format!("FILE_TOKEN={file_secret}")));
    b.shutdown().await;
}

/// An upstream killed between calls of a session is restarted by the next call, which succeeds;
/// the session's interpreter state survives.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_upstream_is_restarted_by_the_next_call() {
    let b = bridge_with(json!({"everything": stdio("mcp-server-everything", &[])})).await;
    let r = py_with(
        &b,
        &["everything"],
        "kept = 41\nprint(await mcp_everything.echo(message='one'))",
    )
    .await
    .ok();
    assert_eq!(r.stdout().trim(), "Echo: one");
    let pids = children_matching(b.pid, "server-everything");
    assert_eq!(pids.len(), 1, "one running upstream: {pids:?}");
    let first = pids[0];
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    wait_until("the upstream to die", Duration::from_secs(10), async || {
        !alive(first)
    })
    .await;

    let r = py_with(
        &b,
        &["everything"],
        "print(await mcp_everything.echo(message='two'), kept + 1)",
    )
    .await
    .ok();
    assert_eq!(r.stdout().trim(), "Echo: two 42");
    let pids = children_matching(b.pid, "server-everything");
    assert_eq!(pids.len(), 1, "{pids:?}");
    assert_ne!(pids[0], first, "a new upstream process");

    // Killed again, this time right before the call (the bridge has not noticed yet): the call
    // is retried on a fresh server or says the server crashed; either way the next call works.
    unsafe { libc::kill(pids[0] as i32, libc::SIGKILL) };
    let r = py_with(
        &b,
        &["everything"],
        "from mcp import runtime\ntry:\n    print(await mcp_everything.echo(message='three'))\nexcept runtime.McpError as e:\n    print('McpError', e)",
    )
    .await
    .ok();
    let out = r.stdout().trim().to_string();
    assert!(
        out == "Echo: three" || (out.starts_with("McpError") && out.contains("crashed")),
        "{out}"
    );
    let r = py_with(
        &b,
        &["everything"],
        "print(await mcp_everything.echo(message='four'))",
    )
    .await
    .ok();
    assert_eq!(r.stdout().trim(), "Echo: four");
    b.shutdown().await;
}

/// A Streamable HTTP upstream configured by `url` (in a JSON discovery file, with a header that
/// never reaches the sandbox).
#[tokio::test(flavor = "multi_thread")]
async fn an_http_upstream_through_the_bridge() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = tokio::process::Command::new(server_bin("mcp-server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the HTTP server did not listen"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let home = Home::new();
    let dir = home.path().join(".config/mcp/servers");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("remote.json"),
        json!({"mcpServers": {"everything-http": {
            "type": "http",
            "url": format!("http://127.0.0.1:{port}/mcp"),
            "headers": {"Authorization": "Bearer hdr-s3cr3t-4711"},
        }}})
        .to_string(),
    )
    .unwrap();
    let b = Bridge::start_with(home, &[], None).await;
    let code = r#"
import json
from mcp import runtime
out = {"echo": await mcp_everything_http.echo(message="over http"),
       "structured": dict(await mcp_everything_http.get_structured_content(location="New York")),
       "long": str(await mcp_everything_http.trigger_long_running_operation(duration=1, steps=2)),
       "meta": json.dumps(runtime.list_loaded_server_metadata())}
print(json.dumps(out))
"#;
    let r = py_with(&b, &["everything-http"], code).await.ok();
    let v = last_json(&r);
    assert_eq!(v["echo"], "Echo: over http");
    assert_eq!(v["structured"]["temperature"], 33);
    assert!(v["long"].as_str().unwrap().contains("completed"));
    assert!(!v["meta"].as_str().unwrap().contains("s3cr3t"));
    assert!(!serde_json::to_string(&r.0).unwrap().contains("s3cr3t"));
    b.shutdown().await;
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unchanged_server_metadata_is_sent_once_per_session() {
    let home = Home::new();
    write_toml_servers(
        &home,
        &json!({
            "time": stdio("mcp-server-time", &["--local-timezone", "UTC"]),
            "everything": stdio("mcp-server-everything", &["stdio"]),
        }),
    );
    let b = Bridge::start_with(home, &[("MCP_BRIDGE_LOG_LEVEL", "debug")], None).await;
    let both = ["time", "everything"];
    let echo = "r = await mcp_everything.echo(message='hi')\nprint(r, 'mcp_time' in globals())";
    let first = py_with(&b, &both, echo).await.ok();
    // Same servers again: the metadata is left out, the proxies are the same and still work,
    // and a proxy name the code deleted is bound again.
    let again = py_with(&b, &both, &format!("del mcp_time\n{echo}"))
        .await
        .ok();
    let third = py_with(&b, &both, echo).await.ok();
    assert_eq!(first.stdout(), again.stdout().replace("False", "True"));
    assert_eq!(third.stdout(), first.stdout());
    assert!(first.stdout().contains("hi"), "{}", first.stdout());
    // Different servers: sent, and they replace the previous ones.
    let r = py_with(
        &b,
        &["time"],
        "print('mcp_everything' in globals(), 'mcp_time' in globals())",
    )
    .await
    .ok();
    assert_eq!(r.stdout(), "False True\n");
    let r = py_with(&b, &both, echo).await.ok();
    assert_eq!(r.stdout(), first.stdout());

    let log = b.home.log();
    let sent: Vec<bool> = log
        .lines()
        .filter(|l| l.contains("exec sent"))
        .map(|l| l.contains("servers_sent=true"))
        .collect();
    assert_eq!(sent, [true, false, false, true, true], "{log}");
    b.shutdown().await;
}

/// A stdio server gets the documented base of the bridge's environment (PATH, HOME, locale,
/// XDG, ...) plus its declared `env`: the bridge's own `MCP_BRIDGE_*` settings and variables
/// nobody declared stay with the bridge. `inherit_env = true` (here in a TOML table; the other
/// server comes from an `mcpServers` JSON file) gives it the whole environment.
#[tokio::test(flavor = "multi_thread")]
async fn upstreams_get_the_base_environment_and_their_env_unless_they_inherit() {
    let home = Home::new();
    let mut base = common::misbehaving_server("normal", &[]);
    base["env"] = json!({"DECLARED": "yes"});
    let mut whole = base.clone();
    whole["inherit_env"] = json!(true);
    common::write_servers(&home, json!({ "base": base }));
    write_toml_servers(&home, &json!({ "whole": whole }));
    let b = Bridge::start_with(
        home,
        &[
            ("MCB_UNDECLARED", "secret"),
            ("LC_TIME", "C"),
            ("TZ", "UTC"),
        ],
        None,
    )
    .await;
    let code = "import json\nfor s in (mcp_base, mcp_whole):\n    e = await s.env()\n    e = e if isinstance(e, dict) else json.loads(e)\n    print(json.dumps(sorted(e)))";
    let r = py_with(&b, &["base", "whole"], code).await.ok();
    let names: Vec<BTreeSet<String>> = r
        .stdout()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let [base, whole] = &names[..] else {
        panic!("{}", r.text())
    };
    for n in [
        "PATH",
        "HOME",
        "XDG_CONFIG_HOME",
        "LC_TIME",
        "TZ",
        "DECLARED",
    ] {
        assert!(base.contains(n), "{n} missing from {base:?}");
    }
    assert!(!base.contains("MCB_UNDECLARED"), "{base:?}");
    assert!(
        !base.iter().any(|n| n.starts_with("MCP_BRIDGE_")),
        "{base:?}"
    );
    for n in ["MCB_UNDECLARED", "MCP_BRIDGE_LOG_LEVEL", "DECLARED", "PATH"] {
        assert!(whole.contains(n), "{n} missing from {whole:?}");
    }
    b.shutdown().await;
}

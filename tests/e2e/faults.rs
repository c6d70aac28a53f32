//! The faults: resource exhaustion inside the sandbox, upstream servers that misbehave
//! (`tests/fixtures/misbehaving_server.py`, a real process speaking stdio JSON-RPC badly on
//! purpose) and clients that misbehave (raw bytes on the bridge's stdin, concurrency,
//! cancellation). Each test asserts the clear outcome, that the bridge keeps serving, and that
//! nothing is left behind.

use crate::common;

use std::time::Duration;

use common::{Bridge, Home, Outcome, RawBridge, probe_lines};
use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest};
use rmcp::service::PeerRequestOptions;
use serde_json::{Value, json};

/// Await `call` on the fixture server; what it raised, as `TypeName message`.
async fn fx_raises(b: &Bridge, call: &str) -> String {
    let code = format!(
        "try:\n    r = await mcp_fx.{call}\n    print('no error', len(str(r)))\nexcept Exception as e:\n    print(type(e).__name__, e)"
    );
    b.fx(&code).await.ok().stdout().to_string()
}

/// The fixture server still answers `echo(text)`.
async fn assert_fx_echoes(b: &Bridge, text: &str) {
    let code = format!("print(await mcp_fx.echo(text={text:?}))");
    assert_eq!(b.fx(&code).await.ok().stdout(), format!("{text}\n"));
}

// ------------------------------------------------------------------------------------------
// Resources

#[tokio::test(flavor = "multi_thread")]
async fn resources_fork_bomb_hits_the_pids_limit() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_PIDS", "64")], None).await;
    let r = b
        .call(json!({"code": "import os\nwhile True:\n    os.fork()", "timeout": 60}))
        .await;
    let r = Outcome(r);
    if gvisor() {
        // Under gVisor (ptrace) a process of the code costs the sandbox's memory far more than
        // under runc (even children that only sleep): the memory limit ends the whole sandbox
        // before 64 processes, named as such (SECURITY.md, isolation levels). The pids limit
        // still holds threads (sandbox::pids_limit_is_reported) and is on the host (below).
        assert_eq!(r.status(), "crashed", "{}", r.text());
        assert_eq!(r.error_type(), "MemoryLimitExceeded", "{}", r.text());
    } else {
        assert_eq!(r.status(), "error", "{}", r.text());
        assert_eq!(r.error_type(), "BlockingIOError", "{}", r.text());
        assert!(r.text().contains("limit of 64"), "{}", r.text());
    }
    // A fresh interpreter is fine, under the same limit: inside the container's cgroup under
    // runc; under gVisor, the code's tasks are held to 64 by gVisor's kernel (nproc) and the
    // host's cgroup has room for gVisor's own threads on top (Config::host_pids_limit).
    let r = b
        .call(json!({"code": "import resource\nprint(resource.getrlimit(resource.RLIMIT_NPROC)[0])", "reset": true}))
        .await;
    let nproc = Outcome(r).ok().stdout().trim().to_string();
    let id = common::containers_of(b.pid)
        .await
        .pop()
        .expect("the session's container");
    let host = common::host_cgroup(
        common::container_pid(&id).await,
        "pids",
        "pids.max",
        "pids.max",
    );
    if gvisor() {
        assert_eq!((nproc.as_str(), host.as_str()), ("64", "576"));
    } else {
        assert_eq!(host, "64");
    }
    b.still_serving().await;
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_memory_bomb_is_named_and_only_the_sandbox_dies() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_MEMORY", "128m")], None).await;
    b.py("kept = 1").await.ok();
    let child = "import subprocess, sys\nrc = subprocess.run([sys.executable, '-c', 'x = b\"y\" * (1 << 30)']).returncode\nprint(rc, kept)";
    if gvisor() {
        // Under gVisor the host's OOM killer sees one process, gVisor's kernel, with every task
        // of the code inside it: a child's bomb ends the whole sandbox, named as such
        // (SECURITY.md, isolation levels).
        let r = b.py(child).await;
        assert_eq!(r.status(), "crashed", "{}", r.text());
        assert_eq!(r.error_type(), "MemoryLimitExceeded", "{}", r.text());
        b.py("kept = 1").await.ok();
    } else {
        // In a child process the OOM killer takes the child: the session survives.
        assert_eq!(b.py(child).await.ok().stdout(), "-9 1\n");
    }
    // In the interpreter itself the sandbox is killed, the reply names the limit, and the next
    // call starts fresh.
    let r = b.py("import numpy as np\na = np.ones(400_000_000)").await;
    assert_eq!(r.status(), "crashed", "{}", r.text());
    assert_eq!(r.error_type(), "MemoryLimitExceeded", "{}", r.text());
    assert!(r.text().contains("memory limit of 128m"), "{}", r.text());
    assert_eq!(r.sc()["session_reset"], true);
    b.assert_kept_is_gone().await;
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_tmpfs_fill_ends_in_enospc_or_the_memory_limit() {
    let b = Bridge::start_with(
        Home::new(),
        &[
            ("MCP_BRIDGE_MEMORY", "128m"),
            ("MCP_BRIDGE_TMP_SIZE", "16m"),
            ("MCP_BRIDGE_WORKSPACE_SIZE", "512m"),
        ],
        None,
    )
    .await;
    // Within its cap, a full /tmp is ENOSPC, and the session goes on.
    let fill = |dir: &str| {
        format!(
            "f = open('{dir}/fill', 'wb')\nwhile True:\n    f.write(b'\\0' * (1 << 20))\n    f.flush()"
        )
    };
    let r = b.py(&fill("/tmp")).await;
    assert_eq!(r.status(), "error", "{}", r.text());
    assert!(r.text().contains("No space left on device"), "{}", r.text());
    b.py("import os\nos.remove('/tmp/fill')").await.ok();
    // A tmpfs larger than the memory limit: its pages count against the memory cgroup, so
    // filling it is a memory exhaustion, reported as such.
    let r = b.py(&fill("/workspace")).await;
    assert_eq!(r.status(), "crashed", "{}", r.text());
    assert!(r.text().contains("memory limit of 128m"), "{}", r.text());
    b.still_serving().await;
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_cpu_spin_is_throttled_to_cpus() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_CPUS", "0.25")], None).await;
    b.py("pass").await.ok();
    // Measured on the host, from the container's cgroup: what the host's kernel counted and
    // throttled, under runc as under gVisor (whose kernel shows no cgroup files inside, and
    // whose own threads are in the same cgroup).
    let id = common::containers_of(b.pid)
        .await
        .pop()
        .expect("the session's container");
    let pid = common::container_pid(&id).await;
    let usage_ns = || -> f64 {
        let v1 = common::host_cgroup(pid, "cpuacct", "cpuacct.usage", "cpu.stat");
        match v1.lines().find_map(|l| l.strip_prefix("usage_usec ")) {
            Some(us) => us.trim().parse::<f64>().unwrap() * 1e3,
            None => v1.parse().unwrap(),
        }
    };
    let throttled = || -> u64 {
        let stat = common::host_cgroup(pid, "cpu", "cpu.stat", "cpu.stat");
        stat.lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // Two spinning processes for 3 s of wall time: unthrottled they would use ~2 CPUs.
    let code = r#"
import subprocess, sys, time
spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
time.sleep(3)
for s in spinners:
    s.kill()
    s.wait()
"#;
    let (u0, t0, w0) = (usage_ns(), throttled(), std::time::Instant::now());
    Outcome(b.call(json!({"code": code, "timeout": 30})).await).ok();
    let (u1, t1, wall) = (usage_ns(), throttled(), w0.elapsed().as_secs_f64());
    let used = (u1 - u0) / 1e9 / wall;
    // The quota is 0.25 CPU; the bound leaves room for accounting granularity only.
    assert!(used < 0.4, "used {used} CPUs with cpus=0.25 over {wall} s");
    assert!(wall >= 3.0, "{wall}");
    assert!(t1 > t0, "never throttled: {t0} -> {t1}");
    b.still_serving().await;
    b.shutdown_clean().await;
}

/// Whether this run's sandboxes are under gVisor (`MCP_BRIDGE_TEST_ISOLATION=gvisor`).
fn gvisor() -> bool {
    common::isolation().as_deref() == Some("gvisor")
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_deep_recursion_is_a_clear_error() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_MEMORY", "256m")], None).await;
    b.py("kept = 1").await.ok();
    let r = b.py("def f(n):\n    return f(n + 1)\nf(0)").await;
    assert_eq!(r.status(), "error");
    assert_eq!(r.error_type(), "RecursionError", "{}", r.text());
    assert_eq!(b.py("print(kept)").await.ok().stdout(), "1\n");
    // With the recursion limit lifted, the frames eat the memory limit instead: named, reset.
    let r = b
        .py("import sys\nsys.setrecursionlimit(10**8)\ndef g(n):\n    return g(n + 1)\ng(0)")
        .await;
    assert!(
        (r.status() == "crashed" && r.text().contains("memory limit of 256m"))
            || r.error_type() == "RecursionError"
            || r.error_type() == "MemoryError",
        "{}",
        r.text()
    );
    b.still_serving().await;
    b.shutdown_clean().await;
}

/// The whole stdout of a reply that carries a preview (over `output_budget`): the part kept as
/// a file, read by its link. Also checks that the reply itself is the preview it should be.
async fn whole_stdout(b: &Bridge, r: &Outcome) -> String {
    let kept = r.meta()["kept"]
        .as_array()
        .and_then(|k| k.iter().find(|k| k["part"] == "stdout"))
        .cloned()
        .unwrap_or_else(|| panic!("stdout was not kept whole: {}", r.text()));
    assert!(r.stdout().contains("bytes left out; the whole stdout is"));
    assert!(
        r.stdout().len() < 64 << 10,
        "{} bytes in the preview",
        r.stdout().len()
    );
    let c = b
        .client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            kept["uri"].as_str().unwrap(),
        ))
        .await
        .unwrap();
    match &c.contents[0] {
        rmcp::model::ResourceContents::TextResourceContents { text, .. } => text.clone(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_100mb_output_flood_is_capped_head_and_tail() {
    let b = Bridge::start().await;
    let code = "import sys\nprint('BEGIN')\nline = 'x' * 1023 + '\\n'\nfor _ in range(100 * 1024):\n    sys.stdout.write(line)\nprint('END')";
    let r = b.call(json!({"code": code, "timeout": 110})).await;
    let r = Outcome(r).ok();
    let out = whole_stdout(&b, &r).await;
    assert!(out.starts_with("BEGIN\n"), "{}", &out[..40]);
    assert!(out.ends_with("END\n"));
    assert!(out.contains("[output truncated:"), "no marker");
    // The default cap is 4 MiB; what is kept stays near it.
    assert!(out.len() < 5 << 20, "{} bytes came back", out.len());
    let total = 6 + 100 * 1024 * 1024 + 4;
    let truncated = r.sc()["truncated_bytes"].as_u64().unwrap() as usize;
    assert!(truncated > total - (5 << 20), "{truncated}");
    b.still_serving().await;
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_single_50mb_line_is_cut_not_lost() {
    let b = Bridge::start().await;
    let r = b
        .call(json!({"code": "print('A' + 'b' * 50_000_000 + 'Z')", "timeout": 110}))
        .await;
    let r = Outcome(r).ok();
    let out = whole_stdout(&b, &r).await;
    assert!(out.starts_with("Abbb"));
    assert!(out.ends_with("bbZ\n"), "{}", &out[out.len() - 20..]);
    assert!(out.contains("[output truncated:"));
    assert!(out.len() < 5 << 20, "{} bytes", out.len());
    assert!(r.sc()["truncated_bytes"].as_u64().unwrap() > 45_000_000);
    b.still_serving().await;
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_a_million_tiny_writes_are_all_accounted_for() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_OUTPUT_CAP", "256k")], None).await;
    // One write(2) each, through the fd: a million frames' worth if nothing coalesced them.
    let code = "import os\nfor i in range(1_000_000):\n    os.write(1, b'%d\\n' % i)";
    let r = b.call(json!({"code": code, "timeout": 110})).await;
    let r = Outcome(r).ok();
    let out = whole_stdout(&b, &r).await;
    let out = out.as_str();
    let total: usize = (0..1_000_000).map(|i: u32| i.to_string().len() + 1).sum();
    assert!(out.starts_with("0\n1\n2\n"));
    assert!(out.ends_with("999998\n999999\n"));
    let marker_start = out.find("\n… [output truncated:").expect("marker");
    let marker_end = marker_start + out[marker_start..].find("] …\n").unwrap() + "] …\n".len();
    let kept = out.len() - (marker_end - marker_start);
    let truncated = r.sc()["truncated_bytes"].as_u64().unwrap() as usize;
    // Every byte is either in the reply or counted as omitted: none lost, none invented.
    assert_eq!(
        kept + truncated,
        total,
        "kept {kept} + truncated {truncated}"
    );
    b.still_serving().await;
    b.shutdown_clean().await;
}

// ------------------------------------------------------------------------------------------
// Upstream faults

async fn fixture_pid(b: &Bridge) -> u32 {
    let r = b.fx("print(await mcp_fx.pid())").await.ok();
    r.stdout().trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_crash_mid_call_is_reported_and_the_server_restarted() {
    let b = Bridge::start_with(Home::with_fx("normal", &[]), &[], None).await;
    let first = fixture_pid(&b).await;
    let out = fx_raises(&b, "crash()").await;
    assert!(out.contains("crashed during the call of 'crash'"), "{out}");
    assert!(out.contains("restarted on the next call"));
    assert!(!common::process_alive(first), "the crashed server lingers");
    let second = fixture_pid(&b).await;
    assert_ne!(first, second);
    assert_fx_echoes(&b, "back").await;
    b.shutdown_clean().await;
    for _ in 0..50 {
        if !common::process_alive(second) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !common::process_alive(second),
        "upstream server outlived the bridge"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_hang_past_the_timeout_is_cancelled() {
    let b = Bridge::start_with(
        Home::with_fx("normal", &[]),
        &[("MCP_BRIDGE_UPSTREAM_CALL_TIMEOUT", "2s")],
        None,
    )
    .await;
    let out = fx_raises(&b, "hang()").await;
    assert!(out.contains("did not answer within 2s"), "{out}");
    // The server itself is fine: the next call answers.
    assert_fx_echoes(&b, "next").await;
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_malformed_json_rpc_is_an_error_not_a_hang() {
    let b = Bridge::start_with(
        Home::with_fx("normal", &[]),
        &[("MCP_BRIDGE_UPSTREAM_CALL_TIMEOUT", "3s")],
        None,
    )
    .await;
    let out = fx_raises(&b, "malformed()").await;
    assert!(
        out.starts_with("Mcp"),
        "a malformed reply must raise: {out}"
    );
    assert!(out.contains("'malformed'"), "{out}");
    assert_fx_echoes(&b, "ok").await;
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_replies_to_ids_never_asked_are_ignored() {
    let b = Bridge::start_with(Home::with_fx("normal", &[]), &[], None).await;
    let code = r#"
import asyncio
res = await asyncio.gather(*(mcp_fx.wrong_id(text=str(i)) for i in range(50)))
print("mismatched", [r for i, r in enumerate(res) if r != "right:%d" % i])
"#;
    let r = b.fx(code).await.ok();
    assert_eq!(r.stdout(), "mismatched []\n");
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_huge_results_arrive_whole_or_fail_clearly() {
    let b = Bridge::start_with(
        Home::with_fx("normal", &[]),
        &[("MCP_BRIDGE_UPSTREAM_CALL_TIMEOUT", "15s")],
        None,
    )
    .await;
    // 10 MB crosses both channels whole.
    let code = "r = await mcp_fx.big(mb=10)\nprint(isinstance(r, str), len(r), r[:3], r[-3:])";
    let r = b.fx(code).await.ok();
    assert_eq!(r.stdout(), format!("True {} BBB END\n", 10 << 20));
    // 50 MB is over the 16 MiB limit of one message over stdio: the call fails at once with an
    // McpError that names the tool and the limit, not with a timeout after 15 s.
    let out = fx_raises(&b, "big(mb=50)").await;
    assert!(
        out.starts_with("McpError") && out.contains("'big'") && out.contains("16 MiB"),
        "{out}"
    );
    assert!(
        !out.contains("did not answer"),
        "reported as a timeout: {out}"
    );
    // The server and the bridge carry on.
    assert_fx_echoes(&b, "next").await;
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_server_that_exits_at_start_is_a_clear_error() {
    let home = Home::new();
    common::write_servers(
        &home,
        json!({"dead": common::misbehaving_server("exit-at-start", &[]),
               "fx": common::misbehaving_server("normal", &[])}),
    );
    let b = Bridge::start_with(home, &[], None).await;
    let r = Outcome(
        b.call(json!({"code": "print(1)", "servers": ["dead"]}))
            .await,
    );
    assert!(r.is_error(), "{}", r.text());
    let text = r.text();
    assert!(text.contains("dead"), "{text}");
    assert!(
        text.contains("exiting at start as asked"),
        "the server's stderr should be quoted: {text}"
    );
    // The others still work, and so does a call without servers.
    assert_eq!(
        Outcome(
            b.call(json!({"code": "print(await mcp_fx.echo(text='alive'))", "servers": ["fx"]}))
                .await
        )
        .ok()
        .stdout(),
        "alive\n"
    );
    b.still_serving().await;
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_server_answering_garbage_at_start_is_a_clear_error() {
    let b = Bridge::start_with(Home::with_fx("garbage-start", &[]), &[], None).await;
    let r = Outcome(b.call(json!({"code": "print(1)", "servers": ["fx"]})).await);
    assert!(r.is_error(), "{}", r.text());
    assert!(r.text().contains("fx"), "{}", r.text());
    assert!(
        r.text().contains("wrote garbage instead of initialize"),
        "the server's stderr should be quoted: {}",
        r.text()
    );
    b.still_serving().await;
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_server_with_thousands_of_tools() {
    let b = Bridge::start_with(Home::with_fx("many-tools", &["5000"]), &[], None).await;
    let code = r#"
from mcp import runtime
tools = runtime.list_tools_sync("fx")
print("count", len(tools))
print("call", await mcp_fx.tool_04321(x=7))
hits = await runtime.search_tool_docs("tool_01234", limit=3)
print("search", hits[0]["tool"])
"#;
    let r = b.fx(code).await.ok();
    let p = probe_lines(r.stdout());
    assert_eq!(p["count"], "5000", "{}", r.stdout());
    assert_eq!(p["call"], r#"tool_04321:{"x": 7}"#);
    assert_eq!(p["search"], "tool_01234");
    // The standing context does not grow with them.
    let tools = b.client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 1);
    b.shutdown_clean().await;
}

// ------------------------------------------------------------------------------------------
// Client faults

#[tokio::test(flavor = "multi_thread")]
async fn client_malformed_json_rpc_on_stdin_is_survived() {
    let mut b = RawBridge::start(Home::new(), &[]).await;
    for garbage in [
        &b"not json at all"[..],
        b"{",
        b"\xff\xfe\x00\x01 binary",
        b"{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"tools/list\"",
    ] {
        b.send_line(garbage).await;
    }
    // Each unparsable line is answered "Parse error", with the null id JSON-RPC gives an
    // answer whose request cannot be read.
    for _ in 0..4 {
        let r = b
            .next(Duration::from_secs(10))
            .await
            .expect("a parse error");
        assert_eq!(r["error"]["code"], -32700, "{r}");
        assert!(r["id"].is_null(), "{r}");
    }
    assert_eq!(b.next(Duration::from_millis(300)).await, None);
    // Well-formed JSON that is not a message gets "Invalid request".
    for not_a_message in [
        json!([]),
        json!({"jsonrpc": "2.0"}),
        json!({"jsonrpc": "2.0", "id": 5, "method": 123}),
    ] {
        b.send_json(not_a_message.clone()).await;
        let r = b
            .next(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("no answer to {not_a_message}"));
        assert_eq!(r["error"]["code"], -32600, "{r}");
    }
    // And the bridge still serves, in order.
    b.send_json(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}))
        .await;
    let r = b.response(7, Duration::from_secs(10)).await;
    assert_eq!(r["result"]["tools"][0]["name"], "run_python");
    let r = b.run_python(8, json!({"code": "print('fine')"})).await;
    assert_eq!(common::structured(&r["result"])["stdout"], "fine\n", "{r}");
    b.close_stdin();
    assert!(b.wait_exit(Duration::from_secs(30)).await.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn client_unknown_methods_and_tools_get_clear_errors() {
    let mut b = RawBridge::start(Home::new(), &[]).await;
    b.send_json(json!({"jsonrpc": "2.0", "id": 1, "method": "foo/bar", "params": {}}))
        .await;
    let r = b.response(1, Duration::from_secs(10)).await;
    assert_eq!(r["error"]["code"], -32601, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("foo/bar") && msg.contains("tools/call"),
        "{msg}"
    );
    b.send_json(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "run_javascript", "arguments": {"code": "1"}}}))
        .await;
    let r = b.response(2, Duration::from_secs(10)).await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this server has one tool, \"run_python\""),
        "{r}"
    );
    b.send_json(
        json!({"jsonrpc": "2.0", "id": 3, "method": "resources/read",
        "params": {"uri": "file:///etc/passwd"}}),
    )
    .await;
    let r = b.response(3, Duration::from_secs(10)).await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("resource://mcp-code-bridge/capabilities"),
        "{r}"
    );
    // Notifications nobody knows are ignored without an answer.
    b.send_json(json!({"jsonrpc": "2.0", "method": "notifications/whatever"}))
        .await;
    let r = b.run_python(4, json!({"code": "print(4)"})).await;
    assert_eq!(common::structured(&r["result"])["stdout"], "4\n", "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn client_wrong_argument_types_are_refused_with_the_expected_shape() {
    let mut b = RawBridge::start(Home::new(), &[]).await;
    let cases: Vec<(Value, &str)> = vec![
        (json!({"code": 5}), "expected a string"),
        (json!({}), "missing field `code`"),
        (json!({"code": "1", "servers": "fx"}), "expected a sequence"),
        (json!({"code": "1", "timeout": "soon"}), "expected f64"),
        (json!({"code": "1", "reset": "yes"}), "expected a boolean"),
        (json!({"code": "1", "session": "../../etc"}), "`session`"),
        (json!({"code": "1", "sudo": true}), "unknown field `sudo`"),
    ];
    for (i, (args, want)) in cases.iter().enumerate() {
        let id = 10 + i as i64;
        let r = b.run_python(id, args.clone()).await;
        assert_eq!(r["error"]["code"], -32602, "{args}: {r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{args}: {msg}");
    }
    // `arguments` that is not an object at all.
    b.send_json(json!({"jsonrpc": "2.0", "id": 30, "method": "tools/call",
        "params": {"name": "run_python", "arguments": "print(1)"}}))
        .await;
    let r = b.response(30, Duration::from_secs(10)).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"arguments\""),
        "{r}"
    );
    // Too large is capped, not fatal (1e300 s once panicked the handler).
    let r = b
        .run_python(31, json!({"code": "print('t')", "timeout": 1e300}))
        .await;
    assert_eq!(common::structured(&r["result"])["stdout"], "t\n", "{r}");
    // Not positive is refused, saying what it must be.
    for (id, t) in [(32, json!(-5)), (33, json!(0))] {
        let r = b
            .run_python(id, json!({"code": "print('t')", "timeout": t}))
            .await;
        assert_eq!(r["error"]["code"], -32602, "{t}: {r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("positive number of seconds"),
            "{t}: {r}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn client_huge_code_is_refused_with_a_message() {
    let mut b = RawBridge::start(Home::new(), &[]).await;
    for (id, size) in [(1, 5usize << 20), (2, 20 << 20)] {
        let code = format!("#{}", "x".repeat(size));
        let r = b.run_python(id, json!({"code": code})).await;
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("the limit is 4194304") && msg.contains("smaller pieces"),
            "{size} bytes: {msg}"
        );
    }
    let r = b.run_python(3, json!({"code": "print('after')"})).await;
    assert_eq!(common::structured(&r["result"])["stdout"], "after\n", "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn client_concurrent_calls_to_one_session_are_serialized_and_matched() {
    let b = Bridge::start().await;
    b.py("counter = 0").await.ok();
    let calls = (0..12).map(|i| {
        let b = &b;
        async move {
            let code = format!(
                "import asyncio\nmine = counter\nawait asyncio.sleep(0.05)\ncounter = mine + 1\nprint('call', {i}, counter)"
            );
            (i, Outcome(b.call(json!({"code": code})).await))
        }
    });
    let results = futures::future::join_all(calls).await;
    let mut seen = Vec::new();
    for (i, r) in results {
        let r = r.ok();
        let out = r.stdout().to_string();
        let parts: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(
            parts[..2],
            ["call", &i.to_string()],
            "reply for the wrong call: {out}"
        );
        seen.push(parts[2].parse::<u32>().unwrap());
    }
    // One at a time: each saw the previous one's increment.
    seen.sort();
    assert_eq!(seen, (1..=12).collect::<Vec<_>>());
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_concurrent_calls_to_many_sessions_stay_apart() {
    // Counts the session containers exactly: no pool (tests/e2e/pool.rs counts the pool's).
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_POOL_SIZE", "0")], None).await;
    let calls = (0..6).flat_map(|s| (0..4).map(move |i| (s, i))).map(|(s, i)| {
        let b = &b;
        async move {
            let code = format!(
                "import os\nname = {s}\nseen = globals().setdefault('seen', [])\nseen.append({i})\nprint(name, {i}, os.uname().nodename)"
            );
            let r = Outcome(b.call(json!({"code": code, "session": format!("s{s}")})).await);
            (s, i, r)
        }
    });
    let results = futures::future::join_all(calls).await;
    let mut hosts = std::collections::BTreeMap::new();
    for (s, i, r) in results {
        let r = r.ok();
        let parts: Vec<String> = r.stdout().split_whitespace().map(String::from).collect();
        assert_eq!(parts[0], s.to_string(), "{}", r.stdout());
        assert_eq!(parts[1], i.to_string(), "{}", r.stdout());
        hosts
            .entry(s)
            .or_insert_with(Vec::new)
            .push(parts[2].clone());
    }
    // Each session is one container of its own.
    let distinct: std::collections::BTreeSet<&String> = hosts.values().flatten().collect();
    assert_eq!(distinct.len(), 6, "{hosts:?}");
    for v in hosts.values() {
        assert!(
            v.iter().all(|h| h == &v[0]),
            "a session changed container: {v:?}"
        );
    }
    for s in 0..6 {
        let r = Outcome(
            b.call(json!({"code": "print(sorted(seen))", "session": format!("s{s}")}))
                .await,
        )
        .ok();
        assert_eq!(r.stdout(), "[0, 1, 2, 3]\n", "session s{s}");
    }
    assert_eq!(common::containers_of(b.pid).await.len(), 6);
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_cancellation_interrupts_the_code_and_keeps_the_session() {
    // Counts the session containers exactly: no pool (tests/e2e/pool.rs counts the pool's).
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_POOL_SIZE", "0")], None).await;
    b.py("kept = 'yes'").await.ok();
    let code = "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    interrupted_by_cancel = True\n    raise";
    let params = CallToolRequestParams::new("run_python").with_arguments(
        json!({"code": code, "timeout": 100})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let handle = b
        .client
        .peer()
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    handle
        .cancel(Some("the user pressed stop".into()))
        .await
        .unwrap();
    // The next call waits for the cancelled one to stop, which the interrupt makes quick.
    let started = std::time::Instant::now();
    let r = b
        .py("print(kept, globals().get('interrupted_by_cancel'))")
        .await
        .ok();
    assert_eq!(r.stdout(), "yes True\n");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the cancelled code kept running"
    );
    assert_eq!(common::containers_of(b.pid).await.len(), 1);
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_closing_stdin_ends_the_bridge_and_its_containers() {
    // Counts the session containers exactly: no pool (tests/e2e/pool.rs counts the pool's).
    let mut b = RawBridge::start(Home::new(), &[("MCP_BRIDGE_POOL_SIZE", "0")]).await;
    let r = b.run_python(1, json!({"code": "print(1)"})).await;
    assert_eq!(common::structured(&r["result"])["stdout"], "1\n");
    let r = b
        .run_python(2, json!({"code": "print(2)", "session": "second"}))
        .await;
    assert_eq!(common::structured(&r["result"])["stdout"], "2\n");
    assert_eq!(common::containers_of(b.pid).await.len(), 2);
    // A call still running when stdin closes does not keep the bridge alive.
    b.send_json(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "run_python", "arguments": {"code": "import time\ntime.sleep(60)"}}}))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.close_stdin();
    let status = b
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the bridge did not exit after stdin closed");
    assert!(status.success(), "{status:?}\n{}", b.home.log());
    // It removed its containers itself: nothing left for a later bridge to reap.
    assert!(common::containers_of(b.pid).await.is_empty());
}

// ------------------------------------------------------------------------------------------
// Configuration faults

/// Durations written as TOML integers get the range check that strings get (`Secs::parse`
/// refuses more than 1e9 s); `timeout = 9223372036854775807` once panicked the bridge with
/// "overflow when adding duration to instant" at the first call.
#[test]
fn config_huge_integer_durations_are_refused_by_name() {
    let home = Home::new();
    let cfg = home.path().join("big.toml");
    std::fs::write(
        &cfg,
        "timeout = 9223372036854775807\nmax_timeout = 9223372036854775807\n",
    )
    .unwrap();
    let out = home
        .command()
        .args(["config", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "accepted: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Either bad key may be reported first; each is named with its file.
    assert!(
        (stderr.contains("`timeout`") || stderr.contains("`max_timeout`"))
            && stderr.contains("out of range")
            && stderr.contains("big.toml"),
        "{stderr}"
    );
}

/// What the code chose reaches the bridge's log (stderr) escaped as the command line's listings
/// escape it (`text::visible`): a `log` frame the code sends as the runtime would, and a fork
/// named with a right-to-left override, an isolate, a zero-width space and a line separator.
/// None of the four is written raw; each is there as its escape.
#[tokio::test(flavor = "multi_thread")]
async fn text_the_code_chose_reaches_the_log_escaped() {
    let b = Bridge::start_with(
        Home::new(),
        &[("MCP_BRIDGE_SNAPSHOT_MAX_SIZE", "64m")],
        None,
    )
    .await;
    let code = r#"
import sys
ch = next(m for n, m in list(sys.modules.items()) if n.endswith('.channel') and hasattr(m, 'send_bytes'))
ch.log('planted \u202e\u2066\u200b\u2028 end', 'warning')
from mcp import runtime
try:
    await runtime.fork('f\u202eork\u2066\u200b\u2028x')
    print('forked')
except Exception as e:
    print('refused', type(e).__name__)
print('done')
"#;
    let r = b.call(json!({"code": code})).await;
    let r = Outcome(r).ok();
    assert!(r.stdout().ends_with("done\n"), "{}", r.text());
    let home = b.shutdown_clean().await;
    let log = home.log();
    assert!(
        log.contains("runtime: planted \\u{202e}\\u{2066}\\u{200b}\\u{2028} end"),
        "{log}"
    );
    for raw in ['\u{202e}', '\u{2066}', '\u{200b}', '\u{2028}'] {
        assert!(
            !log.contains(raw),
            "U+{:04X} is in the log raw:\n{log}",
            raw as u32
        );
    }
}

/// A sandbox whose init cannot fork (`catatonit: failed to fork child: Resource temporarily
/// unavailable`): the uid the sandboxes run as (65534) already has 70 processes on the host,
/// over the sandbox's `RLIMIT_NPROC` (64 with `pids = 8`), so the container's first fork fails
/// with EAGAIN. That needs every sandbox the same host uid with the shared bound of
/// `allow_unenforced_limits` (`container::nproc_limit`): a `max_sessions` more than the
/// set-up's subordinate ids hold (32768 sandboxes) gives the first, so this test is the same
/// on podman with runc (which would otherwise give each sandbox a uid of its own) as on the
/// engines that never do. The reply names that cause and its fix, not the image's Python.
/// Needs root (to hold processes as uid 65534).
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_that_cannot_fork_at_start_is_diagnosed_as_the_process_limit() {
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: holding processes as uid 65534 needs root");
        return;
    }
    use std::os::unix::process::CommandExt;
    let mut held: Vec<std::process::Child> = (0..70)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("300")
                .uid(65534)
                .gid(65534)
                .spawn()
                .expect("a process as uid 65534")
        })
        .collect();
    let b = Bridge::start_with(
        Home::new(),
        &[
            ("MCP_BRIDGE_PIDS", "8"),
            ("MCP_BRIDGE_POOL_SIZE", "0"),
            ("MCP_BRIDGE_MAX_SESSIONS", "40000"),
            ("MCP_BRIDGE_ALLOW_UNENFORCED_LIMITS", "true"),
        ],
        None,
    )
    .await;
    let r = Outcome(b.call(json!({"code": "print(1)"})).await);
    for c in &mut held {
        let _ = c.kill();
        let _ = c.wait();
    }
    let text = r.text();
    assert!(r.is_error(), "{text}");
    assert!(
        text.contains("a limit on processes was reached"),
        "{text}\n{}",
        b.home.log_if_any()
    );
    assert!(
        text.contains("ulimit -u") && text.contains("`pids`"),
        "{text}"
    );
    assert!(!text.contains(">= 3.9"), "{text}");
    // With the processes gone, the next call starts its sandbox.
    let r = Outcome(b.call(json!({"code": "print(2)"})).await).ok();
    assert_eq!(r.stdout(), "2\n");
    b.shutdown().await;
}

//! The upstream pool against real MCP servers: `@modelcontextprotocol/server-everything` and
//! `@modelcontextprotocol/server-filesystem` (npm), `mcp-server-time` and `mcp-server-git` (PyPI).
//!
//! The servers' executables are looked up in `MCP_BRIDGE_TEST_SERVERS_BIN` (one directory or a
//! `:`-separated list) and then `PATH`. A missing server fails the test: install them with
//! `npm install -g @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem`
//! and `pip install mcp-server-time mcp-server-git` (a venv's `bin/` in
//! `MCP_BRIDGE_TEST_SERVERS_BIN` is fine).

use std::time::{Duration, Instant};

use crate::common;

use bridge_core::error::Hinted as _;
use bridge_upstream::{BindError, Discovery, ServerEntry, UpstreamSettings, Upstreams};
use common::{process_alive as alive, server_bin, wait_until};
use serde_json::{Value, json};

fn init_log() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("MCP_BRIDGE_TEST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

fn stdio(bin: &str, args: &[&str]) -> ServerEntry {
    ServerEntry {
        command: Some(server_bin(bin).to_string_lossy().into_owned()),
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn upstreams(entries: Vec<(&str, ServerEntry)>, settings: UpstreamSettings) -> Upstreams {
    init_log();
    Upstreams::new(
        Discovery::from_entries(entries.into_iter().map(|(n, e)| (n.to_string(), e))),
        settings,
    )
}

fn settings() -> UpstreamSettings {
    UpstreamSettings {
        call_timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

async fn call(
    rpc: &dyn bridge_core::protocol::RpcHandler,
    server: &str,
    tool: &str,
    args: Value,
) -> Result<Value, String> {
    rpc.handle(
        "call_tool",
        json!({"server": server, "tool": tool, "arguments": args}),
    )
    .await
    .map_err(|f| f.message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_stdio_echo_structured_image_links_progress_env() {
    let mut entry = stdio("mcp-server-everything", &[]);
    entry
        .env
        .insert("MCB_TEST_SECRET".into(), "hunter2-secret".into());
    entry.description = Some("The reference test server".into());
    let up = upstreams(vec![("everything", entry)], settings());

    let b = up.load(&["everything".into()]).await.unwrap();
    assert_eq!(b.servers.len(), 1);
    let s = &b.servers[0];
    assert_eq!(
        (s.name.as_str(), s.alias.as_str()),
        ("everything", "everything")
    );
    assert_eq!(s.description.as_deref(), Some("The reference test server"));
    let tiny = s
        .tools
        .iter()
        .find(|t| t.name == "get-tiny-image")
        .expect("get-tiny-image listed");
    assert_eq!(tiny.alias, "get_tiny_image");
    let structured = s
        .tools
        .iter()
        .find(|t| t.name == "get-structured-content")
        .unwrap();
    assert!(structured.output_schema.is_some(), "output schema kept");
    // No secret in anything that goes to the sandbox.
    let meta =
        serde_json::to_string(&b.servers).unwrap() + &serde_json::to_string(&b.discovered).unwrap();
    assert!(
        !meta.contains("hunter2"),
        "a secret leaked into the exec metadata"
    );

    let rpc = b.rpc.as_ref();
    assert_eq!(
        rpc.handle("list_servers", json!({})).await.unwrap(),
        json!(["everything"])
    );

    let r = call(
        rpc,
        "everything",
        "echo",
        json!({"message": "hello bridge"}),
    )
    .await
    .unwrap();
    assert_eq!(r["isError"], false);
    assert!(text_of(&r).contains("hello bridge"), "{r}");

    // By alias, the way the proxies call.
    let r = call(
        rpc,
        "everything",
        "get_structured_content",
        json!({"location": "Chicago"}),
    )
    .await
    .unwrap();
    assert_eq!(r["structuredContent"]["temperature"], 36, "{r}");

    let r = call(rpc, "everything", "get-tiny-image", json!({}))
        .await
        .unwrap();
    let image = r["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "image")
        .expect("an image block");
    assert_eq!(image["mimeType"], "image/png");
    assert!(image["data"].as_str().unwrap().len() > 100);

    let r = call(rpc, "everything", "get-resource-links", json!({"count": 3}))
        .await
        .unwrap();
    let links: Vec<&Value> = r["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "resource_link")
        .collect();
    assert_eq!(links.len(), 3, "{r}");
    assert!(links[0]["uri"].as_str().unwrap().contains("://"));

    let t = Instant::now();
    let r = call(
        rpc,
        "everything",
        "trigger-long-running-operation",
        json!({"duration": 2, "steps": 4}),
    )
    .await
    .unwrap();
    assert!(t.elapsed() >= Duration::from_secs(2));
    assert!(text_of(&r).to_lowercase().contains("completed"), "{r}");

    // The configured env reaches the child (and only the child).
    let r = call(rpc, "everything", "get-env", json!({})).await.unwrap();
    assert!(
        text_of(&r).contains("MCB_TEST_SECRET"),
        "env did not reach the server"
    );

    // A tool's own failure is a result with isError, not an RPC error.
    let r = call(rpc, "everything", "get-sum", json!({"a": "x"})).await;
    match r {
        Ok(v) => assert_eq!(v["isError"], true, "{v}"),
        Err(e) => assert!(e.contains("get-sum"), "{e}"),
    }
    // Unknown tools are the server's to refuse.
    let e = call(rpc, "everything", "no-such-tool", json!({})).await;
    assert!(
        matches!(&e, Err(m) if m.contains("no-such-tool"))
            || matches!(&e, Ok(v) if v["isError"] == true),
        "{e:?}"
    );

    // Docs and listing.
    let tools = rpc
        .handle("list_tools", json!({"server": "everything"}))
        .await
        .unwrap();
    assert!(
        tools
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "echo" && t["alias"] == "echo")
    );
    let docs = rpc
        .handle(
            "query_tool_docs",
            json!({"server": "everything", "tool": "get_sum", "detail": "full"}),
        )
        .await
        .unwrap();
    assert_eq!(docs[0]["tool"], "get-sum");
    assert_eq!(docs[0]["toolAlias"], "get_sum");
    assert!(docs[0]["inputSchema"]["properties"]["a"].is_object());
    let docs = rpc
        .handle("query_tool_docs", json!({"server": "everything"}))
        .await
        .unwrap();
    assert!(docs.as_array().unwrap().len() >= 10);
    assert!(docs[0].get("inputSchema").is_none());

    // server-everything registers `simulate-research-query` after initialization and sends
    // notifications/tools/list_changed: the cached list is refreshed and includes it.
    let pool = up.pool();
    wait_until(
        "the tool list refresh",
        Duration::from_secs(10),
        async || {
            pool.tool_list_changes("everything") >= 1
                && pool
                    .cached_tools("everything")
                    .is_some_and(|t| t.iter().any(|t| t.name == "simulate-research-query"))
        },
    )
    .await;
    let tools = rpc
        .handle("list_tools", json!({"server": "everything"}))
        .await
        .unwrap();
    assert!(
        tools
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["alias"] == "simulate_research_query")
    );

    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_lists_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("alpha.txt"), "a").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let root = dir.path().canonicalize().unwrap();
    let up = upstreams(
        vec![(
            "filesystem",
            stdio("mcp-server-filesystem", &[root.to_str().unwrap()]),
        )],
        settings(),
    );
    let b = up.load(&["filesystem".into()]).await.unwrap();
    let r = call(
        b.rpc.as_ref(),
        "filesystem",
        "list_directory",
        json!({"path": root}),
    )
    .await
    .unwrap();
    let text = text_of(&r);
    assert!(
        text.contains("[FILE] alpha.txt") && text.contains("[DIR] sub"),
        "{r}"
    );
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_gets_the_current_time() {
    let up = upstreams(
        vec![(
            "time",
            stdio("mcp-server-time", &["--local-timezone", "UTC"]),
        )],
        settings(),
    );
    let b = up.load(&["time".into()]).await.unwrap();
    let r = call(
        b.rpc.as_ref(),
        "time",
        "get_current_time",
        json!({"timezone": "Europe/Warsaw"}),
    )
    .await
    .unwrap();
    assert_eq!(r["isError"], false, "{r}");
    let all = r.to_string();
    assert!(
        all.contains("Europe/Warsaw") && all.contains("datetime"),
        "{r}"
    );
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_status_of_a_temp_repo() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().canonicalize().unwrap();
    let ok = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(&repo)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::write(repo.join("untracked_file.txt"), "x").unwrap();
    let up = upstreams(
        vec![(
            "git",
            stdio("mcp-server-git", &["--repository", repo.to_str().unwrap()]),
        )],
        settings(),
    );
    let b = up.load(&["git".into()]).await.unwrap();
    let r = call(
        b.rpc.as_ref(),
        "git",
        "git_status",
        json!({"repo_path": repo}),
    )
    .await
    .unwrap();
    assert!(text_of(&r).contains("untracked_file.txt"), "{r}");
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_restarted_by_the_next_call() {
    let up = upstreams(
        vec![("everything", stdio("mcp-server-everything", &[]))],
        settings(),
    );
    let b = up.load(&["everything".into()]).await.unwrap();
    let rpc = b.rpc.as_ref();
    call(rpc, "everything", "echo", json!({"message": "one"}))
        .await
        .unwrap();
    let pool = up.pool();
    let pid = pool.pid("everything").await.expect("a running child");
    assert_eq!(pool.starts("everything"), 1);

    // Killed between calls: the next call restarts it and succeeds.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_until(
        "the client to notice",
        Duration::from_secs(10),
        async || !pool.is_running("everything").await,
    )
    .await;
    let r = call(rpc, "everything", "echo", json!({"message": "two"}))
        .await
        .unwrap();
    assert!(text_of(&r).contains("two"));
    assert_eq!(pool.starts("everything"), 2);
    let pid2 = pool.pid("everything").await.unwrap();
    assert_ne!(pid, pid2);

    // Killed right before a call, before the client noticed: retried on a fresh server.
    unsafe { libc::kill(pid2 as i32, libc::SIGKILL) };
    let r = call(rpc, "everything", "echo", json!({"message": "three"})).await;
    assert!(
        matches!(&r, Ok(v) if text_of(v).contains("three"))
            || matches!(&r, Err(e) if e.contains("crashed")),
        "{r:?}"
    );

    // Killed during a call: that call fails saying so, the next one works.
    let _ = call(rpc, "everything", "echo", json!({"message": "warm"}))
        .await
        .unwrap();
    let pid3 = pool.pid("everything").await.unwrap();
    let slow = call(
        rpc,
        "everything",
        "trigger-long-running-operation",
        json!({"duration": 10, "steps": 10}),
    );
    let killer = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        unsafe { libc::kill(pid3 as i32, libc::SIGKILL) };
    };
    let (r, ()) = tokio::join!(slow, killer);
    let e = r.unwrap_err();
    assert!(e.contains("crashed") && e.contains("everything"), "{e}");
    let r = call(rpc, "everything", "echo", json!({"message": "four"}))
        .await
        .unwrap();
    assert!(text_of(&r).contains("four"));
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_streamable_http() {
    init_log();
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
    wait_until("the HTTP server", Duration::from_secs(30), async || {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;

    let entry = ServerEntry {
        url: Some(format!("http://127.0.0.1:{port}/mcp")),
        headers: [(
            "X-Bridge-Test".to_string(),
            "${MCB_HTTP_TEST_HEADER:-present}".to_string(),
        )]
        .into(),
        ..Default::default()
    };
    let up = upstreams(vec![("everything-http", entry)], settings());
    let b = up.load(&["everything-http".into()]).await.unwrap();
    assert_eq!(b.servers[0].alias, "everything_http");
    let rpc = b.rpc.as_ref();
    let r = call(
        rpc,
        "everything_http",
        "echo",
        json!({"message": "over http"}),
    )
    .await
    .unwrap();
    assert!(text_of(&r).contains("over http"), "{r}");
    let r = call(
        rpc,
        "everything-http",
        "get-structured-content",
        json!({"location": "New York"}),
    )
    .await
    .unwrap();
    assert_eq!(r["structuredContent"]["temperature"], 33);
    let r = call(
        rpc,
        "everything-http",
        "trigger-long-running-operation",
        json!({"duration": 1, "steps": 2}),
    )
    .await
    .unwrap();
    assert!(text_of(&r).to_lowercase().contains("completed"));
    up.shutdown().await;
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_one_warm_client() {
    let up = upstreams(
        vec![("everything", stdio("mcp-server-everything", &[]))],
        settings(),
    );
    let b = up.load(&["everything".into()]).await.unwrap();
    let rpc = b.rpc.as_ref();
    let t = Instant::now();
    let slow = (0..3).map(|_| {
        call(
            rpc,
            "everything",
            "trigger-long-running-operation",
            json!({"duration": 2, "steps": 2}),
        )
    });
    let fast = (0..12).map(|i| {
        call(
            rpc,
            "everything",
            "echo",
            json!({"message": format!("m{i}")}),
        )
    });
    let (slow, fast) = tokio::join!(
        futures::future::join_all(slow),
        futures::future::join_all(fast)
    );
    for (i, r) in fast.iter().enumerate() {
        assert!(text_of(r.as_ref().unwrap()).contains(&format!("m{i}")));
    }
    assert!(slow.iter().all(|r| r.is_ok()), "{slow:?}");
    assert!(
        t.elapsed() < Duration::from_millis(5500),
        "the slow calls ran one after another: {:?}",
        t.elapsed()
    );
    assert_eq!(up.pool().starts("everything"), 1);

    // Warm across binds (sessions): no new start.
    let b2 = up.load(&["everything".into()]).await.unwrap();
    call(
        b2.rpc.as_ref(),
        "everything",
        "echo",
        json!({"message": "again"}),
    )
    .await
    .unwrap();
    assert_eq!(up.pool().starts("everything"), 1);
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_covers_every_discovered_server_and_calls_need_loading() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstreams(
        vec![
            (
                "time",
                stdio("mcp-server-time", &["--local-timezone", "UTC"]),
            ),
            ("everything", stdio("mcp-server-everything", &[])),
            (
                "filesystem",
                stdio("mcp-server-filesystem", &[dir.path().to_str().unwrap()]),
            ),
            (
                "broken",
                ServerEntry {
                    command: Some("mcb-no-such-server-binary".into()),
                    ..Default::default()
                },
            ),
        ],
        settings(),
    );
    // Nothing loaded: docs and search still see every server.
    let b = up.load(&[]).await.unwrap();
    assert_eq!(b.discovered.len(), 4);
    let rpc = b.rpc.as_ref();
    let hits = rpc
        .handle(
            "search_tool_docs",
            json!({"query": "current time in a timezone", "limit": 5}),
        )
        .await
        .unwrap();
    // The server that cannot start is named among the skipped, with why.
    assert_eq!(hits["skipped"][0]["server"], "broken", "{hits}");
    let hits = hits["results"].as_array().unwrap();
    assert!(!hits.is_empty());
    assert_eq!(hits[0]["server"], "time", "{hits:?}");
    assert_eq!(hits[0]["tool"], "get_current_time", "{hits:?}");
    assert!(hits[0]["score"].as_f64().unwrap() > 0.0);
    assert_eq!(hits[0]["serverAlias"], "time");
    assert!(hits.iter().all(|h| h["server"] != "broken"));
    let hits = rpc
        .handle(
            "search_tool_docs",
            json!({"query": "list directory", "limit": 1}),
        )
        .await
        .unwrap();
    let hits = &hits["results"];
    assert_eq!(hits.as_array().unwrap().len(), 1);
    assert_eq!(hits[0]["tool"], "list_directory");
    let docs = rpc
        .handle(
            "query_tool_docs",
            json!({"server": "time", "tool": "convert_time", "detail": "full"}),
        )
        .await
        .unwrap();
    assert!(docs[0]["inputSchema"]["properties"]["source_timezone"].is_object());

    let e = call(rpc, "time", "get_current_time", json!({"timezone": "UTC"}))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        "Server 'time' is not loaded for this call; pass \"servers\": [\"time\"] to run_python to load it"
    );
    let e = up.load(&["broken".into()]).await.err().unwrap();
    assert!(matches!(e, BindError::Unavailable(_)), "{}", e.message());
    let e = e.message();
    assert!(e.contains("broken") && e.contains("not found"), "{e}");
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_calls_time_out_and_the_client_stays_usable() {
    let up = upstreams(
        vec![("everything", stdio("mcp-server-everything", &[]))],
        UpstreamSettings {
            call_timeout: Duration::from_secs(1),
            ..Default::default()
        },
    );
    let b = up.load(&["everything".into()]).await.unwrap();
    let rpc = b.rpc.as_ref();
    let t = Instant::now();
    let e = call(
        rpc,
        "everything",
        "trigger-long-running-operation",
        json!({"duration": 5, "steps": 5}),
    )
    .await
    .unwrap_err();
    assert!(e.contains("did not answer within 1s"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(4));
    let r = call(rpc, "everything", "echo", json!({"message": "still here"}))
        .await
        .unwrap();
    assert!(text_of(&r).contains("still here"));
    // A call abandoned by its caller (an interrupted exec) is cancelled; the client stays usable.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        call(
            rpc,
            "everything",
            "trigger-long-running-operation",
            json!({"duration": 3, "steps": 3}),
        ),
    )
    .await;
    assert!(abandoned.is_err());
    let r = call(
        rpc,
        "everything",
        "echo",
        json!({"message": "after abandon"}),
    )
    .await
    .unwrap();
    assert!(text_of(&r).contains("after abandon"));
    assert_eq!(up.pool().starts("everything"), 1);
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_servers_stop_and_come_back_and_shutdown_kills_them() {
    let up = upstreams(
        vec![("everything", stdio("mcp-server-everything", &[]))],
        UpstreamSettings {
            idle_timeout: Duration::from_millis(600),
            ..settings()
        },
    );
    let b = up.load(&["everything".into()]).await.unwrap();
    let rpc = b.rpc.as_ref();
    call(rpc, "everything", "echo", json!({"message": "x"}))
        .await
        .unwrap();
    let pid = up.pool().pid("everything").await.unwrap();
    wait_until("the idle stop", Duration::from_secs(15), async || {
        !alive(pid)
    })
    .await;
    assert!(!up.pool().is_running("everything").await);
    call(rpc, "everything", "echo", json!({"message": "y"}))
        .await
        .unwrap();
    assert_eq!(up.pool().starts("everything"), 2);
    let pid = up.pool().pid("everything").await.unwrap();
    up.shutdown().await;
    wait_until("the child to exit", Duration::from_secs(10), async || {
        !alive(pid)
    })
    .await;
    let e = call(rpc, "everything", "echo", json!({"message": "z"}))
        .await
        .unwrap_err();
    assert!(e.contains("shutting down"), "{e}");
}

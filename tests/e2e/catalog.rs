//! The persisted tool catalog against a real MCP server (`mcp-server-time`, looked up in
//! `MCP_BRIDGE_TEST_SERVERS_BIN` then `PATH`): a second start answers search and docs without
//! starting the server, a changed definition is a miss, a call starts the server and refreshes
//! the entry, a broken or hung server is skipped with a reason while the others answer, starts
//! are bounded (`hydrate_concurrency`), the file is 0600, and a corrupt file is rebuilt with a warning
//! (`servers --refresh`). Whether a server runs is read from the processes themselves: each
//! server here carries a marker in its environment.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common;

use bridge_upstream::store::{CATALOG_FILE, Store};
use bridge_upstream::{Discovery, ServerEntry, UpstreamSettings, Upstreams};
use common::{Home, Outcome, server_bin, wait_until, write_servers};
use serde_json::{Value, json};

fn init_log() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("MCP_BRIDGE_TEST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

/// A marker no other test's process carries.
fn marker() -> String {
    format!(
        "catalog-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ rand_ish()
    )
}

fn rand_ish() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// `mcp-server-time` with the marker in its environment (and `args`).
fn time_server(mark: &str, args: &[&str]) -> ServerEntry {
    let mut e = ServerEntry {
        command: Some(server_bin("mcp-server-time").to_string_lossy().into_owned()),
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    e.env.insert("MCB_CATALOG_MARK".into(), mark.into());
    e
}

fn shell(mark: &str, script: &str) -> ServerEntry {
    let mut e = ServerEntry {
        command: Some("sh".into()),
        args: vec!["-c".into(), script.into()],
        ..Default::default()
    };
    e.env.insert("MCB_CATALOG_MARK".into(), mark.into());
    e
}

/// How many live processes carry `MCB_CATALOG_MARK=<mark>`.
fn running(mark: &str) -> usize {
    let needle = format!("MCB_CATALOG_MARK={mark}");
    let dir = std::fs::read_dir("/proc").expect("list /proc");
    dir.filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            let pid: u32 = e.file_name().to_string_lossy().parse().unwrap();
            std::fs::read(e.path().join("environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
                && common::process_alive(pid)
        })
        .count()
}

/// Patient limits: the machine running the tests may be slow to start Python servers.
fn settings() -> UpstreamSettings {
    UpstreamSettings {
        call_timeout: Duration::from_secs(60),
        start_timeout: Duration::from_secs(120),
        search_wait: Duration::from_secs(120),
        ..Default::default()
    }
}

/// A bridge's upstream side over `entries`, its catalog in `state`.
fn bridge(
    state: &std::path::Path,
    entries: Vec<(&str, ServerEntry)>,
    s: UpstreamSettings,
) -> Upstreams {
    init_log();
    Upstreams::with_store(
        Discovery::from_entries(entries.into_iter().map(|(n, e)| (n.to_string(), e))),
        s,
        Some(Arc::new(Store::open(state))),
    )
}

async fn search(up: &Upstreams, query: &str) -> Value {
    let b = up.load(&[]).await.unwrap();
    b.rpc
        .handle("search_tool_docs", json!({"query": query, "limit": 5}))
        .await
        .unwrap()
}

fn hit_tools(found: &Value) -> Vec<(String, String)> {
    found["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["server"].as_str().unwrap().to_string(),
                h["tool"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_serves_search_and_docs_without_starting_the_server() {
    let state = tempfile::tempdir().unwrap();
    let mark = marker();
    let entries = || vec![("time", time_server(&mark, &[]))];

    // First start, cold: the search starts the server, lists it, and stops it again.
    let one = bridge(state.path(), entries(), settings());
    let found = search(&one, "convert time between timezones").await;
    assert!(
        hit_tools(&found).contains(&("time".into(), "convert_time".into())),
        "{found}"
    );
    assert_eq!(found["skipped"], json!([]));
    assert_eq!(one.pool().starts("time"), 1);
    wait_until(
        "the listing-only server to stop",
        Duration::from_secs(15),
        async || running(&mark) == 0,
    )
    .await;
    one.flush_catalog().await.unwrap();
    one.shutdown().await;
    let file = state.path().join(CATALOG_FILE);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "catalog file mode {mode:o}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(&mark), "an env value reached the catalog");

    // Second start: search, docs, the loaded server's signatures, all without a start.
    let two = bridge(state.path(), entries(), settings());
    let found = search(&two, "convert time between timezones").await;
    assert!(
        hit_tools(&found).contains(&("time".into(), "convert_time".into())),
        "{found}"
    );
    let b = two.load(&["time".into()]).await.unwrap();
    let names: Vec<&str> = b.servers[0].tools.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"get_current_time"), "{names:?}");
    let catalog = b.servers[0].catalog.clone().expect("catalog info");
    assert_eq!(catalog.source, "catalog");
    let docs = b
        .rpc
        .handle(
            "query_tool_docs",
            json!({"server": "time", "tool": "convert_time", "detail": "full"}),
        )
        .await
        .unwrap();
    assert!(
        docs[0]["inputSchema"]["properties"]["time"].is_object(),
        "{docs}"
    );
    let list = b
        .rpc
        .handle("list_tools", json!({"server": "time"}))
        .await
        .unwrap();
    assert_eq!(list.as_array().unwrap().len(), names.len());
    assert_eq!(two.pool().starts("time"), 0);
    assert!(!two.pool().is_running("time").await);
    assert_eq!(running(&mark), 0, "the server was started");

    // A call starts it, and the entry is refreshed from the running server.
    let r = b
        .rpc
        .handle(
            "call_tool",
            json!({"server": "time", "tool": "get_current_time", "arguments": {"timezone": "UTC"}}),
        )
        .await
        .unwrap();
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(two.pool().starts("time"), 1);
    assert_eq!(running(&mark), 1);
    wait_until(
        "the entry to be refreshed",
        Duration::from_secs(20),
        async || {
            let m = two.pool().catalog_meta("time").unwrap();
            !m.from_file && m.reported.is_some()
        },
    )
    .await;
    let meta = two.pool().catalog_meta("time").unwrap();
    assert!(meta.updated_at.unwrap() >= catalog.updated_at);
    assert_eq!(meta.reported.as_ref().unwrap().name, "mcp-time");
    two.shutdown().await;
    wait_until("the server to stop", Duration::from_secs(15), async || {
        running(&mark) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_definition_is_a_miss() {
    let state = tempfile::tempdir().unwrap();
    let mark = marker();
    let one = bridge(
        state.path(),
        vec![("time", time_server(&mark, &[]))],
        settings(),
    );
    search(&one, "time").await;
    one.flush_catalog().await.unwrap();
    one.shutdown().await;
    assert!(one.pool().cached_tools("time").is_some());

    // Same name, another argument: not served from the old entry.
    let changed = time_server(&mark, &["--local-timezone=Europe/Paris"]);
    let two = bridge(state.path(), vec![("time", changed)], settings());
    assert!(two.pool().cached_tools("time").is_none());
    assert_eq!(two.pool().catalog_meta("time").unwrap().updated_at, None);
    search(&two, "time").await;
    assert_eq!(two.pool().starts("time"), 1);
    two.shutdown().await;

    // Another env *value* is the same definition: a hit.
    let mut other_value = time_server(&mark, &[]);
    other_value
        .env
        .insert("MCB_CATALOG_MARK".into(), format!("{mark}-other"));
    let three = bridge(state.path(), vec![("time", other_value)], settings());
    assert!(three.pool().cached_tools("time").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_or_hung_server_is_skipped_with_a_reason_while_the_others_answer() {
    let state = tempfile::tempdir().unwrap();
    let mark = marker();
    // A search waits 15 s for servers without an entry; the hung one never answers.
    let s = UpstreamSettings {
        search_wait: Duration::from_secs(15),
        start_timeout: Duration::from_secs(20),
        ..settings()
    };
    let up = bridge(
        state.path(),
        vec![
            (
                "broken",
                shell(&mark, "echo 'fatal: no API key' >&2; exit 3"),
            ),
            ("hung", shell(&mark, "exec sleep 60")),
            ("time", time_server(&mark, &[])),
        ],
        s,
    );
    let t = Instant::now();
    let found = search(&up, "current time").await;
    let took = t.elapsed();
    assert!(
        hit_tools(&found).iter().any(|(s, _)| s == "time"),
        "{found}"
    );
    let skipped = found["skipped"].as_array().unwrap();
    let reason = |name: &str| {
        skipped
            .iter()
            .find(|s| s["server"] == name)
            .and_then(|s| s["reason"].as_str())
            .unwrap_or_else(|| panic!("{name} not skipped: {found}"))
            .to_string()
    };
    assert!(reason("broken").contains("fatal: no API key"), "{found}");
    assert!(
        reason("hung").contains("still starting after 15s"),
        "{found}"
    );
    assert_eq!(skipped.len(), 2, "{found}");
    // Bounded by the search's wait, not by the hung server.
    assert!(took < Duration::from_secs(25), "{took:?}");
    // The next search does not try them again, says why, and answers from the catalog.
    let again = search(&up, "current time").await;
    assert!(
        again["skipped"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("searches try it again"),
        "{again}"
    );
    assert!(hit_tools(&again).iter().any(|(s, _)| s == "time"));
    up.shutdown().await;
    wait_until(
        "every server to stop",
        Duration::from_secs(15),
        async || running(&mark) == 0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_search_starts_servers_a_few_at_a_time_and_leaves_none_running() {
    let state = tempfile::tempdir().unwrap();
    let mark = marker();
    let names: Vec<String> = (0..12).map(|i| format!("time{i:02}")).collect();
    let up = bridge(
        state.path(),
        names
            .iter()
            .map(|n| (n.as_str(), time_server(&mark, &[])))
            .collect(),
        settings(),
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (stop, mark) = (stop.clone(), mark.clone());
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                most = most.max(running(&mark));
                std::thread::sleep(Duration::from_millis(10));
            }
            most
        })
    };
    let found = search(&up, "convert time").await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let most = watcher.join().unwrap();
    let hits: std::collections::BTreeSet<String> =
        hit_tools(&found).into_iter().map(|(s, _)| s).collect();
    assert!(!hits.is_empty(), "{found}");
    assert_eq!(found["skipped"], json!([]), "{found}");
    for n in &names {
        assert_eq!(up.pool().starts(n), 1, "{n}");
    }
    let bound = bridge_upstream::hydrate_concurrency();
    assert!(most <= bound, "{most} servers ran at once, over {bound}");
    assert!(most >= 1, "the watcher saw no server");
    wait_until(
        "the listing-only servers to stop",
        Duration::from_secs(20),
        async || running(&mark) == 0,
    )
    .await;
    up.shutdown().await;
}

#[test]
fn servers_refresh_rebuilds_a_corrupt_catalog_with_a_warning() {
    let home = Home::new();
    let mark = marker();
    let time = server_bin("mcp-server-time");
    write_servers(
        &home,
        json!({
            "time": {"command": time, "env": {"MCB_CATALOG_MARK": mark}},
        }),
    );
    let state = home.path().join(".local/state/mcp-code-bridge");
    std::fs::create_dir_all(&state).unwrap();
    let file = state.join(CATALOG_FILE);
    std::fs::write(&file, b"{\"format\": \"mcp-code-bridge tool cat").unwrap();
    let out = home
        .command()
        .args(["servers", "--refresh"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("is not valid"), "{stderr}");
    assert!(stderr.contains("[1/1] time: 2 tool(s)"), "{stderr}");
    assert!(stderr.contains("1 of 1 server(s) listed"), "{stderr}");
    let text = std::fs::read_to_string(&file).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let entries = v["entries"].as_object().unwrap();
    assert_eq!(entries.len(), 1, "{text}");
    let entry = entries.values().next().unwrap();
    assert_eq!(entry["server"], "time");
    assert_eq!(entry["tools"].as_array().unwrap().len(), 2);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(running(&mark), 0, "refresh left the server running");

    // A foreign file is a warning too, and replaced.
    std::fs::write(&file, b"{\"mcpServers\": {}}").unwrap();
    let out = home
        .command()
        .args(["servers", "--refresh"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not a tool catalog"), "{stderr}");
    let v: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(v["entries"].as_object().unwrap().len(), 1);
}

/// Through the real bridge and sandbox: a second bridge in the same home answers the model's
/// search, docs and `describe_server()` with no server process, until a tool is called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_bridge_serves_the_sandbox_from_the_catalog() {
    use common::Bridge;
    let home = Home::new();
    let mark = marker();
    write_servers(
        &home,
        json!({
            "time": {"command": server_bin("mcp-server-time"), "env": {"MCB_CATALOG_MARK": mark}},
        }),
    );
    let search = "from mcp import runtime\nhits = await runtime.search_tool_docs('convert time between timezones')\nprint([h['tool'] for h in hits], list(hits.skipped))";

    let one = Bridge::start_with(home, &[], None).await;
    let out = one.py(search).await.ok();
    assert!(out.stdout().contains("convert_time"), "{}", out.text());
    assert!(out.stdout().contains("[]"), "{}", out.text());
    let Bridge { client, home, pid } = one;
    let _ = client.cancel().await;
    wait_until(
        "the first bridge to exit",
        Duration::from_secs(60),
        async || !common::process_alive(pid),
    )
    .await;
    assert_eq!(running(&mark), 0);

    let two = Bridge::start_with(home, &[], None).await;
    let out = two.py(search).await.ok();
    assert!(out.stdout().contains("convert_time"), "{}", out.text());
    let out = two
        .py("from mcp import runtime\nd = await runtime.query_tool_docs('time', tool='convert_time', detail='full')\nprint(sorted(d[0]['inputSchema']['properties']))")
        .await
        .ok();
    assert!(out.stdout().contains("'time'"), "{}", out.text());
    let out = Outcome(
        two.call(json!({
            "code": "from mcp import runtime\nd = runtime.describe_server('time')\nprint(d['catalog_source'], d['catalog_age_seconds'] >= 0, d['catalog_updated_at'] > 0)\nimport inspect\nprint(inspect.signature(mcp_time.convert_time))",
            "servers": ["time"],
        }))
        .await,
    )
    .ok();
    assert!(
        out.stdout().starts_with("catalog True True"),
        "{}",
        out.text()
    );
    assert!(out.stdout().contains("source_timezone"), "{}", out.text());
    assert_eq!(running(&mark), 0, "a server process was started");

    // Calling a tool starts it.
    let out = Outcome(
        two.call(json!({
            "code": "r = await mcp_time.get_current_time(timezone='UTC')\nprint('UTC' in str(r))",
            "servers": ["time"],
        }))
        .await,
    )
    .ok();
    assert!(out.stdout().contains("True"), "{}", out.text());
    assert_eq!(running(&mark), 1);
    two.shutdown_clean().await;
}

/// `mkfifo PATH`.
fn mkfifo(path: &std::path::Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

/// A FIFO where the catalog belongs does not block the bridge: `initialize` is answered, the
/// file is refused with a warning naming what it is, and the first listing replaces it with a
/// real catalog. A FIFO where its lock belongs fails the write with a warning instead of
/// hanging `servers --refresh`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_the_state_dir_is_refused_never_waited_on() {
    use common::Bridge;
    let home = Home::new();
    write_servers(
        &home,
        json!({"time": {"command": server_bin("mcp-server-time")}}),
    );
    let state = home.path().join(".local/state/mcp-code-bridge");
    std::fs::create_dir_all(&state).unwrap();
    let file = state.join(CATALOG_FILE);
    mkfifo(&file);
    let b = tokio::time::timeout(Duration::from_secs(60), Bridge::start_with(home, &[], None))
        .await
        .expect("initialize answered with a FIFO as the catalog");
    let log = b.home.log();
    assert!(
        log.contains("cannot read the tool catalog")
            && log.contains("it is a FIFO, not a regular file"),
        "{log}"
    );
    let out = b
        .py("from mcp import runtime\nhits = await runtime.search_tool_docs('convert time')\nprint([h['tool'] for h in hits])")
        .await
        .ok();
    assert!(out.stdout().contains("convert_time"), "{}", out.text());
    wait_until(
        "the catalog to be written",
        Duration::from_secs(20),
        async || std::fs::symlink_metadata(&file).is_ok_and(|m| m.is_file()),
    )
    .await;
    let home = b.home.dir.path().to_path_buf();
    let Bridge {
        client, home: h, ..
    } = b;
    let _ = client.cancel().await;

    std::fs::remove_file(state.join("catalog.lock")).ok();
    mkfifo(&state.join("catalog.lock"));
    std::fs::remove_file(&file).unwrap();
    let mut child = h
        .command()
        .args(["servers", "--refresh"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(home.join("refresh.err")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("servers --refresh waited on a FIFO lock");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = std::fs::read_to_string(home.join("refresh.err")).unwrap();
    // Listed, but not written: an error naming the lock, not a wait.
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("error: cannot write the tool catalog")
            && stderr.contains("it is a FIFO, not a regular file"),
        "{stderr}"
    );
}

//! Section 9, over HTTP: what a client of `serve` can make it hold with the default settings:
//! connections that never finish their headers (no token needed), tasks queued on one session,
//! and MCP sessions of one identity.

use super::*;

/// `http.max_connections` and `http.header_timeout` by default.
const MAX_CONNECTIONS: usize = 1024;
/// Refusals (503) `serve` writes at once beyond the cap, each closed within 0.5 s.
const REFUSING: usize = 64;
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The bench itself holds the attacking connections: its soft limit of open files goes up to the
/// hard one, as `serve` does its own.
fn raise_own_open_files() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain calls on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            l.rlim_cur = l.rlim_max.min(1 << 20);
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A raw `initialize` (2025-11-25): its status and the time to the answer's headers.
async fn initialize(http: &reqwest::Client, url: &str) -> (u16, f64) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"}}});
    let t = Instant::now();
    let status = match http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string())
        .send()
        .await
    {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    };
    (status, ms(t.elapsed()))
}

fn met(ok: bool) -> &'static str {
    if ok { "yes" } else { "**no**" }
}

pub(crate) async fn http_bounds(t: &mut Table) {
    raise_own_open_files();
    let home = Home::new(&[]);
    let (mut child, pid, url) = spawn_serve(&home, &[]).await;
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string();
    t.section(
        9,
        "9. Hostile sandbox (one session attacking the host; peaks above the idle bridge)",
    );

    // 1. 1 100 connections that never finish their headers.
    let idle_files = open_files(pid);
    let mut held = Vec::new();
    for _ in 0..1100 {
        match tokio::net::TcpStream::connect(&addr).await {
            Ok(mut s) => {
                let _ = s
                    .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
                    .await;
                held.push(s);
            }
            Err(e) => fail(&format!("connect: {e}")),
        }
    }
    let opened = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = open_files(pid).saturating_sub(idle_files);
    t.fact(
        "serve's open files (above idle) while 1 100 connections never finish their headers",
        "1",
        during.to_string(),
        &format!(
            "≤ {} (http.max_connections + {REFUSING} refusals being answered)",
            MAX_CONNECTIONS + REFUSING
        ),
        met(during <= MAX_CONNECTIONS + REFUSING),
    );
    let http = reqwest::Client::new();
    let (status, took) = initialize(&http, &url).await;
    t.fact(
        "a client's initialize meanwhile: answered",
        "1",
        format!("{status} in {took:.1} ms"),
        "503 within 1 s",
        met(status == 503 && took < 1000.0),
    );
    tokio::time::sleep((HEADER_TIMEOUT + Duration::from_secs(2)).saturating_sub(opened.elapsed()))
        .await;
    let mut buf = [0u8; 512];
    let still = held
        .iter()
        .filter(|s| {
            matches!(s.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count();
    t.fact(
        "of those connections, still open 2 s after http.header_timeout (10 s)",
        "1",
        still.to_string(),
        "0",
        met(still == 0),
    );
    drop(held);
    let (status, took) = initialize(&reqwest::Client::new(), &url).await;
    t.fact(
        "a client's initialize after them",
        "1",
        format!("{status} in {took:.1} ms"),
        "200",
        met(status == 200),
    );

    // 2. 120 tasks of 1 MiB of code on one session, behind one that sleeps.
    let client = {
        use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
        let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.as_str());
        match ClientConfig::new(
            ClientCapabilities::builder().enable_tasks().build(),
            Implementation::new("bench-tasks", "1"),
        )
        .serve(transport)
        .await
        {
            Ok(c) => c,
            Err(e) => fail(&format!("initialize over HTTP: {e}\n{}", home.log())),
        }
    };
    let start = async |code: String| -> Option<String> {
        use rmcp::model::{CallToolResponse, ClientCapabilities, RequestMetaObject};
        let mut params = CallToolRequestParams::new("run_python")
            .with_arguments(json!({"code": code}).as_object().cloned().unwrap());
        let mut meta = RequestMetaObject::new();
        meta.set_client_capabilities(ClientCapabilities::builder().enable_tasks().build());
        params.meta = Some(meta);
        match client.call_tool_once(params).await {
            Ok(CallToolResponse::Task(t)) => Some(t.task.task_id),
            _ => None,
        }
    };
    let mut ids: Vec<String> = start("import time; time.sleep(120)".into())
        .await
        .into_iter()
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = rss_mib(pid);
    reset_peak(pid);
    let big = format!("x = 1\n#{}\n", "x".repeat(1 << 20));
    let mut refused = 0;
    for _ in 0..120 {
        match start(big.clone()).await {
            Some(id) => ids.push(id),
            None => refused += 1,
        }
    }
    let queued = ids.len() - 1;
    let held_mib = rss_mib(pid) - idle;
    peak_row(
        t,
        &format!("peak: 120 × 1 MiB tasks on one session ({queued} queued, {refused} refused)"),
        peak_mib(pid) - idle,
    );
    t.fact(
        "RSS per queued 1 MiB task",
        &queued.to_string(),
        fmt(held_mib / queued.max(1) as f64, Unit::MiB),
        "",
        "",
    );
    for id in &ids {
        let _ = client
            .peer()
            .cancel_task(rmcp::model::CancelTaskParams::new(id.clone()))
            .await;
    }
    let _ = client.cancel().await;

    // 3. One identity opening 3 000 MCP sessions as fast as it can.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss_mib(pid);
    reset_peak(pid);
    let started = Instant::now();
    let (mut kept, mut refused) = (0, 0);
    for _ in 0..3000 {
        match initialize(&http, &url).await.0 {
            200 => kept += 1,
            _ => refused += 1,
        }
    }
    let took = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = rss_mib(pid) - idle;
    t.fact(
        &format!("3 000 initialize of one identity in {took:.1} s: sessions kept / refused"),
        "1",
        format!("{kept} / {refused}"),
        "≤ 32 kept (http.max_mcp_sessions_per_identity)",
        met(kept <= 32),
    );
    t.fact(
        "RSS per MCP session kept",
        &kept.to_string(),
        format!("{:.0} KiB", grown * 1024.0 / kept.max(1) as f64),
        "",
        "",
    );
    t.fact(
        "peak RSS above idle over the 3 000 initialize",
        "1",
        fmt(peak_mib(pid) - idle, Unit::MiB),
        "",
        "",
    );

    // SIGTERM: serve removes the task's container before it exits.
    // SAFETY: kill only sends a signal and touches no memory of ours. `pid` is `child`'s (from
    // `spawn_serve`), not yet reaped, so it still names that process.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
}

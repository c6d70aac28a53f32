//! Section 9: the hostile sandbox, what code attacking the host makes the bridge hold and write.

use super::*;

/// Python that finds the runtime and its real stdout (the frame channel), as `tests/e2e/hostile.rs`.
pub(crate) const RT: &str = "import sys, os, json, threading, time\nrt = sys.modules['__mcp_bridge_runtime__']\nfd = rt.state.frame_out\n";

/// Peak RSS of `pid` since its last reset, in MiB (`VmHWM`).
pub(crate) fn peak_mib(pid: u32) -> f64 {
    status_mib(pid, "VmHWM:")
}

/// Start a new peak: writing 5 to `clear_refs` resets `VmHWM` to the current RSS (Linux ≥ 4.0;
/// the bench runs as the bridge's user).
pub(crate) fn reset_peak(pid: u32) {
    if let Err(e) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5") {
        fail(&format!(
            "cannot reset the peak RSS of the bridge ({pid}): {e}"
        ));
    }
}

/// Bytes `pid` caused to be written to storage (`write_bytes` of `/proc/<pid>/io`).
pub(crate) fn disk_writes(pid: u32) -> u64 {
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
pub(crate) const SESSION_BOUND_MIB: f64 = 80.0;

pub(crate) fn peak_row(t: &mut Table, metric: &str, p: f64) {
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
pub(crate) async fn hostile(t: &mut Table) {
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
        "{RT}eid = rt.state.running.id\nframe = (json.dumps({{'type': 'output', 'id': eid, 'stream': 'stdout', 'data': 'y' * (8 << 20)}}) + '\\n').encode()\n\
def flood():\n    time.sleep(0.3)\n    for _ in range(128):\n        rt.channel.send_bytes(frame)\n    open('/tmp/flood-done', 'w').close()\n\
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
            "{RT}import base64\neid = rt.state.running.id\nprint('o' * (64 << 20))\n\
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

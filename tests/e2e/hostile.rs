//! The hostile sandbox: code that uses only what the sandbox already has (the runtime module in
//! `sys.modules`, the real channel fd, PID 1's fds, threads that outlive a call) tries to make the
//! host pay in disk, memory, log volume and time. Each test names the bound it attacks and
//! asserts it (SECURITY.md lists them).

use crate::common;

use std::time::{Duration, Instant};

use common::{Bridge, Outcome, containers_of, engine_cli, vm_kib};
use serde_json::json;

/// Python that finds the runtime and its real stdout (the frame channel).
/// `write_all(b)` writes all of `b` to the channel, under the runtime's write lock: a write to
/// it may be short (under gVisor a write to the container's stdout takes at most 64 KiB), and a
/// frame cut there would be garbage, not the attack meant.
const RT: &str = "import sys, os, json, threading, time\nrt = sys.modules['__mcp_bridge_runtime__']\nfd = rt.state.frame_out\n\
def write_all(b):\n    v = memoryview(b)\n    with rt.channel.write_lock:\n        while v:\n            v = v[os.write(fd, v):]\n";

/// What one session can make the bridge hold above idle, in MiB, with the default output cap
/// (SECURITY.md, "The host does not pay").
const SESSION_BOUND_MIB: u64 = 80;

/// The bytes of the files under `dir` (links not followed); panics when any cannot be read.
fn bytes_under(dir: &std::path::Path) -> u64 {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    entries
        .map(|e| {
            let e = e.unwrap_or_else(|err| panic!("cannot list {}: {err}", dir.display()));
            let m = std::fs::symlink_metadata(e.path())
                .unwrap_or_else(|err| panic!("cannot stat {}: {err}", e.path().display()));
            if m.is_dir() {
                bytes_under(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

/// Bytes written to the real stdout as lines that are not frames reach no file on the host: the
/// container has no log (the engine's log has no size limit and lies outside every tmpfs cap).
#[tokio::test(flavor = "multi_thread")]
async fn host_disk_junk_on_the_channel_is_not_persisted_by_the_engine() {
    let b = Bridge::start().await;
    let code = format!(
        "{RT}line = b'x' * 1023 + b'\\n'\nfor _ in range(64 * 1024):\n    os.write(fd, line)\nprint('done')"
    );
    let r = Outcome(b.call(json!({"code": code, "timeout": 60})).await);
    assert_eq!(r.stdout(), "done\n", "{}", r.text());
    // The session's container and a pooled one alike.
    let ids = containers_of(b.pid).await;
    assert!(!ids.is_empty());
    for id in &ids {
        let driver =
            engine_cli(&["inspect", "--format", "{{.HostConfig.LogConfig.Type}}", id]).await;
        let driver = driver.trim();
        assert_eq!(driver, "none", "{id}");
        // Where a log would be written: the path the driver names (none under `none`), and the
        // container's own directory, where podman's file driver keeps `ctr.log`. Both measured:
        // a path that cannot be looked at is no measurement.
        let path = engine_cli(&["inspect", "--format", "{{.HostConfig.LogConfig.Path}}", id]).await;
        let path = path.trim();
        if !path.is_empty() {
            let size = match std::fs::metadata(path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
                Err(e) => panic!("cannot stat the container log {path:?}: {e}"),
            };
            assert!(
                size < 1 << 20,
                "container log {path:?} holds {size} bytes after 64 MiB of junk"
            );
        }
        let dir = engine_cli(&["inspect", "--format", "{{.StaticDir}}", id]).await;
        let dir = std::path::Path::new(dir.trim());
        let size = bytes_under(dir);
        assert!(
            size < 1 << 20,
            "the container's directory {} holds {size} bytes after 64 MiB of junk",
            dir.display()
        );
    }
    b.shutdown().await;
}

/// Frames forged between calls by a thread that outlives its call are dropped as they arrive:
/// 1 GiB of well-formed output frames for a finished exec (sent whole, through the runtime's own
/// writer) leave the bridge's peak RSS bounded.
#[tokio::test(flavor = "multi_thread")]
async fn bridge_memory_frames_between_calls_are_dropped_at_arrival() {
    let b = Bridge::start().await;
    let code = format!(
        "{RT}eid = rt.state.running.id\nframe = (json.dumps({{'type': 'output', 'id': eid, 'stream': 'stdout', 'data': 'y' * (8 << 20)}}) + '\\n').encode()\n\
def flood():\n    time.sleep(0.5)\n    for _ in range(128):\n        rt.channel.send_bytes(frame)\n    open('/tmp/flood-done', 'w').close()\n\
threading.Thread(target=flood, daemon=True).start()"
    );
    Outcome(b.call(json!({"code": code})).await).ok();
    let idle = vm_kib(b.pid, "VmRSS:") >> 10;
    // No call runs meanwhile: everything the flood sends arrives between calls.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = b
            .py("import os\nprint(os.path.exists('/tmp/flood-done'))")
            .await
            .ok();
        if r.stdout() == "True\n" || Instant::now() > deadline {
            assert_eq!(r.stdout(), "True\n", "the flood did not finish");
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let peak = vm_kib(b.pid, "VmHWM:") >> 10;
    assert!(
        peak <= idle + SESSION_BOUND_MIB,
        "bridge peak RSS {peak} MiB (idle {idle} MiB) after 1 GiB of stale frames"
    );
    b.shutdown().await;
}

/// Tool calls whose answers are slow hold their arguments in the bridge: past 16 MiB in flight,
/// further calls are refused at once, with a message saying why, instead of held.
#[tokio::test(flavor = "multi_thread")]
async fn bridge_memory_pending_tool_call_arguments_are_bounded_in_bytes() {
    let home = common::Home::with_fx("normal", &[]);
    let b = Bridge::start_with(home, &[("MCP_BRIDGE_UPSTREAM_CALL_TIMEOUT", "3s")], None).await;
    b.py("pass").await.ok();
    let idle = vm_kib(b.pid, "VmRSS:") >> 10;
    let code = "import asyncio
from mcp import runtime
pad = 'z' * (1 << 20)
async def one():
    try:
        await runtime.call_tool('fx', 'hang', {'pad': pad})
        return 'answered'
    except Exception as e:
        return 'bytes' if 'bytes of tool-call arguments' in str(e) else 'other'
r = await asyncio.gather(*[one() for _ in range(200)])
print(r.count('bytes') > 100, r.count('bytes') < 200)";
    let r = Outcome(
        b.call(json!({"code": code, "servers": ["fx"], "timeout": 60}))
            .await,
    );
    assert_eq!(r.stdout(), "True True\n", "{}", r.text());
    let peak = vm_kib(b.pid, "VmHWM:") >> 10;
    assert!(
        peak <= idle + SESSION_BOUND_MIB,
        "bridge peak RSS {peak} MiB (idle {idle} MiB) with 200 MiB of arguments sent"
    );
    b.shutdown().await;
}

/// A sandbox that stops reading its stdin cannot hang the next call: the code is sent under
/// the call's deadline, and a sandbox that does not take it is killed and the session reset.
#[tokio::test(flavor = "multi_thread")]
async fn time_a_sandbox_that_stops_reading_cannot_hang_a_call() {
    let b = Bridge::start().await;
    let code = "import os, signal, threading, time\n\
def stop():\n    time.sleep(0.5)\n    os.kill(os.getpid(), signal.SIGSTOP)\n\
threading.Thread(target=stop, daemon=True).start()";
    Outcome(b.call(json!({"code": code})).await).ok();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let big = format!("x = '{}'\nprint(len(x))", "a".repeat(3 << 20));
    let t0 = Instant::now();
    let r = Outcome(b.call(json!({"code": big, "timeout": 2})).await);
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(2 + 3 + 10),
        "the call took {took:?}"
    );
    assert!(r.is_error(), "{}", r.text());
    assert_eq!(r.sc()["session_reset"], true, "{}", r.text());
    assert_eq!(b.py("print(1 + 1)").await.ok().stdout(), "2\n");
    b.shutdown().await;
}

/// Junk on the container's stderr (PID 1's fd 2) and forged log frames reach the bridge's log
/// rate-limited: 1 MB of junk lines adds at most a few KiB of log. Where each sandbox has a host
/// identity of its own (podman with runc: `--userns=auto`), the container's stderr is not even
/// the sandbox's to open (the engine's pipe belongs to an id its user namespace does not map):
/// the test asserts that, and the forged frames are what reach the log, limited.
#[tokio::test(flavor = "multi_thread")]
async fn host_logs_sandbox_junk_is_rate_limited() {
    let own_ids = common::engine() == "podman" && common::isolation().as_deref() != Some("gvisor");
    let b = Bridge::start().await;
    let before = b.home.log().len();
    let code = format!(
        "{RT}try:\n    err = os.open('/proc/1/fd/2', os.O_WRONLY)\nexcept PermissionError:\n    err = None\n\
if err is not None:\n    for i in range(20000):\n        os.write(err, b'junk line %d\\n' % i)\n\
for i in range(20000):\n    os.write(fd, (json.dumps({{'type': 'log', 'level': 'warning', 'message': 'forged %d' % i}}) + '\\n').encode())\n\
print('stderr', 'closed' if err is None else 'open')"
    );
    let r = Outcome(b.call(json!({"code": code, "timeout": 60})).await);
    let want = if own_ids {
        "stderr closed\n"
    } else {
        "stderr open\n"
    };
    assert_eq!(r.stdout(), want, "{}", r.text());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = b.home.log();
    let grown = log.len() - before;
    assert!(grown < 16 << 10, "the bridge's log grew by {grown} bytes");
    // Limited, not lost: the first lines of the junk (or of the forged frames, where the
    // container's stderr is closed to the sandbox) did reach the log.
    let first = if own_ids { "forged 0" } else { "junk line" };
    assert!(
        log[before..].contains(first),
        "none of the sandbox's {first:?} reached the log:\n{}",
        &log[before..]
    );
    b.shutdown().await;
}

/// Only real images of allowed types come back as image content; display() of text is shown as
/// text, and forged display frames are refused with one notice.
#[tokio::test(flavor = "multi_thread")]
async fn images_are_checked_and_text_displays_are_kept() {
    let b = Bridge::start().await;
    let code = format!(
        "{RT}eid = rt.state.running.id\n\
def forge(mime, data):\n    write_all((json.dumps({{'type': 'display', 'id': eid, 'mime': mime, 'data': data}}) + '\\n').encode())\n\
forge('image/svg+xml', 'PHN2Zz48L3N2Zz4=')\nforge('image/png', '!!! not base64 !!!')\nforge('image/png', 'aGVsbG8=')\n\
display('some text')\ndisplay({{'a': 1}})"
    );
    let r = b.call(json!({"code": code})).await;
    let images = r.content.iter().filter(|c| c.as_image().is_some()).count();
    let r = Outcome(r);
    assert_eq!(images, 0, "{}", r.text());
    assert!(
        r.stdout().contains("some text\n") && r.stdout().contains("{'a': 1}"),
        "{}",
        r.text()
    );
    assert!(
        r.text()
            .contains("3 image(s) from display() were not returned"),
        "{}",
        r.text()
    );
    b.shutdown().await;
}

/// A reply stays readable: 16 images of the largest size each would make a 128 MiB message, more
/// than stdio clients read (rmcp's limit is 16 MiB); the images of one reply are capped in total
/// bytes, the rest refused with a notice, and the reply arrives.
#[tokio::test(flavor = "multi_thread")]
async fn replies_stay_readable_images_are_capped_in_total_bytes() {
    let b = Bridge::start().await;
    let code = format!(
        "{RT}import base64\neid = rt.state.running.id\n\
png = base64.b64encode(b'\\x89PNG\\r\\n\\x1a\\n' + b'\\0' * ((6 << 20) - 8)).decode()\n\
for _ in range(16):\n    write_all((json.dumps({{'type': 'display', 'id': eid, 'mime': 'image/png', 'data': png}}) + '\\n').encode())\n\
print('sent')"
    );
    b.py("pass").await.ok();
    let idle = vm_kib(b.pid, "VmRSS:") >> 10;
    let r = b.call(json!({"code": code, "timeout": 60})).await;
    let peak = vm_kib(b.pid, "VmHWM:") >> 10;
    assert!(
        peak <= idle + SESSION_BOUND_MIB,
        "bridge peak RSS {peak} MiB (idle {idle} MiB) for a reply of 16 largest images"
    );
    let bytes: usize = r
        .content
        .iter()
        .filter_map(|c| c.as_image().map(|i| i.data.len()))
        .sum();
    let r = Outcome(r);
    assert_eq!(r.stdout(), "sent\n", "{}", r.text());
    assert!(bytes > 0 && bytes <= 12 << 20, "{bytes} bytes of images");
    // The images past the reply's total are files with links, not dropped.
    assert!(
        r.text()
            .contains("image(s) from display() are files instead of images")
            && r.text().contains("total"),
        "{}",
        r.text()
    );
    let links =
        r.0.content
            .iter()
            .filter(|c| matches!(c, rmcp::model::ContentBlock::ResourceLink(_)))
            .count();
    let shown = r.meta()["images"].as_u64().unwrap() as usize;
    assert_eq!(shown + links, 16, "{shown} shown, {links} links");
    b.shutdown().await;
}

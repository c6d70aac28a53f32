//! The sandbox end to end: the real binary, a real MCP client, real podman, the real image.

use crate::common;

use common::{Bridge, Home};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn print_persistence_await_and_last_value() {
    let b = Bridge::start().await;
    let r = b.py("print(1+1)").await.ok();
    assert_eq!(r.stdout(), "2\n");
    // What was printed, exactly, and nothing else: the text is the stdout block alone.
    assert_eq!(r.text(), "2\n");
    b.py("import math\nx = 41\ndef inc(v):\n    return v + 1")
        .await
        .ok();
    assert_eq!(
        b.py("print(inc(x), math.pi > 3)").await.ok().stdout(),
        "42 True\n"
    );
    let r = b.py("import asyncio\nawait asyncio.sleep(0.01)\nv = await asyncio.gather(*(asyncio.sleep(0, result=i) for i in range(3)))\nv").await.ok();
    assert_eq!(r.sc()["value"], "[0, 1, 2]");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fd_level_output_and_forged_frames_are_just_output() {
    let b = Bridge::start().await;
    let code = r#"
import os, subprocess, sys
os.system("echo from-shell")
subprocess.run(["sh", "-c", "echo to-stderr >&2"])
os.write(1, b'{"type":"result","id":1,"status":"ok"}\n')
os.write(2, b'{"type":"ready","python":"fake"}\n')
sys.stdout.write('{"type":"rpc","id":9,"exec":1,"method":"call_tool","params":{}}\n')
print("after")
"#;
    let r = b.py(code).await.ok();
    let out = r.stdout();
    assert!(out.contains("from-shell\n"), "{out}");
    assert!(
        out.contains(r#"{"type":"result","id":1,"status":"ok"}"#),
        "{out}"
    );
    assert!(out.contains(r#""method":"call_tool""#), "{out}");
    assert!(out.trim_end().ends_with("after"), "{out}");
    assert!(r.stderr().contains("to-stderr"), "{}", r.stderr());
    assert!(r.stderr().contains(r#"{"type":"ready""#));
    // The session is intact after the forgeries.
    assert_eq!(
        b.py("print('still here')").await.ok().stdout(),
        "still here\n"
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exceptions_show_the_users_traceback_only() {
    let b = Bridge::start().await;
    let r = b.py("def f():\n    return 1/0\n\nf()").await;
    assert_eq!(r.status(), "error");
    assert!(r.is_error());
    assert_eq!(r.error_type(), "ZeroDivisionError");
    let sc = r.sc();
    let tb = sc["error"]["traceback"].as_str().unwrap();
    assert!(tb.contains("line 4") && tb.contains("line 2"), "{tb}");
    assert!(
        !tb.contains("runtime") && !tb.contains("__mcp_bridge"),
        "runtime frames leaked: {tb}"
    );
    let r = b.py("def broken(:\n  pass").await;
    assert_eq!(r.error_type(), "SyntaxError");
    // SystemExit does not end the session.
    let r = b.py("x = 5\nraise SystemExit(3)").await;
    assert_eq!(r.status(), "error");
    assert_eq!(b.py("print(x)").await.ok().stdout(), "5\n");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_interrupts_and_keeps_state() {
    let b = Bridge::start().await;
    b.py("kept = 'yes'").await.ok();
    let r = b
        .call(json!({"code": "import time\ntime.sleep(60)", "timeout": 1.5}))
        .await;
    let r = common::Outcome(r);
    assert_eq!(r.status(), "timeout", "{}", r.text());
    assert!(
        r.text().contains("KeyboardInterrupt") || r.text().contains("interrupted"),
        "{}",
        r.text()
    );
    assert!(r.sc().get("session_reset").is_none());
    assert_eq!(b.py("print(kept)").await.ok().stdout(), "yes\n");
    b.shutdown().await;
}

/// Code that swallows the first KeyboardInterrupt gets a second one before the grace period
/// ends in a kill: the call times out and the session, with what the code did, is kept.
#[tokio::test(flavor = "multi_thread")]
async fn an_unanswered_interrupt_is_sent_again_before_the_kill() {
    let b = Bridge::start().await;
    let code = "import time\ncaught = 0\nwhile True:\n    try:\n        time.sleep(100)\n    except KeyboardInterrupt:\n        caught += 1\n        if caught > 1:\n            raise";
    let r = common::Outcome(b.call(json!({"code": code, "timeout": 1})).await);
    assert_eq!(r.status(), "timeout", "{}", r.text());
    assert!(r.sc().get("session_reset").is_none(), "{}", r.text());
    assert_eq!(b.py("print(caught)").await.ok().stdout(), "2\n");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn code_ignoring_sigint_is_killed_and_the_session_reset() {
    let b = Bridge::start().await;
    b.py("kept = 1").await.ok();
    let code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass";
    let r = common::Outcome(b.call(json!({"code": code, "timeout": 1})).await);
    assert_eq!(r.status(), "timeout");
    assert_eq!(r.sc()["session_reset"], true, "{}", r.text());
    assert!(r.text().contains("session was reset"), "{}", r.text());
    b.assert_kept_is_gone().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn out_of_memory_is_named_and_the_bridge_keeps_serving() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_MEMORY", "96m")], None).await;
    let r = b
        .py("chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))")
        .await;
    assert_ne!(r.status(), "ok");
    assert!(r.text().contains("memory"), "{}", r.text());
    assert!(
        r.text().contains("96m") || r.error_type() == "MemoryError",
        "{}",
        r.text()
    );
    assert_eq!(b.py("print('alive')").await.ok().stdout(), "alive\n");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pids_limit_is_reported() {
    // The same limit under both: under gVisor the code's threads are gVisor's tasks, held to
    // `pids` by its kernel (nproc), and the host's cgroup leaves room for gVisor's own threads.
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_PIDS", "32")], None).await;
    let code = "import threading, time\nts = []\nwhile True:\n    t = threading.Thread(target=time.sleep, args=(3,), daemon=True)\n    t.start()\n    ts.append(t)";
    let r = b.py(code).await;
    assert_eq!(r.status(), "error", "{}", r.text());
    assert!(r.text().contains("limit of 32"), "{}", r.text());
    // The session lived through it: the limit failed a thread, it did not end the sandbox.
    assert_eq!(b.py("print(len(ts) < 32)").await.ok().stdout(), "True\n");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn output_is_capped_with_head_tail_and_marker() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_OUTPUT_CAP", "64k")], None).await;
    let r = b
        .py("print('BEGIN')\nprint('x' * 5_000_000)\nprint('END')")
        .await
        .ok();
    let out = r.stdout();
    assert!(out.starts_with("BEGIN"), "{}", &out[..100]);
    assert!(out.trim_end().ends_with("END"));
    assert!(out.contains("truncated"), "no marker");
    assert!(out.len() < 3 * 64 * 1024, "{} bytes came back", out.len());
    assert!(r.sc()["truncated_bytes"].as_u64().unwrap() > 4_000_000);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_gives_a_fresh_interpreter_and_sessions_are_separate() {
    let b = Bridge::start().await;
    b.py("y = 1").await.ok();
    b.call(json!({"code": "y = 2", "session": "other"})).await;
    let r = common::Outcome(
        b.call(json!({"code": "print(y)", "session": "other"}))
            .await,
    )
    .ok();
    assert_eq!(r.stdout(), "2\n");
    let r = common::Outcome(
        b.call(json!({"code": "print('y' in globals())", "reset": true}))
            .await,
    )
    .ok();
    assert_eq!(r.stdout(), "False\n");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sandbox_is_isolated() {
    // A listener on the host's loopback must not be reachable from inside.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let b = Bridge::start().await;
    let gvisor = if gvisor() { "True" } else { "False" };
    let code = format!(
        r#"
import os, socket
print("ifaces", sorted(n for _, n in socket.if_nameindex()))
def tcp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((host, port)); return "connected"
    except OSError as e:
        return type(e).__name__
print("loopback", tcp("127.0.0.1", {port}))
print("outside", tcp("1.1.1.1", 53))
try:
    socket.getaddrinfo("example.com", 80); print("dns ok")
except OSError as e:
    print("dns", type(e).__name__)
print("uid", os.getuid(), os.getgid())
st = open("/proc/self/status").read()
print("capeff", [l.split()[1] for l in st.splitlines() if l.startswith("CapEff")][0])
import ctypes
print("nnp", ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))  # PR_GET_NO_NEW_PRIVS: gVisor's status has no line
root = [l.split() for l in open("/proc/mounts") if l.split()[1] == "/"][0]
print("rootro", "ro" in root[3].split(","))
for p in ["/etc/x", "/usr/x", "/x"]:
    try:
        open(p, "w"); print("wrote", p)
    except OSError as e:
        print("refused", p)
tmp = [l.split() for l in open("/proc/mounts") if l.split()[1] in ("/tmp", "/workspace")]
# gVisor's /proc/mounts shows noexec only (security::filesystem_exec_from_writable_mounts_is_refused).
flags = ("noexec",) if {gvisor} else ("noexec", "nosuid", "nodev")
print("tmpfs", sorted((m[1], all(o in m[3].split(",") for o in flags)) for m in tmp))
"#
    );
    let r = b.py(&code).await.ok();
    let out = r.stdout();
    assert!(out.contains("ifaces ['lo']"), "{out}");
    assert!(out.contains("loopback ConnectionRefusedError"), "{out}");
    assert!(!out.contains("outside connected"), "{out}");
    assert!(
        out.contains("dns gaierror") || out.contains("dns OSError"),
        "{out}"
    );
    assert!(out.contains("uid 65534 65534"), "{out}");
    assert!(out.contains("capeff 0000000000000000"), "{out}");
    assert!(out.contains("nnp 1"), "{out}");
    assert!(out.contains("rootro True"), "{out}");
    assert!(!out.contains("wrote"), "{out}");
    assert!(
        out.contains("tmpfs [('/tmp', True), ('/workspace', True)]"),
        "{out}"
    );
    drop(listener);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_are_present_in_the_cgroup() {
    let b = Bridge::start_with(
        Home::new(),
        &[
            ("MCP_BRIDGE_MEMORY", "200m"),
            ("MCP_BRIDGE_PIDS", "77"),
            ("MCP_BRIDGE_CPUS", "0.5"),
        ],
        None,
    )
    .await;
    let code = r#"
import os
def first(*paths):
    for p in paths:
        if os.path.exists(p):
            return open(p).read().strip()
    return "missing"
print("mem", first("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"))
print("pids", first("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"))
print("cpu", first("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"))
import resource
print("nofile", resource.getrlimit(resource.RLIMIT_NOFILE))
"#;
    let out = b.py(code).await.ok().stdout().to_string();
    if gvisor() {
        // gVisor's kernel shows no cgroup files inside: the limits are on the whole gVisor
        // sandbox, on the host (below).
        assert!(
            out.contains("mem missing\npids missing\ncpu missing\n"),
            "{out}"
        );
    } else {
        assert!(out.contains(&format!("mem {}", 200 * 1024 * 1024)), "{out}");
        assert!(out.contains("pids 77"), "{out}");
        assert!(out.contains("cpu 50000"), "{out}");
    }
    assert!(out.contains("nofile (1024, 1024)"), "{out}");
    // What the host's kernel enforces, read from the cgroup of each container's process (under
    // gVisor: the sandbox's, its kernel included), whatever the sandbox shows inside.
    let ids = common::containers_of(b.pid).await;
    assert!(!ids.is_empty());
    for id in &ids {
        let (mem, pids, cpu) = host_cgroup_limits(common::container_pid(id).await);
        assert_eq!(mem, (200 * 1024 * 1024).to_string(), "{id}");
        // Under gVisor the cgroup holds gVisor's own threads too: room for them on top
        // (Config::host_pids_limit); the code's tasks are held to 77 inside.
        let host_pids = if gvisor() { 77 * 8 + 64 } else { 77 };
        assert_eq!(pids, host_pids.to_string(), "{id}");
        assert!(cpu == "50000" || cpu.starts_with("50000 "), "{id}: {cpu}");
    }
    b.shutdown().await;
}

/// Whether this run's sandboxes are under gVisor (`MCP_BRIDGE_TEST_ISOLATION=gvisor`).
fn gvisor() -> bool {
    common::isolation().as_deref() == Some("gvisor")
}

/// The memory, pids and cpu limits of the cgroup host process `pid` is in, as the host's
/// kernel has them.
fn host_cgroup_limits(pid: u32) -> (String, String, String) {
    (
        common::host_cgroup(pid, "memory", "memory.limit_in_bytes", "memory.max"),
        common::host_cgroup(pid, "pids", "pids.max", "pids.max"),
        common::host_cgroup(pid, "cpu", "cpu.cfs_quota_us", "cpu.max"),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn containers_are_removed_when_the_bridge_exits() {
    let b = Bridge::start().await;
    b.py("print(1)").await.ok();
    let pid = b.pid;
    // The session's container, and the pool's if it refilled already.
    assert!(!common::containers_of(pid).await.is_empty());
    b.shutdown().await;
    let mut left = common::containers_of(pid).await;
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        left = common::containers_of(pid).await;
    }
    assert!(left.is_empty(), "containers left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_sessions_are_removed() {
    let b = Bridge::start_with(
        Home::new(),
        &[("MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT", "2s")],
        None,
    )
    .await;
    b.py("z = 1").await.ok();
    assert!(!common::containers_of(b.pid).await.is_empty());
    // The session's container goes, and so does the pool's: an idle bridge holds none.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert!(
        common::containers_of(b.pid).await.is_empty(),
        "idle container still there"
    );
    // Its state was kept on disk as it closed: the next call restores it in a new sandbox.
    let r = b.py("print('z' in globals())").await.ok();
    assert_eq!(r.stdout(), "True\n");
    assert_eq!(r.meta()["resumed"], json!("snapshot"), "{:?}", r.meta());
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn orphans_of_a_killed_bridge_are_reaped_at_next_start() {
    let b = Bridge::start().await;
    b.py("print(1)").await.ok();
    let pid = b.pid;
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // Its session's container, and the pool's when the refill had started one. Every bridge on
    // the engine reaps dead bridges' containers, so another test's bridge may have taken them
    // already: the next start must leave none, whoever removed them.
    let left = common::containers_of(pid).await;
    let b2 = Bridge::start().await;
    b2.py("print(2)").await.ok();
    let still = common::containers_of(pid).await;
    assert!(
        still.is_empty(),
        "orphans not reaped: {still:?} (of {left:?} left by the killed bridge)\n{}",
        b2.home.log()
    );
    b2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn max_sessions_closes_the_least_recently_used_idle_session_and_says_so() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_MAX_SESSIONS", "2")], None).await;
    let run = |code: &str, session: &str| {
        let args = json!({"code": code, "session": session});
        let b = &b;
        async move { common::Outcome(b.call(args).await) }
    };
    run("a = 1", "a").await.ok();
    run("b = 2", "b").await.ok();
    // "a" is now more recently used than "b".
    assert_eq!(run("print(a)", "a").await.ok().stdout(), "1\n");
    let r = run("c = 3", "c").await.ok();
    assert!(
        r.text().contains("session \"b\"")
            && r.text().contains("max_sessions = 2")
            && r.text().contains("its state was kept as a snapshot"),
        "the closing is not reported: {}",
        r.text()
    );
    assert_eq!(common::containers_of(b.pid).await.len(), 2);
    // "a" kept its sandbox; "b" its state, on disk, restored in a new sandbox (starting it
    // closed "c", now the oldest).
    assert_eq!(run("print(a)", "a").await.ok().stdout(), "1\n");
    let r = run("print(b)", "b").await.ok();
    assert_eq!(r.stdout(), "2\n");
    assert_eq!(r.meta()["resumed"], json!("snapshot"));
    assert!(r.text().contains("session \"c\""), "{}", r.text());
    assert_eq!(common::containers_of(b.pid).await.len(), 2);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn max_sessions_refuses_a_new_session_while_every_session_runs_code() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_MAX_SESSIONS", "1")], None).await;
    common::Outcome(b.call(json!({"code": "kept = 7", "session": "busy"})).await).ok();
    let peer = b.client.peer().clone();
    let long = tokio::spawn(async move {
        let params = rmcp::model::CallToolRequestParams::new("run_python").with_arguments(
            json!({"code": "import time\ntime.sleep(4)\nprint(kept)", "session": "busy"})
                .as_object()
                .cloned()
                .unwrap(),
        );
        common::Outcome(peer.call_tool(params).await.unwrap())
    });
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let r = common::Outcome(b.call(json!({"code": "print(1)", "session": "new"})).await);
    assert!(
        r.is_error(),
        "a second session started past max_sessions = 1"
    );
    let text = r.text();
    assert!(
        text.contains("max_sessions")
            && text.contains("busy")
            && text.contains("MCP_BRIDGE_MAX_SESSIONS"),
        "{text}"
    );
    // The busy session was not touched: its call finishes with its state.
    assert_eq!(long.await.unwrap().ok().stdout(), "7\n");
    // Once it is idle, the new session takes its place.
    let r = common::Outcome(b.call(json!({"code": "print(2)", "session": "new"})).await).ok();
    assert_eq!(r.stdout(), "2\n");
    assert_eq!(common::containers_of(b.pid).await.len(), 1);
    b.shutdown().await;
}

/// Under memory overcommitted the kernel's OOM killer takes a sandbox first: every sandbox
/// process has the highest `oom_score_adj` (read on the host), the bridge its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_is_what_the_oom_killer_takes_first() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_POOL_SIZE", "0")], None).await;
    let out = b
        .py("print(open('/proc/self/oom_score_adj').read().strip())")
        .await
        .ok()
        .stdout()
        .to_string();
    if !gvisor() {
        assert_eq!(out, "1000\n", "the code's own process");
    }
    let ids = common::containers_of(b.pid).await;
    assert_eq!(ids.len(), 1, "{ids:?}");
    let host = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(
        host(common::container_pid(&ids[0]).await),
        "1000",
        "{}",
        ids[0]
    );
    assert_ne!(host(b.pid), "1000", "the bridge is not a first choice");
    b.shutdown().await;
}

/// Below `memory_reserve` of available host memory no new session starts: the call is refused
/// with what, why and what to do, and no container is made (a reserve no host has).
#[tokio::test(flavor = "multi_thread")]
async fn a_new_session_is_refused_under_the_memory_reserve() {
    let b = Bridge::start_with(
        Home::new(),
        &[("MCP_BRIDGE_MEMORY_RESERVE", "100000g")],
        None,
    )
    .await;
    let r = common::Outcome(b.call(json!({"code": "print(1)", "session": "new"})).await);
    assert!(r.is_error(), "{}", r.text());
    let text = r.text();
    assert!(
        text.contains("cannot start session \"new\"")
            && text.contains("MiB of memory available, under memory_reserve = 102400000 MiB")
            && text.contains("MCP_BRIDGE_MEMORY_RESERVE"),
        "{text}"
    );
    assert!(b.home.log().contains("refusing a new session"));
    assert_eq!(common::containers_of(b.pid).await, Vec::<String>::new());
    b.shutdown().await;
}

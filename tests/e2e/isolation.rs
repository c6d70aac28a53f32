//! Kernel isolation (`isolation = "gvisor"`): the code runs under gVisor's kernel when asked,
//! `doctor` proves it, and a missing gVisor runtime runs no code at all: never a
//! silent fallback to runc. The other suites run a second time under gVisor (scripts/test.sh,
//! `MCP_BRIDGE_TEST_ISOLATION=gvisor`); these tests ask for gVisor themselves, so they check it
//! in every pass. They need gVisor registered with podman as `runsc`, as
//! `scripts/setup-debian.sh --test-deps` (or `--isolation gvisor`) does.

use std::time::Duration;

use crate::common;
use common::{Bridge, Home};

fn host_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_string()
}

/// The runtime the engine created a container with (`podman inspect`).
fn runtime_of(id: &str) -> String {
    let out = std::process::Command::new("podman")
        .args(["inspect", "--format", "{{.OCIRuntime}}", id])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn under_gvisor_every_sandbox_runs_on_gvisors_kernel() {
    let b = Bridge::start_with(
        Home::new(),
        &[
            ("MCP_BRIDGE_ISOLATION", "gvisor"),
            ("MCP_BRIDGE_POOL_SIZE", "1"),
        ],
        None,
    )
    .await;
    let r = b
        .py("import platform, os\nprint(platform.release(), os.getuid())")
        .await
        .ok();
    let out = r.stdout().trim().to_string();
    let kernel = out.split(' ').next().unwrap_or("");
    assert_ne!(
        kernel,
        host_kernel(),
        "the code sees the host's kernel: {out}"
    );
    assert!(out.ends_with(" 65534"), "{out}");
    // Every container of this bridge, the session's and the pool's refilled one, is gVisor's.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut ids = common::containers_of(b.pid).await;
    while ids.len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        ids = common::containers_of(b.pid).await;
    }
    assert_eq!(ids.len(), 2, "a session and a refilled pool: {ids:?}");
    for id in &ids {
        assert_eq!(runtime_of(id), "runsc", "{id}");
    }
    // The hardening is the same under gVisor: no network, read-only root, no capabilities.
    let r = b
        .py(concat!(
            "import socket, os\n",
            "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); print('net')\n",
            "except OSError as e: print('no net')\n",
            "try:\n    open('/etc/x', 'w'); print('rw')\n",
            "except OSError: print('ro')\n",
            "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n",
            // gVisor gave podman's own /run to the sandbox's user, writable and executable;
            // the bridge mounts its own (root's, noexec).
            "try:\n    open('/run/x', 'w'); print('run writable')\n",
            "except OSError: print('run closed')\n",
            "print([l.split()[3] for l in open('/proc/mounts') if l.split()[1] == '/run'])\n",
        ))
        .await
        .ok();
    let out = r.stdout();
    assert!(
        out.starts_with("no net\nro\n0000000000000000\nrun closed\n"),
        "{out}"
    );
    assert!(out.contains("noexec"), "{out}");
    // The sandbox that served these calls proved its kernel at boot, before it took a call (the
    // one refilling the pool may still be booting).
    let log = b.home.log();
    let proved = log
        .lines()
        .filter(|l| {
            l.contains("sandbox ready") && l.contains("4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016")
        })
        .count();
    assert!(proved >= 1, "{log}");
    b.shutdown_clean().await;
}

/// A runtime registered as gVisor's that is not (here runc, under the name `gvisor_runtime`
/// gives): the engine runs the container, but the kernel its runtime saw at boot is the host's,
/// so the sandbox is removed before any code runs, pooled or not, and the reply says why and
/// what to do.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_whose_kernel_is_not_gvisors_is_refused_before_any_code_runs() {
    let b = Bridge::start_with(
        Home::new(),
        &[
            ("MCP_BRIDGE_ISOLATION", "gvisor"),
            ("MCP_BRIDGE_GVISOR_RUNTIME", "runc"),
            ("MCP_BRIDGE_POOL_SIZE", "1"),
        ],
        None,
    )
    .await;
    let r = b
        .py("open('/workspace/ran', 'w').write('x'); print('ran')")
        .await;
    assert!(r.is_error(), "{}", r.text());
    let text = r.text();
    assert!(!text.contains("ran\n"), "{text}");
    assert!(
        text.contains("the sandbox's kernel is not gVisor's: it is the host's kernel")
            && text.contains(&host_kernel()),
        "{text}"
    );
    assert!(text.contains("\"runc\" (gvisor_runtime)"), "{text}");
    assert!(text.contains("no fallback to runc"), "{text}");
    // The refused sandboxes are gone (the pool's too), and the bridge keeps answering.
    let left = common::wait_no_containers(b.pid, Duration::from_secs(30)).await;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(b.client.list_all_tools().await.unwrap().len(), 1);
    b.shutdown().await;
}

#[test]
fn doctor_proves_gvisor_by_the_kernel_the_sandbox_sees() {
    let home = Home::new();
    let out = home
        .command()
        .env("MCP_BRIDGE_ISOLATION", "gvisor")
        .arg("doctor")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("isolation: gvisor, through the engine's runtime runsc"),
        "{text}"
    );
    assert!(text.contains("runsc version"), "{text}");
    assert!(text.contains(", platform "), "{text}");
    assert!(
        text.contains("is gVisor's")
            && text.contains(&format!("not the host's ({})", host_kernel())),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gvisor_without_its_runtime_runs_no_code_and_says_what_fixes_it() {
    let b = Bridge::start_with(
        Home::new(),
        &[
            ("MCP_BRIDGE_ISOLATION", "gvisor"),
            ("MCP_BRIDGE_GVISOR_RUNTIME", "no-such-runsc"),
        ],
        None,
    )
    .await;
    let r = b.py("print('ran')").await;
    assert!(r.is_error(), "{}", r.text());
    assert_eq!(r.status(), "unavailable", "{}", r.text());
    let text = r.text();
    assert!(!text.contains("ran\n"), "{text}");
    assert!(text.contains("\"no-such-runsc\""), "{text}");
    assert!(text.contains("no fallback to runc"), "{text}");
    assert!(
        text.contains("setup-debian.sh --isolation gvisor"),
        "{text}"
    );
    assert!(common::containers_of(b.pid).await.is_empty());
    // `allow_unenforced_limits` does not excuse it, and the bridge keeps answering.
    let tools = b.client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 1);
    b.shutdown().await;

    let home = Home::new();
    let out = home
        .command()
        .env("MCP_BRIDGE_ISOLATION", "gvisor")
        .env("MCP_BRIDGE_GVISOR_RUNTIME", "no-such-runsc")
        .env("MCP_BRIDGE_ALLOW_UNENFORCED_LIMITS", "1")
        .args(["exec", "print('ran')"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-runsc"), "{err}");
}

#[test]
fn doctor_warns_when_serve_reaches_beyond_the_machine_on_the_hosts_kernel() {
    let doctor = |env: &[(&str, &str)]| {
        let home = Home::new();
        let out = home
            .command()
            .envs(env.iter().copied())
            .args(["doctor", "--quick"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let warning = "beyond this machine, and its sandboxes share the host's kernel";
    // `container` named: the gVisor pass of scripts/test.sh sets gvisor for every bridge.
    let text = doctor(&[
        ("MCP_BRIDGE_LISTEN", "0.0.0.0:8931"),
        ("MCP_BRIDGE_ISOLATION", "container"),
    ]);
    assert!(text.contains(warning), "{text}");
    // On loopback (the default), or under gVisor, there is nothing to warn of.
    assert!(!doctor(&[]).contains(warning));
    let text = doctor(&[
        ("MCP_BRIDGE_LISTEN", "0.0.0.0:8931"),
        ("MCP_BRIDGE_ISOLATION", "gvisor"),
    ]);
    assert!(!text.contains(warning), "{text}");
}

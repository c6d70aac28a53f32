//! The attacks: every isolation claim of SECURITY.md attacked from inside the sandbox,
//! through the real binary, rmcp's real client, real podman and the real image. Each test asserts
//! the specific refusal (errno, missing interface, dropped frame) and that the bridge keeps serving.

use crate::common;

use std::io::ErrorKind;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::time::Duration;

use common::{Bridge, Home, Outcome, assert_each, probe_lines};
use serde_json::{Value, json};

/// The host's non-loopback IPv4 and IPv6 addresses (what a container with a network could reach).
fn host_addresses() -> (Vec<String>, Vec<String>) {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    unsafe {
        let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
        assert_eq!(libc::getifaddrs(&mut ifap), 0);
        let mut cur = ifap;
        while !cur.is_null() {
            let a = (*cur).ifa_addr;
            if !a.is_null() {
                match (*a).sa_family as i32 {
                    libc::AF_INET => {
                        let sin = &*(a as *const libc::sockaddr_in);
                        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                        if !ip.is_loopback() {
                            v4.push(ip.to_string());
                        }
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(a as *const libc::sockaddr_in6);
                        let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                        // Link-local addresses need a scope id; global ones are what matters.
                        if !ip.is_loopback() && (ip.segments()[0] & 0xffc0) != 0xfe80 {
                            v6.push(ip.to_string());
                        }
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(ifap);
    }
    (v4, v6)
}

// ------------------------------------------------------------------------------------------
// Network

/// The answer of a connection to an address outside the sandbox with no route to it: ENETUNREACH
/// from Linux's stack; gVisor's own network stack says EHOSTUNREACH for the same empty table.
/// Whether this run's sandboxes are under gVisor (`MCP_BRIDGE_TEST_ISOLATION=gvisor`): where a
/// probe reads what gVisor's kernel shows differently from Linux, the test asserts gVisor's own
/// answer (SECURITY.md, Kernel isolation), never nothing.
fn gvisor() -> bool {
    common::isolation().as_deref() == Some("gvisor")
}

fn no_route(r: &str) -> bool {
    r == "OSError 101" || (common::isolation().as_deref() == Some("gvisor") && r == "OSError 113")
}

#[tokio::test(flavor = "multi_thread")]
async fn network_has_no_interface_but_lo() {
    let b = Bridge::start().await;
    let code = r#"
import socket
print("ifaces", sorted(n for _, n in socket.if_nameindex()))
print("netdev", sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))
print("routes4", len(open("/proc/net/route").readlines()) - 1)
try:
    v6 = sorted(l.split()[-1] for l in open("/proc/net/if_inet6"))
except FileNotFoundError:
    v6 = []
print("if_inet6", v6)
try:
    socket.getaddrinfo("example.com", 80)
    print("dns resolved")
except OSError as e:
    print("dns", type(e).__name__)
"#;
    let p = b.probe(code).await;
    assert_eq!(p["ifaces"], "['lo']");
    assert_eq!(p["netdev"], "['lo']");
    assert_eq!(p["routes4"], "0", "an IPv4 route exists");
    assert!(
        p["if_inet6"] == "[]" || p["if_inet6"] == "['lo']",
        "IPv6 addresses other than lo's: {}",
        p["if_inet6"]
    );
    assert_eq!(p["dns"], "gaierror");
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn network_host_tcp_listeners_are_unreachable() {
    // Listeners on the host's loopback and on every host interface.
    let lo = TcpListener::bind("127.0.0.1:0").unwrap();
    let any = TcpListener::bind("0.0.0.0:0").unwrap();
    lo.set_nonblocking(true).unwrap();
    any.set_nonblocking(true).unwrap();
    let (v4, _) = host_addresses();
    let mut targets = vec![format!("127.0.0.1:{}", lo.local_addr().unwrap().port())];
    let any_port = any.local_addr().unwrap().port();
    targets.push(format!("127.0.0.1:{any_port}"));
    for ip in &v4 {
        targets.push(format!("{ip}:{any_port}"));
    }
    let b = Bridge::start().await;
    let code = format!(
        r#"
import socket
for t in {targets:?}:
    host, port = t.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        print(t, "CONNECTED")
    except OSError as e:
        print(t, type(e).__name__, e.errno)
"#
    );
    let stdout = b.out(&code).await;
    let p = probe_lines(&stdout);
    assert_eq!(p.len(), targets.len(), "{stdout}");
    for t in &targets {
        let r = &p[t];
        if t.starts_with("127.0.0.1") {
            // The container's own loopback: nothing listens there.
            assert_eq!(r, "ConnectionRefusedError 111", "{t}: {r}");
        } else {
            // No route out of the empty network namespace.
            assert!(no_route(r), "{t}: {r} (expected ENETUNREACH)");
        }
    }
    for l in [&lo, &any] {
        match l.accept() {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("a host listener got a connection from the sandbox: {other:?}"),
        }
    }
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn network_host_udp_listeners_receive_nothing() {
    let lo = UdpSocket::bind("127.0.0.1:0").unwrap();
    let any = UdpSocket::bind("0.0.0.0:0").unwrap();
    let (v4, _) = host_addresses();
    let mut targets = vec![format!("127.0.0.1:{}", lo.local_addr().unwrap().port())];
    let any_port = any.local_addr().unwrap().port();
    for ip in &v4 {
        targets.push(format!("{ip}:{any_port}"));
    }
    let b = Bridge::start().await;
    let code = format!(
        r#"
import socket
for t in {targets:?}:
    host, port = t.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _ in range(5):
            s.sendto(b"from-the-sandbox", (host, int(port)))
        print(t, "sent")
    except OSError as e:
        print(t, type(e).__name__, e.errno)
"#
    );
    let stdout = b.out(&code).await;
    let p = probe_lines(&stdout);
    for t in &targets {
        let r = &p[t];
        if !t.starts_with("127.0.0.1") {
            assert!(no_route(r), "{t}: {r} (expected ENETUNREACH)");
        }
    }
    // Whatever the sandbox sent went to its own loopback; nothing reached the host.
    std::thread::sleep(Duration::from_millis(300));
    let mut buf = [0u8; 64];
    for s in [&lo, &any] {
        s.set_nonblocking(true).unwrap();
        match s.recv_from(&mut buf) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("a host UDP socket received from the sandbox: {other:?}"),
        }
    }
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn network_raw_and_packet_sockets_are_refused() {
    let b = Bridge::start().await;
    let code = r#"
import socket
cases = {
    "raw4": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    "raw4tcp": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP),
    "raw6": (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
    "packet_raw": (socket.AF_PACKET, socket.SOCK_RAW, 0x0300),
    "packet_dgram": (socket.AF_PACKET, socket.SOCK_DGRAM, 0x0300),
}
for name, args in cases.items():
    try:
        socket.socket(*args).close()
        print(name, "OPENED")
    except OSError as e:
        print(name, type(e).__name__, e.errno)
"#;
    let p = b.probe(code).await;
    assert_each(
        &p,
        &["raw4", "raw4tcp", "raw6", "packet_raw", "packet_dgram"],
        "PermissionError 1",
    );
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn network_engine_sockets_are_neither_visible_nor_reachable() {
    // An abstract unix socket on the host: reachable from any process in the host's network
    // namespace, so it shows whether the sandbox shares it.
    let abstract_name = format!("mcb-security-test-{}", std::process::id());
    let listener = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&abstract_name).unwrap();
        std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
    };
    let b = Bridge::start().await;
    let code = format!(
        r#"
import os, socket, stat
paths = ["/run/podman/podman.sock", "/var/run/docker.sock", "/run/docker.sock",
         "/run/user/0/podman/podman.sock", "/run/containerd/containerd.sock", "/var/run/podman"]
for p in paths:
    print("path", p, os.path.exists(p))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("\0{abstract_name}")
    print("abstract CONNECTED")
except OSError as e:
    print("abstract", type(e).__name__)
found = []
for root, dirs, files in os.walk("/", onerror=lambda e: None):
    if root in ("/proc", "/sys"):
        dirs[:] = []
        continue
    for f in files:
        p = os.path.join(root, f)
        try:
            if stat.S_ISSOCK(os.lstat(p).st_mode):
                found.append(p)
        except OSError:
            pass
print("sockets", found)
"#
    );
    let stdout = b.out(&code).await;
    let paths: Vec<&str> = stdout.lines().filter(|l| l.starts_with("path ")).collect();
    assert_eq!(paths.len(), 6, "one line per engine path: {stdout}");
    for l in paths {
        assert!(l.ends_with(" False"), "engine path visible inside: {l}");
    }
    let p = probe_lines(&stdout);
    assert_eq!(p["abstract"], "ConnectionRefusedError", "{stdout}");
    assert_eq!(p["sockets"], "[]", "unix sockets inside: {stdout}");
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "the host socket got a connection"
    );
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn network_ipv6_reaches_nothing() {
    let (_, v6) = host_addresses();
    // The host's IPv6 loopback, when the host has IPv6 at all.
    let lo6 = TcpListener::bind("[::1]:0").ok();
    let mut targets = vec!["2001:4860:4860::8888:53".to_string()];
    if let Some(l) = &lo6 {
        targets.push(format!("::1:{}", l.local_addr().unwrap().port()));
    }
    for ip in &v6 {
        targets.push(format!("{ip}:22"));
    }
    let b = Bridge::start().await;
    let code = format!(
        r#"
import socket
print("has_ipv6", socket.has_ipv6)
for t in {targets:?}:
    host, port = t.rsplit(":", 1)
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError as e:
        print(t, "nosocket", e.errno)
        continue
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        print(t, "CONNECTED")
    except OSError as e:
        print(t, type(e).__name__, e.errno)
"#
    );
    let stdout = b.out(&code).await;
    let p = probe_lines(&stdout);
    for t in &targets {
        let r = p.get(t).unwrap_or_else(|| panic!("{t} missing: {stdout}"));
        assert!(!r.contains("CONNECTED"), "{t}: {r}");
        if t.starts_with("::1:") {
            // Inside, ::1 (if the kernel gives the namespace IPv6) is the container's own.
            assert!(
                r == "ConnectionRefusedError 111" || r.starts_with("OSError 99"),
                "{t}: {r}"
            );
        } else {
            // ENETUNREACH, or EADDRNOTAVAIL / EAFNOSUPPORT where IPv6 is off.
            assert!(
                no_route(r) || r.starts_with("OSError 99") || r.starts_with("nosocket 97"),
                "{t}: {r}"
            );
        }
    }
    if let Some(l) = lo6 {
        l.set_nonblocking(true).unwrap();
        assert!(
            l.accept().is_err(),
            "the host's [::1] listener got a connection"
        );
    }
    b.shutdown_still_serving().await;
}

// ------------------------------------------------------------------------------------------
// Filesystem

#[tokio::test(flavor = "multi_thread")]
async fn filesystem_writes_outside_the_scratch_mounts_are_refused() {
    let b = Bridge::start().await;
    let code = r#"
import errno, os
targets = ["/x", "/usr/x", "/usr/lib/x", "/etc/x", "/etc/passwd", "/bin/x", "/var/x", "/home/x",
           "/root/x", "/opt/x", "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches",
           "/proc/sysrq-trigger", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/x",
           "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/pids/pids.max",
           "/sys/fs/cgroup/x", "/run/x", "/dev/x"]
for p in targets:
    try:
        with open(p, "a") as f:
            f.write("1")
        print(p, "WROTE")
    except OSError as e:
        print(p, errno.errorcode.get(e.errno, e.errno))
for d in ["/newdir", "/usr/newdir", "/etc/newdir"]:
    try:
        os.mkdir(d)
        print(d, "MADE")
    except OSError as e:
        print(d, errno.errorcode.get(e.errno, e.errno))
mounts = {l.split()[1]: l.split()[3].split(",") for l in open("/proc/mounts")}
for m in ["/", "/proc/sys", "/sys", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids"]:
    print("mount", m, "ro" in mounts.get(m, []))
"#;
    let stdout = b.out(code).await;
    assert!(
        !stdout.contains("WROTE") && !stdout.contains("MADE"),
        "{stdout}"
    );
    // 20 files, 3 directories, 5 mounts: one line each.
    assert_eq!(stdout.lines().count(), 28, "{stdout}");
    for l in stdout.lines() {
        // gVisor's /proc/sys is no mount of its own but part of its procfs, whose files there
        // the sandbox's user cannot write (refused above, as under runc).
        // gVisor mounts no cgroup files at all (sandbox::limits_are_present_in_the_cgroup reads
        // the limits on the host): the writes to those paths above found nothing (ENOENT).
        if gvisor()
            && [
                "mount /proc/sys False",
                "mount /sys/fs/cgroup/memory False",
                "mount /sys/fs/cgroup/pids False",
            ]
            .contains(&l)
        {
            continue;
        }
        if l.starts_with("mount ") {
            assert!(l.ends_with(" True"), "not read-only: {l}");
        } else {
            let errno = l.rsplit(' ').next().unwrap();
            assert!(
                ["EROFS", "EACCES", "EPERM", "ENOENT"].contains(&errno),
                "unexpected result {l}"
            );
        }
    }
    // Permissions refuse first (EACCES); the read-only mounts checked above refuse even where a
    // permission would not.
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn filesystem_nothing_of_the_host_is_visible() {
    let home = Home::new();
    let canary = format!("canary-{}-{}", std::process::id(), home.path().display());
    std::fs::write(home.path().join("host-canary.txt"), &canary).unwrap();
    let state_dir = home.path().join(".local/state/mcp-code-bridge");
    std::fs::create_dir_all(&state_dir).unwrap();
    std::fs::write(state_dir.join("state-canary.txt"), &canary).unwrap();
    // An upstream server with a secret in its env: the secret must not enter the sandbox.
    common::write_servers(
        &home,
        json!({"fx": {"command": "python3",
            "args": [common::fixture("misbehaving_server.py").display().to_string(), "normal"],
            "env": {"MCB_UPSTREAM_SECRET": "hunter2-upstream-secret"}}}),
    );
    let home_path = home.path().display().to_string();
    let b = Bridge::start_with(home, &[], None).await;
    let code = format!(
        r#"
import os, json
home = {home_path:?}
print("home_exists", os.path.exists(home))
print("home_canary", os.path.exists(home + "/host-canary.txt"))
print("state_dir", os.path.exists(home + "/.local/state/mcp-code-bridge"))
mounts = open("/proc/mounts").read()
print("mounts_mention_home", home in mounts)
print("mounts_mention_sock", ".sock" in mounts)
env = json.dumps(dict(os.environ))
print("env_mentions_home", home in env)
print("env_bridge_vars", sorted(k for k in os.environ if k.startswith("MCP_BRIDGE")))
pid1 = open("/proc/1/environ", "rb").read().decode(errors="replace")
everything = env + pid1 + json.dumps(list(os.environ.values()))
print("secret_anywhere", "hunter2-upstream-secret" in everything)
print("HOME", os.environ.get("HOME"))
"#
    );
    let stdout = b.call(json!({"code": code, "servers": ["fx"]})).await;
    let stdout = Outcome(stdout).ok().stdout().to_string();
    let p = probe_lines(&stdout);
    assert_eq!(p["home_exists"], "False", "{stdout}");
    assert_eq!(p["home_canary"], "False");
    assert_eq!(p["state_dir"], "False");
    assert_eq!(p["mounts_mention_home"], "False");
    assert_eq!(p["mounts_mention_sock"], "False");
    assert_eq!(p["env_mentions_home"], "False");
    assert_eq!(p["env_bridge_vars"], "[]");
    assert_eq!(p["secret_anywhere"], "False");
    assert_eq!(p["HOME"], "/workspace");
    // The loaded server's metadata that did reach the sandbox carries no env either.
    let meta = b
        .out(
        "from mcp import runtime\nimport json\nprint(json.dumps(runtime.list_loaded_server_metadata()))",
    )
    .await;
    assert!(!meta.contains("hunter2"), "{meta}");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn filesystem_scratch_mounts_are_size_capped() {
    let b = Bridge::start_with(
        Home::new(),
        &[
            ("MCP_BRIDGE_TMP_SIZE", "8m"),
            ("MCP_BRIDGE_WORKSPACE_SIZE", "12m"),
        ],
        None,
    )
    .await;
    // Every writable mount, found by looking rather than by a list we could get wrong.
    let code = r#"
import errno, os
chunk = b"\0" * (256 * 1024)
for m in ["/tmp", "/workspace", "/var/tmp", "/dev/shm"]:
    written = 0
    err = None
    try:
        with open(m + "/fill", "wb") as f:
            while written < 1 << 30:
                f.write(chunk)
                f.flush()
                written += len(chunk)
    except OSError as e:
        err = errno.errorcode.get(e.errno, e.errno)
    os.remove(m + "/fill")
    print(m, written >> 20, err)
"#;
    let stdout = b.out(code).await;
    let p = probe_lines(&stdout);
    let cap = |m: &str| -> u64 {
        let (mib, err) = p[m].split_once(' ').unwrap();
        assert_eq!(err, "ENOSPC", "{m}: {stdout}");
        mib.parse().unwrap()
    };
    assert!(cap("/tmp") <= 8, "{stdout}");
    assert!(cap("/workspace") <= 12, "{stdout}");
    assert!(cap("/var/tmp") <= 8, "{stdout}");
    assert!(cap("/dev/shm") <= 64, "{stdout}");
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn filesystem_exec_from_writable_mounts_is_refused() {
    let b = Bridge::start().await;
    let code = r#"
import errno, mmap, os, shutil, subprocess
# Every mount point the sandbox user can write to must be noexec.
writable = []
for l in open("/proc/mounts"):
    f = l.split()
    if os.path.isdir(f[1]) and os.access(f[1], os.W_OK):
        writable.append(f[1])
        print("mount", f[1], "noexec" in f[3].split(","), "nosuid" in f[3].split(","))
for d in writable:
    target = os.path.join(d, "mcb-true")
    try:
        shutil.copy("/usr/bin/true", target)
        os.chmod(target, 0o755)
    except OSError as e:
        print("exec", d, "nocopy", errno.errorcode.get(e.errno))
        continue
    try:
        subprocess.run([target], check=True)
        print("exec", d, "RAN")
    except OSError as e:
        print("exec", d, errno.errorcode.get(e.errno, e.errno))
    with open(target, "rb") as f:
        try:
            mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)
            print("mmap", d, "MAPPED")
        except OSError as e:
            print("mmap", d, errno.errorcode.get(e.errno, e.errno))
    os.remove(target)
print("writable", sorted(writable))
"#;
    let stdout = b.out(code).await;
    assert!(!stdout.contains("RAN"), "{stdout}");
    assert!(gvisor() || !stdout.contains("MAPPED"), "{stdout}");
    let writable = stdout
        .lines()
        .find(|l| l.starts_with("writable "))
        .unwrap()
        .to_string();
    for m in ["/tmp", "/workspace"] {
        assert!(writable.contains(&format!("'{m}'")), "{writable}");
        // Each was attacked both ways: the loop below judges what it finds.
        for how in ["exec", "mmap"] {
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(&format!("{how} {m} "))),
                "no {how} attempt from {m}: {stdout}"
            );
        }
    }
    for l in stdout.lines() {
        if l.starts_with("mount ") {
            // gVisor's /proc/mounts shows noexec but never nosuid (its kernel keeps the flag;
            // no_new_privs makes a setuid bit inert anyway:
            // privilege_setuid_binaries_do_not_elevate).
            let want = if gvisor() {
                " True False"
            } else {
                " True True"
            };
            assert!(
                l.ends_with(want),
                "writable mount without noexec/nosuid: {l}"
            );
        }
        // mqueue holds no regular files at all ("nocopy EINVAL").
        if l.starts_with("exec ") && !l.contains(" nocopy ") {
            assert!(l.ends_with(" EACCES") || l.ends_with(" EPERM"), "{l}");
        }
        if l.starts_with("mmap ") && !l.contains(" nocopy ") {
            // gVisor's noexec stops execve but not mmap(PROT_EXEC) of a file there: code so
            // mapped runs on gVisor's kernel, as the Python process does (SECURITY.md).
            if gvisor() {
                assert!(l.ends_with(" MAPPED"), "{l}");
            } else {
                assert!(l.ends_with(" EACCES") || l.ends_with(" EPERM"), "{l}");
            }
        }
    }
    b.shutdown_still_serving().await;
}

// ------------------------------------------------------------------------------------------
// Privilege

#[tokio::test(flavor = "multi_thread")]
async fn privilege_setuid_binaries_do_not_elevate() {
    let b = Bridge::start().await;
    let code = r#"
import os, select, subprocess, time
found = subprocess.run("find / -xdev -perm /6000 -type f 2>/dev/null", shell=True,
                       capture_output=True, text=True).stdout.split()
print("setuid", sorted(found))
# su is setuid root: while it waits for a password, see who it runs as.
p = subprocess.Popen(["/usr/bin/su", "root", "-c", "id -u"], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
select.select([p.stderr], [], [], 10)  # "Password:" is written once su is running
st = open("/proc/%d/status" % p.pid).read().splitlines()
print("su_uid", [l.split()[1:] for l in st if l.startswith("Uid:")][0])
print("su_caps", [l.split()[1] for l in st if l.startswith("CapEff:")][0])
o, e = p.communicate(b"wrong\n", timeout=10)
print("su_rc", p.returncode)
print("su_out", o.decode().strip() or "-")
print("uid_after", os.getuid(), os.geteuid())
"#;
    let stdout = b.out(code).await;
    let p = probe_lines(&stdout);
    assert!(p["setuid"].contains("/usr/bin/su"), "{stdout}");
    assert_eq!(
        p["su_uid"], "['65534', '65534', '65534', '65534']",
        "the setuid bit took effect: {stdout}"
    );
    assert_eq!(p["su_caps"], "0000000000000000");
    assert_ne!(p["su_rc"], "0", "{stdout}");
    assert_eq!(p["su_out"], "-", "{stdout}");
    assert_eq!(p["uid_after"], "65534 65534");
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn privilege_no_capabilities_in_any_set() {
    let b = Bridge::start().await;
    // no_new_privs and the ambient set asked of the kernel too (prctl), in the code's process
    // and a child: gVisor's /proc/<pid>/status has no NoNewPrivs or CapAmb line.
    let code = r#"
import ctypes, subprocess, sys
def caps(text):
    return {l.split(":")[0]: l.split()[1] for l in text.splitlines()
            if l.startswith(("Cap", "NoNewPrivs", "Seccomp:"))}
ASK = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
nnp = libc.prctl(39, 0, 0, 0, 0)
amb = [libc.prctl(47, 1, c, 0, 0) for c in range(41)]
print(nnp, "none" if set(amb) == {0} else "einval" if set(amb) == {-1} and ctypes.get_errno() == 22 else amb)
"""
print("self", sorted(caps(open("/proc/self/status").read()).items()))
child = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout
print("child", sorted(caps(child).items()))
print("init", sorted(caps(open("/proc/1/status").read()).items()))
exec(ASK.replace("print(", "print('prctl_self', "))
print("prctl_child", subprocess.run([sys.executable, "-c", ASK], capture_output=True, text=True).stdout.strip())
"#;
    let stdout = b.out(code).await;
    let zero = "0000000000000000";
    let sets = format!(
        "('CapBnd', '{zero}'), ('CapEff', '{zero}'), ('CapInh', '{zero}'), ('CapPrm', '{zero}')"
    );
    let p = probe_lines(&stdout);
    if gvisor() {
        // gVisor's kernel has no ambient set (PR_CAP_AMBIENT is EINVAL) and no
        // NoNewPrivs line; prctl says no_new_privs is set. PID 1 (the tiny init) has no filter:
        // runsc loads the engine's profile only with --oci-seccomp, which is not passed
        // (SECURITY.md), and the runtime's own filter is on the code's processes.
        let want = format!("[{sets}, ('Seccomp', '2')]");
        assert_eq!(p["self"], want, "{stdout}");
        assert_eq!(p["child"], want, "{stdout}");
        assert_eq!(p["init"], format!("[{sets}, ('Seccomp', '0')]"), "{stdout}");
        assert_eq!(p["prctl_self"], "1 einval", "{stdout}");
        assert_eq!(p["prctl_child"], "1 einval", "{stdout}");
    } else {
        let want = format!("[('CapAmb', '{zero}'), {sets}, ('NoNewPrivs', '1'), ('Seccomp', '2')]");
        assert_eq!(p["self"], want, "{stdout}");
        assert_eq!(p["child"], want, "{stdout}");
        assert_eq!(p["init"], want, "{stdout}");
        assert_eq!(p["prctl_self"], "1 none", "{stdout}");
        assert_eq!(p["prctl_child"], "1 none", "{stdout}");
    }
    b.shutdown_still_serving().await;
}

/// Python defining `sc(name, *args)`: a raw syscall through ctypes, returning the errno name
/// or "OK" (the sandbox's libc wrappers would hide nothing, but raw syscalls leave no doubt).
const SYSCALL_PRELUDE: &str = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
NR = {"unshare": 272, "mount": 165, "ptrace": 101, "keyctl": 250, "add_key": 248,
      "bpf": 321, "mknod": 133, "setns": 308, "umount2": 166, "pivot_root": 155,
      "init_module": 175, "kexec_load": 246, "perf_event_open": 298, "userfaultfd": 323}
def sc(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(NR[name], *args)
    return "OK" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())
"#;

async fn syscalls(b: &Bridge, body: &str) -> std::collections::BTreeMap<String, String> {
    b.probe(&format!("{SYSCALL_PRELUDE}\n{body}")).await
}

/// The attack of a fresh bridge's sandbox by the system calls of `body`: each of `keys` it
/// prints is refused with `EPERM`, and the bridge serves on.
async fn syscalls_refused(body: &str, keys: &[&str]) {
    let b = Bridge::start().await;
    let p = syscalls(&b, body).await;
    assert_each(&p, keys, "EPERM");
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn privilege_unshare_of_privileged_namespaces_is_refused() {
    syscalls_refused(
        r#"
flags = {"mount": 0x00020000, "net": 0x40000000, "pid": 0x20000000,
         "uts": 0x04000000, "ipc": 0x08000000, "cgroup": 0x02000000}
for n, f in flags.items():
    print("unshare_" + n, sc("unshare", ctypes.c_int(f)))
"#,
        &[
            "unshare_mount",
            "unshare_net",
            "unshare_pid",
            "unshare_uts",
            "unshare_ipc",
            "unshare_cgroup",
        ],
    )
    .await;
}

/// A single-threaded child (the runtime itself is multi-threaded, where the kernel answers
/// EINVAL) asks for a user namespace: inside one it would hold every capability, could mount a
/// fresh tmpfs without noexec and run files from it, and reach far more kernel code.
#[tokio::test(flavor = "multi_thread")]
async fn privilege_user_namespaces_are_refused() {
    let b = Bridge::start().await;
    let code = r#"
import subprocess, sys
child = r'''
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
r = libc.unshare(0x10000000)
print("OK" if r == 0 else errno.errorcode[ctypes.get_errno()])
'''
print("unshare_user", subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
print("unshare_cmd", subprocess.run(["unshare", "-r", "true"], capture_output=True).returncode)
"#;
    let p = b.probe(code).await;
    assert_eq!(p["unshare_user"], "EPERM", "{p:?}");
    assert_ne!(p["unshare_cmd"], "0", "{p:?}");
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn privilege_mount_is_refused() {
    let b = Bridge::start().await;
    let p = syscalls(
        &b,
        r#"
os.makedirs("/tmp/m", exist_ok=True)
print("mount_tmpfs", sc("mount", b"none", b"/tmp/m", b"tmpfs", ctypes.c_ulong(0), None))
print("mount_proc", sc("mount", b"proc", b"/tmp/m", b"proc", ctypes.c_ulong(0), None))
print("remount_root_rw", sc("mount", None, b"/", None, ctypes.c_ulong(32 | 0x20), None))
print("bind", sc("mount", b"/", b"/tmp/m", None, ctypes.c_ulong(4096), None))
print("umount_tmp", sc("umount2", b"/tmp", ctypes.c_int(2)))
print("pivot_root", sc("pivot_root", b"/tmp", b"/tmp/m"))
import shutil
print("mount_cmd", shutil.which("mount") or "absent")
"#,
    )
    .await;
    assert_each(
        &p,
        &[
            "mount_tmpfs",
            "mount_proc",
            "remount_root_rw",
            "bind",
            "umount_tmp",
            "pivot_root",
        ],
        "EPERM",
    );
    // The image carries no mount(8); the syscall above is what a binary would use anyway.
    assert_eq!(p["mount_cmd"], "absent");
    b.shutdown_still_serving().await;
}

/// What ptrace can reach at all: the PID namespace shows only the sandbox's own processes,
/// all running as the sandbox user, so a tracer can never touch a host process.
#[tokio::test(flavor = "multi_thread")]
async fn privilege_ptrace_reaches_only_the_sandboxs_own_processes() {
    let b = Bridge::start().await;
    let p = syscalls(
        &b,
        r#"
pids = sorted(int(d) for d in os.listdir("/proc") if d.isdigit())
uids = sorted({[l.split()[1] for l in open("/proc/%d/status" % q) if l.startswith("Uid:")][0] for q in pids})
print("max_pid", max(pids))
print("uids", uids)
print("init", open("/proc/1/cmdline").read().split("\0")[0])
print("host_pid1_visible", any(open("/proc/%d/cmdline" % q).read().startswith(("/sbin/init", "/lib/systemd", "/usr/lib/systemd")) for q in pids))
"#,
    )
    .await;
    assert_eq!(p["uids"], "['65534']", "{p:?}");
    assert!(p["max_pid"].parse::<u32>().unwrap() < 64, "{p:?}");
    // The engine's init (`--init`): podman's catatonit, docker's tini.
    let init = if common::engine() == "docker" {
        "/sbin/docker-init"
    } else {
        "/run/podman-init"
    };
    assert_eq!(p["init"], init, "{p:?}");
    assert_eq!(p["host_pid1_visible"], "False");
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn privilege_ptrace_of_another_process_is_refused() {
    syscalls_refused(
        r#"
import subprocess, time
PTRACE_ATTACH = 16
child = subprocess.Popen(["sleep", "30"])
time.sleep(0.2)
print("attach_init", sc("ptrace", ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(1), None, None))
print("attach_child", sc("ptrace", ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(child.pid), None, None))
child.kill()
"#,
        &[
            "attach_init",
            "attach_child",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn privilege_add_key_is_refused_and_proc_keys_is_masked() {
    let b = Bridge::start().await;
    let p = syscalls(
        &b,
        r#"
KEY_SPEC_SESSION_KEYRING = -3
print("add_key", sc("add_key", b"user", b"mcb", b"secret", ctypes.c_size_t(6), ctypes.c_int(KEY_SPEC_SESSION_KEYRING)))
try:
    print("proc_keys_empty", open("/proc/keys").read() == "")
except OSError as e:
    print("proc_keys_empty", errno.errorcode.get(e.errno))
"#,
    )
    .await;
    assert!(p["add_key"] == "EPERM" || p["add_key"] == "ENOSYS", "{p:?}");
    // gVisor's kernel has no keyrings and no /proc/keys at all.
    let want = if gvisor() { "ENOENT" } else { "True" };
    assert_eq!(p["proc_keys_empty"], want, "/proc/keys shows host keys");
    b.shutdown_still_serving().await;
}

/// Keyrings are not namespaced: a sandbox that may call keyctl shares the user keyring of its
/// uid with every host process of that uid.
#[tokio::test(flavor = "multi_thread")]
async fn privilege_keyctl_is_refused() {
    syscalls_refused(
        r#"
KEYCTL_GET_KEYRING_ID, KEYCTL_JOIN_SESSION_KEYRING, KEY_SPEC_USER_KEYRING = 0, 1, -4
print("keyctl_join", sc("keyctl", ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), b"mcb"))
print("keyctl_user_keyring", sc("keyctl", ctypes.c_int(KEYCTL_GET_KEYRING_ID), ctypes.c_int(KEY_SPEC_USER_KEYRING), ctypes.c_int(0)))
"#,
        &[
            "keyctl_join",
            "keyctl_user_keyring",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn privilege_bpf_and_other_kernel_interfaces_are_refused() {
    syscalls_refused(
        r#"
attr = ctypes.create_string_buffer(128)
print("bpf_map_create", sc("bpf", ctypes.c_int(0), attr, ctypes.c_uint(128)))
print("bpf_prog_load", sc("bpf", ctypes.c_int(5), attr, ctypes.c_uint(128)))
print("init_module", sc("init_module", None, ctypes.c_ulong(0), b""))
print("kexec_load", sc("kexec_load", ctypes.c_ulong(0), ctypes.c_ulong(0), None, ctypes.c_ulong(0)))
print("setns", sc("setns", ctypes.c_int(os.open("/proc/1/ns/net", os.O_RDONLY)), ctypes.c_int(0)))
"#,
        &[
            "bpf_map_create",
            "bpf_prog_load",
            "init_module",
            "kexec_load",
            "setns",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn privilege_device_nodes_cannot_be_made() {
    let b = Bridge::start().await;
    let p = syscalls(
        &b,
        r#"
import stat
for d in ["/tmp", "/workspace", "/dev/shm"]:
    for name, mode, dev in [("null", stat.S_IFCHR, os.makedev(1, 3)), ("mem", stat.S_IFCHR, os.makedev(1, 1)),
                            ("vda", stat.S_IFBLK, os.makedev(254, 0))]:
        try:
            os.mknod(d + "/" + name, mode | 0o666, dev)
            print("mknod_%s_%s" % (d, name), "MADE")
        except OSError as e:
            print("mknod_%s_%s" % (d, name), errno.errorcode.get(e.errno))
devs = sorted(os.listdir("/dev"))
print("dev", devs)
try:
    open("/dev/mem", "rb")
    print("devmem OPENED")
except OSError as e:
    print("devmem", errno.errorcode.get(e.errno))
"#,
    )
    .await;
    for d in ["/tmp", "/workspace", "/dev/shm"] {
        for n in ["null", "mem", "vda"] {
            assert_eq!(p[&format!("mknod_{d}_{n}")], "EPERM", "{d}/{n}: {p:?}");
        }
    }
    assert_eq!(p["devmem"], "ENOENT", "{p:?}");
    for forbidden in ["'mem'", "'kmem'", "'vda'", "'sda'", "'kvm'", "'port'"] {
        assert!(
            !p["dev"].contains(forbidden),
            "/dev has {forbidden}: {}",
            p["dev"]
        );
    }
    b.shutdown_still_serving().await;
}

// ------------------------------------------------------------------------------------------
// Protocol abuse from inside: frames written to the real channel fd.

/// Python that finds the channel to the host the way an attacker would: the runtime dup'ed the
/// container's stdout to a private descriptor, the only write end of a pipe whose read end is not
/// in this process. `forge(x)` writes bytes or a frame to it (under the runtime's write lock, so a
/// forged frame is not interleaved with a real one).
const CHANNEL_PRELUDE: &str = r#"
import json, os, sys, threading
def _channel_fd():
    links = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            links[int(name)] = os.readlink("/proc/self/fd/" + name)
        except OSError:
            pass
    def write_end(fd):
        flags = int(open("/proc/self/fdinfo/%d" % fd).read().split("flags:")[1].split()[0], 8)
        return flags & 3 in (1, 2)
    # A pipe under runc; under gVisor the container's own stdio is a host file ("host:[n]").
    pipes = [fd for fd, t in links.items() if t.startswith(("pipe:", "host:"))]
    only = [fd for fd in pipes if fd > 2 and write_end(fd)
            and sum(1 for o in pipes if links[o] == links[fd]) == 1]
    assert len(only) == 1, (only, links)
    return only[0]
CH = _channel_fd()
_rt = sys.modules["__mcp_bridge_runtime__"]
assert CH == _rt.state.frame_out, "found the wrong descriptor"
EXEC_ID = _rt.state.running.id
def forge(x):
    data = x if isinstance(x, bytes) else json.dumps(x).encode() + b"\n"
    with _rt.channel.write_lock:
        view = memoryview(data)
        while view:
            view = view[os.write(CH, view):]
_forged_ids = iter(range(10**12, 10**13))
def forged_rpc(method, params, exec_id=None, wait=30):
    """An rpc frame written by hand; the host's answer is caught by registering the id.
    Returns None when no answer came within `wait` seconds."""
    rid = next(_forged_ids)
    p = _rt.channel.Pending(event=threading.Event())
    _rt.channel.pending[rid] = p
    forge({"type": "rpc", "id": rid, "exec": EXEC_ID if exec_id is None else exec_id,
           "method": method, "params": params})
    answered = p.event.wait(wait)
    _rt.channel.pending.pop(rid, None)
    if wait >= 30:
        assert answered, "the host never answered forged rpc %d" % rid
    return p.msg if answered else None
"#;

fn with_channel(code: &str) -> String {
    format!("{CHANNEL_PRELUDE}\n{code}")
}

#[tokio::test(flavor = "multi_thread")]
async fn protocol_forged_result_frame_only_fools_the_model_itself() {
    let b = Bridge::start().await;
    // A result for the running exec, forged before the code finishes: the host believes it (the
    // channel is the code's own), so this call ends early with the forged value...
    let r = b
        .py(&with_channel(
            r#"
forge({"type": "result", "id": EXEC_ID, "status": "ok", "value": "'forged value'"})
import time
time.sleep(1)
print("real output after the forgery")
"#,
        ))
        .await
        .ok();
    assert_eq!(r.sc()["value"], "'forged value'");
    assert!(!r.stdout().contains("real output"), "{}", r.stdout());
    // ...and the real frames of that exec, arriving later, go to no one: the next call gets
    // exactly its own output.
    let next = b.py("print('second call')").await.ok();
    assert_eq!(next.stdout(), "second call\n");
    assert!(next.sc().get("value").is_none());
    let again = b.py("print('third call')\n40 + 2").await.ok();
    assert_eq!(again.stdout(), "third call\n");
    assert_eq!(again.sc()["value"], "42");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn protocol_garbage_and_terminated_partial_frames_are_dropped() {
    let b = Bridge::start().await;
    let r = b
        .py(&with_channel(
            r#"
import random
rnd = random.Random(6)
forge(b"\x00\xff\xfe garbage \x80\x81\n")
forge(bytes(rnd.randrange(256) for _ in range(100_000)) + b"\n")
forge(b"[1, 2, 3]\n")
forge(b'"just a string"\n')
forge(b'{"no_type": true}\n')
forge(b'{"type": "result"}\n')
forge(b'{"type": "result", "id": "not-an-int", "status": "ok"}\n')
forge(b'{"type": "output", "id": -1, "stream": "stdout", "data": "negative"}\n')
forge(b'{"type": "output", "id": 18446744073709551616, "stream": "stdout", "data": "huge"}\n')
forge(b'{"type": "rpc", "id": 1, "exec": 1, "method": 5}\n')
forge(b'{"type": "some_future_frame", "x": 1}\n')
forge(b'{"type": "output", "id": ' + str(EXEC_ID).encode() + b', "stream": "stdout", "da')
forge(b'ta": "PARTIAL-SPLIT", "extra": {"nested": [1, {"deep": "x"}]}}\n')
forge(b'{"type": "output", "id": ' + str(EXEC_ID).encode() + b', "stream": "stdout"')
forge(b' TRAILING GARBAGE\n')
forge(b"\n\n\n")
print("real output")
"#,
        ))
        .await
        .ok();
    // A forged frame for the live exec, even split across writes, is the code's own output;
    // everything malformed vanished without a trace in the reply.
    assert_eq!(r.stdout(), "PARTIAL-SPLITreal output\n");
    assert!(
        b.home.log().contains("not a frame"),
        "garbage was not logged"
    );
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn protocol_unterminated_partial_frame_costs_only_the_models_own_call() {
    let b = Bridge::start().await;
    b.py("kept = 1").await.ok();
    // A frame left without its newline swallows the runtime's next real frame. Followed by
    // output, the output is lost (the glued line is garbage) and the call still ends.
    let r = b
        .py(&with_channel(
            "forge(b'{\"type\": \"output\", \"id\": 1')\nprint('swallowed')",
        ))
        .await
        .ok();
    assert!(!r.stdout().contains("swallowed"), "{}", r.text());
    assert_eq!(b.py("print(kept)").await.ok().stdout(), "1\n");
    // With nothing after it, the swallowed frame is the result: the host never hears the exec
    // end, so the call times out, the sandbox is killed and reset, and the reply says so.
    let r = Outcome(
        b.call(json!({"code": with_channel("forge(b'{\"type\": \"output\", \"id\": 1')"), "timeout": 2}))
            .await,
    );
    assert_eq!(r.status(), "timeout", "{}", r.text());
    assert_eq!(r.sc()["session_reset"], true, "{}", r.text());
    assert!(r.text().contains("session was reset"), "{}", r.text());
    b.assert_kept_is_gone().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn protocol_oversize_frames_are_discarded_whole() {
    let b = Bridge::start().await;
    let r = b
        .py(&with_channel(
            r#"
big = 17 * 1024 * 1024
# An oversize line of junk, written in pieces...
for _ in range(17):
    forge(b"a" * (1024 * 1024))
forge(b"tail\n")
# ...and an oversize but well-formed output frame for the live exec.
forge(json.dumps({"type": "output", "id": EXEC_ID, "stream": "stdout", "data": "X" * big}).encode() + b"\n")
print("after the oversize frames")
"#,
        ))
        .await
        .ok();
    assert_eq!(r.stdout(), "after the oversize frames\n");
    let log = b.home.log();
    assert_eq!(
        log.matches("discarding a line over").count(),
        2,
        "expected two discarded lines; log:\n{}",
        log.lines()
            .filter(|l| l.contains("discard"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn protocol_frames_naming_ids_that_never_existed_are_dropped() {
    let b = Bridge::start().await;
    let r = b
        .py(&with_channel(
            r#"
ghost = EXEC_ID + 1000
forge({"type": "output", "id": ghost, "stream": "stdout", "data": "GHOST OUTPUT"})
forge({"type": "display", "id": ghost, "mime": "image/png", "data": "iVBORw0KGgo="})
forge({"type": "result", "id": ghost, "status": "error", "error": {"type": "Ghost", "message": "boo"}})
forge({"type": "result", "id": 0, "status": "ok", "value": "'zero'"})
forge({"type": "rpc_result", "id": 12345, "ok": True, "result": "host frames do not flow this way"})
forge({"type": "ready", "python": "forged"})
forge({"type": "log", "level": "error", "message": "forged log line"})
print("real")
"#,
        ))
        .await
        .ok();
    assert_eq!(r.stdout(), "real\n");
    assert!(r.sc().get("value").is_none(), "{:?}", r.sc());
    assert!(r.0.content.iter().all(|c| c.as_image().is_none()));
    // The ghost exec id is not answered later either.
    for _ in 0..3 {
        let next = b.py("print('next')").await.ok();
        assert_eq!(next.stdout(), "next\n");
        assert!(!next.text().contains("GHOST") && !next.text().contains("Ghost"));
    }
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn protocol_forged_rpcs_are_answered_only_within_the_call_and_its_servers() {
    let home = Home::new();
    common::write_servers(
        &home,
        json!({"fx": common::misbehaving_server("normal", &[]), "other": common::misbehaving_server("normal", &[])}),
    );
    let b = Bridge::start_with(home, &[], None).await;
    // Remember this exec's id so a later call can forge an rpc in its name.
    let first = b
        .call(
            json!({"code": with_channel("old_exec = EXEC_ID\nprint(old_exec)"), "servers": ["fx"]}),
        )
        .await;
    let first = Outcome(first).ok();
    assert!(!first.stdout().is_empty());
    let r = b
        .call(json!({"code": with_channel(r#"
def show(name, m):
    print(name, json.dumps({"ok": m.get("ok"), "result": m.get("result"), "error": m.get("error")}))
show("loaded", forged_rpc("call_tool", {"server": "fx", "tool": "echo", "arguments": {"text": "hi"}}))
show("unloaded", forged_rpc("call_tool", {"server": "other", "tool": "echo", "arguments": {"text": "hi"}}))
show("unknown_server", forged_rpc("call_tool", {"server": "nope", "tool": "echo", "arguments": {}}))
show("unknown_method", forged_rpc("rm_rf", {}))
show("bad_params", forged_rpc("call_tool", {"server": 5}))
show("stale_exec", forged_rpc("call_tool", {"server": "fx", "tool": "echo", "arguments": {"text": "x"}}, exec_id=old_exec))
show("future_exec", forged_rpc("list_servers", {}, exec_id=EXEC_ID + 7))
show("list_servers", forged_rpc("list_servers", {}))
"#), "servers": ["fx"]}))
        .await;
    let r = Outcome(r).ok();
    let p = probe_lines(r.stdout());
    let get = |k: &str| -> Value {
        serde_json::from_str(p.get(k).unwrap_or_else(|| panic!("{k}: {}", r.stdout()))).unwrap()
    };
    let loaded = get("loaded");
    assert_eq!(loaded["ok"], true, "{loaded}");
    assert!(loaded["result"].to_string().contains("hi"), "{loaded}");
    let unloaded = get("unloaded");
    assert_eq!(unloaded["ok"], false, "{unloaded}");
    let msg = unloaded["error"].as_str().unwrap();
    assert!(
        msg.contains("other") && msg.contains("\"servers\""),
        "the refusal should say how to load the server: {msg}"
    );
    for k in ["unknown_server", "unknown_method", "bad_params"] {
        let v = get(k);
        assert_eq!(v["ok"], false, "{k}: {v}");
        assert!(!v["error"].as_str().unwrap().is_empty(), "{k}: {v}");
    }
    for k in ["stale_exec", "future_exec"] {
        let v = get(k);
        assert_eq!(v["ok"], false, "{k}: {v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("after its run_python call ended"),
            "{k}: {v}"
        );
    }
    assert_eq!(get("list_servers")["result"], json!(["fx"]));
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn protocol_rpc_flood_is_answered_and_the_channel_stays_usable() {
    let home = Home::with_fx("normal", &[]);
    let b = Bridge::start_with(home, &[], None).await;
    let r = b
        .call(json!({"code": with_channel(r#"
# 20000 rpcs nobody waits for, as fast as the pipe takes them.
frames = b"".join(json.dumps({"type": "rpc", "id": 5 * 10**12 + i, "exec": EXEC_ID,
                              "method": "list_servers", "params": {}}).encode() + b"\n"
                  for i in range(20000))
forge(frames)
# The host never blocks on them: it answers, refuses ("too many tool calls in flight"), or -
# past twice the pending limit, a sandbox flooding faster than it reads - drops them. Once they
# drain, the real channel works in both directions, with answers matched to requests.
import time
for _ in range(120):
    m = forged_rpc("list_servers", {}, wait=1)
    if m is not None and m.get("ok"):
        break
    assert m is None or "too many tool calls in flight" in m.get("error", ""), m
    time.sleep(0.2)
print("forged_after", m.get("ok"), m.get("result"))
print("after_flood", await mcp_fx.echo(text="after the flood"))
"#), "servers": ["fx"], "timeout": 100}))
        .await;
    let r = Outcome(r).ok();
    let p = probe_lines(r.stdout());
    assert_eq!(p["after_flood"], "after the flood", "{}", r.stdout());
    assert_eq!(p["forged_after"], "True ['fx']");
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn protocol_thousands_of_concurrent_tool_calls_each_get_their_own_answer() {
    let home = Home::with_fx("normal", &[]);
    let b = Bridge::start_with(home, &[], None).await;
    let code = r#"
import asyncio
async def one(i):
    try:
        return await mcp_fx.echo(text="req-%d" % i)
    except Exception as e:
        return e
res = await asyncio.gather(*(one(i) for i in range(3000)))
wrong = [(i, r) for i, r in enumerate(res) if not isinstance(r, Exception) and r != "req-%d" % i]
errors = [str(r) for r in res if isinstance(r, Exception)]
print("answered", len(res) - len(errors))
print("wrong", len(wrong), wrong[:3])
print("errors", len(errors), sorted(set(e[:100] for e in errors))[:3])
"#;
    let r = Outcome(
        b.call(json!({"code": code, "servers": ["fx"], "timeout": 110}))
            .await,
    )
    .ok();
    let p = probe_lines(r.stdout());
    assert_eq!(
        p["wrong"],
        "0 []",
        "replies delivered to the wrong call: {}",
        r.stdout()
    );
    assert_eq!(p["errors"], "0 []", "{}", r.stdout());
    assert_eq!(p["answered"], "3000");
    b.shutdown_still_serving().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn protocol_pending_tool_calls_beyond_the_limit_are_refused_clearly() {
    let home = Home::with_fx("normal", &[]);
    let b = Bridge::start_with(home, &[("MCP_BRIDGE_UPSTREAM_CALL_TIMEOUT", "60s")], None).await;
    // 4300 calls that never finish: the host keeps 4096 pending (32 running) and refuses the
    // rest at once with a message, instead of queueing without bound.
    let code = r#"
import asyncio
tasks = [asyncio.ensure_future(mcp_fx.hang()) for _ in range(4300)]
await asyncio.sleep(4)
refused = [t for t in tasks if t.done() and t.exception() is not None]
msgs = sorted(set(str(t.exception())[:120] for t in refused))
print("refused", len(refused))
print("pending", sum(1 for t in tasks if not t.done()))
print("answered", sum(1 for t in tasks if t.done() and t.exception() is None))
print("messages", msgs)
for t in tasks:
    t.cancel()
"#;
    let r = Outcome(
        b.call(json!({"code": code, "servers": ["fx"], "timeout": 60}))
            .await,
    )
    .ok();
    let p = probe_lines(r.stdout());
    let refused: usize = p["refused"].parse().unwrap();
    let pending: usize = p["pending"].parse().unwrap();
    assert_eq!(p["answered"], "0", "{}", r.stdout());
    assert_eq!(refused + pending, 4300, "{}", r.stdout());
    assert!(refused >= 4300 - 4096, "{}", r.stdout());
    assert!(
        p["messages"].contains("too many tool calls in flight (limit 4096)"),
        "{}",
        r.stdout()
    );
    // The abandoned calls do not wedge the next one.
    let r = Outcome(
        b.call(json!({"code": "print(await mcp_fx.echo(text='fine'))", "servers": ["fx"]}))
            .await,
    )
    .ok();
    assert_eq!(r.stdout(), "fine\n");
    b.shutdown().await;
}

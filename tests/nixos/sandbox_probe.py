# Run by `mcp-code-bridge exec -f` inside the sandbox (tests/nixos/sandbox.nix). Every check
# raises on failure, so the bridge exits non-zero; the last line is the marker the test looks for.
# @ipv4@, @ipv6@ and @port@ are filled in by Nix: a listener on the VM that a container with
# default networking can reach (the test checks that first).
import os
import socket
import sys

IPV4 = "@ipv4@"
IPV6 = "@ipv6@"
PORT = int("@port@")


def blocked(what, fn):
    try:
        fn()
    except OSError as e:  # socket.gaierror and timeouts are OSErrors too
        print(f"{what}: blocked ({type(e).__name__}: {e})")
        return
    raise AssertionError(f"{what}: NOT blocked")


def tcp(family, addr):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(addr)


def udp(family, addr):
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01", addr)
        s.recvfrom(512)


# network: the VM's listener, DNS, IPv6
blocked("tcp to the VM listener", lambda: tcp(socket.AF_INET, (IPV4, PORT)))
blocked("dns lookup", lambda: socket.getaddrinfo("example.com", 443))
blocked("udp dns query to the VM", lambda: udp(socket.AF_INET, (IPV4, 53)))
blocked("tcp over ipv6", lambda: tcp(socket.AF_INET6, (IPV6, PORT, 0, 0)))
ifaces = sorted(os.listdir("/sys/class/net"))
assert ifaces == ["lo"], f"network interfaces: {ifaces}"

# identity
assert (os.getuid(), os.getgid()) == (65534, 65534), (os.getuid(), os.getgid())
assert os.geteuid() == 65534 and os.getegid() == 65534

# capabilities and no_new_privs
status = dict(
    line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line
)
for cap in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"):
    assert int(status[cap].strip(), 16) == 0, f"{cap} = {status[cap].strip()}"
assert status["NoNewPrivs"].strip() == "1", status["NoNewPrivs"]

# filesystems: read-only root, size-capped noexec tmpfs on /tmp and /workspace
mounts = {}
for line in open("/proc/self/mounts"):
    dev, mnt, fstype, opts = line.split()[:4]
    mounts[mnt] = (fstype, set(opts.split(",")))
assert "ro" in mounts["/"][1], f"/ is mounted {mounts['/']}"
for mnt in ("/tmp", "/workspace"):
    fstype, opts = mounts[mnt]
    assert fstype == "tmpfs", (mnt, fstype)
    assert {"noexec", "nosuid", "nodev"} <= opts, (mnt, opts)
    with open(os.path.join(mnt, "probe.txt"), "w") as f:
        f.write("writable")
blocked("write to /", lambda: open("/probe.txt", "w"))
blocked("write to /etc", lambda: open("/etc/probe.txt", "w"))

# the image's Python
import numpy  # noqa: E402
import pandas  # noqa: E402

assert sys.version_info[:2] == (3, 14), sys.version
print("python", sys.version.split()[0], "numpy", numpy.__version__, "pandas", pandas.__version__)
print("SANDBOX-PROBE-OK")

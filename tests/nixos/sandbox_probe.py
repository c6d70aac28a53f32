# Run inside containers by tests/nixos/sandbox.nix, in one of two modes (@mode@, filled in by Nix
# with the other @...@ values):
#
# - "control": in a container *with* a network (podman's, dual-stack). Every network check below
#   must succeed: the VM's HTTP listener over IPv4 and IPv6 (one dual-stack socket on ::), its DNS
#   responder over UDP on IPv4 and IPv6, a name lookup through the VM's resolver, an interface
#   besides lo. So each of them is a check that can fail.
# - "sandbox": by `mcp-code-bridge exec -f`, in the bridge's sandbox. The same checks must all be
#   blocked; then identity, capabilities, no_new_privs, the engine's seccomp profile, filesystems
#   and the image's Python.
#
# The IPv6 checks are blocked on podman's default network too, which has no IPv6 (nixpkgs' podman
# module sets ipv6_enabled = false): what they prove is that IPv6 is blocked where the control's
# network carries it. A sandbox that had landed on the default network would still fail here, by
# the IPv4 checks and the interface check.
#
# Every check raises on failure, so the bridge (or python3) exits non-zero; the last line is the
# marker the test looks for. In sandbox mode every network check is tried and reported before the
# first one that was not blocked fails the probe. @isolation@ is "container" (the host's kernel,
# runc/crun) or "gvisor" (gVisor's runsc, whose own kernel reports some things differently: where
# it does, the check reads the kernel's answer through a system call rather than /proc or /sys
# text).
import ctypes
import os
import socket
import struct
import subprocess
import sys

MODE = "@mode@"
ISOLATION = "@isolation@"
IPV4 = "@ipv4@"
IPV6 = "@ipv6@"
PORT = int("@port@")
NAME = "@name@"
assert MODE in ("control", "sandbox"), MODE
assert ISOLATION in ("container", "gvisor"), ISOLATION


# ---------------------------------------------------------------- network
def http(family, addr):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(addr)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        head = s.recv(64)
    assert head.startswith(b"HTTP/1."), head


def dns_query(family, addr, qtype):
    qname = b"".join(bytes([len(p)]) + p.encode() for p in NAME.split(".")) + b"\x00"
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + qname + struct.pack(">HH", qtype, 1)
    # connect() first, as glibc's resolver does (resolv/res_send.c): the kernel then drops a
    # reply from any other address than the one asked, as the resolver would.
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.connect(addr)
        s.send(query)
        reply = s.recv(512)
    ident, flags, _, answers = struct.unpack(">HHHH", reply[:8])
    assert ident == 0x1234 and flags & 0x8000 and answers >= 1, reply


def lookup():
    infos = socket.getaddrinfo(NAME, PORT, socket.AF_INET, socket.SOCK_STREAM)
    found = sorted({info[4][0] for info in infos})
    assert found == [IPV4], found


def interfaces():
    # The kernel's list (netlink, through if_nameindex); /sys/class/net must agree where the
    # kernel has it (gVisor may not).
    names = sorted(name for _, name in socket.if_nameindex())
    if os.path.isdir("/sys/class/net"):
        assert sorted(os.listdir("/sys/class/net")) == names, (os.listdir("/sys/class/net"), names)
    else:
        assert ISOLATION == "gvisor", "no /sys/class/net"
    return names


NETWORK = [
    ("tcp over ipv4 to the VM's listener", lambda: http(socket.AF_INET, (IPV4, PORT))),
    ("tcp over ipv6 to the VM's listener", lambda: http(socket.AF_INET6, (IPV6, PORT, 0, 0))),
    ("udp dns query over ipv4 to the VM", lambda: dns_query(socket.AF_INET, (IPV4, 53), 1)),
    ("udp dns query over ipv6 to the VM", lambda: dns_query(socket.AF_INET6, (IPV6, 53, 0, 0), 28)),
    (f"dns lookup of {NAME} through the VM's resolver", lookup),
]

print(f"KERNEL={os.uname().release}")

if MODE == "control":
    for what, check in NETWORK:
        check()
        print(f"{what}: reached")
    names = interfaces()
    assert names != ["lo"], f"network interfaces: {names}"
    print(f"interfaces: {names}")
    print("CONTROL-OK")
    sys.exit(0)


def blocked(what, fn, fail=True):
    try:
        fn()
    except OSError as e:  # socket.gaierror, timeouts and PermissionError are OSErrors too
        print(f"{what}: blocked ({type(e).__name__}: {e})")
        return True
    if fail:
        raise AssertionError(f"{what}: NOT blocked")
    print(f"{what}: NOT blocked")
    return False


reached = [what for what, check in NETWORK if not blocked(what, check, fail=False)]
assert not reached, f"reached from the sandbox: {reached}"
names = interfaces()
assert names == ["lo"], f"network interfaces: {names}"
print(f"interfaces: {names}")

# ---------------------------------------------------------------- identity
assert (os.getuid(), os.getgid()) == (65534, 65534), (os.getuid(), os.getgid())
assert os.geteuid() == 65534 and os.getegid() == 65534

# ---------------------------------------------------------------- capabilities, no_new_privs
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
PR_CAPBSET_READ, PR_GET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET = 23, 39, 47, 1


def prctl(op, a2=0, a3=0):
    r = libc.prctl(op, a2, a3, 0, 0)
    if r < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return r


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


header, data = CapHeader(0x20080522, 0), (CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
if libc.capget(ctypes.byref(header), data) != 0:
    raise OSError(ctypes.get_errno(), "capget")
for d in data:
    assert (d.effective, d.permitted, d.inheritable) == (0, 0, 0), (d.effective, d.permitted, d.inheritable)
bounding, known = [], 0
for cap in range(64):
    try:
        if prctl(PR_CAPBSET_READ, cap):
            bounding.append(cap)
    except OSError:  # EINVAL: past the last capability
        break
    known = cap + 1
assert known > 0 and bounding == [], f"bounding set: {bounding} of {known} capabilities"
ambient = []
try:
    for cap in range(known):
        if prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap):
            ambient.append(cap)
except OSError:
    assert ISOLATION == "gvisor", "PR_CAP_AMBIENT failed"  # gVisor may not implement it: no ambient set
assert ambient == [], f"ambient set: {ambient}"
assert prctl(PR_GET_NO_NEW_PRIVS) == 1, "no_new_privs is not set"

# A filter on this process (the runtime's own, stacked on the engine's profile under runc). The
# engine's profile is on PID 1 too under runc; runsc loads it only with --oci-seccomp, which the
# wrappers do not pass (it answers the profile's refusals, select(2) included, with EPERM).
for pid in ("self", "1") if ISOLATION != "gvisor" else ("self",):
    fields = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status").read().splitlines() if ":" in l)
    assert fields.get("Seccomp", "").strip() == "2", f"/proc/{pid}/status: Seccomp {fields.get('Seccomp')}"
print("seccomp: a filter on this process" + (" and on PID 1" if ISOLATION != "gvisor" else ""))

# /proc/self/status says the same; under gVisor only the fields it reports.
status = dict(
    line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line
)
for field in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb", "NoNewPrivs"):
    if field not in status:
        assert ISOLATION == "gvisor", f"/proc/self/status has no {field}"
        continue
    expected = 1 if field == "NoNewPrivs" else 0
    assert int(status[field].strip(), 16) == expected, f"{field} = {status[field].strip()}"

# ---------------------------------------------------------------- filesystems
# Read-only root; size-capped tmpfs on /tmp and /workspace on which nothing can be executed.
mounts = {}
for line in open("/proc/self/mounts"):
    dev, mnt, fstype, opts = line.split()[:4]
    mounts[mnt] = (fstype, set(opts.split(",")))
assert "ro" in mounts["/"][1], f"/ is mounted {mounts['/']}"
for mnt in ("/tmp", "/workspace"):
    fstype, opts = mounts[mnt]
    assert fstype == "tmpfs", (mnt, fstype)
    # gVisor's /proc/self/mounts may leave nosuid and nodev out; noexec is also tried below.
    flags = {"noexec", "nosuid", "nodev"} if ISOLATION == "container" else {"noexec"}
    assert flags <= opts, (mnt, opts)
    script = os.path.join(mnt, "probe-exec")
    with open(script, "w") as f:
        f.write(f"#!{sys.executable}\nprint('executed')\n")
    os.chmod(script, 0o755)
    blocked(f"executing a file in {mnt}", lambda: subprocess.run([script], check=True))
blocked("write to /", lambda: open("/probe.txt", "w"))
blocked("write to /etc", lambda: open("/etc/probe.txt", "w"))

# ---------------------------------------------------------------- the image's Python
import numpy  # noqa: E402
import pandas  # noqa: E402

assert sys.version_info[:2] == (3, 14), sys.version
print("python", sys.version.split()[0], "numpy", numpy.__version__, "pandas", pandas.__version__)
print("SANDBOX-PROBE-OK")

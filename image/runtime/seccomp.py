"""The runtime's own seccomp filter, stacked on the engine's profile before any user code runs.

The engine's profile is the first line; podman's default one still allows a few calls that give
the code more kernel than it needs (SECURITY.md). This filter refuses them: `unshare`, `setns`,
`ptrace`, `keyctl`, `add_key`, `request_key`, `bpf`, `perf_event_open`, `userfaultfd`, `clone`
asking for a new namespace, `mknod`/`mknodat` of a character or block device (which gVisor's
kernel grants where Linux refuses it without CAP_MKNOD), x32-ABI calls and calls of another
architecture (EPERM), and
`clone3` with ENOSYS (its flags are in memory a filter cannot read; libc then falls back to
`clone`). Filters can only be added under no_new_privs, never removed, and are inherited by
every thread and process started after: `install` runs while the runtime is the only thread.

It is part of the sandbox, not an extra: when it cannot be installed (no table for this
machine, the kernel or the engine refuses it), `boot.main` does not start the sandbox.
"""

import os
import platform

_SECCOMP = {
    # machine: (AUDIT_ARCH_*, syscall numbers)
    "x86_64": (0xC000003E, {"clone": 56, "clone3": 435, "unshare": 272, "setns": 308,
                            "ptrace": 101, "keyctl": 250, "add_key": 248, "request_key": 249,
                            "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
                            "mknod": 133, "mknodat": 259}),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435, "unshare": 97, "setns": 268,
                             "ptrace": 117, "keyctl": 219, "add_key": 217, "request_key": 218,
                             "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
                             "mknodat": 33}),
}
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
DENIED = ("unshare", "setns", "ptrace", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
          "userfaultfd")
# mknod's mode: the file type bits, and the two types that are devices.
S_IFMT, S_IFCHR, S_IFBLK = 0o170000, 0o020000, 0o060000
# Where the mode is in seccomp_data (args[i] at 16 + 8 * i, low half first): mknod(path, mode,
# dev) and mknodat(dirfd, path, mode, dev). aarch64 has only mknodat.
MKNOD_MODE = {"mknod": 24, "mknodat": 32}
# Classic BPF: the instructions the program uses, and the filter's answers.
LD_ABS, JEQ, JGE, JSET, AND, RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38


def program(arch, nrs):
    """The filter as classic-BPF instructions (code, jt, jf, k): refuse the calls above with
    EPERM; clone only when it asks for a new namespace; mknod and mknodat only of a device;
    clone3 with ENOSYS."""
    prog = []  # (code, jt, jf, k); jumps are filled with labels first
    prog.append((LD_ABS, 0, 0, 4))                      # arch
    prog.append((JEQ, 1, 0, arch))                      # ours: go on; else refuse
    prog.append((RET, 0, 0, EPERM))
    prog.append((LD_ABS, 0, 0, 0))                      # nr
    prog.append((JGE, "deny", 0, 0x40000000))           # x32 ABI numbers
    for name in DENIED:
        prog.append((JEQ, "deny", 0, nrs[name]))
    mknods = [name for name in MKNOD_MODE if name in nrs]
    for name in mknods:
        prog.append((JEQ, name, 0, nrs[name]))
    prog.append((JEQ, "enosys", 0, nrs["clone3"]))
    prog.append((JEQ, 0, "allow", nrs["clone"]))
    prog.append((LD_ABS, 0, 0, 16))                     # clone flags (args[0], low half)
    prog.append((JSET, "deny", "allow", CLONE_NAMESPACES))
    labels = {}
    for name in mknods:
        labels[name] = len(prog)
        prog.append((LD_ABS, 0, 0, MKNOD_MODE[name]))   # the mode (low half)
        prog.append((AND, 0, 0, S_IFMT))
        prog.append((JEQ, "deny", 0, S_IFCHR))
        prog.append((JEQ, "deny", "allow", S_IFBLK))
    labels["allow"] = len(prog)
    prog.append((RET, 0, 0, ALLOW))
    labels["deny"] = len(prog)
    prog.append((RET, 0, 0, EPERM))
    labels["enosys"] = len(prog)
    prog.append((RET, 0, 0, ENOSYS))
    out = []
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        out.append((code, jt, jf, k))
    return out


def install():
    """Stack the filter on the calling (only) thread. Returns None, or why it was not installed."""
    import ctypes
    import struct

    entry = _SECCOMP.get(platform.machine())
    if entry is None:
        return "no syscall table for %s" % platform.machine()
    prog = program(*entry)
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return "prctl(NO_NEW_PRIVS): %s" % os.strerror(ctypes.get_errno())
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return "prctl(SECCOMP): %s" % os.strerror(ctypes.get_errno())
    return None

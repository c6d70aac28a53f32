"""Tests of the sandbox runtime (image/runtime/ + image/loader.py), driven over the frame
protocol of docs/protocol.md exactly as the bridge drives it. The test plays the host: it sends
the boot frame the bridge sends (every module of image/runtime/, the entry module, the host's
constants) to the loader, the container's whole command.

Run: python3 -m pytest image/tests -q
With MCP_RUNTIME_TEST_IMAGE=<image> the runtime runs in that image under podman (hardened like the
bridge runs it: no network, read-only root, all caps dropped, nobody user) instead of on the host.
"""

import base64
import json
import os
import platform
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

IMAGE_DIR = Path(__file__).resolve().parent.parent
LOADER = (IMAGE_DIR / "loader.py").read_text()
# The runtime's modules by name, as the bridge embeds them (crates/sandbox/src/runtime.rs, MODULES).
MODULES = {p.stem: p.read_text() for p in sorted((IMAGE_DIR / "runtime").glob("*.py"))}
MAX_FRAME_BYTES = 16 * 1024 * 1024
# What the bridge sends as the boot frame's `constants` (each is a constant of the bridge's).
HOST_CONSTANTS = {
    "max_frame_bytes": MAX_FRAME_BYTES,
    "max_image_bytes": 6 * 1024 * 1024,
    "out_dir": "/workspace/out",
    "out_entries": 20000,
    "kept_dir": ".outputs",
    "skill_default_depth": 16,
}
TEST_IMAGE = os.environ.get("MCP_RUNTIME_TEST_IMAGE")
# The `code` frame the first sandbox of this run sent (as the bridge keeps it), for the next ones.
CODE = {}


def boot_frame(**fields):
    """The boot frame the bridge sends; `fields` replace or (None) remove some of its fields."""
    frame = {"type": "boot", "modules": MODULES, "entry": "boot", "constants": HOST_CONSTANTS}
    frame.update(fields)
    return {k: v for k, v in frame.items() if v is not None}


def runtime_command(loader=LOADER):
    if not TEST_IMAGE:
        return [sys.executable, "-u", "-c", loader]
    return [
        os.environ.get("MCP_RUNTIME_TEST_PODMAN", "podman"), "--runtime", "runc", "run", "--rm", "-i",
        "--network", "none", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--user", "65534:65534", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000",
        "--tmpfs", "/tmp:rw,noexec,nosuid,nodev,size=256m", "--tmpfs", "/workspace:rw,noexec,nosuid,nodev,size=64m",
        "-w", "/workspace", "-e", "HOME=/workspace", TEST_IMAGE, "python3", "-u", "-c", loader,
    ]


def rt_module(name):
    """Code that binds `rt` to one of the runtime's modules inside the sandbox."""
    return "import sys\nrt = sys.modules['__mcp_bridge_runtime__.%s']\n" % name

PNG_1x1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


class HostError(Exception):
    """Raised by an rpc handler: answered as ok:false."""


class Run:
    def __init__(self, frames):
        self.frames = frames
        self.result = frames[-1]
        self.status = self.result.get("status")
        self.value = self.result.get("value")
        self.error = self.result.get("error")
        self.rpcs = [f for f in frames if f["type"] == "rpc"]
        self.displays = [f for f in frames if f["type"] == "display"]

    def out(self, stream=None):
        return "".join(
            f["data"] for f in self.frames if f["type"] == "output" and (stream is None or f["stream"] == stream)
        )

    @property
    def stdout(self):
        return self.out("stdout")

    @property
    def stderr(self):
        return self.out("stderr")


class Sandbox:
    """The runtime in a subprocess, started exactly as the container starts it."""

    def __init__(self):
        self.proc = subprocess.Popen(
            runtime_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(IMAGE_DIR),
        )
        self.frames = queue.Queue()
        self.line_sizes = []
        self.bad_lines = []
        self.stderr_chunks = []
        self._ids = iter(range(1, 1 << 30))
        # What the host's skill store answers `load_skills` with; None: the rpc handler answers.
        self.skills = {"skills": [], "broken": []}
        # Whether exec frames say skills are saved (the host's `skills` field): only then does
        # an interpreter's first exec ask for them.
        self.skills_saved = True
        self.skill_loads = 0
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.send(boot_frame(code=CODE.get("frame")))
        first = self.next_frame(timeout=60)
        # The runtime's compiled code, sent first when the loader compiled it (the boot frame
        # carried none this interpreter could use): later sandboxes of this run boot with it.
        if first and first["type"] == "code":
            CODE["frame"] = {"magic": first["magic"], "modules": first["modules"]}
            first = self.next_frame(timeout=60)
        assert first and first["type"] == "ready", first
        self.ready = first

    def _read(self):
        for line in self.proc.stdout:
            self.line_sizes.append(len(line))
            try:
                self.frames.put(json.loads(line))
            except ValueError:
                self.bad_lines.append(line)
        self.frames.put(None)

    def _read_stderr(self):
        for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):
            self.stderr_chunks.append(chunk)

    def send(self, frame):
        self.send_raw(json.dumps(frame).encode() + b"\n")

    def send_raw(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def next_frame(self, timeout=20):
        try:
            frame = self.frames.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no frame within %ss" % timeout)
        if frame is None:
            raise AssertionError("runtime exited; stderr: %r" % b"".join(self.stderr_chunks)[-3000:])
        return frame

    def start(self, code, servers=(), discovered=None, output_cap=1 << 20):
        """`servers=None` leaves servers and discovered out, as the host does when unchanged."""
        eid = next(self._ids)
        frame = {"type": "exec", "id": eid, "code": code, "output_cap": output_cap}
        if self.skills_saved:
            frame["skills"] = True
        if servers is not None:
            if discovered is None:
                discovered = [{"name": s["name"], "alias": s["alias"], "description": s.get("description", "")}
                              for s in servers]
            frame["servers"] = list(servers)
            frame["discovered"] = list(discovered)
        self.send(frame)
        return eid

    def collect(self, eid, rpc=None, timeout=30, on_frame=None):
        frames = []
        deadline = time.monotonic() + timeout
        while True:
            frame = self.next_frame(timeout=max(0.1, deadline - time.monotonic()))
            if frame.get("type") == "log":
                continue
            assert frame.get("id") == eid or frame["type"] == "rpc", frame
            if frame["type"] == "rpc" and frame["method"] == "load_skills" and self.skills is not None:
                # The first exec of an interpreter asks for the saved skills: the host's store.
                self.send({"type": "rpc_result", "id": frame["id"], "ok": True, "result": self.skills})
                self.skill_loads += 1
                continue
            frames.append(frame)
            if on_frame is not None:
                on_frame(frame)
            if frame["type"] == "rpc":
                assert frame["exec"] == eid
                try:
                    if rpc is None:
                        raise HostError("no rpc expected")
                    answer = {"type": "rpc_result", "id": frame["id"], "ok": True,
                              "result": rpc(frame["method"], frame["params"])}
                except HostError as e:
                    answer = {"type": "rpc_result", "id": frame["id"], "ok": False, "error": str(e)}
                self.send(answer)
            if frame["type"] == "result":
                return Run(frames)

    def run(self, code, rpc=None, timeout=30, **kw):
        return self.collect(self.start(code, **kw), rpc=rpc, timeout=timeout)

    def ok(self, code, **kw):
        r = self.run(code, **kw)
        assert r.status == "ok", (r.error or {}).get("traceback", r.result)
        return r

    def healthy(self):
        """Whether the runtime still answers a trivial exec at once (nothing else queued)."""
        if self.proc.poll() is not None:
            return False
        try:
            while True:  # frames a failed test left behind
                if self.frames.get_nowait() is None:
                    return False
        except queue.Empty:
            pass
        try:
            eid = self.start("'healthy'", servers=None)
            while True:
                f = self.next_frame(timeout=5)
                if f.get("type") == "result" and f.get("id") == eid:
                    return f.get("value") == "'healthy'"
        except AssertionError:
            return False

    def close(self):
        try:
            self.proc.stdin.close()
        except Exception:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def _shared():
    holder = [Sandbox()]
    yield holder
    holder[0].close()


@pytest.fixture
def sb(_shared):
    """The module's shared runtime. A test that leaves it wedged (a lost interrupt, a hung exec)
    fails alone: the runtime is killed and the next test gets a fresh one."""
    yield _shared[0]
    if not _shared[0].healthy():
        _shared[0].proc.kill()
        _shared[0].close()
        _shared[0] = Sandbox()


@pytest.fixture
def fresh():
    s = Sandbox()
    yield s
    s.close()


FS = {
    "name": "file-system",
    "alias": "file_system",
    "description": "Files on the host",
    "cwd": "/srv",
    "tools": [
        {
            "name": "read-file",
            "alias": "read_file",
            "description": "Read a file.",
            "input_schema": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Where the file is"},
                    "head": {"type": "integer", "description": "First N lines"},
                    "encoding": {"type": "string", "enum": ["utf-8", "latin-1"], "default": "utf-8"},
                    "max-bytes": {"type": "number"},
                    "class": {"type": "boolean"},
                },
                "required": ["path"],
            },
        },
        {"name": "list", "alias": "list_", "description": "List things.",
         "input_schema": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}},
                                                            "opts": {"type": "object"}}}},
        {"name": "snap", "alias": "snap", "description": "Take a picture.", "input_schema": {"type": "object"}},
    ],
}
OTHER = {"name": "other", "alias": "other", "description": "Another server", "tools": []}


def tool_host(results):
    """An rpc handler answering call_tool with canned CallToolResults keyed by tool name."""
    calls = []

    def handle(method, params):
        calls.append((method, params))
        if method == "call_tool":
            res = results[params["tool"]]
            if isinstance(res, Exception):
                raise res
            return res
        if method == "list_servers":
            return ["file-system"]
        raise HostError("unexpected method " + method)

    handle.calls = calls
    return handle


# ---------------------------------------------------------------------------- basics


def test_ready_frame(sb):
    if not TEST_IMAGE:
        assert sb.ready["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert sb.ready["python"][0] == "3"
    assert isinstance(sb.ready["pid"], int)


def test_ready_frame_says_the_kernel_read_at_boot(sb):
    # What the host checks under isolation = "gvisor": the kernel as uname and /proc/version
    # give it, read before any exec.
    u = os.uname()
    kernel = sb.ready["kernel"]
    assert kernel["release"] == u.release and kernel["version"] == u.version, kernel
    with open("/proc/version") as f:
        assert kernel["proc_version"] == f.readline().strip(), kernel


def test_every_module_is_loaded_at_boot_and_the_public_api_is_mcp_runtime(sb):
    # The loader compiles a module when it is first imported: boot imports all of them, so none
    # is left to be compiled later (or never, unnoticed).
    r = sb.ok("import sys\nsorted(k[len('__mcp_bridge_runtime__.'):] for k in sys.modules\n"
              "       if k.startswith('__mcp_bridge_runtime__.'))")
    assert r.value == repr(sorted(MODULES))
    # mcp.runtime shows the public API and nothing of the machinery behind it.
    r = sb.ok("from mcp import runtime\n"
              "[sorted(n for n in vars(runtime) if not n.startswith('__')), runtime.__all__,\n"
              " sorted({getattr(runtime, n).__module__ for n in runtime.__all__})]")
    names, public, modules = eval(r.value)
    api = MODULES["api"]
    listed = api[api.index("NAMES = ("):api.index(")", api.index("NAMES = ("))]
    assert names == sorted(n for n in listed.split('"')[1::2])
    assert public == [n for n in listed.split('"')[1::2]
                      if n not in ("Audio", "Media", "Resource", "ToolDict", "ToolList", "ToolStr", "ServerProxy")]
    assert modules == ["mcp.runtime"]


# A prelude run before the loader, in the runtime's own process: a seccomp filter of its own that
# makes the kernel refuse every further filter (prctl(PR_SET_SECCOMP) and seccomp(2) with EACCES),
# as an engine or kernel that does not allow stacking would. It exists only in this test's command.
REFUSE_SECCOMP_SETUP = """
import ctypes, platform, struct
_PRCTL, _SECCOMP = {"x86_64": (157, 317), "aarch64": (167, 277)}[platform.machine()]
_prog = [(0x20, 0, 0, 0), (0x15, 3, 0, _SECCOMP), (0x15, 0, 3, _PRCTL), (0x20, 0, 0, 16),
         (0x15, 0, 1, 22), (0x06, 0, 0, 0x00050000 | 13), (0x06, 0, 0, 0x7FFF0000)]
_raw = ctypes.create_string_buffer(b"".join(struct.pack("=HBBI", *i) for i in _prog))
class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
_libc = ctypes.CDLL(None, use_errno=True)
"""
REFUSE_SECCOMP = REFUSE_SECCOMP_SETUP + """
assert _libc.prctl(38, 1, 0, 0, 0) == 0
assert _libc.prctl(22, 2, ctypes.byref(_Fprog(len(_prog), ctypes.addressof(_raw))), 0, 0) == 0
"""
# A machine the runtime has no syscall table for.
UNKNOWN_MACHINE = "import platform\nplatform.machine = lambda: 'sparc64'\n"


def boot_with(prelude="", frame=None):
    """Start the runtime (after `prelude`) with a boot frame, as the host does, and close the
    channel after its first frame; returns (exit status, frames written, stderr)."""
    proc = subprocess.Popen(runtime_command(prelude + "\n" + LOADER), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(IMAGE_DIR))
    try:
        proc.stdin.write(json.dumps(frame or boot_frame()).encode() + b"\n")
        proc.stdin.flush()
        first = proc.stdout.readline()  # `ready`, or nothing when the runtime exits first
        while first and json.loads(first.splitlines()[-1])["type"] == "code":  # sent before `ready`
            first += proc.stdout.readline()
    finally:
        proc.stdin.close()
        proc.stdin = None
    out, err = proc.communicate(timeout=60)
    return proc.returncode, [json.loads(line) for line in (first + out).splitlines()], err.decode()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="the prelude's filter knows x86_64 and aarch64")
def test_a_seccomp_filter_the_kernel_refuses_fails_the_start():
    status, frames, stderr = boot_with(REFUSE_SECCOMP)
    # No ready frame (nor any other): the host sees the sandbox exit while starting, with this.
    assert frames == [] and status == 1, (status, frames, stderr)
    assert ("mcp-code-bridge runtime: cannot start: the seccomp filter could not be installed "
            "(prctl(SECCOMP): Permission denied); the sandbox does not run without it") in stderr, stderr
    # The prelude without its filter: the runtime starts (the refusal above is the filter's).
    status, frames, stderr = boot_with(REFUSE_SECCOMP_SETUP)
    assert [f["type"] for f in frames] == ["code", "ready"] and status == 0, (status, frames, stderr)


def test_a_machine_without_a_syscall_table_fails_the_start():
    status, frames, stderr = boot_with(UNKNOWN_MACHINE)
    assert frames == [] and status == 1, (status, frames, stderr)
    assert "cannot start: the seccomp filter could not be installed (no syscall table for sparc64)" in stderr


def test_a_boot_frame_without_the_hosts_constants_fails_the_start():
    status, frames, stderr = boot_with(frame=boot_frame(constants=dict(HOST_CONSTANTS, out_dir=None, out_entries="1")))
    assert frames == [] and status == 1, (status, frames, stderr)
    assert "cannot start: the boot frame lacks the host's constants out_dir, out_entries" in stderr, stderr


def test_frames_sent_right_after_the_boot_frame_are_not_lost():
    # The loader reads the boot frame through a buffered reader that the runtime goes on
    # reading from: an exec that arrives in the same write is run, not swallowed.
    proc = subprocess.Popen(runtime_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=str(IMAGE_DIR))
    try:
        proc.stdin.write(json.dumps(boot_frame()).encode() + b"\n" +
                         json.dumps({"type": "exec", "id": 1, "code": "6 * 7", "output_cap": 1000}).encode() + b"\n")
        proc.stdin.flush()
        ready = json.loads(proc.stdout.readline())
        if ready["type"] == "code":
            ready = json.loads(proc.stdout.readline())
        result = json.loads(proc.stdout.readline())
        assert ready["type"] == "ready" and result["value"] == "42", (ready, result)
    finally:
        proc.stdin.close()
        proc.wait(10)


# ------------------------------------------------------------------- compiled code between boots


def boot_frames(frame):
    """The frames a runtime booted with `frame` sends up to `ready`, and the answer to one exec
    run after it (the runtime is then closed)."""
    proc = subprocess.Popen(runtime_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=str(IMAGE_DIR))
    try:
        proc.stdin.write(json.dumps(frame).encode() + b"\n")
        proc.stdin.flush()
        frames = []
        while not frames or frames[-1]["type"] != "ready":
            line = proc.stdout.readline()
            assert line, proc.stderr.read().decode()
            frames.append(json.loads(line))
        code = ("import sys\nrt = sys.modules['__mcp_bridge_runtime__.values']\n"
                "[getattr(rt, 'MARK', None), rt.convert_result.__code__.co_filename]")
        proc.stdin.write(json.dumps({"type": "exec", "id": 1, "code": code, "output_cap": 1000}).encode() + b"\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
    finally:
        proc.stdin.close()
        proc.wait(10)
    return frames, result


def test_a_boot_without_code_compiles_the_runtime_and_sends_its_code_first():
    frames, result = boot_frames(boot_frame())
    assert [f["type"] for f in frames] == ["code", "ready"], frames
    code, ready = frames
    assert ready["compiled"] is True
    # Every module's code, marshalled by this interpreter (its magic number names its kind).
    assert sorted(code["modules"]) == sorted(MODULES)
    assert code["magic"] and bytes.fromhex(code["magic"])
    if not TEST_IMAGE:
        import importlib.util
        import marshal

        assert code["magic"] == importlib.util.MAGIC_NUMBER.hex()
        for name, data in code["modules"].items():
            assert marshal.loads(base64.b64decode(data)).co_filename == "<mcp-bridge-runtime/%s.py>" % name
    assert result["value"] == "[None, '<mcp-bridge-runtime/values.py>']", result


def test_a_boot_with_code_runs_that_code_and_compiles_nothing():
    first, _ = boot_frames(boot_frame())
    code = first[0]
    # Code the runtime's own interpreter made from a source that differs from the frame's (a
    # mark added): seen after the boot, it was that code that ran, not the source.
    marked = Sandbox()
    try:
        made = marked.ok("import marshal, binascii\n"
                         "print(binascii.b2a_base64(marshal.dumps(compile(%r + '\\nMARK = 1\\n', "
                         "'<mcp-bridge-runtime/values.py>', 'exec')), newline=False).decode())" % MODULES["values"],
                         output_cap=1 << 20).stdout.strip()
    finally:
        marked.close()
    modules = dict(code["modules"], values=made)
    frames, result = boot_frames(boot_frame(code={"magic": code["magic"], "modules": modules}))
    assert [f["type"] for f in frames] == ["ready"], frames
    assert frames[0]["compiled"] is False
    assert result["value"] == "[1, '<mcp-bridge-runtime/values.py>']", result


@pytest.mark.parametrize("broken", ["other interpreter", "bad base64", "not marshal", "not code", "not a string", "missing"])
def test_code_that_cannot_be_used_is_compiled_from_source_and_sent_again(broken):
    code = boot_frames(boot_frame())[0][0]
    magic, modules = code["magic"], dict(code["modules"])
    if broken == "other interpreter":
        magic = "00" + magic[2:] if not magic.startswith("00") else "ff" + magic[2:]
    elif broken == "bad base64":
        modules["values"] = "%%% not base64"
    elif broken == "not marshal":
        modules["values"] = base64.b64encode(b"\x00not marshal data").decode()
    elif broken == "not code":
        import marshal

        modules["values"] = base64.b64encode(marshal.dumps(7)).decode()
    elif broken == "not a string":
        modules["values"] = 7
    else:
        del modules["values"]
    frames, result = boot_frames(boot_frame(code={"magic": magic, "modules": modules}))
    assert [f["type"] for f in frames] == ["code", "ready"], frames
    assert frames[-1]["compiled"] is True
    # What it sends again is the whole runtime's code, as a boot without code sends it.
    assert frames[0]["magic"] == code["magic"] and sorted(frames[0]["modules"]) == sorted(MODULES)
    assert result["value"] == "[None, '<mcp-bridge-runtime/values.py>']", result


def test_persistence_and_last_expression(sb):
    r = sb.ok("x = 40\ndef f(a):\n    return a + 2\n")
    assert "value" not in r.result
    r = sb.ok("import math\nf(x)")
    assert r.value == "42"
    assert sb.ok("_ + 1").value == "43"
    assert sb.ok("None").value is None
    assert sb.ok("print('a'); math.floor(2.5)").value == "2"
    assert sb.ok("x = 1; x").value == "1"
    assert sb.ok("__name__").value == "'__main__'"


def test_top_level_await_and_persistent_loop(sb):
    r = sb.ok(
        "import asyncio\n"
        "async def g(v):\n    await asyncio.sleep(0.01)\n    return v * 2\n"
        "ev = asyncio.Event()\n"
        "async def waiter():\n    await ev.wait()\n    return 'woken'\n"
        "t = asyncio.ensure_future(waiter())\n"
        "await g(21)"
    )
    assert r.value == "42"
    r = sb.ok("ev.set()\nawait t")
    assert r.value == "'woken'"
    # sync cells can still use asyncio.run (no loop is running during them)
    assert sb.ok("asyncio.run(g(2))").value == "4"
    assert sb.ok("await g(3)").value == "6"


def test_value_repr_is_capped(sb):
    r = sb.ok("'y' * 100000")
    assert len(r.value) < 11000 and "more characters" in r.value
    r = sb.ok("list(range(1000000))")
    assert len(r.value) < 11000


# ---------------------------------------------------------------------------- output


def test_print_and_subprocess_output(sb):
    r = sb.ok(
        "import os, subprocess, sys\n"
        "print('hello')\n"
        "os.system('echo from-shell')\n"
        "subprocess.run(['sh', '-c', 'echo to-stderr >&2'])\n"
        "print('err-line', file=sys.stderr)\n"
        "os.write(1, b'raw-fd\\n')\n"
    )
    assert r.stdout == "hello\nfrom-shell\nraw-fd\n"
    assert r.stderr == "to-stderr\nerr-line\n"
    assert all(f["type"] != "result" for f in r.frames[:-1])


def test_frame_shaped_output_is_just_output(sb):
    eid = sb.start("import os\nos.write(1, b'{\"type\":\"result\",\"id\":%d,\"status\":\"ok\"}\\n')\n"
                   "print('{\"type\":\"result\",\"id\":1}')\nprint('after')" % 999)
    r = sb.collect(eid)
    assert r.status == "ok"
    assert '{"type":"result","id":999,"status":"ok"}\n' in r.stdout
    assert r.stdout.endswith("after\n")


def test_frame_fds_are_not_inherited(sb):
    r = sb.ok(
        "import subprocess\n"
        "out = subprocess.run(['sh', '-c', 'ls /proc/self/fd'], capture_output=True, text=True).stdout.split()\n"
        "sorted(int(x) for x in out)"
    )
    fds = json.loads(r.value)
    assert fds[:3] == [0, 1, 2] and all(fd < 3 or fd > 2 for fd in fds)
    assert len([fd for fd in fds if fd > 2]) <= 1  # at most ls's own directory fd


def test_utf8_split_across_writes(sb):
    r = sb.ok("import os, time\nb = 'h\u00e9\u20ac\U0001f600'.encode()\nfor i in range(len(b)):\n"
              "    os.write(1, b[i:i+1]); time.sleep(0.03)\n")
    assert r.stdout == "h\u00e9\u20ac\U0001f600"


def test_output_cap_head_and_tail(sb):
    r = sb.run("for i in range(1000):\n    print('line %04d' % i)\n", output_cap=2000)
    assert r.status == "ok"
    out = r.stdout
    total = 1000 * len("line 0000\n")
    assert r.result["truncated"] == total - 2000
    assert out.startswith("line 0000\nline 0001\n")
    assert out.endswith("line 0998\nline 0999\n")
    assert "[output truncated: %d bytes omitted]" % (total - 2000) in out
    assert "line 0500" not in out
    # under the cap: nothing lost, no marker, no truncated field
    r = sb.ok("print('z' * 1500)", output_cap=2000)
    assert r.stdout == "z" * 1500 + "\n" and "truncated" not in r.result


def test_huge_single_line_is_cut_not_lost(fresh):
    t0 = time.monotonic()
    r = fresh.run("import sys\nsys.stdout.write('A' * 50_000_000 + 'END\\n')\nprint('done', file=sys.stderr)",
                  output_cap=100_000)
    elapsed = time.monotonic() - t0
    assert r.status == "ok"
    out = r.stdout
    assert out.startswith("A" * 1000) and out.endswith("AEND\n")
    assert r.result["truncated"] == 50_000_004 - (100_000 - len("done\n"))
    assert len(out) < 110_000
    assert r.stderr == "done\n"
    assert elapsed < 20
    assert max(fresh.line_sizes) < MAX_FRAME_BYTES


def test_million_tiny_writes_are_coalesced(fresh):
    t0 = time.monotonic()
    r = fresh.run("for i in range(1_000_000):\n    print(i)\n", output_cap=1 << 20, timeout=60)
    elapsed = time.monotonic() - t0
    assert r.status == "ok"
    outputs = [f for f in r.frames if f["type"] == "output"]
    assert len(outputs) < 300, len(outputs)
    out = r.stdout
    assert out.startswith("0\n1\n2\n") and out.endswith("999998\n999999\n")
    assert r.result["truncated"] > 0
    assert elapsed < 30, elapsed


def test_stdin_is_devnull_and_print_after_exit_builtin(sb):
    r = sb.run("input()")
    assert r.status == "error" and r.error["type"] == "EOFError"
    r = sb.run("exit(3)")
    assert r.status == "error" and r.error["type"] == "SystemExit"
    r = sb.ok("print('still here')\nimport sys\nsys.stdin.read()")
    assert r.stdout == "still here\n" and r.value == "''"


def test_repairs_closed_fds_and_streams(sb):
    r = sb.run("import os, sys\nsys.stdout.close()\nos.close(2)")
    assert r.status == "ok"
    r = sb.ok("import sys\nprint('back')\nprint('err', file=sys.stderr)")
    assert r.stdout == "back\n" and r.stderr == "err\n"


# ---------------------------------------------------------------------------- errors


def test_traceback_shows_only_user_frames(sb):
    sb.ok("def boom(n):\n    if n == 0:\n        raise ValueError('deep')\n    return boom(n - 1)\n")
    eid = sb.start("a = 1\n\nboom(2)\n")
    r = sb.collect(eid)
    assert r.status == "error"
    assert r.error["type"] == "ValueError" and r.error["message"] == "deep"
    tb = r.error["traceback"]
    assert tb.startswith("Traceback (most recent call last):")
    assert 'File "<cell-%d>", line 3, in <module>' % eid in tb
    assert ", line 3, in boom" in tb and ", line 4, in boom" in tb
    assert "raise ValueError('deep')" in tb
    assert "mcp-bridge-runtime" not in tb and "runtime.py" not in tb and "asyncio" not in tb
    assert tb.rstrip().endswith("ValueError: deep")


def test_traceback_in_async_cell(sb):
    eid = sb.start("import asyncio\nasync def h():\n    await asyncio.sleep(0)\n    1/0\n\nawait h()")
    r = sb.collect(eid)
    tb = r.error["traceback"]
    assert r.error["type"] == "ZeroDivisionError"
    assert 'File "<cell-%d>", line 6' % eid in tb and "line 4, in h" in tb
    assert "mcp-bridge-runtime" not in tb and "base_events" not in tb and "tasks.py" not in tb


def test_syntax_error(sb):
    eid = sb.start("x = 1\ny = (\n")
    r = sb.collect(eid)
    assert r.status == "error" and r.error["type"] == "SyntaxError"
    assert '"<cell-%d>", line 2' % eid in r.error["traceback"]
    assert "mcp-bridge-runtime" not in r.error["traceback"]
    r = sb.run("await = 3")
    assert r.error["type"] == "SyntaxError"


def test_system_exit_keeps_session(sb):
    sb.ok("keep = 'me'")
    r = sb.run("import sys\nsys.exit(2)")
    assert r.status == "error" and r.error["type"] == "SystemExit" and r.error["message"] == "2"
    r = sb.run("raise SystemExit('bye')")
    assert r.error["type"] == "SystemExit"
    r = sb.run("import asyncio\nawait asyncio.sleep(0)\nraise SystemExit(1)")
    assert r.status == "error" and r.error["type"] == "SystemExit"
    assert sb.ok("keep").value == "'me'"


def test_garbage_frames_are_ignored(sb):
    sb.send_raw(b"this is not json\n")
    sb.send_raw(b"[1,2,3]\n")
    sb.send_raw(b"\n")
    sb.send({"type": "exec", "id": "nope", "code": "1"})
    sb.send({"type": "rpc_result", "id": 123456, "ok": True})
    sb.send({"type": "interrupt", "id": 987654})
    sb.send({"type": "whatever"})
    assert sb.ok("1 + 1").value == "2"


# ---------------------------------------------------------------------------- interrupt


def _interrupt_when_started(sb, code, marker="started"):
    eid = sb.start(code)

    def on_frame(frame):
        if frame["type"] == "output" and marker in frame["data"]:
            sb.send({"type": "interrupt", "id": eid})

    t0 = time.monotonic()
    r = sb.collect(eid, on_frame=on_frame, timeout=20)
    return r, time.monotonic() - t0


@pytest.mark.parametrize("code", [
    "import time\nprint('started')\ntime.sleep(100)",
    "print('started')\nwhile True:\n    pass",
    "import asyncio\nprint('started')\nawait asyncio.sleep(100)",
    "import asyncio\nasync def spin():\n    while True:\n        pass\nprint('started')\nawait spin()",
    "import asyncio\nprint('started')\nawait asyncio.gather(asyncio.sleep(100), asyncio.sleep(200))",
    "import subprocess\nprint('started')\nsubprocess.run(['sleep', '100'])",
])
def test_interrupt(sb, code):
    sb.ok("survivor = 7")
    r, elapsed = _interrupt_when_started(sb, code)
    assert r.status == "interrupted", r.result
    assert elapsed < 10
    assert sb.ok("survivor * 6").value == "42"


def test_interrupt_before_a_cells_task_first_runs(sb):
    # The interrupt lands while the event loop runs a slow callback queued ahead of the task of
    # the cell's last expression: between two loop steps, before that task's first step, whose
    # code then never awaits. The cancellation the first SIGINT schedules comes too late; the
    # interrupt must still reach the code.
    code = ("import asyncio, time\nasync def spin():\n    while True:\n        pass\n"
            "asyncio.get_event_loop().call_soon(time.sleep, 1.0)\nprint('started')\nawait spin()")
    sb.ok("survivor = 7")
    r, elapsed = _interrupt_when_started(sb, code)
    assert r.status == "interrupted", r.result
    assert elapsed < 10
    assert sb.ok("survivor * 6").value == "42"


def test_a_repeated_interrupt_reaches_code_that_caught_the_first(sb):
    eid = sb.start("import time\ncaught = 0\nwhile True:\n    try:\n        print('started')\n"
                   "        time.sleep(100)\n    except KeyboardInterrupt:\n        caught += 1\n"
                   "        if caught > 1:\n            raise\n        print('again')")
    sent = []

    def on_frame(frame):
        if frame["type"] == "output" and len(sent) < 2 and ("started" in frame["data"] or "again" in frame["data"]):
            sent.append(1)
            sb.send({"type": "interrupt", "id": eid})

    r = sb.collect(eid, on_frame=on_frame, timeout=20)
    assert r.status == "interrupted" and "again" in r.stdout, r.result
    assert sb.ok("caught").value == "2"


def test_interrupt_runs_user_finally_blocks(sb):
    r, _ = _interrupt_when_started(
        sb, "import asyncio\ntry:\n    print('started')\n    await asyncio.sleep(100)\nfinally:\n    print('cleanup')")
    assert r.status == "interrupted" and "cleanup" in r.stdout


def test_interrupt_of_sync_rpc_wait(sb):
    eid = sb.start("from mcp import runtime\nprint('started')\nruntime.search_tool_docs_sync('x')", servers=[FS])

    def on_frame(frame):
        if frame["type"] == "rpc":
            sb.send({"type": "interrupt", "id": eid})

    frames = []
    while True:  # do not answer the rpc: the call must still be interruptible
        f = sb.next_frame()
        frames.append(f)
        on_frame(f)
        if f["type"] == "result":
            break
    assert frames[-1]["status"] == "interrupted"
    sb.send({"type": "rpc_result", "id": [f for f in frames if f["type"] == "rpc"][0]["id"], "ok": True, "result": []})
    assert sb.ok("2 * 21").value == "42"


def test_interrupt_keyboardinterrupt_has_user_traceback(sb):
    r, _ = _interrupt_when_started(sb, "import time\nprint('started')\nfor i in range(10**9):\n    time.sleep(0.001)")
    assert r.status == "interrupted"
    tb = r.error["traceback"]
    assert "KeyboardInterrupt" in tb and "<cell-" in tb and "mcp-bridge-runtime" not in tb


# ---------------------------------------------------------------------------- MCP proxies and helpers


def test_proxies_signatures_and_help(sb):
    r = sb.ok(
        "import inspect\n"
        "sig = inspect.signature(mcp_file_system.read_file)\n"
        "str(sig)",
        servers=[FS, OTHER],
    )
    assert r.value == repr("(path: str, *, head: int = None, encoding: str = 'utf-8', max_bytes: float = None, class_: bool = None)")
    r = sb.ok(
        "f = mcp_file_system.read_file\n"
        "[f.__name__, f.__qualname__, inspect.iscoroutinefunction(f), f.__annotations__['path'] is str,\n"
        " sorted(mcp_servers), mcp_servers['file-system'] is mcp_file_system, 'read_file' in dir(mcp_file_system)]",
        servers=[FS, OTHER],
    )
    assert r.value == "['read_file', 'read_file', True, True, ['file-system', 'file_system', 'other'], True, True]"
    r = sb.ok("help(mcp_file_system.read_file)", servers=[FS])
    flat = " ".join(r.stdout.split()).replace("( ", "(")  # pydoc >= 3.13 wraps long signatures
    assert "async read_file(path: str, *, head: int = None" in flat, r.stdout
    assert "Where the file is" in r.stdout and "One of:" in r.stdout and "'max-bytes'" in r.stdout
    r = sb.ok("help(mcp_file_system)", servers=[FS])
    assert "Files on the host" in r.stdout and "read_file" in r.stdout and "snap" in r.stdout
    r = sb.ok("str(inspect.signature(mcp_file_system.list_))", servers=[FS])
    assert r.value == "'(*, tags: list = None, opts: dict = None)'"


def test_bad_arguments_raise_type_error_without_rpc(sb):
    host = tool_host({})
    for code in ("await mcp_file_system.read_file()",
                 "await mcp_file_system.read_file('a', 3)",
                 "await mcp_file_system.read_file('a', nope=1)",
                 "await mcp_file_system.read_file(path='a', path2='b')"):
        r = sb.run(code, servers=[FS], rpc=host)
        assert r.status == "error" and r.error["type"] == "TypeError", (code, r.result)
        assert "read_file" in r.error["message"]
    assert host.calls == [] and all(not f["type"] == "rpc" for f in r.frames)
    r = sb.run("await mcp_file_system.nosuch()", servers=[FS], rpc=host)
    assert r.error["type"] == "AttributeError" and "read_file" in r.error["message"]


def test_tool_call_sends_original_names(sb):
    host = tool_host({"read-file": {"content": [{"type": "text", "text": "hello"}]}})
    r = sb.ok("v = await mcp_file_system.read_file('/a', head=3, max_bytes=1.5, class_=True)\n"
              "[v, type(v).__name__, v.mcp_result['content'][0]['type']]", servers=[FS], rpc=host)
    assert r.value == "['hello', 'ToolStr', 'text']"
    (method, params), = host.calls
    assert method == "call_tool"
    assert params == {"server": "file-system", "tool": "read-file",
                      "arguments": {"path": "/a", "head": 3, "max-bytes": 1.5, "class": True}}
    # defaults and None are not sent: the server applies its own defaults
    host.calls.clear()
    sb.ok("await mcp_file_system.read_file('/b', encoding='latin-1', head=None)", servers=[FS], rpc=host)
    assert host.calls[0][1]["arguments"] == {"path": "/b", "encoding": "latin-1"}


def test_import_star_from_server_module(sb):
    host = tool_host({"list": {"content": [{"type": "text", "text": "[1, 2]"}]}})
    r = sb.ok("from mcp.servers.file_system import *\nres = await list_(tags=['a'])\n"
              "import mcp.servers.file_system as m\n[res, m.__all__, list_.__module__]", servers=[FS], rpc=host)
    assert r.value == "[[1, 2], ['read_file', 'list_', 'snap'], 'mcp.servers.file_system']"
    r = sb.run("from mcp.servers.other import *", servers=[FS], discovered=[{"name": "other", "alias": "other"}])
    assert r.error["type"] == "ModuleNotFoundError" and '"servers": ["other"]' in r.error["message"]


def test_result_conversion(sb):
    host = tool_host({
        "read-file": {"content": [{"type": "text", "text": "{\"a\": 1}"}],
                      "structuredContent": {"rows": [1, 2]}},
        "list": {"content": [{"type": "text", "text": "{\"k\": [1, 2, 3]}"}]},
        "snap": {"content": [{"type": "image", "data": base64.b64encode(PNG_1x1).decode(), "mimeType": "image/png"}]},
    })
    r = sb.ok("s = await mcp_file_system.read_file('x')\n"
              "[s, type(s).__name__, s.mcp_result['content'][0]['text']]", servers=[FS], rpc=host)
    assert r.value == "[{'rows': [1, 2]}, 'ToolDict', '{\"a\": 1}']"
    r = sb.ok("j = await mcp_file_system.list_()\n[j, isinstance(j, dict), j.mcp_result['content'][0]['type']]",
              servers=[FS], rpc=host)
    assert r.value == "[{'k': [1, 2, 3]}, True, 'text']"
    r = sb.ok("img = await mcp_file_system.snap()\n[repr(img), img.mime, img.data[:4], img._repr_png_() == img.data]",
              servers=[FS], rpc=host)
    assert r.value == "['<Image image/png, %d bytes 1x1>', 'image/png', b'\\x89PNG', True]" % len(PNG_1x1)
    r = sb.ok("raw = await runtime.call_tool('file-system', 'snap', raw=True) if False else None\n"
              "from mcp import runtime\nraw = await runtime.call_tool('file_system', 'snap', {}, raw=True)\n"
              "sorted(raw)", servers=[FS], rpc=host)
    assert r.value == "['content']"


def test_result_conversion_text_multi_and_resources(sb):
    host = tool_host({
        "read-file": {"content": [{"type": "text", "text": "plain words"}]},
        "list": {"content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
        "snap": {"content": [
            {"type": "text", "text": "see"},
            {"type": "resource", "resource": {"uri": "file:///a", "mimeType": "text/plain", "text": "body"}},
            {"type": "resource_link", "uri": "file:///b", "name": "b"},
        ]},
    })
    r = sb.ok("[await mcp_file_system.read_file('x'), await mcp_file_system.list_()]", servers=[FS], rpc=host)
    assert r.value == "['plain words', ['one', 'two']]"
    r = sb.ok("v = await mcp_file_system.snap()\n[v[0], v[1].uri, v[1].text, v[2]['name'], v[2].type]",
              servers=[FS], rpc=host)
    assert r.value == "['see', 'file:///a', 'body', 'b', 'resource_link']"


def test_tool_error_raises(sb):
    host = tool_host({"read-file": {"content": [{"type": "text", "text": "ENOENT: no such file"}], "isError": True}})
    eid = sb.start("x = 1\nawait mcp_file_system.read_file('missing')", servers=[FS])
    r = sb.collect(eid, rpc=host)
    assert r.status == "error" and r.error["type"] == "McpToolError"
    assert "ENOENT: no such file" in r.error["message"]
    tb = r.error["traceback"]
    assert 'File "<cell-%d>", line 2' % eid in tb and "mcp-bridge-runtime" not in tb
    assert "mcp.runtime.McpToolError" in tb
    r = sb.ok("from mcp import runtime\ntry:\n    await mcp_file_system.read_file('missing')\n"
              "except runtime.McpToolError as e:\n    err = e\n"
              "[isinstance(err, runtime.McpError), isinstance(err, RuntimeError), err.mcp_result['isError']]",
              servers=[FS], rpc=host)
    assert r.value == "[True, True, True]"


def test_host_error_raises_mcp_error(sb):
    host = tool_host({"read-file": HostError("Server 'file-system' is not available; load it")})
    r = sb.run("await mcp_file_system.read_file('x')", servers=[FS], rpc=host)
    assert r.error["type"] == "McpError" and "is not available; load it" in r.error["message"]


def test_stale_proxy_and_unloaded_servers(sb):
    host = tool_host({"read-file": {"content": [{"type": "text", "text": "ok"}]}})
    sb.ok("old = mcp_file_system\nold_tool = mcp_file_system.read_file\nfrom mcp.servers.file_system import read_file",
          servers=[FS], rpc=host)
    r = sb.ok("['mcp_file_system' in globals(), sorted(mcp_servers), 'mcp_other' in globals()]",
              servers=[OTHER], discovered=[{"name": "file-system", "alias": "file_system"}, {"name": "other", "alias": "other"}])
    assert r.value == "[False, ['other'], True]"
    for code in ("await old.read_file('x')", "await old_tool('x')", "await read_file('x')"):
        r = sb.run(code, servers=[OTHER], discovered=[{"name": "file-system", "alias": "file_system"}], rpc=host)
        assert r.error["type"] == "McpError", r.result
        assert "not loaded" in r.error["message"] and '"servers": ["file-system"]' in r.error["message"]
        assert r.rpcs == []
    # loaded again: the old objects work again
    assert sb.ok("await old_tool('x')", servers=[FS], rpc=host).value == "'ok'"
    # a user variable that happens to be named like a proxy is left alone
    sb.ok("mcp_mine = 5", servers=[FS])
    assert sb.ok("mcp_mine", servers=[]).value == "5"


def test_unloaded_and_unknown_servers_say_what_to_do(sb):
    disc = [{"name": "file-system", "alias": "file_system"}, {"name": "other", "alias": "other"}]
    load = '"servers": ["file-system"]'
    # A discovered server not loaded in this call: the three ways of naming it say how to load it,
    # and stay the exception types they were.
    for code, kind in (("mcp_file_system", "NameError"),
                       ("mcp_servers['file-system']", "ServerNotLoadedError"),
                       ("mcp_servers['file_system']", "ServerNotLoadedError"),
                       ("from mcp.servers.file_system import read_file", "ModuleNotFoundError")):
        r = sb.run(code, servers=[OTHER], discovered=disc)
        assert r.error["type"] == kind, r.result
        assert "not loaded" in r.error["message"] and load in r.error["message"], r.error
        assert load in r.error["traceback"], r.error["traceback"]
    assert "name 'mcp_file_system' is not defined" in sb.run("mcp_file_system", servers=[OTHER]).error["message"]
    # A server that does not exist: named as such, with the closest configured one.
    for code in ("mcp_file_sytem", "mcp_servers['file-sytem']"):
        msg = sb.run(code, servers=[OTHER], discovered=disc).error["message"]
        assert "No MCP server" in msg and "Did you mean 'file-system'?" in msg, msg
        assert "Discovered servers: file-system, other." in msg, msg
    # Caught as before.
    r = sb.ok("out = []\ntry:\n    mcp_file_system\nexcept NameError as e:\n    out.append('NameError')\n"
              "try:\n    mcp_servers['file-system']\nexcept KeyError as e:\n    out.append(str(e))\n"
              "try:\n    import mcp.servers.file_system\nexcept ImportError:\n    out.append('ImportError')\n"
              "out", servers=[OTHER], discovered=disc)
    assert r.value.startswith("['NameError', ") and r.value.endswith(", 'ImportError']"), r.value
    assert "is not loaded" in r.value and "file-system" in r.value, r.value
    # Other NameErrors are left as Python wrote them.
    r = sb.run("undefined_thing", servers=[OTHER], discovered=disc)
    assert r.error["type"] == "NameError" and "MCP" not in r.error["message"]


def test_servers_left_out_means_unchanged(sb):
    host = tool_host({"read-file": {"content": [{"type": "text", "text": "ok"}]}})
    sb.ok("first = mcp_file_system\ndel mcp_other", servers=[FS, OTHER], rpc=host)
    # Left out: the previous exec's servers stay, the same objects, with their names bound again.
    r = sb.ok("from mcp import runtime\n"
              "[mcp_file_system is first, 'mcp_other' in globals(), sorted(mcp_servers),"
              " sorted(runtime.discovered_servers()), await mcp_file_system.read_file('x')]",
              servers=None, rpc=host)
    assert r.value == "[True, True, ['file-system', 'file_system', 'other'], ['file-system', 'other'], 'ok']"
    # Sent again (different): they replace the previous ones.
    r = sb.ok("['mcp_file_system' in globals(), sorted(mcp_servers)]", servers=[OTHER])
    assert r.value == "[False, ['other']]"
    # Even with the mcp package taken away by the code, left out still means the last ones.
    sb.ok("import sys\nfor k in [k for k in sys.modules if k == 'mcp' or k.startswith('mcp.')]:\n"
          "    del sys.modules[k]", servers=None)
    r = sb.ok("from mcp.servers.other import *\nimport mcp.runtime\nsorted(mcp_servers)", servers=None)
    assert r.value == "['other']"


def test_runtime_helpers(sb):
    docs = [{"server": "file-system", "serverAlias": "file_system", "tool": "read-file", "toolAlias": "read_file",
             "description": "Read a file."}]

    def host(method, params):
        host.calls.append((method, params))
        if method == "list_servers":
            return ["file-system", "other"]
        if method == "query_tool_docs" and params["server"] != "nope":
            return docs
        if method == "search_tool_docs":
            return [dict(docs[0], score=0.9)]
        if method == "list_tools":
            return [{"name": "t", "alias": "t", "description": ""}]
        raise HostError("unknown server 'nope'")

    host.calls = []
    disc = [{"name": "file-system", "alias": "file_system", "description": "Files"},
            {"name": "other", "alias": "other", "description": ""},
            {"name": "far", "alias": "far", "description": "not loaded"}]
    r = sb.ok(
        "from mcp import runtime\n"
        "out = {}\n"
        "out['disc'] = runtime.discovered_servers()\n"
        "out['sync'] = runtime.list_servers_sync()\n"
        "out['rpc'] = await runtime.list_servers()\n"
        "out['meta'] = [m['name'] for m in runtime.list_loaded_server_metadata()]\n"
        "d = runtime.describe_server('file_system')\n"
        "out['desc'] = (d['name'], d['alias'], d['cwd'], d['tools'][0]['alias'], sorted(d['tools'][0]))\n"
        "out['tools'] = runtime.list_tools_sync('file-system')[0]\n"
        "out['far_tools'] = runtime.list_tools_sync('far')\n"
        "out['q'] = await runtime.query_tool_docs('file-system', tool='read_file', detail='full')\n"
        "out['qs'] = runtime.query_tool_docs_sync('far')\n"
        "out['s'] = await runtime.search_tool_docs('read', limit=3)\n"
        "out['ss'] = runtime.search_tool_docs_sync('read')\n"
        "out['cap'] = runtime.capability_summary()\n"
        "try:\n    runtime.query_tool_docs_sync('nope')\nexcept runtime.McpError as e:\n    out['err'] = str(e)\n"
        "try:\n    runtime.describe_server('far')\nexcept runtime.McpError as e:\n    out['derr'] = str(e)\n"
        "import json\nprint(json.dumps(out))",
        servers=[FS, OTHER], discovered=disc, rpc=host)
    out = json.loads(r.stdout)
    assert out["disc"] == ["file-system", "other", "far"]
    assert out["sync"] == ["file-system", "other"]
    assert out["rpc"] == ["file-system", "other"]
    assert out["meta"] == ["file-system", "other"]
    assert out["desc"] == ["file-system", "file_system", "/srv", "read_file",
                           ["alias", "description", "input_schema", "name"]]
    assert out["tools"] == {"name": "read-file", "alias": "read_file", "description": "Read a file."}
    assert out["far_tools"] == [{"name": "t", "alias": "t", "description": ""}]
    assert out["q"] == docs and out["qs"] == docs
    assert out["s"][0]["score"] == 0.9 and out["ss"][0]["tool"] == "read-file"
    assert "far" in out["cap"] and "mcp_file_system" in out["cap"] and "\n" not in out["cap"]
    assert out["err"] == "unknown server 'nope'"
    assert '"servers": ["far"]' in out["derr"]
    methods = [m for m, _ in host.calls]
    assert methods == ["list_servers", "list_tools", "query_tool_docs", "query_tool_docs", "search_tool_docs",
                       "search_tool_docs", "query_tool_docs"]
    assert host.calls[2][1] == {"server": "file-system", "detail": "full", "tool": "read-file"}
    assert host.calls[4][1] == {"query": "read", "limit": 3}
    assert host.calls[5][1] == {"query": "read", "limit": 5}


def test_rpc_ids_unique_and_concurrent_calls(sb):
    host = tool_host({"read-file": {"content": [{"type": "text", "text": "1"}]},
                      "list": {"content": [{"type": "text", "text": "2"}]}})
    r = sb.ok("import asyncio\nawait asyncio.gather(*[mcp_file_system.read_file('a') for _ in range(5)], "
              "mcp_file_system.list_())", servers=[FS], rpc=host)
    assert r.value == "[1, 1, 1, 1, 1, 2]"
    ids = [f["id"] for f in r.rpcs]
    assert len(set(ids)) == len(ids) == 6
    r2 = sb.ok("await mcp_file_system.list_()", servers=[FS], rpc=host)
    assert r2.rpcs[0]["id"] > max(ids)


def test_rpc_arguments_must_be_json(sb):
    r = sb.run("await mcp_file_system.list_(opts={'x': object()})", servers=[FS], rpc=tool_host({}))
    assert r.error["type"] == "TypeError" and "JSON" in r.error["message"] and r.rpcs == []


# ---------------------------------------------------------------------------- display, misc


def test_display_png_bytes_and_text(sb):
    r = sb.ok("print('before')\ndisplay(%r)\ndisplay('some text')\ndisplay({'a': 1})" % PNG_1x1)
    assert [d["mime"] for d in r.displays] == ["image/png", "text/plain", "text/plain"]
    assert base64.b64decode(r.displays[0]["data"]) == PNG_1x1
    assert r.displays[1]["data"] == "some text" and r.displays[2]["data"] == "{'a': 1}"
    kinds = [f["type"] for f in r.frames]
    assert kinds.index("output") < kinds.index("display")


def test_display_repr_png_object(sb):
    r = sb.ok("class P:\n    def _repr_png_(self):\n        return %r\ndisplay(P())" % PNG_1x1)
    assert r.displays[0]["mime"] == "image/png" and base64.b64decode(r.displays[0]["data"]) == PNG_1x1


def test_environment(sb):
    r = sb.ok("import os, sys\n[os.environ['MPLBACKEND'], os.path.isdir(os.environ['MPLCONFIGDIR']), "
              "sys.stdout.line_buffering, sys.stderr.line_buffering]")
    assert r.value == "['Agg', True, True, True]"


def test_user_mcp_package_is_ours(sb):
    r = sb.ok("import mcp, mcp.runtime\n[mcp.runtime.__name__, callable(mcp.runtime.capability_summary)]")
    assert r.value == "['mcp.runtime', True]"


def test_eof_on_stdin_exits(fresh):
    fresh.ok("import threading, time\nthreading.Thread(target=time.sleep, args=(100,)).start()")
    eid = fresh.start("import time\ntime.sleep(100)")
    time.sleep(0.2)
    t0 = time.monotonic()
    fresh.proc.stdin.close()
    fresh.proc.wait(5)
    assert time.monotonic() - t0 < 3


def test_queued_exec_interrupted_before_start(fresh):
    first = fresh.start("import time\ntime.sleep(0.5)\n'first'")
    second = fresh.start("'second'")
    fresh.send({"type": "interrupt", "id": second})
    r1 = fresh.collect(first)
    assert r1.value == "'first'"
    r2 = fresh.collect(second)
    assert r2.status == "interrupted"


def test_background_output_between_execs_is_dropped(fresh):
    fresh.ok("import threading, time, sys\n"
             "def chatter():\n    for i in range(20):\n        print('bg', i); time.sleep(0.01)\n"
             "threading.Thread(target=chatter).start()")
    time.sleep(0.5)
    r = fresh.ok("print('mine')")
    assert r.stdout == "mine\n"
    assert not fresh.bad_lines


def test_fork_child_cannot_write_frames(fresh):
    r = fresh.ok("import os\npid = os.fork()\nif pid == 0:\n    print('child'); display(b'x'); os._exit(0)\n"
                 "os.waitpid(pid, 0)\nprint('parent')")
    assert "child\n" in r.stdout and "parent\n" in r.stdout
    assert r.displays == [] and not fresh.bad_lines


@pytest.mark.skipif(not os.path.exists("/bin/sh"), reason="needs a shell")
def test_help_and_pager_do_not_block(sb):
    r = sb.ok("help(len)")
    assert "Return the number of items" in r.stdout


def test_pandas_value_is_limited(sb):
    r = sb.run("import pandas as pd\ndf = pd.DataFrame({'c%d' % i: range(1000) for i in range(40)})\ndf")
    if r.status == "error" and r.error["type"] == "ModuleNotFoundError":
        pytest.skip("pandas is not installed")
    assert r.status == "ok"
    lines = r.value.splitlines()
    assert len(lines) < 70 and "..." in r.value and "[1000 rows x 40 columns]" in r.value
    assert len(r.value) < 10_100
    # The dtypes the head and tail do not show: every column's, by name; then the file with
    # the whole data.
    dtypes = r.value.splitlines()[-2]
    assert dtypes.startswith("dtypes: c0: int64, c1: int64"), dtypes
    assert "c39: int64" in dtypes, dtypes
    assert r.value.splitlines()[-1].startswith("full data: "), r.value
    assert "1000 rows \u00d7 40 columns;" in r.value.splitlines()[-1], r.value
    r = sb.ok("df2 = pd.DataFrame({'n%d' % i: [1.5] * 3 for i in range(45)})\ndf2['s'] = 'x'\ndf2")
    assert "and 6 more (float64 \u00d75, " in r.value.splitlines()[-2], r.value
    # A small frame is shown whole, with no dtypes line.
    assert "dtypes" not in sb.ok("pd.DataFrame({'a': [1]})").value
    r = sb.ok("df['c1']")
    assert "Name: c1" in r.value and len(r.value.splitlines()) < 70


def test_matplotlib_show_and_pil_display(sb):
    r = sb.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nlen(plt.get_fignums())")
    if r.status == "error" and r.error["type"] == "ModuleNotFoundError":
        pytest.skip("matplotlib is not installed")
    assert r.status == "ok", r.error
    assert r.value == "0"
    assert len(r.displays) == 1 and r.displays[0]["mime"] == "image/png"
    assert base64.b64decode(r.displays[0]["data"])[:8] == b"\x89PNG\r\n\x1a\n"
    r = sb.ok("fig, ax = plt.subplots()\nax.bar([1], [2])\nfig")
    assert [d["mime"] for d in r.displays] == ["image/png"] and r.value.startswith("<Figure")
    r = sb.run("from PIL import Image as PILImage\ndisplay(PILImage.new('RGB', (4, 3), 'red'))")
    if r.status == "ok":
        data = base64.b64decode(r.displays[0]["data"])
        assert data[:4] == b"\x89PNG" and int.from_bytes(data[16:20], "big") == 4


# Code that ends by itself, and code that only an interrupt ends (each shape of waiting and
# spinning, sync and async, body and last expression). image/tests/stress_interrupts.py runs the
# same under CPU load a thousand times and more.
FINITE_CODES = ["import time\ntime.sleep(0.05)\n'x'", "sum(range(200000))", "import asyncio\nawait asyncio.sleep(0.02)\n1",
                "print('p' * 100)\n2", "[i for i in range(50000)][-1]"]
ENDLESS_CODES = [
    "while True:\n    pass",
    "import time\nwhile True:\n    time.sleep(0.001)",
    "import asyncio\nasync def spin():\n    while True:\n        pass\nawait spin()",
    "import asyncio\nasync def spin():\n    while True:\n        pass\nx = 1\nawait spin()",
    "import asyncio\nawait asyncio.sleep(100)",
    "import asyncio\nasync def f():\n    while True:\n        await asyncio.sleep(0)\nawait f()",
    # A slow callback queued ahead of the task of the last expression: an interrupt in its 30 ms
    # lands between two steps of the loop, before the spinning task has first run.
    "import asyncio, time\nasync def spin():\n    while True:\n        pass\nasyncio.get_event_loop().call_soon(time.sleep, 0.03)\nawait spin()",
]


def test_interrupt_at_random_moments_never_breaks_the_session(fresh):
    import random

    rng = random.Random(7)
    for i in range(120):
        endless = i % 2 == 1
        code = rng.choice(ENDLESS_CODES if endless else FINITE_CODES)
        eid = fresh.start(code)
        time.sleep(rng.random() * 0.06)
        fresh.send({"type": "interrupt", "id": eid})
        r = fresh.collect(eid, timeout=20)
        assert r.status in (("interrupted",) if endless else ("ok", "interrupted")), (code, r.result)
    assert fresh.ok("40 + 2").value == "42"
    assert not fresh.bad_lines


def test_interrupt_of_pending_async_rpc(sb):
    eid = sb.start("print('started')\nawait mcp_file_system.read_file('slow')", servers=[FS])
    frames = []
    while True:  # the rpc stays unanswered: the await must still be interruptible
        f = sb.next_frame()
        frames.append(f)
        if f["type"] == "rpc":
            sb.send({"type": "interrupt", "id": eid})
        if f["type"] == "result":
            break
    assert frames[-1]["status"] == "interrupted"
    rpc_id = [f for f in frames if f["type"] == "rpc"][0]["id"]
    sb.send({"type": "rpc_result", "id": rpc_id, "ok": True, "result": {"content": []}})  # late: dropped
    assert sb.ok("'alive'").value == "'alive'"


# ---------------------------------------------------------------------------- the session as a notebook


def _export(sandbox, path, code=""):
    """Run `code` then export_notebook(path) in one cell; returns (the run, the notebook)."""
    r = sandbox.ok(code + "from mcp import runtime\nruntime.export_notebook(%r)" % path)
    assert r.value == repr(path)
    if TEST_IMAGE:  # the file is inside the container: read it through the sandbox
        text = sandbox.ok("print(open(%r).read(), end='')" % path).stdout
    else:
        text = Path(path).read_text()
    return r, json.loads(text)


def _check_nbformat4(nb):
    """The parts of the nbformat 4.5 schema the runtime writes (tests/e2e/notebook.rs validates the
    whole file with nbformat itself)."""
    assert nb["nbformat"] == 4 and nb["nbformat_minor"] == 5
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    ids = [c["id"] for c in nb["cells"]]
    assert len(set(ids)) == len(ids)
    for c in nb["cells"]:
        assert set(c) >= {"cell_type", "id", "metadata", "source"}
        if c["cell_type"] != "code":
            continue
        assert isinstance(c["execution_count"], int)
        for o in c["outputs"]:
            kind = o["output_type"]
            assert kind in ("stream", "display_data", "execute_result", "error"), o
            if kind == "stream":
                assert o["name"] in ("stdout", "stderr") and isinstance(o["text"], str)
            if kind == "error":
                assert all(isinstance(line, str) for line in o["traceback"])


def test_export_notebook_records_each_cell_in_order(fresh, tmp_path):
    path = "/workspace/out/session.ipynb" if TEST_IMAGE else str(tmp_path / "out" / "session.ipynb")
    fresh.ok("x = 40\nprint('hello')\nimport sys\nprint('warn', file=sys.stderr)")
    fresh.ok("x + 2")
    assert fresh.run("1 / 0").status == "error"
    fresh.ok("display(%r)\ndisplay('some text')" % PNG_1x1)
    assert fresh.run("def broken(:").status == "error"
    r, nb = _export(fresh, path, "print('before export')\n")
    _check_nbformat4(nb)
    cells = nb["cells"]
    assert [c["execution_count"] for c in cells] == [1, 2, 3, 4, 5, 6]
    assert cells[0]["source"].startswith("x = 40")
    # Two pipes: the order between stdout and stderr is the order the host received them in.
    assert sorted(cells[0]["outputs"], key=lambda o: o["name"]) == [
        {"output_type": "stream", "name": "stderr", "text": "warn\n"},
        {"output_type": "stream", "name": "stdout", "text": "hello\n"},
    ]
    assert cells[1]["outputs"] == [
        {"output_type": "execute_result", "execution_count": 2, "data": {"text/plain": "42"}, "metadata": {}}]
    err = cells[2]["outputs"][-1]
    assert err["output_type"] == "error" and err["ename"] == "ZeroDivisionError"
    assert err["evalue"] == "division by zero" and "ZeroDivisionError: division by zero" in err["traceback"][-1]
    image, text = cells[3]["outputs"]
    assert image["output_type"] == "display_data"
    assert base64.b64decode(image["data"]["image/png"]) == PNG_1x1
    assert text["data"] == {"text/plain": "some text"}
    assert cells[4]["outputs"][0]["ename"] == "SyntaxError"
    # The exporting cell itself, as far as it had run: its code and what it printed before.
    assert "export_notebook" in cells[5]["source"]
    assert cells[5]["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "before export\n"}]


def test_export_notebook_default_path_and_os_errors(fresh):
    r = fresh.ok("from mcp import runtime\nimport inspect\n"
                 "inspect.signature(runtime.export_notebook).parameters['path'].default")
    assert r.value == "'/workspace/out/session.ipynb'"
    r = fresh.run("runtime.export_notebook('/dev/null/session.ipynb')")
    assert r.status == "error" and r.error["type"] in ("NotADirectoryError", "FileExistsError"), r.error
    if TEST_IMAGE:  # read-only root: the normal OSError, nothing special
        r = fresh.run("runtime.export_notebook('/etc/session.ipynb')")
        assert r.status == "error" and r.error["type"] in ("PermissionError", "OSError"), r.error


def test_a_new_interpreter_starts_an_empty_notebook(fresh, tmp_path):
    path = "/workspace/s.ipynb" if TEST_IMAGE else str(tmp_path / "s.ipynb")
    fresh.ok("print('old session')")
    fresh.close()
    again = Sandbox()  # what `reset` gives: a new interpreter
    try:
        _, nb = _export(again, path)
        assert len(nb["cells"]) == 1 and nb["cells"][0]["execution_count"] == 1
        assert "old session" not in json.dumps(nb)
    finally:
        again.close()


def test_notebook_record_is_bounded_and_says_what_it_dropped(fresh, tmp_path):
    path = "/workspace/b.ipynb" if TEST_IMAGE else str(tmp_path / "b.ipynb")
    fresh.ok(rt_module("constants") + "rt.NOTEBOOK_MAX_CELLS = 4\nrt.NOTEBOOK_MAX_BYTES = 64 * 1024")
    for i in range(6):
        fresh.ok("print(%d)" % i)
    _, nb = _export(fresh, path)
    cells = nb["cells"]
    assert cells[0]["cell_type"] == "markdown" and cells[0]["source"].startswith("*4 earlier cell(s)")
    assert [c["execution_count"] for c in cells[1:]] == [5, 6, 7, 8]
    # Bytes: a cell's outputs beyond what the record keeps are counted, not kept. Checked from
    # the cell itself (the newest cell is never dropped): how much of it is kept depends on how
    # the pipe reader chunked it, so only the bound and the marker are certain.
    _, nb = _export(fresh, path, "for _ in range(3):\n    print('x' * 30000, flush=True)\n")
    big = nb["cells"][-1]
    assert big["source"].startswith("for _ in r")
    kept = "".join(o["text"] for o in big["outputs"] if o["name"] == "stdout")
    assert len(kept) <= 64 * 1024 and set(kept) <= {"x", "\n"}
    assert "not recorded" in big["outputs"][-1]["text"]
    # And older cells go until the record fits: a newer cell is kept whole.
    fresh.ok("print('z' * 20000)")
    _, nb = _export(fresh, path)
    assert nb["cells"][0]["cell_type"] == "markdown"
    code = nb["cells"][1:]
    small = next(c for c in code if c["source"].startswith("print('z' "))
    assert code[-2:] == [small, code[-1]] and "export_notebook" in code[-1]["source"]
    assert small["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "z" * 20000 + "\n"}]
    recorded = sum(len(c["source"]) + sum(len(json.dumps(o)) for o in c["outputs"]) for c in code)
    assert recorded < 64 * 1024 + 2000


def test_export_larger_than_the_cap_is_a_clear_error(fresh, tmp_path):
    path = str(tmp_path / "big.ipynb")
    fresh.ok(rt_module("constants") + "rt.NOTEBOOK_EXPORT_CAP = 10_000\nprint('y' * 20_000)")
    r = fresh.run("from mcp import runtime\nruntime.export_notebook(%r)" % path)
    assert r.status == "error" and r.error["type"] == "NotebookTooLarge", r.error
    assert "more than the" in r.error["message"] and "reset" in r.error["message"]
    assert not os.path.exists(path)


def test_notebook_leaves_out_calls_that_never_ran_and_records_interrupts(fresh, tmp_path):
    path = "/workspace/i.ipynb" if TEST_IMAGE else str(tmp_path / "i.ipynb")
    first = fresh.start("import time\ntime.sleep(0.5)\n'first'")
    second = fresh.start("'second'")
    fresh.send({"type": "interrupt", "id": second})
    assert fresh.collect(first).value == "'first'"
    assert fresh.collect(second).status == "interrupted"
    eid = fresh.start("import time\nprint('waiting', flush=True)\ntime.sleep(30)")
    fresh.collect(eid, on_frame=lambda f: f["type"] == "output" and fresh.send({"type": "interrupt", "id": eid}))
    _, nb = _export(fresh, path)
    cells = nb["cells"]
    assert [c["execution_count"] for c in cells] == [1, 2, 3] and "'second'" not in json.dumps(nb)
    assert cells[0]["outputs"][0]["data"] == {"text/plain": "'first'"}
    assert cells[1]["outputs"][0] == {"output_type": "stream", "name": "stdout", "text": "waiting\n"}
    assert cells[1]["outputs"][-1]["ename"] == "KeyboardInterrupt"


def test_keep_frames_write_a_part_under_the_kept_dir_and_nothing_else(fresh, tmp_path):
    # The host sends back the parts of an exec's output that were too long for its result; the
    # runtime writes each under OUT_DIR/KEPT_DIR, replacing whatever the code left there (a link
    # included, never followed), and refuses any other path. Each is answered.
    root = "/workspace/keep" if TEST_IMAGE else str(tmp_path / "keep")
    fresh.ok(rt_module("constants") + "rt.OUT_DIR = %r\nimport os\nos.makedirs(rt.OUT_DIR)" % root)
    eid = fresh.ok("1").result["id"]

    def keep(path, data="x", raw=False):
        if isinstance(data, str) and not raw:
            data = base64.b64encode(data.encode()).decode()
        fresh.send({"type": "keep", "id": eid, "path": path, "data": data})
        frame = fresh.next_frame()
        while frame["type"] == "log":
            frame = fresh.next_frame()
        assert frame["type"] == "kept" and frame["id"] == eid, frame
        return frame

    text = "line \u00e9\n" * 1000
    ok = keep(".outputs/%d.stdout.txt" % eid, text)
    assert "error" not in ok and ok["out"] not in (None, "empty")
    read = fresh.ok("open(%r).read()" % (root + "/.outputs/%d.stdout.txt" % eid)).value
    assert read == repr(text)
    # A link the code put in the file's place is replaced, and its target untouched.
    fresh.ok("open(%r, 'w').write('mine')\nos.remove(%r)\nos.symlink(%r, %r)" % (
        root + "/target", root + "/.outputs/%d.stdout.txt" % eid, root + "/target",
        root + "/.outputs/%d.stdout.txt" % eid))
    assert "error" not in keep(".outputs/%d.stdout.txt" % eid, "new")
    assert fresh.ok("open(%r).read(), os.path.islink(%r)" % (
        root + "/target", root + "/.outputs/%d.stdout.txt" % eid)).value == "('mine', False)"
    for bad in ("../escape.txt", ".outputs/../../x", ".outputs/a/b", "elsewhere/x", ".outputs/", "/etc/x"):
        assert "not a path under .outputs/" in keep(bad)["error"], bad
    assert not os.path.exists(os.path.join(os.path.dirname(root), "escape.txt"))
    assert "error" in keep(".outputs/n.txt", 5)
    assert "not base64" in keep(".outputs/n.txt", "not base64!", raw=True)["error"]
    assert fresh.ok("os.path.exists(%r)" % (root + "/.outputs/n.txt")).value == "False"
    assert fresh.healthy()


def test_files_frame_answers_with_the_out_dir_as_a_tar_in_pieces(fresh, tmp_path):
    # Under gVisor the host asks for OUT_DIR through the channel: the runtime answers with a tar
    # of it (the engine's names, out/...; links and fifos as entries, never followed or opened),
    # base64 in `tar` frames, each far below MAX_FRAME_BYTES, the last with `end`. Bounded by the
    # host's limit in bytes (it stops there) and its entry bound plus one.
    import io
    import tarfile

    root = "/workspace/files" if TEST_IMAGE else str(tmp_path / "files")
    fresh.ok(rt_module("constants") + "rt.OUT_DIR = %r\nimport os\nos.makedirs(rt.OUT_DIR + '/sub')\n"
             "open(rt.OUT_DIR + '/a.csv', 'w').write('x,y\\n')\n"
             "open(rt.OUT_DIR + '/sub/big.bin', 'wb').write(os.urandom(3 << 20))\n"
             "os.symlink('/etc/passwd', rt.OUT_DIR + '/passwd')\n"
             "os.mkfifo(rt.OUT_DIR + '/pipe')\n"
             "fd = os.open(rt.OUT_DIR.encode() + b'/\\xff.txt', os.O_CREAT | os.O_WRONLY); os.close(fd)" % root)
    eid = fresh.ok("1").result["id"]

    def files(limit=1 << 30, timeout=25):
        fresh.send({"type": "files", "id": eid, "limit": limit, "timeout": timeout})
        data, frames = b"", []
        while True:
            frame = fresh.next_frame()
            if frame["type"] == "log":
                continue
            assert frame["type"] == "tar" and frame["id"] == eid, frame
            frames.append(frame)
            if frame.get("end"):
                return data, frames
            data += base64.b64decode(frame["data"])

    data, frames = files()
    assert all(len(json.dumps(f)) < MAX_FRAME_BYTES // 8 for f in frames)
    assert len(frames) >= 4 and "error" not in frames[-1], frames[-1]
    with tarfile.open(fileobj=io.BytesIO(data), encoding="utf-8", errors="surrogateescape") as t:
        members = {m.name: m for m in t.getmembers()}
        assert members["out/a.csv"].isreg() and t.extractfile("out/a.csv").read() == b"x,y\n"
        assert members["out/sub/big.bin"].size == 3 << 20
        assert members["out/passwd"].issym() and members["out/pipe"].isfifo()
        assert "out/\udcff.txt" in members and members["out"].isdir()
    # At most `limit` bytes: the runtime stops there, and says nothing (the host does).
    data, frames = files(limit=100_000)
    assert len(data) == 100_000 and "error" not in frames[-1]
    # A missing directory is an empty answer.
    fresh.ok(rt_module("constants") + "rt.OUT_DIR = %r" % (root + "/none"))
    data, frames = files()
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        assert t.getmembers() == []
    assert fresh.healthy()


def test_result_carries_a_digest_of_workspace_out_that_changes_with_it(fresh, tmp_path):
    # The host copies /workspace/out only when this digest changed: it must change with every
    # write the code can make there, and say "empty" for nothing, None when it cannot tell.
    root = "/workspace/stamp" if TEST_IMAGE else str(tmp_path / "stamp")
    fresh.ok(rt_module("outdir") + "consts = sys.modules['__mcp_bridge_runtime__.constants']\n"
             "import os\nroot = %r" % root)
    stamp = lambda: fresh.ok("rt.out_stamp(root)").value  # noqa: E731
    assert stamp() == "'empty'"
    fresh.ok("os.makedirs(root + '/sub')")
    with_dir = stamp()
    assert with_dir not in ("'empty'", None)
    fresh.ok("open(root + '/sub/a.csv', 'w').write('1,2\\n')")
    one = stamp()
    assert one != with_dir and stamp() == one  # stable while nothing changes
    # Rewritten in place, same size, its mtime set back: ctime still moves.
    fresh.ok("st = os.stat(root + '/sub/a.csv')\nimport time; time.sleep(0.01)\n"
             "open(root + '/sub/a.csv', 'w').write('3,4\\n')\n"
             "os.utime(root + '/sub/a.csv', ns=(st.st_atime_ns, st.st_mtime_ns))")
    assert stamp() not in (one, None)
    # A link is an entry, never followed.
    fresh.ok("os.symlink('/etc', root + '/etc')")
    linked = stamp()
    fresh.ok("os.remove(root + '/etc')")
    assert linked != stamp()
    # Past the entries the host reads, and for a root that is not a directory: no digest.
    fresh.ok("consts.OUT_ENTRIES = 1")
    assert stamp() is None  # a None value is no value
    fresh.ok("consts.OUT_ENTRIES = 20000\nopen(root + '.file', 'w').close()")
    assert fresh.ok("rt.out_stamp(root + '.file')").value is None
    # And every result frame carries it, for the real /workspace/out.
    assert fresh.ok("rt.out_stamp()").value == repr(fresh.ok("1").result["out"])


# ---------------------------------------------------------------------------- skills


def skill_host():
    """An rpc handler playing the host's skill store: what save_skill sent, kept by name."""
    store = {}

    def handle(method, params):
        if method == "save_skill":
            replaced = params["name"] in store
            store[params["name"]] = params
            return {"name": params["name"], "replaced": replaced, "count": len(store)}
        if method == "list_skills":
            return {"skills": [{"name": n, "description": p["description"]} for n, p in store.items()],
                    "broken": [{"name": "old", "reason": "its source is not UTF-8"}]}
        if method == "search_tool_docs":
            return {"results": [{"server": "s", "tool": "t", "description": "sales total", "score": 0.5}],
                    "skipped": []}
        raise HostError("unexpected method " + method)

    handle.store = store
    return handle


def test_save_skill_sends_dedented_source_name_and_docstring(fresh):
    host = skill_host()
    r = fresh.run(
        "from mcp import runtime\n"
        "if True:\n"
        "    def clean_sales(df, col='amount'):\n"
        "        '''Drop rows without an amount.\n\n        More words.'''\n"
        "        return df[df[col].notna()]\n"
        "runtime.save_skill(clean_sales)",
        rpc=host,
    )
    assert r.status == "ok", r.error
    saved = host.store["clean_sales"]
    assert saved["source"].startswith("def clean_sales(df, col='amount'):\n")
    assert saved["description"] == "Drop rows without an amount.\n\nMore words."
    assert "'replaced': False" in r.value
    # save_tool is the same function; an explicit description wins over the docstring.
    r = fresh.run("runtime.save_tool(clean_sales, 'cleans')", rpc=host)
    assert r.status == "ok" and "'replaced': True" in r.value
    assert host.store["clean_sales"]["description"] == "cleans"


def test_save_skill_refuses_what_has_no_source_with_a_clear_error(fresh):
    host = skill_host()
    for code, kind, words in [
        ("runtime.save_skill(lambda x: x)", "ValueError", "a lambda has no name"),
        ("runtime.save_skill(len)", "TypeError", "function defined with def"),
        ("ns = {}\nexec('def f(): pass', ns)\nruntime.save_skill(ns['f'])", "ValueError", "source of f() is not available"),
    ]:
        r = fresh.run("from mcp import runtime\n" + code, rpc=host)
        assert r.status == "error" and r.error["type"] == kind, r.error
        assert words in r.error["message"], r.error["message"]
    assert host.store == {}


def test_host_refusal_of_a_skill_is_an_mcp_error(fresh):
    def host(method, params):
        raise HostError("10 skills are saved, the most skills.max_count allows (10)")

    r = fresh.run("from mcp import runtime\ndef f(): pass\nruntime.save_skill(f)", rpc=host)
    assert r.error["type"] == "McpError" and "skills.max_count" in r.error["message"]


def test_saved_skills_are_defined_at_the_first_exec_and_broken_ones_reported(fresh):
    fresh.skills = {
        "skills": [
            {"name": "double", "description": "Twice x.", "source": "def double(x):\n    return 2 * x\n"},
            {"name": "broken", "description": "", "source": "def broken(:\n"},
            {"name": "liar", "description": "", "source": "def other(): pass\n"},
        ],
        "broken": [{"name": "latin", "reason": "its source is not UTF-8"}],
    }
    r = fresh.run("double(21)")
    assert r.status == "ok" and r.value == "42"
    assert fresh.skill_loads == 1
    err = r.stderr
    assert err.startswith("[skills] not defined in this session (the call goes on):"), err
    assert "broken: SyntaxError" in err and "liar: ValueError: its source defines other, not liar" in err
    assert "latin: its source is not UTF-8" in err
    # Asked once per interpreter; the traceback of a skill names it.
    r = fresh.run("double(None)")
    assert fresh.skill_loads == 1 and r.stderr == ""
    assert 'File "<skill double>", line 2, in double' in r.error["traceback"]
    assert "return 2 * x" in r.error["traceback"]


def test_a_skill_is_defined_without_running_anything_else(fresh, tmp_path):
    """A stored skill whose source has code besides its function (forged, or stored before the
    host checked) is not run at all; decorators and non-literal defaults are refused; annotations
    are never evaluated; only the function is defined."""
    marker = tmp_path / "ran"
    run = "open(%r, 'a').write('x')" % str(marker)
    fresh.skills = {
        "skills": [
            {"name": "before", "description": "", "source": run + "\ndef before(): return 1\n"},
            {"name": "after", "description": "", "source": "def after(): return 1\n" + run + "\n"},
            {"name": "decorated", "description": "",
             "source": "@(lambda f: (%s, f)[1])\ndef decorated(): return 1\n" % run},
            {"name": "default", "description": "", "source": "def default(x=%s): return 1\n" % run},
            {"name": "annotated", "description": "",
             "source": "def annotated(x: %s = (1, -2.5, {'k': [None, b'']})) -> %s:\n    return x\n" % (run, run)},
        ],
        "broken": [],
    }
    r = fresh.run("annotated()")
    assert r.status == "ok" and r.value == "(1, -2.5, {'k': [None, b'']})", (r.error, r.value)
    assert not marker.exists(), "code besides the function ran at load"
    err = r.stderr
    assert "before: ValueError: its source is not exactly one function definition (2 top-level" in err, err
    assert "after: ValueError: its source is not exactly one function definition" in err, err
    assert "decorated: ValueError: it has a decorator" in err, err
    assert "default: ValueError: a default value is not a literal" in err, err
    r = fresh.run("[n in globals() for n in ('before', 'after', 'decorated', 'default')]")
    assert r.value == "[False, False, False, False]", r.value
    assert isinstance(fresh.run("annotated.__annotations__['x']").value, str)
    assert not marker.exists()


def test_save_skill_refuses_a_decorator_or_a_computed_default_before_sending(fresh):
    host = skill_host()
    for code, words in [
        ("def deco(f):\n    return f\n@deco\ndef f(): pass\nruntime.save_skill(f)", "it has a decorator"),
        ("def g(x=len('ab')): pass\nruntime.save_skill(g)", "a default value is not a literal"),
    ]:
        r = fresh.run("from mcp import runtime\n" + code, rpc=host)
        assert r.status == "error" and r.error["type"] == "ValueError", r.error
        assert words in r.error["message"] and "cannot be a skill" in r.error["message"], r.error
    assert host.store == {}


def test_a_skill_loaded_from_the_host_can_be_saved_again_and_searched(fresh):
    fresh.skills = {"skills": [{"name": "sales_total", "description": "Sum of the sales column.",
                                "source": "def sales_total(df):\n    return df['sales'].sum()\n"}],
                    "broken": []}
    host = skill_host()
    r = fresh.run("from mcp import runtime\nruntime.save_skill(sales_total)", rpc=host)
    assert r.status == "ok", r.error
    assert host.store["sales_total"]["source"] == "def sales_total(df):\n    return df['sales'].sum()\n"
    r = fresh.run("[h.get('skill') or h['tool'] for h in runtime.search_tool_docs_sync('sales total', limit=5)]",
                  rpc=host)
    assert r.value == "['sales_total', 't']", r.value
    r = fresh.run("runtime.list_skills()", rpc=host)
    assert "'name': 'sales_total'" in r.value
    assert "skill 'old' is broken: its source is not UTF-8" in r.stderr


def test_no_skills_saved_no_round_trip(fresh):
    """An exec whose frame does not say skills are saved asks nothing of the host: the first call
    of an interpreter costs no extra RPC when the store is empty."""
    fresh.skills_saved = False
    fresh.skills = None  # a load_skills rpc would now reach the rpc handler below
    asked = []

    def host(method, params):
        asked.append(method)
        raise HostError("unexpected rpc " + method)

    r = fresh.run("1 + 1", rpc=host)
    assert r.status == "ok" and r.value == "2" and asked == [], asked
    # A later exec that says skills are saved (one was saved by another bridge) loads them once.
    fresh.skills_saved = True
    fresh.skills = {"skills": [{"name": "double", "description": "Twice x.",
                                "source": "def double(x):\n    return 2 * x\n"}], "broken": []}
    assert fresh.run("double(21)").value == "42"


def test_a_host_without_skills_is_not_an_error(fresh):
    fresh.skills = None  # the rpc handler answers load_skills: with an error, as doctor's probe does
    r = fresh.run("1 + 1")
    assert r.status == "ok" and r.value == "2" and r.stderr == ""

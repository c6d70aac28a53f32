"""The mcp-code-bridge sandbox runtime.

The bridge embeds this file and sends it as the first line of the container's stdin (the
`boot` frame); `image/loader.py` executes it as the module `__mcp_bridge_runtime__` and calls
`main()`. The host <-> sandbox contract is docs/protocol.md.

Pure standard library, Python >= 3.9.

Layout of the process once `main()` runs:
  * the real stdin / stdout are kept on private close-on-exec descriptors that only the frame
    reader thread and `_send_bytes` touch;
  * fd 0 is /dev/null; fd 1 / fd 2 are pipes drained by two threads that forward what arrives as
    `output` frames (head live, rolling tail kept, see `_Router`);
  * the main thread runs user code (exec frames are queued for it) on one persistent asyncio loop;
  * interrupts arrive as SIGINT to the main thread (sent by the frame reader for `interrupt`
    frames, or by the engine) and are turned into KeyboardInterrupt / task cancellation only
    while user code runs. An interrupt frame is level-triggered: until the exec has seen it
    (a KeyboardInterrupt raised, or its task really cancelled), the watchdog thread sends
    SIGINT again, so no moment of arrival can lose it (see `_interrupt_watchdog`).
"""

import __future__
import _thread
import ast
import asyncio
import base64
import builtins
import codecs
import collections
import collections.abc
import copy
import dataclasses
import hashlib
import importlib.machinery
import inspect
import io
import itertools
import json
import keyword
import linecache
import numbers
import os
import platform
import queue
import re
import reprlib
import select
import signal
import stat
import sys
import tempfile
import textwrap
import threading
import time
import traceback
import types
import typing
import warnings

# --------------------------------------------------------------------------------------------
# Constants

RUNTIME_FILENAME = sys._getframe().f_code.co_filename
CELL_PREFIX = "<cell-"
MAX_FRAME_BYTES = 16 * 1024 * 1024  # the host discards longer lines
READ_CHUNK = 64 * 1024  # one read of an output pipe / largest live output frame
TAIL_FRAME_BYTES = 256 * 1024  # largest output frame built from the kept tail
BATCH_DELAY = 0.02  # small writes are coalesced for this long
DRAIN_TIMEOUT = 5.0
VALUE_CAP = 10_000  # characters of the last expression's repr
TEXT_DISPLAY_CAP = 100_000
TRACEBACK_CAP = 32_000
MESSAGE_CAP = 8_000
IMAGE_CAP = 6 * 1024 * 1024  # raw bytes; the host refuses larger images (MAX_IMAGE_BYTES in src/sandbox/session.rs)
DEFAULT_OUTPUT_CAP = 1024 * 1024
KICK_FIRST = 0.05  # an undelivered interrupt is signalled again after this long ...
KICK_MAX = 0.2  # ... and then at most this far apart, until the exec has seen it
TLA_FLAG = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)


# --------------------------------------------------------------------------------------------
# Process-wide state


class _State:
    def __init__(self):
        self.main_ident = None
        self.frame_out = None  # private fd: frames to the host
        self.frame_in = None  # private fd: frames from the host
        self.forked = False
        self.running = None  # the _Exec being run by the main thread
        self.loop = None
        self.ns = None  # the user's namespace (dict of the __main__ module)
        self.main_module = None
        self.loaded = collections.OrderedDict()  # server name -> metadata (this exec)
        self.discovered = ()  # ({name, alias, description}, ...)
        self.proxies = {}  # server name -> proxy (this exec)
        self.globals_set = {}  # global name -> object the runtime put into ns
        self.queued = set()  # exec ids waiting in the queue
        self.cancelled = set()  # queued exec ids interrupted before they started
        self.sig_defer = 0  # >0 while the main thread writes a frame
        self.sig_pending = False
        self.std_objects = ()  # our sys.stdin/stdout/stderr
        self.fd_targets = {}  # fd -> (private fd, (st_dev, st_ino))
        self.readers = []
        self.c_fflush = None


_state = _State()
_write_lock = threading.Lock()
_exec_queue = queue.Queue()
_rpc_ids = itertools.count(1)
_rpc_lock = threading.Lock()
_pending = {}  # rpc id -> _Pending
_tool_cache = {}  # (server, alias, tool json) -> function
# server name -> (metadata, proxy, module) as last built: an exec that loads a server with the
# same metadata reuses them instead of rebuilding every tool (~1 ms per call for 50 tools).
_server_cache = {}


# --------------------------------------------------------------------------------------------
# Frames out


def _json_default(o):
    if isinstance(o, (set, frozenset)):
        return list(o)
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    tolist = getattr(type(o), "tolist", None)  # numpy arrays and scalars, pandas objects
    if tolist is not None:
        return o.tolist()
    if isinstance(o, numbers.Integral):
        return int(o)
    if isinstance(o, numbers.Real):
        return float(o)
    if hasattr(o, "isoformat") and callable(o.isoformat):  # datetime, date, time
        return o.isoformat()
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if isinstance(o, collections.abc.Mapping):
        return dict(o)
    if isinstance(o, (collections.abc.Sequence, collections.abc.Set)) and not isinstance(
        o, (str, bytes, bytearray)
    ):
        return list(o)
    raise TypeError("Object of type %s is not JSON serializable" % type(o).__name__)


def _encode(obj, strict=False):
    text = json.dumps(
        obj,
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=not strict,
        default=_json_default if strict else str,
    )
    # Lone surrogates cannot be UTF-8: they become '?', never an invalid frame.
    return text.encode("utf-8", "replace") + b"\n"


def _defer_enter():
    if threading.get_ident() == _state.main_ident:
        _state.sig_defer += 1
        return True
    return False


def _defer_exit(entered):
    if not entered:
        return
    _state.sig_defer -= 1
    if _state.sig_defer == 0 and _state.sig_pending:
        _state.sig_pending = False
        _interrupt_now()


def _send_bytes(data):
    """Write one encoded frame. Atomic with respect to interrupts and other threads."""
    if _state.forked or _state.frame_out is None:
        return False
    entered = _defer_enter()
    try:
        with _write_lock:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(_state.frame_out, view)
                except InterruptedError:
                    continue
                except OSError:
                    # The host is gone (or the channel was destroyed): nothing left to serve.
                    os._exit(0)
                view = view[n:]
    finally:
        _defer_exit(entered)
    return True


def _send(obj):
    if obj.get("type") in ("output", "display"):
        _notebook.frame(obj)
    return _send_bytes(_encode(obj))


def _log(message, level="warning"):
    try:
        _send({"type": "log", "level": level, "message": str(message)[:MESSAGE_CAP]})
    except Exception:
        pass


# --------------------------------------------------------------------------------------------
# Output: fd 1 / fd 2 pipes -> output frames, with a head / tail cap


def _utf8_decoder():
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


class _OutputState:
    def __init__(self, exec_id, cap):
        cap = max(0, cap)
        self.exec_id = exec_id
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head_used = 0
        self.totals = {"stdout": 0, "stderr": 0}
        self.heads = {"stdout": 0, "stderr": 0}
        self.seq = 0
        # Per-stream rolling tails of (seq, bytes): a flood on one stream cannot push the
        # other stream's last lines out (the two readers are not in lock-step).
        self.tails = {"stdout": collections.deque(), "stderr": collections.deque()}
        self.tail_lens = {"stdout": 0, "stderr": 0}
        self.decoders = {"stdout": _utf8_decoder(), "stderr": _utf8_decoder()}


def _trim_left(chunks, length, limit):
    """Drop bytes from the left of a deque of (seq, bytes) until at most `limit` remain."""
    while length > limit:
        excess = length - limit
        seq, b = chunks[0]
        if len(b) <= excess:
            chunks.popleft()
            length -= len(b)
        else:
            chunks[0] = (seq, b[excess:])
            length -= excess
    return length


class _Router:
    def __init__(self):
        self.lock = threading.Lock()
        self.out = None

    def begin(self, exec_id, cap):
        with self.lock:
            self.out = _OutputState(exec_id, cap)

    def feed(self, stream, data):
        """Called by a pipe reader thread (one per stream) with raw bytes."""
        if not data:
            return
        with self.lock:
            out = self.out
            if out is None:
                return  # output written between execs belongs to nobody
            out.totals[stream] += len(data)
            room = out.head_cap - out.head_used
            text = ""
            if room > 0:
                live = bytes(data[:room])
                out.head_used += len(live)
                out.heads[stream] += len(live)
                text = out.decoders[stream].decode(live)
                data = data[len(live):]
            if data:
                out.seq += 1
                out.tails[stream].append((out.seq, bytes(data)))
                out.tail_lens[stream] = _trim_left(
                    out.tails[stream], out.tail_lens[stream] + len(data), out.tail_cap)
        if text:
            _send({"type": "output", "id": out.exec_id, "stream": stream, "data": text})

    def end(self):
        """Detach the exec's output, send what the cap kept back; returns bytes omitted."""
        with self.lock:
            out, self.out = self.out, None
        if out is None:
            return 0
        eid = out.exec_id

        def emit(stream, text):
            if text:
                _send({"type": "output", "id": eid, "stream": stream, "data": text})

        # Share the tail budget: each stream keeps at least half of it if it needs it.
        lens = out.tail_lens
        cap = out.tail_cap
        if lens["stdout"] + lens["stderr"] > cap:
            half = cap // 2
            keep_err = min(lens["stderr"], max(cap - half, cap - lens["stdout"]))
            keep_out = min(lens["stdout"], cap - keep_err)
            for stream, keep in (("stdout", keep_out), ("stderr", keep_err)):
                lens[stream] = _trim_left(out.tails[stream], lens[stream], keep)
        lost = {s: out.totals[s] - out.heads[s] - lens[s] for s in ("stdout", "stderr")}
        dropped = lost["stdout"] + lost["stderr"]
        decoders = out.decoders
        chunks = sorted(
            [(seq, "stdout", b) for seq, b in out.tails["stdout"]]
            + [(seq, "stderr", b) for seq, b in out.tails["stderr"]]
        )
        if dropped:
            for stream in ("stdout", "stderr"):
                emit(stream, decoders[stream].decode(b"", True))
            marker_stream = "stdout" if lost["stdout"] >= lost["stderr"] else "stderr"
            emit(marker_stream, "\n\u2026 [output truncated: %d bytes omitted] \u2026\n" % dropped)
            decoders = {"stdout": _utf8_decoder(), "stderr": _utf8_decoder()}
        started = set()
        run = bytearray()
        run_stream = None
        for _, stream, chunk in chunks:
            if dropped and stream not in started:
                # The tail may start inside a UTF-8 sequence: skip its continuation bytes.
                i = 0
                while i < min(3, len(chunk)) and 0x80 <= chunk[i] <= 0xBF:
                    i += 1
                chunk = chunk[i:]
            started.add(stream)
            if run and (stream != run_stream or len(run) >= TAIL_FRAME_BYTES):
                emit(run_stream, decoders[run_stream].decode(bytes(run)))
                run = bytearray()
            run_stream = stream
            run += chunk
        if run:
            emit(run_stream, decoders[run_stream].decode(bytes(run)))
        for stream in ("stdout", "stderr"):
            emit(stream, decoders[stream].decode(b"", True))
        return dropped


_router = _Router()


def _block_sigint():
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    except Exception:
        pass


class _PipeReader(threading.Thread):
    """Reads one output pipe in big chunks, coalescing small writes, and feeds the router."""

    def __init__(self, stream, rfd, wfd):
        super().__init__(name="mcp-bridge-" + stream, daemon=True)
        self.stream = stream
        self.rfd = rfd
        self.wfd = wfd  # private write end: the drain sentinel goes through it
        self.token = None
        self.token_seen = threading.Event()
        # Set by _drain: cuts the coalescing wait short, so a call's last output is forwarded
        # at once instead of BATCH_DELAY later (a warm print would otherwise cost ~20 ms).
        self.wake = threading.Event()
        self.carry = b""

    def run(self):
        _block_sigint()
        poller = select.poll()
        poller.register(self.rfd, select.POLLIN)
        while True:
            try:
                poller.poll()
                data = os.read(self.rfd, READ_CHUNK)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return
            if len(data) < READ_CHUNK and self.token is None:
                # Small write: give the writer a moment (a drain ends it), then take all there is.
                self.wake.wait(BATCH_DELAY)
                self.wake.clear()
                buf = bytearray(data)
                try:
                    while len(buf) < READ_CHUNK and poller.poll(0):
                        more = os.read(self.rfd, READ_CHUNK - len(buf))
                        if not more:
                            break
                        buf += more
                except OSError:
                    pass
                data = bytes(buf)
            try:
                self.process(data)
            except Exception as e:  # never let the reader die
                _log("output reader: %r" % (e,))

    def process(self, data):
        if self.carry:
            data = self.carry + data
            self.carry = b""
        token = self.token
        if token is None:
            _router.feed(self.stream, data)
            return
        idx = data.find(token)
        if idx >= 0:
            _router.feed(self.stream, data[:idx])
            self.token = None
            self.token_seen.set()
            _router.feed(self.stream, data[idx + len(token):])
            return
        keep = 0
        for k in range(min(len(token) - 1, len(data)), 0, -1):
            if data.endswith(token[:k]):
                keep = k
                break
        _router.feed(self.stream, data[: len(data) - keep])
        self.carry = data[len(data) - keep:] if keep else b""


def _flush_std():
    seen = set()
    for obj in (sys.stdout, sys.stderr) + tuple(_state.std_objects[1:]):
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            obj.flush()
        except Exception:
            pass
    if _state.c_fflush is not None:
        try:
            _state.c_fflush(None)
        except Exception:
            pass


def _drain():
    """Wait until everything written to fd 1 / fd 2 so far has been forwarded."""
    readers = [r for r in _state.readers if r.is_alive()]
    for r in readers:
        r.token_seen.clear()
        r.token = b"\x00[mcp-bridge-drain:" + os.urandom(12).hex().encode() + b"]\x00"
    for r in readers:
        try:
            os.write(r.wfd, r.token)
        except OSError:
            r.token = None
            r.token_seen.set()
        r.wake.set()
    deadline = time.monotonic() + DRAIN_TIMEOUT
    for r in readers:
        if not r.token_seen.wait(max(0.0, deadline - time.monotonic())):
            r.token = None


# --------------------------------------------------------------------------------------------
# Interrupts


class _Exec:
    def __init__(self, exec_id, cap):
        self.id = exec_id
        self.cap = cap
        self.in_user = False
        self.interrupt_requested = False  # an interrupt frame named this exec
        self.delivered = False  # ... and the code has seen it since (see _interrupt_watchdog)
        self.done = False  # the user's code has finished, one way or another
        self.interrupted = False
        self.cancel_sent = False
        self.kicks = 0  # SIGINTs sent again by the watchdog
        self.task = None


def _cancel_task(ex, task):
    try:
        task.cancel()
    except Exception:
        pass
    # A cancelled task sees CancelledError at its next step, whether it waits on a future or is
    # about to start: the interrupt has reached the code.
    ex.delivered = True


def _interrupt_now():
    ex = _state.running
    if ex is None or not ex.in_user:
        return  # not in user code: the watchdog signals again, _execute checks the flag
    ex.interrupted = True
    loop = _state.loop
    task = ex.task
    if task is not None and not task.done() and loop is not None and loop.is_running() and not ex.cancel_sent:
        try:
            current = asyncio.current_task(loop)
        except Exception:
            current = None
        if current is None:
            # The loop is between steps (e.g. waiting in `await asyncio.sleep(100)`): cancel the
            # cell's task so the user's code unwinds through its own try/finally. The cancel
            # runs after what is already queued, which may be the task's own first step
            # spinning for ever: then the watchdog signals again, and that one raises.
            ex.cancel_sent = True
            loop.call_soon_threadsafe(_cancel_task, ex, task)
            return
    ex.delivered = True
    raise KeyboardInterrupt


def _on_sigint(signum, frame):
    if _state.sig_defer:
        _state.sig_pending = True
        return
    _interrupt_now()


def _on_sigterm(signum, frame):
    os._exit(0)


def _kick_main():
    try:
        signal.pthread_kill(_state.main_ident, signal.SIGINT)
    except Exception:
        _thread.interrupt_main()


def _handle_interrupt(msg):
    eid = msg.get("id")
    ex = _state.running
    if ex is not None and ex.id == eid:
        # A repeated frame (the host sends one more when the first went unanswered) is a second
        # Ctrl-C: delivered again, even to code that caught the first.
        ex.delivered = False
        ex.interrupt_requested = True
        _kick_main()
        _interrupt_wake.set()
    elif eid in _state.queued:
        _state.cancelled.add(eid)


_interrupt_wake = threading.Event()


def _interrupt_watchdog():
    """Signal the main thread again until the running exec has seen its interrupt.

    One SIGINT is not always enough: it can land where the runtime, not the user's code, is
    running (between two steps of the event loop, just before a cell's task first runs, before
    `in_user` is set), where it is only noted. Until `delivered` is set, SIGINT follows at
    growing intervals (KICK_FIRST up to KICK_MAX), so an interrupt is level-triggered: whenever
    it arrives, it reaches the code before the exec ends."""
    _block_sigint()
    while True:
        _interrupt_wake.wait()
        _interrupt_wake.clear()
        delay = KICK_FIRST
        while True:
            time.sleep(delay)
            ex = _state.running
            if ex is None or ex.done or ex.delivered or not ex.interrupt_requested:
                break
            ex.kicks += 1
            _kick_main()
            delay = min(delay * 2, KICK_MAX)


# --------------------------------------------------------------------------------------------
# Frames in


def _frame_reader():
    _block_sigint()
    stream = io.open(_state.frame_in, "rb", buffering=1 << 16, closefd=False)
    while True:
        try:
            line = stream.readline()
        except Exception:
            line = b""
        if not line:
            os._exit(0)  # the host closed our stdin: the session is over
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
        except Exception:
            _log("ignored a frame that is not JSON (%d bytes)" % len(line))
            continue
        if not isinstance(msg, dict):
            continue
        try:
            _dispatch(msg)
        except Exception as e:
            _log("ignored a bad %r frame: %r" % (msg.get("type"), e))


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _dispatch(msg):
    kind = msg.get("type")
    if kind == "exec":
        if not _is_int(msg.get("id")) or not isinstance(msg.get("code"), str):
            _log("ignored an exec frame without an integer id and a code string")
            return
        _state.queued.add(msg["id"])
        _exec_queue.put(msg)
    elif kind == "rpc_result":
        p = _pending.get(msg.get("id")) if _is_int(msg.get("id")) else None
        if p is not None:
            p.resolve(msg)
    elif kind == "interrupt":
        _handle_interrupt(msg)


# --------------------------------------------------------------------------------------------
# RPC to the host


class McpError(RuntimeError):
    """An MCP bridge request failed (the message says what to do)."""


class McpToolError(McpError):
    """A tool reported an error (`isError: true`); `.mcp_result` holds the whole result."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.mcp_result = result


class ToolDenied(PermissionError):
    """The user's policy, or the user when asked, refused a tool call. The message names the
    tool, the rule and where it is set; catch it and go on without that call (retrying is
    refused the same way)."""


class _Pending:
    __slots__ = ("loop", "fut", "event", "msg")

    def __init__(self, loop=None, fut=None, event=None):
        self.loop = loop
        self.fut = fut
        self.event = event
        self.msg = None

    def resolve(self, msg):
        self.msg = msg
        if self.event is not None:
            self.event.set()
        elif self.fut is not None:
            try:
                self.loop.call_soon_threadsafe(_set_future, self.fut, msg)
            except RuntimeError:
                pass  # that loop is closed


def _set_future(fut, msg):
    if not fut.done():
        fut.set_result(msg)


def _rpc_prepare(method, params):
    if _state.forked:
        raise McpError("MCP calls are not available in a forked child process")
    ex = _state.running
    if ex is None:
        raise McpError("no run_python call is active: MCP calls work only while a cell runs")
    with _rpc_lock:
        rid = next(_rpc_ids)
    frame = {"type": "rpc", "id": rid, "exec": ex.id, "method": method, "params": params}
    try:
        data = _encode(frame, strict=True)
    except (TypeError, ValueError) as e:
        raise TypeError("arguments of %s cannot be sent as JSON: %s" % (method, e)) from None
    if len(data) > MAX_FRAME_BYTES - 1024:
        raise McpError(
            "request too large: %d bytes (the sandbox channel carries at most %d bytes per message)"
            % (len(data), MAX_FRAME_BYTES)
        )
    return rid, data


def _rpc_unwrap(msg):
    if msg.get("ok") is True:
        return msg.get("result")
    err = msg.get("error")
    if msg.get("kind") == "denied":
        raise ToolDenied(str(err) if err else "the tool call was denied by the user's policy")
    raise McpError(str(err) if err else "the bridge refused the request")


async def _rpc(method, params):
    rid, data = _rpc_prepare(method, params)
    loop = asyncio.get_running_loop()
    p = _Pending(loop=loop, fut=loop.create_future())
    _pending[rid] = p
    try:
        _send_bytes(data)
        msg = await p.fut
    finally:
        _pending.pop(rid, None)
    return _rpc_unwrap(msg)


def _rpc_sync(method, params):
    rid, data = _rpc_prepare(method, params)
    p = _Pending(event=threading.Event())
    _pending[rid] = p
    try:
        _send_bytes(data)
        p.event.wait()
    finally:
        _pending.pop(rid, None)
    return _rpc_unwrap(p.msg)


# --------------------------------------------------------------------------------------------
# Tool results -> Python values


class ToolDict(dict):
    """A dict tool result; `.mcp_result` is the whole MCP CallToolResult."""

    mcp_result = None


class ToolList(list):
    """A list tool result; `.mcp_result` is the whole MCP CallToolResult."""

    mcp_result = None


class ToolStr(str):
    """A text tool result; `.mcp_result` is the whole MCP CallToolResult."""

    mcp_result = None


def _image_size(mime, data):
    try:
        if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
            return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        if data[:6] in (b"GIF87a", b"GIF89a"):
            return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    except Exception:
        pass
    return None


class Media:
    """Binary content from a tool (image or audio): `.mime`, `.data` (bytes)."""

    kind = "media"

    def __init__(self, data, mime="application/octet-stream"):
        self.data = bytes(data)
        self.mime = mime
        self.mcp_result = None

    @property
    def mimeType(self):
        return self.mime

    def __bytes__(self):
        return self.data

    def save(self, path):
        """Write the bytes to `path`."""
        with open(path, "wb") as f:
            f.write(self.data)
        return path

    def __repr__(self):
        size = _image_size(self.mime, self.data)
        dims = " %dx%d" % size if size else ""
        return "<%s %s, %d bytes%s>" % (type(self).__name__, self.mime, len(self.data), dims)


class Image(Media):
    """An image from a tool. `display(img)` shows it; `.save(path)` writes it."""

    kind = "image"

    def __init__(self, data, mime="image/png"):
        super().__init__(data, mime)

    def _repr_png_(self):
        return self.data if self.mime == "image/png" else None

    def _repr_jpeg_(self):
        return self.data if self.mime in ("image/jpeg", "image/jpg") else None


class Audio(Media):
    """Audio from a tool: `.mime`, `.data` (bytes)."""

    kind = "audio"


class Resource(dict):
    """An embedded resource or resource link (a dict with attribute access: uri, name,
    mimeType, text, blob, description)."""

    mcp_result = None

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def _b64decode(s):
    try:
        return base64.b64decode(s or "")
    except Exception:
        return b""


def _content_item(item):
    if not isinstance(item, dict):
        return item
    kind = item.get("type")
    if kind == "text":
        return item.get("text", "")
    if kind == "image":
        return Image(_b64decode(item.get("data")), item.get("mimeType") or "image/png")
    if kind == "audio":
        return Audio(_b64decode(item.get("data")), item.get("mimeType") or "audio/wav")
    if kind == "resource":
        res = item.get("resource") if isinstance(item.get("resource"), dict) else {}
        out = Resource(type="resource", uri=res.get("uri"))
        for key in ("name", "title", "mimeType", "text"):
            if key in res:
                out[key] = res[key]
        if "blob" in res:
            out["blob"] = _b64decode(res.get("blob"))
        return out
    if kind == "resource_link":
        out = Resource(type="resource_link")
        for key in ("uri", "name", "title", "description", "mimeType", "size"):
            if key in item:
                out[key] = item[key]
        return out
    return item


def _result_text(result):
    parts = []
    for item in result.get("content") or []:
        if isinstance(item, dict) and item.get("type") == "text":
            parts.append(str(item.get("text", "")))
    if parts:
        return "\n".join(parts)
    if result.get("structuredContent") is not None:
        return json.dumps(result.get("structuredContent"))[:MESSAGE_CAP]
    return ""


def _attach(value, result):
    if type(value) is dict:
        value = ToolDict(value)
    elif type(value) is list:
        value = ToolList(value)
    elif type(value) is str:
        value = ToolStr(value)
    try:
        if isinstance(value, (ToolDict, ToolList, ToolStr, Media, Resource)):
            value.mcp_result = result
    except Exception:
        pass
    return value


def _convert_result(result, tool=None, where=""):
    if not isinstance(result, dict):
        return result
    if result.get("isError"):
        text = _result_text(result) or "the tool reported an error"
        raise McpToolError("%s%s" % (where, text), result)
    structured = result.get("structuredContent")
    if structured is not None:
        out_schema = (tool or {}).get("output_schema") or {}
        if (
            isinstance(out_schema, dict)
            and out_schema.get("x-fastmcp-wrap-result")
            and isinstance(structured, dict)
            and list(structured) == ["result"]
        ):
            structured = structured["result"]
        return _attach(structured, result)
    content = result.get("content")
    items = [_content_item(c) for c in content] if isinstance(content, list) else []
    if not items:
        return None
    if all(isinstance(i, str) for i in items):
        if len(items) == 1:
            text = items[0]
            stripped = text.strip()
            if stripped:
                try:
                    return _attach(json.loads(stripped), result)
                except (ValueError, RecursionError):
                    pass
            return _attach(text, result)
        return _attach(list(items), result)
    if len(items) == 1:
        return _attach(items[0], result)
    return _attach(list(items), result)


# --------------------------------------------------------------------------------------------
# Server proxies and tool functions


class ServerProxy:
    """An MCP server loaded for this run_python call; its attributes are the tools."""

    __slots__ = ()
    _mcp_server_ = ""
    _mcp_alias_ = ""
    _mcp_tools_ = {}
    _mcp_by_name_ = {}

    def __getattr__(self, item):
        cls = type(self)
        func = cls._mcp_by_name_.get(item)
        if func is not None:
            return func
        if item.startswith("__"):
            raise AttributeError(item)
        names = ", ".join(sorted(cls._mcp_tools_)) or "none"
        raise AttributeError("MCP server %r has no tool %r. Tools: %s" % (cls._mcp_server_, item, names))

    def __getitem__(self, key):
        cls = type(self)
        func = cls._mcp_tools_.get(key) or cls._mcp_by_name_.get(key)
        if func is None:
            raise KeyError(key)
        return func

    def __dir__(self):
        return sorted(type(self)._mcp_tools_)

    def __iter__(self):
        return iter(type(self)._mcp_tools_)

    def __len__(self):
        return len(type(self)._mcp_tools_)

    def __repr__(self):
        cls = type(self)
        names = sorted(cls._mcp_tools_)
        shown = ", ".join(names[:20]) + (", \u2026" if len(names) > 20 else "")
        return "<MCP server %r (mcp_%s): %d tools: %s>" % (cls._mcp_server_, cls._mcp_alias_, len(names), shown)


def _ident(name, used=(), fallback="arg"):
    s = re.sub(r"\W", "_", str(name))
    if not s:
        s = fallback
    if s[0].isdigit():
        s = "_" + s
    if keyword.iskeyword(s) or s.startswith("__mcp"):
        s += "_"
    if not s.isidentifier():
        s = fallback
    base, n = s, 2
    while s in used:
        s = "%s_%d" % (base, n)
        n += 1
    return s


_JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


def _py_type(schema):
    if not isinstance(schema, dict):
        return typing.Any
    t = schema.get("type")
    if isinstance(t, str):
        return _JSON_TYPES.get(t, typing.Any)
    if isinstance(t, list):
        types_ = tuple(_JSON_TYPES[x] for x in t if isinstance(x, str) and x in _JSON_TYPES)
        if len(types_) == 1:
            return types_[0]
        if types_:
            return typing.Union[types_]
        return typing.Any
    for key in ("anyOf", "oneOf"):
        alts = schema.get(key)
        if isinstance(alts, list) and alts:
            types_ = tuple(dict.fromkeys(_py_type(a) for a in alts))
            if typing.Any in types_:
                return typing.Any
            return types_[0] if len(types_) == 1 else typing.Union[types_]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        kinds = tuple(dict.fromkeys(type(v) for v in enum))
        return kinds[0] if len(kinds) == 1 else typing.Any
    if "const" in schema:
        return type(schema["const"])
    return typing.Any


def _type_label(schema):
    if not isinstance(schema, dict):
        return "any"
    t = schema.get("type")
    if isinstance(t, list):
        return " | ".join(_type_label(dict(schema, type=x)) for x in t)
    if t == "array":
        items = schema.get("items")
        return "list[%s]" % _type_label(items) if isinstance(items, dict) and items else "list"
    if isinstance(t, str):
        return {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
                "object": "dict", "null": "None"}.get(t, t)
    for key in ("anyOf", "oneOf"):
        alts = schema.get(key)
        if isinstance(alts, list) and alts:
            return " | ".join(dict.fromkeys(_type_label(a) for a in alts))
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return type(enum[0]).__name__
    return "any"


def _short_json(value, limit=200):
    try:
        s = json.dumps(value, ensure_ascii=False)
    except Exception:
        s = repr(value)
    return s if len(s) <= limit else s[: limit - 1] + "\u2026"


def _tool_doc(server_name, tool_name, description, params, output_schema):
    lines = [(description or "").strip() or "MCP tool %r." % tool_name, ""]
    if params:
        lines.append("Args:")
        for p in params:
            schema = p["schema"] if isinstance(p["schema"], dict) else {}
            bits = [_type_label(schema), "required" if p["required"] else "optional"]
            if "default" in schema:
                bits.append("default " + _short_json(schema["default"]))
            desc = [" ".join(str(schema.get("description") or "").split())]
            enum = schema.get("enum")
            if isinstance(enum, list) and enum:
                desc.append("One of: %s." % ", ".join(_short_json(v, 60) for v in enum[:30]))
            if p["py"] != p["name"]:
                desc.append("(sent as %r)" % p["name"])
            desc = " ".join(d for d in desc if d)
            lines.append("    %s (%s)%s" % (p["py"], ", ".join(bits), (": " + desc) if desc else ""))
        lines.append("")
    if isinstance(output_schema, dict) and output_schema:
        lines.append("Output schema: " + _short_json(output_schema, 600))
    lines.append(
        "MCP tool %r of server %r (async: use `await`). Returns a Python value (`.mcp_result` holds "
        "the full result); raises McpToolError if the tool fails." % (tool_name, server_name)
    )
    return "\n".join(lines)


def _make_tool(server_name, server_alias, tool):
    try:
        key = (server_name, server_alias, json.dumps(tool, sort_keys=True, default=str))
    except Exception:
        key = None
    if key is not None and key in _tool_cache:
        return _tool_cache[key]
    tool_name = str(tool.get("name"))
    alias = tool.get("alias")
    if not isinstance(alias, str) or not alias.isidentifier() or keyword.iskeyword(alias):
        alias = _ident(alias or tool_name, fallback="tool")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        schema = tool.get("inputSchema") if isinstance(tool.get("inputSchema"), dict) else {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [r for r in (schema.get("required") or []) if isinstance(r, str)]
    req_set = set(required)
    order = [n for n in props if n in req_set]
    order += [n for n in required if n not in props and n not in order]
    order += [n for n in props if n not in req_set]
    used = set()
    params = []
    for name in order:
        py = _ident(name, used)
        used.add(py)
        pschema = props.get(name, {})
        is_req = name in req_set
        default = None
        if not is_req and isinstance(pschema, dict) and "default" in pschema:
            default = pschema["default"]
        params.append({"name": name, "py": py, "required": is_req, "default": default, "schema": pschema})

    glb = {"__builtins__": builtins}
    parts = []
    star = False
    for i, p in enumerate(params):
        if p["required"]:
            parts.append(p["py"])
        else:
            if not star:
                parts.append("*")
                star = True
            glb["__mcp_d%d__" % i] = p["default"]
            parts.append("%s=__mcp_d%d__" % (p["py"], i))
    values = "".join("%s, " % p["py"] for p in params)
    src = "async def %s(%s):\n    return await __mcp_invoke__((%s))\n" % (alias, ", ".join(parts), values)

    specs = [(p["name"], p["required"], p["default"]) for p in params]
    output_schema = tool.get("output_schema") or tool.get("outputSchema")
    tool_meta = {"name": tool_name, "output_schema": output_schema}

    async def invoke(vals):
        args = {}
        for (orig, is_req, default), v in zip(specs, vals):
            if not is_req and (v is None or v is default):
                continue
            args[orig] = v
        return await _call_loaded_tool(server_name, tool_meta, args)

    glb["__mcp_invoke__"] = invoke
    exec(compile(src, RUNTIME_FILENAME, "exec"), glb)
    func = glb[alias]
    func.__qualname__ = alias
    func.__module__ = "mcp.servers." + server_alias
    func.__doc__ = _tool_doc(server_name, tool_name, tool.get("description"), params, output_schema)
    func.__annotations__ = {p["py"]: _py_type(p["schema"]) for p in params}
    func.__mcp_tool__ = tool_name
    func._mcp_server_ = server_name
    if key is not None:
        _tool_cache[key] = func
    return func


def _server_alias(meta):
    alias = meta.get("alias")
    if isinstance(alias, str) and alias.isidentifier() and not keyword.iskeyword(alias):
        return alias
    return _ident(alias or meta.get("name"), fallback="server")


def _make_proxy(meta):
    name = str(meta.get("name"))
    alias = _server_alias(meta)
    tools = collections.OrderedDict()
    by_name = {}
    for tool in meta.get("tools") or []:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        func = _make_tool(name, alias, tool)
        if func.__name__.startswith("__") or func.__name__ in tools:
            continue
        tools[func.__name__] = func
        by_name[tool["name"]] = func
    desc = (meta.get("description") or "").strip()
    doc = "MCP server %r%s. Tools (async; `await mcp_%s.<tool>(...)`): %s." % (
        name, (": " + desc) if desc else "", alias, ", ".join(tools) or "none")
    body = {name_: staticmethod(f) for name_, f in tools.items()}
    body.update({
        "__doc__": doc,
        "__module__": "mcp.servers." + alias,
        "__slots__": (),
        "_mcp_server_": name,
        "_mcp_alias_": alias,
        "_mcp_tools_": tools,
        "_mcp_by_name_": by_name,
        "_mcp_meta_": meta,
    })
    cls = type("mcp_" + alias, (ServerProxy,), body)
    module = types.ModuleType("mcp.servers." + alias, doc)
    module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    module.__package__ = "mcp.servers"
    for tname, f in tools.items():
        setattr(module, tname, f)
    module.__all__ = list(tools)
    proxy = cls()
    module.server = proxy
    return proxy, module


def _lookup_loaded(server):
    if server in _state.loaded:
        return _state.loaded[server]
    for meta in _state.loaded.values():
        if meta.get("alias") == server or _server_alias(meta) == server:
            return meta
    return None


def _not_loaded_message(server):
    """Why `server` (a name or an alias) has no proxy in this call, and what to do: load it, or
    pick one of the servers that exist."""
    discovered = [d.get("name") for d in _state.discovered]
    name = next((d.get("name") for d in _state.discovered if server in (d.get("name"), d.get("alias"))), None)
    if name is not None:
        # Spelled as run_python's JSON argument (the host's message says the same), with the
        # server's real name even when its alias was typed.
        return (
            'MCP server %r is not loaded in this run_python call: pass "servers": [%s] to run_python '
            "to use its tools (its docs are available via runtime.query_tool_docs(%r))."
            % (name, json.dumps(name), name)
        )
    import difflib

    keys = {}
    for d in _state.discovered:
        keys[d.get("name")] = d.get("name")
        keys[d.get("alias")] = d.get("name")
    close = difflib.get_close_matches(str(server), [k for k in keys if isinstance(k, str)], n=1)
    guess = " Did you mean %r?" % keys[close[0]] if close else ""
    return "No MCP server %r is configured.%s Discovered servers: %s." % (
        server, guess, ", ".join(map(str, discovered)) or "none")


def _not_loaded_error(server):
    return McpError(_not_loaded_message(server))


class ServerNotLoadedError(KeyError):
    """`mcp_servers[name]` for a server not loaded in this call (a KeyError, as before), with a
    message saying how to load it or which servers exist."""

    def __str__(self):
        # KeyError's own str() is the repr of its key, quotes and escapes included.
        return str(self.args[0]) if self.args else ""


class _ServerMap(dict):
    """`mcp_servers`: the loaded proxies by name and alias; a missing key says why."""

    __slots__ = ()

    def __missing__(self, key):
        raise ServerNotLoadedError(_not_loaded_message(key))


def _explain_name_error(exc):
    """A NameError for `mcp_<alias>` gets the reason and the fix: the server exists and is loaded
    with "servers", or no such server is configured. Done where the error is reported, since
    name lookups in the user's namespace cannot be hooked; the type stays NameError."""
    if type(exc) is not NameError:
        return
    name = getattr(exc, "name", None)
    if name is None:
        m = re.match(r"name '([^']+)' is not defined", str(exc))
        name = m.group(1) if m else None
    if not isinstance(name, str) or not name.startswith("mcp_") or name == "mcp_servers":
        return
    exc.args = ("name %r is not defined. %s" % (name, _not_loaded_message(name[len("mcp_"):])),)
    try:
        # Python's own "Did you mean" would be computed from `name` and contradict the above.
        exc.name = None
    except AttributeError:
        pass


async def _call_loaded_tool(server_name, tool_meta, args):
    if server_name not in _state.loaded or _state.running is None:
        raise _not_loaded_error(server_name)
    result = await _rpc("call_tool", {"server": server_name, "tool": tool_meta["name"], "arguments": args})
    return _convert_result(result, tool_meta)


# --------------------------------------------------------------------------------------------
# The `mcp` package seen by user code


def _new_module(name, doc, package=False):
    mod = types.ModuleType(name, doc)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        mod.__path__ = []
        mod.__package__ = name
    else:
        mod.__package__ = name.rpartition(".")[0]
    return mod


_RUNTIME_DOC = """Helpers of the mcp-code-bridge sandbox.

discovered_servers(), await list_servers(), list_servers_sync(), describe_server(name),
list_loaded_server_metadata(), list_tools_sync(server),
await query_tool_docs(server, tool=None, detail="summary"|"full") / query_tool_docs_sync(...),
await search_tool_docs(query, limit=5) / search_tool_docs_sync(...), capability_summary(),
await call_tool(server, tool, arguments=None, raw=False),
export_notebook(path="/workspace/out/session.ipynb") (the session as a Jupyter notebook),
save_skill(func, description=None) (alias save_tool), list_skills(), delete_skill(name).
"""


def _install_mcp_package():
    for name in list(sys.modules):
        if name == "mcp" or name.startswith("mcp."):
            del sys.modules[name]
    pkg = _new_module("mcp", "MCP servers available inside the mcp-code-bridge sandbox.", True)
    rt = _new_module("mcp.runtime", _RUNTIME_DOC)
    for name in _RUNTIME_API:
        obj = globals()[name]
        try:
            obj.__module__ = "mcp.runtime"
        except (AttributeError, TypeError):
            pass
        setattr(rt, name, obj)
    rt.__all__ = [n for n in _RUNTIME_API if n not in _RUNTIME_EXTRA]
    servers = _new_module("mcp.servers", "One module per MCP server loaded for this call.", True)
    pkg.runtime = rt
    pkg.servers = servers
    pkg.ToolDenied = ToolDenied  # `from mcp import ToolDenied`, as well as runtime.ToolDenied
    sys.modules["mcp"] = pkg
    sys.modules["mcp.runtime"] = rt
    sys.modules["mcp.servers"] = servers
    return pkg


class _ImportHook:
    """Patches matplotlib.pyplot.show when pyplot is imported; explains missing mcp.servers.X."""

    def __init__(self):
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("mcp.servers.") and fullname.count(".") == 2:
            alias = fullname.rsplit(".", 1)[1]
            raise ModuleNotFoundError(str(_not_loaded_error(alias)), name=fullname)
        if fullname != "matplotlib.pyplot" or self.busy:
            return None
        self.busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            original = spec.loader.exec_module

            def exec_module(module):
                original(module)
                _patch_pyplot(module)

            spec.loader.exec_module = exec_module
            return spec
        except Exception:
            return None
        finally:
            self.busy = False


def _patch_pyplot(plt):
    show = getattr(plt, "show", None)
    if show is None or getattr(show, "_mcp_bridge", False):
        return

    def show(*args, **kwargs):
        """Display every open figure (as PNG) and close them (mcp-code-bridge)."""
        for num in list(plt.get_fignums()):
            try:
                display(plt.figure(num))
            except Exception as e:
                print("plt.show(): could not render figure %s: %s" % (num, e), file=sys.stderr)
        plt.close("all")

    show._mcp_bridge = True
    plt.show = show


def _install_servers(servers, discovered):
    """Make this exec's servers and discovery list current. The host leaves both out (None)
    when they equal the previous exec's: then only the proxies' global names are bound again
    (the code may have deleted or rebound them)."""
    if sys.modules.get("mcp") is None or getattr(sys.modules.get("mcp"), "runtime", None) is None:
        _install_mcp_package()
        servers = servers if servers is not None else [dict(m) for m in _state.loaded.values()]
        discovered = discovered if discovered is not None else [dict(d) for d in _state.discovered]
    if servers is None and discovered is None:
        _bind_globals()
        return
    disc = []
    for d in discovered if isinstance(discovered, list) else []:
        if isinstance(d, dict) and isinstance(d.get("name"), str):
            disc.append({"name": d["name"], "alias": d.get("alias") or d["name"],
                         "description": d.get("description") or ""})
    _state.discovered = tuple(disc)
    loaded = collections.OrderedDict()
    for meta in servers if isinstance(servers, list) else []:
        if isinstance(meta, dict) and isinstance(meta.get("name"), str):
            loaded[meta["name"]] = meta
    _state.loaded = loaded

    servers_pkg = sys.modules["mcp.servers"]
    for name in list(sys.modules):
        if name.startswith("mcp.servers."):
            del sys.modules[name]
            try:
                delattr(servers_pkg, name.rsplit(".", 1)[1])
            except AttributeError:
                pass
    proxies = collections.OrderedDict()
    for name, meta in loaded.items():
        cached = _server_cache.get(name)
        if cached is not None and cached[0] == meta:
            proxy, module = cached[1], cached[2]
        else:
            try:
                proxy, module = _make_proxy(meta)
            except Exception as e:
                _log("could not build the proxy of server %r: %r" % (name, e))
                continue
            _server_cache[name] = (meta, proxy, module)
        alias = type(proxy)._mcp_alias_
        proxies[name] = proxy
        sys.modules[module.__name__] = module
        setattr(servers_pkg, alias, module)
    _state.proxies = proxies
    _bind_globals()


def _bind_globals():
    """`mcp_<alias>` and `mcp_servers` in the user's namespace, for the current proxies; names
    this runtime set earlier and the code has not rebound are removed first."""
    proxies = _state.proxies
    by_key = _ServerMap()
    for name, proxy in proxies.items():
        by_key[name] = proxy
        by_key[type(proxy)._mcp_alias_] = proxy
    ns = _state.ns
    for gname, obj in list(_state.globals_set.items()):
        if ns.get(gname) is obj:
            del ns[gname]
    new = {}
    for proxy in proxies.values():
        new["mcp_" + type(proxy)._mcp_alias_] = proxy
    new["mcp_servers"] = by_key
    for gname, obj in new.items():
        ns[gname] = obj
    _state.globals_set = new


# --------------------------------------------------------------------------------------------
# mcp.runtime: the helper API


def discovered_servers():
    """Names of every MCP server the bridge discovered (loaded or not), as a tuple."""
    return tuple(d["name"] for d in _state.discovered)


async def list_servers():
    """Ask the bridge which servers are selectable in this call (the loaded ones)."""
    result = await _rpc("list_servers", {})
    return tuple(result) if isinstance(result, list) else result


def list_servers_sync():
    """Names of the servers loaded for this call (from the metadata sent with it)."""
    return tuple(_state.loaded)


def _public_tool(tool, full=True):
    out = {"name": tool.get("name"), "alias": tool.get("alias") or _ident(tool.get("name"), fallback="tool"),
           "description": tool.get("description") or ""}
    if tool.get("policy") in ("ask", "deny"):
        out["policy"] = tool["policy"]  # the user's policy asks before calling it, or refuses it
    if full:
        out["input_schema"] = copy.deepcopy(tool.get("input_schema") or {})
        if tool.get("output_schema"):
            out["output_schema"] = copy.deepcopy(tool.get("output_schema"))
    return out


def _public_server(meta):
    out = {
        "name": meta.get("name"),
        "alias": _server_alias(meta),
        "description": meta.get("description") or "",
        "cwd": meta.get("cwd"),
        "tools": [_public_tool(t) for t in meta.get("tools") or [] if isinstance(t, dict)],
    }
    catalog = meta.get("catalog")
    if isinstance(catalog, dict) and isinstance(catalog.get("updated_at"), (int, float)):
        # The host sends when the tool list was taken; the age is computed here, so the
        # metadata stays the same bytes from one call to the next.
        out["catalog_updated_at"] = catalog["updated_at"]
        out["catalog_age_seconds"] = max(0, int(time.time() - catalog["updated_at"]))
        out["catalog_source"] = catalog.get("source")
    return out


def describe_server(name):
    """Metadata of a server loaded for this call: name, alias, description, cwd, tools
    (each with name, alias, description, input_schema, and policy "ask" or "deny" when the
    user's policy asks before calling it or refuses it), and how old the tool list is:
    catalog_age_seconds, catalog_updated_at (epoch seconds), catalog_source ("catalog": read
    from the bridge's saved catalog; "live": listed from the running server)."""
    meta = _lookup_loaded(name)
    if meta is None:
        raise _not_loaded_error(name)
    return _public_server(meta)


def list_loaded_server_metadata():
    """Metadata of every server loaded for this call, as a tuple of dicts."""
    return tuple(_public_server(m) for m in _state.loaded.values())


def list_tools_sync(server):
    """[{name, alias, description}] of a server's tools (cached when loaded, else asks the bridge)."""
    meta = _lookup_loaded(server)
    if meta is not None:
        return [_public_tool(t, full=False) for t in meta.get("tools") or [] if isinstance(t, dict)]
    return _rpc_sync("list_tools", {"server": _canonical_server(server)})


def _canonical_server(server):
    """The server's name when `server` is a known name or alias, else `server` unchanged."""
    meta = _lookup_loaded(server)
    if meta is not None:
        return meta["name"]
    for d in _state.discovered:
        if server == d["name"]:
            return server
    for d in _state.discovered:
        if server == d["alias"]:
            return d["name"]
    return server


def _canonical_tool(server, tool):
    meta = _lookup_loaded(server)
    for t in (meta or {}).get("tools") or []:
        if isinstance(t, dict) and tool == t.get("name"):
            return tool
    for t in (meta or {}).get("tools") or []:
        if isinstance(t, dict) and tool == t.get("alias"):
            return t.get("name")
    return tool


def _docs_params(server, tool, detail):
    if detail not in ("summary", "full"):
        raise ValueError("detail must be 'summary' or 'full'")
    params = {"server": _canonical_server(server), "detail": detail}
    if tool is not None:
        params["tool"] = _canonical_tool(server, tool)
    return params


async def query_tool_docs(server, tool=None, detail="summary"):
    """Tool docs of a discovered server: [{server, serverAlias, tool, toolAlias, description}]
    plus inputSchema / outputSchema when detail="full". `tool` narrows to one tool."""
    return await _rpc("query_tool_docs", _docs_params(server, tool, detail))


def query_tool_docs_sync(server, tool=None, detail="summary"):
    """Blocking variant of query_tool_docs()."""
    return _rpc_sync("query_tool_docs", _docs_params(server, tool, detail))


def _search_params(query, limit):
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError("limit must be a positive integer")
    return {"query": str(query), "limit": limit}


class SearchResults(list):
    """The hits of a search, best first; `.skipped` lists the servers left out of it, each as
    {server, reason} (one that failed to start, or is still starting)."""

    skipped = ()


def _search_results(result):
    # The host answers {results, skipped}; a bare list is an answer without skipped servers.
    if isinstance(result, dict):
        hits = SearchResults(result.get("results") or [])
        hits.skipped = tuple(s for s in result.get("skipped") or () if isinstance(s, dict))
    else:
        hits = SearchResults(result or [])
    for s in hits.skipped:
        print("search_tool_docs: skipped server %r: %s" % (s.get("server"), s.get("reason")),
              file=sys.stderr)
    return hits


async def search_tool_docs(query, limit=5):
    """Fuzzy, ranked search over the tools of every discovered server:
    [{server, serverAlias, tool, toolAlias, description, score}], and over the saved skills
    (defined in this session's namespace): {skill, description, score}. Servers left out (failed
    or still starting) are printed to stderr and listed in the result's `.skipped`."""
    hits = _search_results(await _rpc("search_tool_docs", _search_params(query, limit)))
    return _with_skill_hits(hits, query, limit)


def search_tool_docs_sync(query, limit=5):
    """Blocking variant of search_tool_docs()."""
    hits = _search_results(_rpc_sync("search_tool_docs", _search_params(query, limit)))
    return _with_skill_hits(hits, query, limit)


# --------------------------------------------------------------------------------------------
# Skills: functions saved on the host (runtime.save_skill) and defined in every new session.
# The host keeps them (`<state_dir>/skills/`, bounded in size and number); this side sends a
# function's source and loads the saved ones at the first exec of the interpreter.

_skills = {}  # name -> description, of the skills defined in this interpreter
_skills_state = {"loaded": False}
_SKILL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SKILL_NOTICE_CAP = 4000


def _skill_source(func):
    if isinstance(func, (staticmethod, classmethod)):
        func = func.__func__
    if not (inspect.isfunction(func) or inspect.iscoroutinefunction(func)):
        raise TypeError("save_skill() takes a function defined with def; got %s" % type(func).__name__)
    name = func.__name__
    if name == "<lambda>":
        raise ValueError("a lambda has no name to save it under: define it with `def NAME(...):` "
                         "in a cell and save that")
    if not _SKILL_NAME.match(name) or keyword.iskeyword(name):
        raise ValueError("%r cannot be a skill's name: use ASCII letters, digits and _" % name)
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError) as e:
        raise ValueError("the source of %s() is not available (%s): define it with def in a "
                         "run_python cell and save it from there" % (name, e)) from None
    source = textwrap.dedent(source)
    try:
        tree = ast.parse(source, "<skill %s>" % name)
    except SyntaxError as e:
        raise ValueError("the source of %s() does not compile on its own: %s" % (name, e)) from None
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body):
        raise ValueError("the source of %s() does not define it at the top level (is it a lambda "
                         "assigned to a name?): define it with `def %s(...):`" % (name, name))
    try:
        _skill_definition(name, source, "<skill %s>" % name)
    except ValueError as e:
        raise ValueError("%s() cannot be a skill: %s. A skill is one function defined with def, with "
                         "no decorator and only literal default values; it imports what it needs "
                         "inside its body" % (name, str(e).replace("; it is not run", ""))) from None
    return name, source


def save_skill(func, description=None):
    """Save `func` (a function defined with def) for every later session: its source and its
    description (default: its docstring) are kept by the bridge, and each new session has it
    defined under its name. Saving a name again replaces it. Size and number are bounded by the
    bridge's configuration (skills.max_size, skills.max_count); a refusal raises McpError.
    Returns {name, replaced, count}. The function should import what it uses inside its body."""
    name, source = _skill_source(func)
    if description is None:
        description = inspect.getdoc(func) or ""
    result = _rpc_sync("save_skill", {"name": name, "source": source, "description": str(description)})
    _skills[name] = str(description)
    return result


save_tool = save_skill  # the name the Python original gives it


def list_skills():
    """The saved skills: [{name, description, saved_at}]; skills that cannot be loaded are
    printed to stderr."""
    result = _rpc_sync("list_skills", {}) or {}
    for b in result.get("broken") or ():
        print("list_skills: skill %r is broken: %s" % (b.get("name"), b.get("reason")), file=sys.stderr)
    return [dict(s) for s in result.get("skills") or () if isinstance(s, dict)]


def delete_skill(name):
    """Remove the saved skill `name` for later sessions (this session keeps its definition)."""
    result = _rpc_sync("delete_skill", {"name": str(name)})
    _skills.pop(str(name), None)
    return result


# A skill is one function, and defining it runs nothing else (the host checks the same before it
# stores a skill and before it sends one to be loaded): no statement besides the `def`, no
# decorator (a call), only literal default values, and annotations compiled as strings
# (`from __future__ import annotations`), so they are never evaluated at definition.
_SKILL_DEFAULT_DEPTH = 16


def _skill_literal(node, depth=0):
    if depth > _SKILL_DEFAULT_DEPTH:
        return False
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return (isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(node.operand, ast.Constant)
                and isinstance(node.operand.value, (int, float, complex)))
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_skill_literal(e, depth + 1) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _skill_literal(k, depth + 1) and _skill_literal(v, depth + 1)
                   for k, v in zip(node.keys, node.values))
    return False


def _skill_definition(name, source, filename):
    """The code object that defines skill `name` and does nothing else; ValueError saying why
    when `source` is more than that one function definition."""
    tree = ast.parse(source, filename)
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    if len(tree.body) != 1 or not isinstance(tree.body[0], defs):
        raise ValueError("its source is not exactly one function definition (%d top-level "
                         "statements); it is not run" % len(tree.body))
    func = tree.body[0]
    if func.name != name:
        raise ValueError("its source defines %s, not %s" % (func.name, name))
    if func.decorator_list:
        raise ValueError("it has a decorator, which would run when it is defined; it is not run")
    defaults = list(func.args.defaults) + [d for d in func.args.kw_defaults if d is not None]
    if not all(_skill_literal(d) for d in defaults):
        raise ValueError("a default value is not a literal and would run when it is defined; "
                         "it is not run")
    module = ast.Module(body=[func], type_ignores=[])
    return compile(module, filename, "exec", flags=__future__.annotations.compiler_flag,
                   dont_inherit=True)


def _define_skill(skill):
    """Define one saved skill in the user's namespace; returns why it could not be, or None."""
    name, source = skill.get("name"), skill.get("source")
    if not isinstance(name, str) or not isinstance(source, str):
        return "its record is malformed"
    filename = "<skill %s>" % name
    try:
        code = _skill_definition(name, source, filename)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(code, _state.ns)
    except Exception as e:
        return "%s: %s" % (type(e).__name__, e)
    if not callable(_state.ns.get(name)):
        return "its source does not define %s" % name
    _skills[name] = skill.get("description") or ""
    return None


def _load_skills():
    """At the first exec of this interpreter (a new session, pooled or not): ask the host for
    the saved skills and define them. A skill that no longer compiles or runs is named on the
    call's stderr; the call goes on."""
    if _skills_state["loaded"]:
        return
    _skills_state["loaded"] = True
    try:
        reply = _rpc_sync("load_skills", {})
    except McpError as e:  # a host without skills (a one-shot probe): nothing to define
        _log("skills not loaded: %s" % e, "debug")
        return
    if not isinstance(reply, dict):
        return
    notices = []
    for skill in reply.get("skills") or ():
        if isinstance(skill, dict):
            why = _define_skill(skill)
            if why is not None:
                notices.append("%s: %s" % (skill.get("name"), why))
    for b in reply.get("broken") or ():
        if isinstance(b, dict):
            notices.append("%s: %s" % (b.get("name"), b.get("reason")))
    if notices:
        text = "[skills] not defined in this session (the call goes on): " + "; ".join(notices)
        print(_cap_middle(text, _SKILL_NOTICE_CAP), file=sys.stderr)


def _skill_score(query, name, description):
    tokens = [t for t in re.split(r"[^0-9a-z]+", str(query).lower()) if t]
    if not tokens:
        return 0.0
    text = "%s %s" % (name.lower().replace("_", " "), description.lower())
    return sum(1 for t in tokens if t in text) / len(tokens)


def _with_skill_hits(hits, query, limit):
    """The servers' hits and the skills' matches, best first, at most `limit`."""
    extra = []
    for name, description in _skills.items():
        score = _skill_score(query, name, description)
        if score > 0:
            first = description.strip().splitlines()[0] if description.strip() else ""
            extra.append({"skill": name, "description": first, "score": round(score, 3)})
    if not extra:
        return hits
    merged = SearchResults(sorted(list(hits) + extra, key=lambda h: -float(h.get("score") or 0))[:limit])
    merged.skipped = hits.skipped
    return merged


def _resolve_call(server, tool, arguments):
    meta = _lookup_loaded(server)
    if meta is None:
        raise _not_loaded_error(server)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, collections.abc.Mapping):
        raise TypeError("arguments must be a dict of the tool's parameters")
    tool_name = _canonical_tool(server, tool)
    tool_meta = None
    for t in meta.get("tools") or []:
        if isinstance(t, dict) and t.get("name") == tool_name:
            tool_meta = t
            break
    params = {"server": meta["name"], "tool": tool_name, "arguments": dict(arguments)}
    return params, tool_meta


async def call_tool(server, tool, arguments=None, raw=False):
    """Call a tool of a loaded server by name or alias. Returns the converted value
    (raw=True: the whole CallToolResult dict)."""
    params, tool_meta = _resolve_call(server, tool, arguments)
    result = await _rpc("call_tool", params)
    return result if raw else _convert_result(result, tool_meta)


def call_tool_sync(server, tool, arguments=None, raw=False):
    """Blocking variant of call_tool()."""
    params, tool_meta = _resolve_call(server, tool, arguments)
    result = _rpc_sync("call_tool", params)
    return result if raw else _convert_result(result, tool_meta)


def capability_summary():
    """A one-paragraph overview of what this sandbox can do."""
    disc = discovered_servers()
    loaded = ["%s (mcp_%s)" % (n, _server_alias(m)) for n, m in _state.loaded.items()]
    return (
        "This is a persistent, network-less Python %s sandbox (variables, imports and functions "
        "persist between run_python calls; top-level `await` works). %d MCP server(s) discovered: %s. "
        "Loaded for this call: %s. Each loaded server is a `mcp_<alias>` object (also "
        "`mcp_servers[name]` and `from mcp.servers.<alias> import *`) whose tools are async "
        "functions with real signatures and docstrings (`await mcp_x.tool(arg=...)`, "
        "`help(mcp_x.tool)`). Discover with `from mcp import runtime`: runtime.discovered_servers(), "
        "await runtime.search_tool_docs('what you need'), await runtime.query_tool_docs(server, "
        "detail='full'), runtime.describe_server(name); call with await runtime.call_tool(server, "
        "tool, {...}); load more servers by passing servers=[...] to run_python. Tool results come "
        "back as Python values (structured content or parsed JSON/text, the whole result in "
        "`.mcp_result`); display(obj) shows images and matplotlib figures."
        % (platform.python_version(), len(disc), ", ".join(disc) or "none",
           ", ".join(loaded) or "none (pass servers=[...] to run_python)")
    )


# --------------------------------------------------------------------------------------------
# display()

_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def _sniff(data):
    for magic, mime in _IMAGE_MAGIC:
        if data[: len(magic)] == magic:
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _rich(obj):
    """(mime, bytes) for something that renders as an image, else None."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        data = bytes(obj)
        mime = _sniff(data)
        return (mime, data) if mime else None
    if isinstance(obj, Image):
        return obj.mime, obj.data
    mod = type(obj).__module__ or ""
    if mod.startswith("PIL.") and hasattr(obj, "save"):
        buf = io.BytesIO()
        img = obj
        if getattr(img, "mode", "RGB") not in ("RGB", "RGBA", "L", "LA", "P", "1", "I", "I;16"):
            img = img.convert("RGBA")
        img.save(buf, format="PNG")
        return "image/png", buf.getvalue()
    if mod.startswith("matplotlib"):
        fig = obj if hasattr(obj, "savefig") else getattr(obj, "figure", None)
        if fig is not None and hasattr(fig, "savefig"):
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            return "image/png", buf.getvalue()
    for attr, mime in (("_repr_png_", "image/png"), ("_repr_jpeg_", "image/jpeg")):
        try:
            method = getattr(obj, attr, None)
        except Exception:
            method = None
        if not callable(method):
            continue
        data = method()
        if isinstance(data, tuple) and data:
            data = data[0]
        if isinstance(data, str):
            data = _b64decode(data)
        if isinstance(data, (bytes, bytearray)) and data:
            return mime, bytes(data)
    return None


def _auto_display(value):
    """Whether the last expression's value is also shown as an image."""
    if isinstance(value, Image):
        return True
    mod = type(value).__module__ or ""
    return (mod.startswith("PIL.") and hasattr(value, "save")) or (
        mod.startswith("matplotlib") and hasattr(value, "savefig")
    )


def display(*objs):
    """Show objects to the user: images (PNG/JPEG bytes, PIL images, matplotlib figures,
    objects with _repr_png_) as images, anything else as text."""
    for obj in objs:
        ex = _state.running
        if ex is None:
            return None
        try:
            rich = _rich(obj)
        except Exception as e:
            print("display(): could not render %s: %s" % (type(obj).__name__, e), file=sys.stderr)
            rich = None
        if rich is not None:
            mime, data = rich
            if len(data) > IMAGE_CAP:
                frame = {"type": "display", "id": ex.id, "mime": "text/plain",
                         "data": "[image %s of %d bytes not shown: larger than %d bytes]" % (mime, len(data), IMAGE_CAP)}
            else:
                frame = {"type": "display", "id": ex.id, "mime": mime,
                         "data": base64.b64encode(data).decode("ascii")}
        else:
            text = obj if isinstance(obj, str) else _repr_value(obj, TEXT_DISPLAY_CAP)
            if len(text) > TEXT_DISPLAY_CAP:
                text = text[:TEXT_DISPLAY_CAP] + "\u2026 [%d more characters]" % (len(text) - TEXT_DISPLAY_CAP)
            frame = {"type": "display", "id": ex.id, "mime": "text/plain", "data": text}
        _flush_std()
        if threading.get_ident() == _state.main_ident:
            _drain()  # what was printed before display() arrives before it
        _send(frame)
    return None


# --------------------------------------------------------------------------------------------
# The session as a notebook: every exec is recorded as a cell (its code, and the output,
# display, value and error frames exactly as sent to the host, so what the model saw is what
# the notebook shows); export_notebook() writes them as nbformat 4.5 JSON. The record lives in
# this interpreter, so `reset` (a new one) starts an empty record.

NOTEBOOK_MAX_CELLS = 500
NOTEBOOK_MAX_BYTES = 32 * 1024 * 1024  # code + output text + base64 images held in the record
NOTEBOOK_EXPORT_CAP = 48 * 1024 * 1024  # the JSON written, framing and escapes included


class NotebookTooLarge(ValueError):
    """export_notebook() would write more than NOTEBOOK_EXPORT_CAP bytes."""


class _Cell:
    __slots__ = ("number", "source", "outputs", "size", "omitted", "exec_id")

    def __init__(self, number, exec_id, source):
        self.number = number
        self.exec_id = exec_id
        self.source = source
        self.outputs = []
        self.size = len(source)
        self.omitted = 0  # outputs left out: this cell alone reached NOTEBOOK_MAX_BYTES


class _NotebookRecord:
    """The session's cells, oldest first, bounded in number and bytes (oldest dropped)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.cells = collections.deque()
        self.size = 0
        self.count = 0  # execution_count of the last cell begun
        self.dropped = 0
        self.current = None

    def begin(self, exec_id, code):
        with self.lock:
            self.count += 1
            if len(code) > NOTEBOOK_MAX_BYTES // 2:
                code = code[: NOTEBOOK_MAX_BYTES // 2] + "\n# \u2026 [%d more characters of this cell not recorded]\n" % (
                    len(code) - NOTEBOOK_MAX_BYTES // 2)
            cell = _Cell(self.count, exec_id, code)
            self.cells.append(cell)
            self.size += cell.size
            self.current = cell
            self._trim()

    def _trim(self):
        while len(self.cells) > 1 and (len(self.cells) > NOTEBOOK_MAX_CELLS or self.size > NOTEBOOK_MAX_BYTES):
            old = self.cells.popleft()
            self.size -= old.size
            self.dropped += 1

    def _add(self, cell, output, size):
        if cell.size + size > NOTEBOOK_MAX_BYTES:
            cell.omitted += 1
            return
        outs = cell.outputs
        if (output.get("output_type") == "stream" and outs and outs[-1].get("output_type") == "stream"
                and outs[-1]["name"] == output["name"]):
            outs[-1]["text"].append(output["text"])  # one stream output per run of a stream
        else:
            if output.get("output_type") == "stream":
                output["text"] = [output["text"]]
            outs.append(output)
        cell.size += size
        self.size += size
        self._trim()

    def frame(self, obj):
        """An output or display frame on its way to the host (any thread)."""
        cell = self.current
        if cell is None or obj.get("id") != cell.exec_id:
            return
        kind = obj.get("type")
        data = obj.get("data")
        if not isinstance(data, str) or not data:
            return
        if kind == "output":
            output = {"output_type": "stream", "name": obj.get("stream", "stdout"), "text": data}
        elif kind == "display":
            mime = obj.get("mime") or "text/plain"
            bundle = {mime: data}
            if mime != "text/plain":
                bundle["text/plain"] = "<%s image>" % mime
            output = {"output_type": "display_data", "data": bundle, "metadata": {}}
        else:
            return
        with self.lock:
            if cell is self.current:
                self._add(cell, output, len(data))

    def finish(self, exec_id, status, value, error):
        with self.lock:
            cell = self.current
            if cell is None or cell.exec_id != exec_id:
                return
            self.current = None
            if value is not None:
                self._add(cell, {"output_type": "execute_result", "execution_count": cell.number,
                                 "data": {"text/plain": value}, "metadata": {}}, len(value))
            if error is not None or status == "interrupted":
                error = error or {"type": "KeyboardInterrupt", "message": "", "traceback": ""}
                tb = error.get("traceback") or ""
                self._add(cell, {"output_type": "error", "ename": str(error.get("type", "")),
                                 "evalue": str(error.get("message", "")),
                                 "traceback": tb.splitlines() or [str(error.get("type", ""))]}, len(tb))

    def notebook(self):
        """The record as an nbformat 4.5 notebook (a dict)."""
        cells = []
        with self.lock:
            if self.dropped:
                cells.append({
                    "cell_type": "markdown", "id": "dropped", "metadata": {},
                    "source": "*%d earlier cell(s) of this session were dropped: the record keeps "
                              "at most %d cells and %d MiB.*" % (self.dropped, NOTEBOOK_MAX_CELLS,
                                                                  NOTEBOOK_MAX_BYTES >> 20),
                })
            for c in self.cells:
                outputs = []
                for o in c.outputs:
                    if o["output_type"] == "stream":
                        o = dict(o, text="".join(o["text"]))
                    outputs.append(o)
                if c.omitted:
                    outputs.append({"output_type": "stream", "name": "stderr",
                                    "text": "[%d output(s) of this cell not recorded: the record keeps at most "
                                            "%d MiB]\n" % (c.omitted, NOTEBOOK_MAX_BYTES >> 20)})
                cells.append({
                    "cell_type": "code", "id": "cell-%d" % c.number, "metadata": {},
                    "execution_count": c.number,
                    "source": c.source, "outputs": outputs,
                })
        return {
            "nbformat": 4, "nbformat_minor": 5,
            "metadata": {
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                "language_info": {"name": "python", "version": platform.python_version()},
            },
            "cells": cells,
        }


_notebook = _NotebookRecord()


def export_notebook(path="/workspace/out/session.ipynb"):
    """Write this session's cells (code, printed output, last values, displayed images, errors)
    as a Jupyter notebook (nbformat 4.5) and return the path written. The cell calling this is
    included with what it has printed so far. The record keeps the last 500 cells / 32 MiB;
    NotebookTooLarge if the file would exceed 48 MiB; OSError if the path is not writable."""
    path = os.path.abspath(os.fspath(path))
    if threading.get_ident() == _state.main_ident and _state.running is not None:
        _flush_std()
        _drain()  # what this cell printed so far is in the record
    data = json.dumps(_notebook.notebook(), ensure_ascii=False, indent=1)
    data = data.encode("utf-8", "replace") + b"\n"
    if len(data) > NOTEBOOK_EXPORT_CAP:
        raise NotebookTooLarge(
            "the notebook would be %d bytes, more than the %d MiB export_notebook() writes; "
            "clear large outputs (images, long prints) by restarting the session with reset, or "
            "save the results you need as files" % (len(data), NOTEBOOK_EXPORT_CAP >> 20))
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


# --------------------------------------------------------------------------------------------
# Executing cells

_big_repr = reprlib.Repr()
for _attr, _val in (("maxlevel", 8), ("maxtuple", 200), ("maxlist", 200), ("maxarray", 200),
                    ("maxdict", 100), ("maxset", 100), ("maxfrozenset", 100), ("maxdeque", 100),
                    ("maxstring", VALUE_CAP), ("maxlong", 2000), ("maxother", 2000)):
    setattr(_big_repr, _attr, _val)


def _repr_value(value, cap=VALUE_CAP):
    try:
        mod = type(value).__module__ or ""
        pd = sys.modules.get("pandas")
        if pd is not None and mod.startswith("pandas") and hasattr(value, "to_string"):
            with pd.option_context("display.max_rows", 60, "display.max_columns", 20,
                                   "display.width", 200, "display.max_colwidth", 100):
                text = repr(value)
        elif isinstance(value, (list, tuple, dict, set, frozenset, collections.deque)) and len(value) > 1000:
            text = _big_repr.repr(value)
        elif isinstance(value, (str, bytes, bytearray)) and len(value) > cap:
            text = repr(value[:cap])
        else:
            text = repr(value)
    except Exception as e:
        text = "<repr of %s failed: %s: %s>" % (type(value).__name__, type(e).__name__, e)
    if not isinstance(text, str):
        text = str(text)
    if len(text) > cap:
        text = text[:cap] + "\u2026 [%d more characters]" % (len(text) - cap)
    return text


def _clean_traceback(tb):
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    start = None
    for i, t in enumerate(frames):
        if t.tb_frame.f_code.co_filename.startswith(CELL_PREFIX):
            start = i
            break
    if start is None:
        return None
    keep = [t for t in frames[start:] if t.tb_frame.f_code.co_filename != RUNTIME_FILENAME]
    new = None
    for t in reversed(keep):
        new = types.TracebackType(new, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return new


def _clean_exception(exc, seen=None):
    if seen is None:
        seen = set()
    if exc is None or id(exc) in seen:
        return
    seen.add(id(exc))
    try:
        exc.__traceback__ = _clean_traceback(exc.__traceback__)
    except Exception:
        pass
    _clean_exception(exc.__cause__, seen)
    _clean_exception(exc.__context__, seen)
    for sub in getattr(exc, "exceptions", None) or ():
        if isinstance(sub, BaseException):
            _clean_exception(sub, seen)


def _cap_middle(text, cap):
    if len(text) <= cap:
        return text
    half = cap // 2
    return text[:half] + "\n\u2026 [%d characters omitted] \u2026\n" % (len(text) - cap) + text[-half:]


def _error_info(exc):
    _clean_exception(exc)
    try:
        _explain_name_error(exc)
    except Exception:
        pass
    try:
        tb_text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        tb_text = "%s\n" % type(exc).__name__
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable %s>" % type(exc).__name__
    name = type(exc).__qualname__
    return {"type": name, "message": _cap_middle(message, MESSAGE_CAP), "traceback": _cap_middle(tb_text, TRACEBACK_CAP)}


def _get_loop():
    loop = _state.loop
    if loop is None or loop.is_closed():
        loop = _state.loop = asyncio.new_event_loop()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_event_loop(loop)
    return loop


def _retrieve(task):
    if task.done() and not task.cancelled():
        try:
            task.exception()
        except BaseException:
            pass


def _run_coro(ex, coro):
    loop = _get_loop()
    task = loop.create_task(coro)
    ex.task = task
    try:
        return loop.run_until_complete(task)
    except BaseException:
        _retrieve(task)
        raise
    finally:
        ex.task = None
        if not task.done():
            # Interrupted from another task: unwind the cell's task too.
            task.cancel()
            try:
                loop.run_until_complete(asyncio.wait([task], timeout=1.0))
            except BaseException:
                pass
            _retrieve(task)


def _run_code(ex, code):
    value = eval(code, _state.ns)
    if code.co_flags & inspect.CO_COROUTINE:
        return _run_coro(ex, value)
    return value


def _execute(ex, code):
    """Run one cell. Returns (status, value repr or None, error dict or None)."""
    filename = "%s%d>" % (CELL_PREFIX, ex.id)
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST | TLA_FLAG, dont_inherit=True)
        expr_code = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body.pop()
            expr_code = compile(ast.Expression(body=last.value), filename, "eval", TLA_FLAG, dont_inherit=True)
        body_code = compile(tree, filename, "exec", TLA_FLAG, dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as e:
        e.__traceback__ = None
        return "error", None, _error_info(e)
    value = None
    try:
        ex.in_user = True
        if ex.interrupt_requested:
            ex.delivered = True
            raise KeyboardInterrupt
        _run_code(ex, body_code)
        if expr_code is not None:
            value = _run_code(ex, expr_code)
        ex.in_user = False
    except KeyboardInterrupt as e:
        ex.in_user = False
        return "interrupted", None, _error_info(e)
    except asyncio.CancelledError as e:
        ex.in_user = False
        if ex.interrupted:
            # The interrupt reached the code as the cancellation of what it awaited: say what
            # happened in the traceback's last line too.
            tb = _error_info(e)["traceback"].rstrip("\n").splitlines()
            if tb and "CancelledError" in tb[-1]:
                tb[-1] = "KeyboardInterrupt"
            return "interrupted", None, {"type": "KeyboardInterrupt", "message": "", "traceback": "\n".join(tb) + "\n"}
        return "error", None, _error_info(e)
    except BaseException as e:  # SystemExit included: the session survives it
        ex.in_user = False
        return "error", None, _error_info(e)
    finally:
        ex.in_user = False
    if value is None:
        return "ok", None, None
    _state.ns["_"] = value
    if _auto_display(value):
        try:
            display(value)
        except Exception:
            pass
    text = _repr_value(value)
    if inspect.iscoroutine(value):
        text += "  # a coroutine: use `await` to run it"
    return "ok", text, None


def _repair_process_state():
    """Undo damage earlier cells may have done to the std fds / streams / helpers."""
    for fd, (private, ident) in _state.fd_targets.items():
        try:
            st = os.fstat(fd)
            ok = (st.st_dev, st.st_ino) == ident
        except OSError:
            ok = False
        if not ok:
            try:
                os.dup2(private, fd)
            except OSError:
                pass
    stdin, stdout, stderr = _state.std_objects
    if sys.stdin is None or getattr(sys.stdin, "closed", False):
        sys.stdin = stdin if not stdin.closed else _open_std(0)
    if sys.stdout is None or getattr(sys.stdout, "closed", False):
        sys.stdout = stdout if not stdout.closed else _open_std(1)
    if sys.stderr is None or getattr(sys.stderr, "closed", False):
        sys.stderr = stderr if not stderr.closed else _open_std(2)
    builtins.display = display
    if "matplotlib.pyplot" in sys.modules:
        try:
            _patch_pyplot(sys.modules["matplotlib.pyplot"])
        except Exception:
            pass


def _run_exec(msg):
    eid = msg["id"]
    cap = msg.get("output_cap")
    if not _is_int(cap):
        cap = DEFAULT_OUTPUT_CAP
    ex = _Exec(eid, cap)
    _router.begin(eid, cap)
    _state.sig_pending = False  # a SIGINT noted during an earlier exec is not this one's
    _state.running = ex  # from here on an interrupt frame for eid reaches ex ...
    _state.queued.discard(eid)
    if eid in _state.cancelled:  # ... and one that came while it was queued is not lost
        _state.cancelled.discard(eid)
        ex.interrupt_requested = True
    status, value, error = "error", None, None
    try:
        if ex.interrupt_requested:
            status = "interrupted"
        else:
            try:
                _repair_process_state()
                _install_servers(msg.get("servers"), msg.get("discovered"))
            except Exception as e:
                _log("preparing exec %s: %r" % (eid, e))
            if msg.get("skills"):
                try:
                    _load_skills()
                except Exception as e:
                    _log("loading skills at exec %s: %r" % (eid, e))
            _notebook.begin(eid, msg["code"])
            status, value, error = _execute(ex, msg["code"])
    except KeyboardInterrupt:
        status, value, error = "interrupted", None, None
    except BaseException as e:
        status, value, error = "error", None, {"type": type(e).__name__, "message": str(e), "traceback": ""}
    finally:
        ex.in_user = False
        ex.done = True
    if ex.kicks:
        _log("exec %s: the interrupt was signalled %d more time(s) before the code saw it" % (eid, ex.kicks), "debug")
    _flush_std()
    _drain()
    truncated = _router.end()
    _notebook.finish(eid, status, value, error)
    _state.running = None
    result = {"type": "result", "id": eid, "status": status}
    if value is not None:
        result["value"] = value
    if error is not None:
        result["error"] = error
    if truncated:
        result["truncated"] = truncated
    stamp = _out_stamp()
    if stamp is not None:
        result["out"] = stamp
    _send(result)


OUT_DIR = "/workspace/out"
_OUT_STAMP_ENTRIES = 20000  # the host reads at most as many entries of one copy


def _out_stamp(root=OUT_DIR):
    """A digest of what `root` holds (each entry's path, mode, size, mtime, ctime and inode; no
    link followed), "empty" when it is missing or empty, None when it cannot tell (too many
    entries, an error): the host copies the directory out only when this changed, so a call
    that writes no file costs no copy. ctime is in it because code cannot set it back."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return "empty"
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    h = hashlib.blake2b(digest_size=16)
    n = 0
    stack = [root]
    try:
        while stack:
            with os.scandir(stack.pop()) as entries:
                for e in entries:
                    n += 1
                    if n > _OUT_STAMP_ENTRIES:
                        return None
                    st = e.stat(follow_symlinks=False)
                    h.update(b"%s\0%d %d %d %d %d\n" % (os.fsencode(e.path), st.st_mode, st.st_size,
                                                        st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(e.path)
    except OSError:
        return None
    return "empty" if n == 0 else h.hexdigest()


# --------------------------------------------------------------------------------------------
# Start-up


def _open_std(fd):
    if fd == 0:
        return io.TextIOWrapper(io.FileIO(0, "rb", closefd=False), encoding="utf-8", errors="replace")
    return io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(fd, "wb", closefd=False)),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )


def _ident_of(fd):
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _setup_fds():
    # Private copies of the real stdin/stdout: the frame channel (os.dup: close-on-exec).
    _state.frame_out = os.dup(1)
    _state.frame_in = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    os.dup2(devnull, 0)
    _state.fd_targets[0] = (devnull, _ident_of(devnull))
    for fd, stream in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()  # both ends close-on-exec; fd 1/2 below are inheritable copies
        try:
            import fcntl

            fcntl.fcntl(r, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except Exception:
            pass
        os.dup2(w, fd)
        _state.fd_targets[fd] = (w, _ident_of(w))
        _state.readers.append(_PipeReader(stream, r, w))
    stdin, stdout, stderr = _open_std(0), _open_std(1), _open_std(2)
    _state.std_objects = (stdin, stdout, stderr)
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = stdin, stdout, stderr


def _after_fork_in_child():
    _state.forked = True
    for fd in (_state.frame_out, _state.frame_in):
        try:
            os.close(fd)
        except Exception:
            pass
    for r in _state.readers:
        try:
            os.close(r.rfd)
        except Exception:
            pass
    _state.frame_out = _state.frame_in = None


def _setup_env():
    os.environ["MPLBACKEND"] = "Agg"
    cfg = os.environ.get("MPLCONFIGDIR")
    usable = False
    if cfg:
        try:
            os.makedirs(cfg, exist_ok=True)
            usable = os.access(cfg, os.W_OK)
        except OSError:
            usable = False
    if not usable:
        try:
            os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="matplotlib-")
        except Exception:
            pass


def _setup_namespace():
    main_mod = types.ModuleType("__main__")
    main_mod.__builtins__ = builtins
    sys.modules["__main__"] = main_mod
    _state.main_module = main_mod
    _state.ns = main_mod.__dict__
    _state.ns["mcp_servers"] = _ServerMap()
    _state.globals_set = {"mcp_servers": _state.ns["mcp_servers"]}


# ---------------------------------------------------------------------------- seccomp
# The engine's seccomp profile is the first line; podman's default one still allows a few calls
# that give the code more kernel than it needs (SECURITY.md, "Open gaps"). This filter is stacked
# on top of it before any user code runs: filters can only be added under no_new_privs, never
# removed, and are inherited by every thread and process the code starts.

_SECCOMP = {
    # machine: (AUDIT_ARCH_*, syscall numbers)
    "x86_64": (0xC000003E, {"clone": 56, "clone3": 435, "unshare": 272, "setns": 308,
                            "ptrace": 101, "keyctl": 250, "add_key": 248, "request_key": 249,
                            "bpf": 321, "perf_event_open": 298, "userfaultfd": 323}),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435, "unshare": 97, "setns": 268,
                             "ptrace": 117, "keyctl": 219, "add_key": 217, "request_key": 218,
                             "bpf": 280, "perf_event_open": 241, "userfaultfd": 282}),
}
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000


def _seccomp_program(arch, nrs):
    """A classic-BPF seccomp program refusing the calls above with EPERM; clone only when it asks
    for a new namespace; clone3 with ENOSYS, so that libc falls back to clone (clone3's flags live
    in memory a filter cannot read)."""
    LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    denied = [nrs[n] for n in ("unshare", "setns", "ptrace", "keyctl", "add_key", "request_key",
                               "bpf", "perf_event_open", "userfaultfd")]
    prog = []  # (code, jt, jf, k); jumps are filled with labels first
    prog.append((LD_ABS, 0, 0, 4))                      # arch
    prog.append((JEQ, 1, 0, arch))                      # ours: go on; else refuse
    prog.append((RET, 0, 0, EPERM))
    prog.append((LD_ABS, 0, 0, 0))                      # nr
    prog.append((JGE, "deny", 0, 0x40000000))           # x32 ABI numbers
    for nr in denied:
        prog.append((JEQ, "deny", 0, nr))
    prog.append((JEQ, "enosys", 0, nrs["clone3"]))
    prog.append((JEQ, 0, "allow", nrs["clone"]))
    prog.append((LD_ABS, 0, 0, 16))                     # clone flags (args[0], low half)
    prog.append((JSET, "deny", "allow", _CLONE_NAMESPACES))
    labels = {}
    labels["allow"] = len(prog); prog.append((RET, 0, 0, ALLOW))
    labels["deny"] = len(prog); prog.append((RET, 0, 0, EPERM))
    labels["enosys"] = len(prog); prog.append((RET, 0, 0, ENOSYS))
    out = []
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        out.append((code, jt, jf, k))
    return out


def _install_seccomp():
    """Stack the filter on the calling (only) thread. Returns None, or why it was not installed."""
    import ctypes
    import struct

    entry = _SECCOMP.get(platform.machine())
    if entry is None:
        return "no syscall table for %s" % platform.machine()
    prog = _seccomp_program(*entry)
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


def _preload():
    """Import the modules MCP_BRIDGE_PRELOAD names (comma-separated) before saying ready: the
    bridge sets it on pooled sandboxes, started before any call waits, so that `import pandas`
    in a session's first call finds it in sys.modules. Nothing is bound in the session's
    namespace and the variable is removed; a module that fails is logged and skipped. Output
    written meanwhile belongs to no exec and is dropped (_Router.feed), all of it before
    `ready`."""
    names = os.environ.pop("MCP_BRIDGE_PRELOAD", "")
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit or KeyboardInterrupt from a module included
            _log("preload: could not import %s: %s: %s" % (name, type(e).__name__, e))
    if names:
        # What the imports printed is still in the pipes: let the readers drop it now, before
        # `ready`, or the first exec would find it there and take it for its own.
        _flush_std()
        _drain()


def main():
    _state.main_ident = threading.get_ident()
    # First, while this is the only thread: everything started later inherits the filter.
    try:
        why = _install_seccomp()
    except Exception as e:  # never fatal: the engine's own profile still applies
        why = repr(e)
    if why:
        os.write(2, ("mcp-code-bridge runtime: extra seccomp filter not installed: %s\n" % why).encode())
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    except Exception:
        pass
    _setup_env()
    _setup_fds()
    try:
        import ctypes

        _state.c_fflush = ctypes.CDLL(None).fflush
    except Exception:
        _state.c_fflush = None
    _install_mcp_package()
    sys.meta_path.insert(0, _ImportHook())
    builtins.display = display
    _setup_namespace()
    _get_loop()
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except Exception:
        pass
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    for r in _state.readers:
        r.start()
    threading.Thread(target=_frame_reader, name="mcp-bridge-frames", daemon=True).start()
    threading.Thread(target=_interrupt_watchdog, name="mcp-bridge-interrupts", daemon=True).start()
    _preload()
    _send({"type": "ready", "python": platform.python_version(), "pid": os.getpid()})
    while True:
        try:
            msg = _exec_queue.get()
            _run_exec(msg)
        except KeyboardInterrupt:
            continue
        except BaseException as e:  # the runtime itself must not die
            try:
                _log("runtime error: %r" % (e,))
                if _state.running is not None:
                    eid = _state.running.id
                    _state.running = None
                    _router.end()
                    _send({"type": "result", "id": eid, "status": "error",
                           "error": {"type": type(e).__name__, "message": str(e), "traceback": ""}})
            except BaseException:
                pass


_RUNTIME_API = (
    "discovered_servers",
    "list_servers",
    "list_servers_sync",
    "describe_server",
    "list_loaded_server_metadata",
    "list_tools_sync",
    "query_tool_docs",
    "query_tool_docs_sync",
    "search_tool_docs",
    "search_tool_docs_sync",
    "capability_summary",
    "call_tool",
    "call_tool_sync",
    "save_skill",
    "save_tool",
    "list_skills",
    "delete_skill",
    "display",
    "export_notebook",
    "NotebookTooLarge",
    "McpError",
    "McpToolError",
    "ToolDenied",
    "Image",
    "Audio",
    "Media",
    "Resource",
    "ToolDict",
    "ToolList",
    "ToolStr",
    "ServerProxy",
    "ServerNotLoadedError",
)
# In mcp.runtime but left out of its __all__ (and so out of help(runtime)'s listing).
_RUNTIME_EXTRA = ("Audio", "Media", "Resource", "ToolDict", "ToolList", "ToolStr", "ServerProxy")

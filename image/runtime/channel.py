"""The frame channel to the host (docs/protocol.md): one JSON object per line, out on a private
copy of the container's stdout, in on a private copy of its stdin.

`take_stdio` moves the channel off fd 0 and fd 1 (close-on-exec copies only this module writes
and the frame reader reads), so user code, C extensions and subprocesses never write a frame by
accident. Frames out: `send` (and `send_bytes` for one already encoded), whole and atomic with
respect to other threads and to interrupts. Frames in: the reader thread hands `exec` frames to
the main thread's queue, `rpc_result` frames to the request waiting for them (`pending`), and
`interrupt` frames to `interrupts`, those of a type in `handlers` to their handler (`outdir`
takes `keep` and `files`, `snapshot` takes `snapshot`, `restore` and `restore_data`, and hands
the work to the main thread's queue); anything else is ignored.
"""

import collections.abc
import json
import numbers
import os
import sys
import threading

from . import constants, interrupts, notebook, state

write_lock = threading.Lock()
# Frames in that other modules handle, by type (`outdir` takes `keep`), called on the reader thread.
# They must not block: the reader goes on reading (a restore's data, an interrupt) meanwhile.
handlers = {}
_input = None  # the buffered reader of the host's frames


def take_stdio(frames_in):
    """The channel's private descriptors (close-on-exec). Frames in are read from `frames_in`,
    the loader's buffered reader on a copy of fd 0: it read the boot frame, and whatever the
    host sent after it is in its buffer. Frames out go to a copy of fd 1."""
    global _input
    _input = frames_in
    state.frame_in = frames_in.fileno()
    state.frame_out = os.dup(1)


# ------------------------------------------------------------------------------- frames out


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
    dataclasses = sys.modules.get("dataclasses")  # not imported at boot: none exists before
    if dataclasses is not None and dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if isinstance(o, collections.abc.Mapping):
        return dict(o)
    if isinstance(o, (collections.abc.Sequence, collections.abc.Set)) and not isinstance(
        o, (str, bytes, bytearray)
    ):
        return list(o)
    raise TypeError("Object of type %s is not JSON serializable" % type(o).__name__)


def encode(obj, strict=False):
    """One frame's line. strict: what JSON cannot carry (NaN, unknown types) is an error, for
    the code's own arguments; else it is written as best it can be."""
    text = json.dumps(
        obj,
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=not strict,
        default=_json_default if strict else str,
    )
    # Lone surrogates cannot be UTF-8: they become '?', never an invalid frame.
    return text.encode("utf-8", "replace") + b"\n"


def send_bytes(data):
    """Write one encoded frame. Atomic with respect to interrupts and other threads."""
    if state.forked or state.frame_out is None:
        return False
    entered = interrupts.defer_enter()
    try:
        with write_lock:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(state.frame_out, view)
                except InterruptedError:
                    continue
                except OSError:
                    # The host is gone (or the channel was destroyed): nothing left to serve.
                    os._exit(0)
                view = view[n:]
    finally:
        interrupts.defer_exit(entered)
    return True


def send(obj):
    if obj.get("type") in ("output", "display"):
        notebook.record.frame(obj)
    return send_bytes(encode(obj))


def log(message, level="warning"):
    """A `log` frame: the runtime's diagnostics, tied to no exec."""
    try:
        send({"type": "log", "level": level, "message": str(message)[:constants.MESSAGE_CAP]})
    except Exception:
        pass


# -------------------------------------------------------------------------------- frames in


class Pending:
    """A request waiting for its `rpc_result`: an event (a blocking caller) or a future (an
    awaiting one, resolved on its own loop)."""

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


pending = {}  # rpc id -> Pending


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def reader():
    """The frame reader thread: reads the host's frames until EOF, which ends the process."""
    interrupts.block_sigint()
    stream = _input
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
            log("ignored a frame that is not JSON (%d bytes)" % len(line))
            continue
        if not isinstance(msg, dict):
            continue
        try:
            dispatch(msg)
        except Exception as e:
            log("ignored a bad %r frame: %r" % (msg.get("type"), e))


def dispatch(msg):
    kind = msg.get("type")
    if kind == "exec":
        if not is_int(msg.get("id")) or not isinstance(msg.get("code"), str):
            log("ignored an exec frame without an integer id and a code string")
            return
        state.queued.add(msg["id"])
        state.exec_queue.put(msg)
    elif kind == "rpc_result":
        p = pending.get(msg.get("id")) if is_int(msg.get("id")) else None
        if p is not None:
            p.resolve(msg)
    elif kind == "interrupt":
        interrupts.handle_interrupt(msg)
    elif kind in handlers:
        handlers[kind](msg)

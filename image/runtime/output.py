"""What the code writes to fd 1 and fd 2, as `output` frames of the running exec.

`capture` points fd 0 at /dev/null and fd 1 / fd 2 at pipes (so subprocesses and C code are
captured too) and gives Python new sys.std* objects on them. A `PipeReader` thread per pipe reads
in big chunks, coalescing small writes for a moment, and feeds the `Router`, which applies the
exec's output cap: the first half is forwarded live, of the rest a rolling tail is kept (each
stream keeps at least half of it for itself) and sent when the code ends, after a marker saying
how many bytes were left out. `drain` waits until everything written so far has been forwarded
(a sentinel through each pipe marks the point), so an exec's output precedes its result.
"""

import codecs
import collections
import io
import os
import select
import sys
import threading
import time

from . import channel, constants, interrupts, state


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


def trim_left(chunks, length, limit):
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


class Router:
    """The running exec's output: live head, kept tail, sent as output frames."""

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
                out.tail_lens[stream] = trim_left(
                    out.tails[stream], out.tail_lens[stream] + len(data), out.tail_cap)
        if text:
            channel.send({"type": "output", "id": out.exec_id, "stream": stream, "data": text})

    def end(self):
        """Detach the exec's output, send what the cap kept back; returns bytes omitted."""
        with self.lock:
            out, self.out = self.out, None
        if out is None:
            return 0
        eid = out.exec_id

        def emit(stream, text):
            if text:
                channel.send({"type": "output", "id": eid, "stream": stream, "data": text})

        # Share the tail budget: each stream keeps at least half of it if it needs it.
        lens = out.tail_lens
        cap = out.tail_cap
        if lens["stdout"] + lens["stderr"] > cap:
            half = cap // 2
            keep_err = min(lens["stderr"], max(cap - half, cap - lens["stdout"]))
            keep_out = min(lens["stdout"], cap - keep_err)
            for stream, keep in (("stdout", keep_out), ("stderr", keep_err)):
                lens[stream] = trim_left(out.tails[stream], lens[stream], keep)
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
            if run and (stream != run_stream or len(run) >= constants.TAIL_FRAME_BYTES):
                emit(run_stream, decoders[run_stream].decode(bytes(run)))
                run = bytearray()
            run_stream = stream
            run += chunk
        if run:
            emit(run_stream, decoders[run_stream].decode(bytes(run)))
        for stream in ("stdout", "stderr"):
            emit(stream, decoders[stream].decode(b"", True))
        return dropped


router = Router()


class PipeReader(threading.Thread):
    """Reads one output pipe in big chunks, coalescing small writes, and feeds the router."""

    def __init__(self, stream, rfd, wfd):
        super().__init__(name="mcp-bridge-" + stream, daemon=True)
        self.stream = stream
        self.rfd = rfd
        self.wfd = wfd  # private write end: the drain sentinel goes through it
        self.token = None
        self.token_seen = threading.Event()
        # Set by drain: cuts the coalescing wait short, so a call's last output is forwarded
        # at once instead of BATCH_DELAY later (a warm print would otherwise cost ~20 ms).
        self.wake = threading.Event()
        self.carry = b""

    def run(self):
        interrupts.block_sigint()
        poller = select.poll()
        poller.register(self.rfd, select.POLLIN)
        while True:
            try:
                poller.poll()
                data = os.read(self.rfd, constants.READ_CHUNK)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return
            if len(data) < constants.READ_CHUNK and self.token is None:
                # Small write: give the writer a moment (a drain ends it), then take all there is.
                self.wake.wait(constants.BATCH_DELAY)
                self.wake.clear()
                buf = bytearray(data)
                try:
                    while len(buf) < constants.READ_CHUNK and poller.poll(0):
                        more = os.read(self.rfd, constants.READ_CHUNK - len(buf))
                        if not more:
                            break
                        buf += more
                except OSError:
                    pass
                data = bytes(buf)
            try:
                self.process(data)
            except Exception as e:  # never let the reader die
                channel.log("output reader: %r" % (e,))

    def process(self, data):
        if self.carry:
            data = self.carry + data
            self.carry = b""
        token = self.token
        if token is None:
            router.feed(self.stream, data)
            return
        idx = data.find(token)
        if idx >= 0:
            router.feed(self.stream, data[:idx])
            self.token = None
            self.token_seen.set()
            router.feed(self.stream, data[idx + len(token):])
            return
        keep = 0
        for k in range(min(len(token) - 1, len(data)), 0, -1):
            if data.endswith(token[:k]):
                keep = k
                break
        router.feed(self.stream, data[: len(data) - keep])
        self.carry = data[len(data) - keep:] if keep else b""


def flush_std():
    """Flush Python's and C's buffers of stdout / stderr into the pipes."""
    seen = set()
    for obj in (sys.stdout, sys.stderr) + tuple(state.std_objects[1:]):
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            obj.flush()
        except Exception:
            pass
    if state.c_fflush is not None:
        try:
            state.c_fflush(None)
        except Exception:
            pass


def drain():
    """Wait until everything written to fd 1 / fd 2 so far has been forwarded."""
    readers = [r for r in state.readers if r.is_alive()]
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
    deadline = time.monotonic() + constants.DRAIN_TIMEOUT
    for r in readers:
        if not r.token_seen.wait(max(0.0, deadline - time.monotonic())):
            r.token = None


def open_std(fd):
    """A sys.std* object on fd 0, 1 or 2."""
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


def capture():
    """fd 0 from /dev/null, fd 1 / fd 2 into pipes with a reader each (started by the caller),
    new sys.std* objects. What each fd should be is remembered, so an exec can repair it."""
    devnull = os.open(os.devnull, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    os.dup2(devnull, 0)
    state.fd_targets[0] = (devnull, _ident_of(devnull))
    for fd, stream in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()  # both ends close-on-exec; fd 1/2 below are inheritable copies
        try:
            import fcntl

            fcntl.fcntl(r, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except Exception:
            pass
        os.dup2(w, fd)
        state.fd_targets[fd] = (w, _ident_of(w))
        state.readers.append(PipeReader(stream, r, w))
    stdin, stdout, stderr = open_std(0), open_std(1), open_std(2)
    state.std_objects = (stdin, stdout, stderr)
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = stdin, stdout, stderr

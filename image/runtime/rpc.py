"""Requests to the host (`rpc` frames) and their answers, for awaiting and for blocking callers,
and the exceptions a refusal becomes.

A request names the running exec (there is none between calls, and none in a forked child) and
must fit in one frame; an answer with `ok:false` raises `McpError`, or `ToolDenied` when the
host says the user's policy refused it (`PackageDenied` and `PackageError` for an install,
which `installs` names). `SnapshotError` is the runtime's own: a `runtime.fork()` whose snapshot
could not be written (`snapshot` raises it, before any request).
"""

import asyncio
import itertools
import threading

from . import channel, constants, state


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


class PackageError(McpError):
    """An install failed: the message says what was wrong (an unknown package, no wheel for this
    interpreter, a conflict with the image's packages, the index unreachable...) and what to do.
    Nothing of a failed install is left in the session."""


class PackageDenied(PermissionError):
    """The user's `[packages]` policy, or the user when asked, refused an install. Retrying the
    same install is refused the same way without asking again."""


class SnapshotError(McpError):
    """runtime.fork() could not write the session's state: it is larger than the bridge's
    snapshot_max_size (the message names the largest values: delete what you do not need and
    fork again), or snapshots are off. `.info` holds what the snapshot said of the state."""

    def __init__(self, message, info=None):
        super().__init__(message)
        self.info = info or {}


_ids = itertools.count(1)
_ids_lock = threading.Lock()


def _prepare(method, params):
    if state.forked:
        raise McpError("MCP calls are not available in a forked child process")
    ex = state.running
    if ex is None:
        raise McpError("no run_python call is active: MCP calls work only while a cell runs")
    with _ids_lock:
        rid = next(_ids)
    frame = {"type": "rpc", "id": rid, "exec": ex.id, "method": method, "params": params}
    try:
        data = channel.encode(frame, strict=True)
    except (TypeError, ValueError) as e:
        raise TypeError("arguments of %s cannot be sent as JSON: %s" % (method, e)) from None
    limit = constants.MAX_FRAME_BYTES
    if len(data) > limit - 1024:
        raise McpError(
            "request too large: %d bytes (the sandbox channel carries at most %d bytes per message)"
            % (len(data), limit)
        )
    return rid, data


def _unwrap(msg):
    if msg.get("ok") is True:
        return msg.get("result")
    err = msg.get("error")
    kind = msg.get("kind")
    if kind == "denied":
        raise ToolDenied(str(err) if err else "the tool call was denied by the user's policy")
    if kind in ("package", "package_denied"):
        cls = PackageDenied if kind == "package_denied" else PackageError
        raise cls(str(err) if err else "the install was refused")
    raise McpError(str(err) if err else "the bridge refused the request")


async def request(method, params):
    """Ask the host; the answer's result, or the exception it says."""
    rid, data = _prepare(method, params)
    loop = asyncio.get_running_loop()
    p = channel.Pending(loop=loop, fut=loop.create_future())
    channel.pending[rid] = p
    try:
        channel.send_bytes(data)
        msg = await p.fut
    finally:
        channel.pending.pop(rid, None)
    return _unwrap(msg)


def request_sync(method, params):
    """request(), blocking this thread until the answer."""
    rid, data = _prepare(method, params)
    p = channel.Pending(event=threading.Event())
    channel.pending[rid] = p
    try:
        channel.send_bytes(data)
        p.event.wait()
    finally:
        channel.pending.pop(rid, None)
    return _unwrap(p.msg)

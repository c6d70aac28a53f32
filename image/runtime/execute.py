"""Running cells: one exec frame at a time on the main thread, in the session's persistent
namespace, on one persistent event loop (top-level `await` works), notebook-style (the last
expression's value is shown), and its `result` frame.

Before the code runs, what earlier cells broke is repaired (std fds and streams, `display`, the
`mcp` package), the exec's servers are installed, and at an interpreter's first exec that says
so the saved skills are defined. Tracebacks keep only the frames of the user's cells
(`<cell-ID>`) and what they called, never the runtime's. The result frame comes after every
output frame of the exec and carries a digest of the host's OUT_DIR, so the host copies the
files out only when they changed. The same thread, between execs and in their order of arrival,
writes and restores the session's snapshots (`snapshot`).
"""

import ast
import asyncio
import builtins
import inspect
import linecache
import os
import sys
import traceback
import types
import warnings

from . import (channel, constants, discovery, display, interrupts, notebook, outdir, output, package, proxies, skills,
               snapshot, state)


# ---------------------------------------------------------------------------------- errors


def _clean_traceback(tb):
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    start = None
    for i, t in enumerate(frames):
        if t.tb_frame.f_code.co_filename.startswith(constants.CELL_PREFIX):
            start = i
            break
    if start is None:
        return None
    keep = [t for t in frames[start:] if not t.tb_frame.f_code.co_filename.startswith(constants.RUNTIME_FILES)]
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


def error_info(exc):
    """The result frame's `error` of an exception: type, message, traceback of the user's frames."""
    _clean_exception(exc)
    try:
        discovery.explain_name_error(exc)
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
    return {"type": name, "message": display.cap_middle(message, constants.MESSAGE_CAP),
            "traceback": display.cap_middle(tb_text, constants.TRACEBACK_CAP)}


# ------------------------------------------------------------------------------- the code


def get_loop():
    """The session's event loop (a new one if the code closed it), current on this thread."""
    loop = state.loop
    if loop is None or loop.is_closed():
        loop = state.loop = asyncio.new_event_loop()
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
    loop = get_loop()
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
    value = eval(code, state.ns)
    if code.co_flags & inspect.CO_COROUTINE:
        return _run_coro(ex, value)
    return value


def execute(ex, code):
    """Run one cell. Returns (status, value repr or None, error dict or None)."""
    filename = "%s%d>" % (constants.CELL_PREFIX, ex.id)
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    flag = constants.TLA_FLAG
    try:
        tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST | flag, dont_inherit=True)
        expr_code = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body.pop()
            expr_code = compile(ast.Expression(body=last.value), filename, "eval", flag, dont_inherit=True)
        body_code = compile(tree, filename, "exec", flag, dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as e:
        e.__traceback__ = None
        return "error", None, error_info(e)
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
        return "interrupted", None, error_info(e)
    except asyncio.CancelledError as e:
        ex.in_user = False
        if ex.interrupted:
            # The interrupt reached the code as the cancellation of what it awaited: say what
            # happened in the traceback's last line too.
            tb = error_info(e)["traceback"].rstrip("\n").splitlines()
            if tb and "CancelledError" in tb[-1]:
                tb[-1] = "KeyboardInterrupt"
            return "interrupted", None, {"type": "KeyboardInterrupt", "message": "", "traceback": "\n".join(tb) + "\n"}
        return "error", None, error_info(e)
    except BaseException as e:  # SystemExit included: the session survives it
        ex.in_user = False
        return "error", None, error_info(e)
    finally:
        ex.in_user = False
    if value is None:
        return "ok", None, None
    state.ns["_"] = value
    if display.auto_display(value):
        try:
            display.display(value)
        except Exception:
            pass
    text = display.repr_value(value)
    text += outdir.full_data(value, ex.id)
    if inspect.iscoroutine(value):
        text += "  # a coroutine: use `await` to run it"
    return "ok", text, None


# --------------------------------------------------------------------------------- an exec


def _repair_process_state():
    """Undo damage earlier cells may have done to the std fds / streams / helpers."""
    for fd, (private, ident) in state.fd_targets.items():
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
    stdin, stdout, stderr = state.std_objects
    if sys.stdin is None or getattr(sys.stdin, "closed", False):
        sys.stdin = stdin if not stdin.closed else output.open_std(0)
    if sys.stdout is None or getattr(sys.stdout, "closed", False):
        sys.stdout = stdout if not stdout.closed else output.open_std(1)
    if sys.stderr is None or getattr(sys.stderr, "closed", False):
        sys.stderr = stderr if not stderr.closed else output.open_std(2)
    builtins.display = display.display
    if "matplotlib.pyplot" in sys.modules:
        try:
            display.patch_pyplot(sys.modules["matplotlib.pyplot"])
        except Exception:
            pass


def run_exec(msg):
    """Run one exec frame and send its result frame."""
    eid = msg["id"]
    cap = msg.get("output_cap")
    if not channel.is_int(cap):
        cap = constants.DEFAULT_OUTPUT_CAP
    ex = interrupts.Exec(eid, cap)
    output.router.begin(eid, cap)
    state.sig_pending = False  # a SIGINT noted during an earlier exec is not this one's
    state.running = ex  # from here on an interrupt frame for eid reaches ex ...
    state.queued.discard(eid)
    if eid in state.cancelled:  # ... and one that came while it was queued is not lost
        state.cancelled.discard(eid)
        ex.interrupt_requested = True
    status, value, error = "error", None, None
    try:
        if ex.interrupt_requested:
            status = "interrupted"
        else:
            try:
                _repair_process_state()
                proxies.install(msg.get("servers"), msg.get("discovered"), fresh=package.ensure())
            except Exception as e:
                channel.log("preparing exec %s: %r" % (eid, e))
            if msg.get("skills"):
                try:
                    skills.load()
                except Exception as e:
                    channel.log("loading skills at exec %s: %r" % (eid, e))
            notebook.record.begin(eid, msg["code"])
            status, value, error = execute(ex, msg["code"])
    except KeyboardInterrupt:
        status, value, error = "interrupted", None, None
    except BaseException as e:
        status, value, error = "error", None, {"type": type(e).__name__, "message": str(e), "traceback": ""}
    finally:
        ex.in_user = False
        ex.done = True
    if ex.kicks:
        channel.log("exec %s: the interrupt was signalled %d more time(s) before the code saw it" % (eid, ex.kicks), "debug")
    output.flush_std()
    output.drain()
    truncated = output.router.end()
    notebook.record.finish(eid, status, value, error)
    state.running = None
    result = {"type": "result", "id": eid, "status": status}
    if value is not None:
        result["value"] = value
    if error is not None:
        result["error"] = error
    if truncated:
        result["truncated"] = truncated
    stamp = outdir.out_stamp()
    if stamp is not None:
        result["out"] = stamp
    channel.send(result)


def serve():
    """The main thread's loop: the frames of its queue one at a time, for ever: execs, and
    snapshots taken or restored between them. The runtime itself must not die: an error of its
    own ends the exec with an error result."""
    while True:
        try:
            msg = state.exec_queue.get()
            kind = msg.get("type")
            if kind == "exec":
                run_exec(msg)
            elif kind == "snapshot":
                snapshot.take(msg)
            elif kind == "restore":
                snapshot.restore(msg)
        except KeyboardInterrupt:
            continue
        except BaseException as e:
            try:
                channel.log("runtime error: %r" % (e,))
                if state.running is not None:
                    eid = state.running.id
                    state.running = None
                    output.router.end()
                    channel.send({"type": "result", "id": eid, "status": "error",
                                  "error": {"type": type(e).__name__, "message": str(e), "traceback": ""}})
            except BaseException:
                pass

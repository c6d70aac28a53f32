"""Start-up: what `main` does between the loader and the first exec.

In order: take the host's constants from the boot frame; install the seccomp filter while this
is the only thread (a failure of either stops here: the reason goes to stderr, which the host
names in the start's error, and there is no `ready`); move the frame channel off fd 0/1; send
the runtime's compiled code when the loader had to compile it (the first frame, before any code
but the runtime's ran); capture fd 1/2; build the `mcp` package and the user's `__main__`; start
the frame reader, the pipe readers and the interrupt watchdog; import the preload list; say
`ready`, with the kernel read first of all; then run execs for ever (`execute.serve`).
"""

import builtins
import importlib
import os
import platform
import signal
import sys
import threading
import types

from . import channel, constants, discovery, display, execute, installs, interrupts, output, package, seccomp, state


def fail(why):
    """Do not start: say why on stderr (the host names it in the start's error) and exit."""
    try:
        os.write(2, ("mcp-code-bridge runtime: cannot start: %s\n" % why).encode("utf-8", "replace"))
    finally:
        os._exit(1)


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
            import tempfile  # only here: the image sets a usable MPLCONFIGDIR

            os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="matplotlib-")
        except Exception:
            pass


def _setup_namespace():
    main_mod = types.ModuleType("__main__")
    main_mod.__builtins__ = builtins
    sys.modules["__main__"] = main_mod
    state.main_module = main_mod
    state.ns = main_mod.__dict__
    state.ns["mcp_servers"] = discovery.ServerMap()
    state.globals_set = {"mcp_servers": state.ns["mcp_servers"]}


def _after_fork_in_child():
    state.forked = True
    for fd in (state.frame_out, state.frame_in):
        try:
            os.close(fd)
        except Exception:
            pass
    for r in state.readers:
        try:
            os.close(r.rfd)
        except Exception:
            pass
    state.frame_out = state.frame_in = None


def _preload():
    """Import the modules MCP_BRIDGE_PRELOAD names (comma-separated) before saying ready: the
    bridge sets it on pooled sandboxes, started before any call waits, so that `import pandas`
    in a session's first call finds it in sys.modules. Nothing is bound in the session's
    namespace and the variable is removed; a module that fails is logged and skipped. Output
    written meanwhile belongs to no exec and is dropped (output.Router.feed), all of it before
    `ready`."""
    names = os.environ.pop("MCP_BRIDGE_PRELOAD", "")
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit or KeyboardInterrupt from a module included
            channel.log("preload: could not import %s: %s: %s" % (name, type(e).__name__, e))
    if names:
        # What the imports printed is still in the pipes: let the readers drop it now, before
        # `ready`, or the first exec would find it there and take it for its own.
        output.flush_std()
        output.drain()


def _send_code(frame):
    """When the loader compiled a module from its source (the boot frame carried no `code`, or
    code another kind of interpreter made, or code that would not load), send every module's
    compiled code, marshalled, as a `code` frame: the host keeps it and sends it in the next
    sandboxes' boot frames, sparing them the compiling (docs/protocol.md, "Boot"). Sent as the
    first frame, before any code but the runtime's and the standard library's ran here (the
    installed packages are not on the path yet, the preload list not imported): the host takes
    no `code` frame that is not the first."""
    made = frame.get("compiled")
    if not made or not frame.get("magic"):
        return
    import binascii
    import marshal

    modules = {}
    for name in frame["modules"]:
        code = made.get(name) or frame["source"](name)  # compiled at its import, or now
        modules[name] = binascii.b2a_base64(marshal.dumps(code), newline=False).decode("ascii")
    channel.send({"type": "code", "magic": frame["magic"], "modules": modules})


def kernel():
    """The kernel this sandbox runs on, as the kernel says it: `uname`'s release and version and
    the first line of /proc/version, read at boot, before any code of the user's runs. Under
    isolation = "gvisor" the host refuses a sandbox whose kernel is not gVisor's."""
    u = os.uname()
    try:
        with open("/proc/version", "rb") as f:
            proc_version = f.read(4096).decode("utf-8", "replace").split("\n")[0].strip()
    except OSError:
        proc_version = ""
    return {"release": u.release, "version": u.version, "proc_version": proc_version}


def main(frame, frames_in):
    """Run the runtime: `frame` is the boot frame (docs/protocol.md), `frames_in` the buffered
    reader it was read from, where the host's next frames are. Never returns."""
    state.main_ident = threading.get_ident()
    seen = kernel()
    wrong = constants.apply(frame.get("constants"))
    if wrong:
        fail("the boot frame lacks the host's constants %s" % ", ".join(wrong))
    # First, while this is the only thread: everything started later inherits the filter.
    try:
        why = seccomp.install()
    except Exception as e:
        why = repr(e)
    if why:
        fail("the seccomp filter could not be installed (%s); the sandbox does not run without it" % why)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    except Exception:
        pass
    _setup_env()
    channel.take_stdio(frames_in)
    _send_code(frame)
    output.capture()
    try:
        import ctypes

        state.c_fflush = ctypes.CDLL(None).fflush
    except Exception:
        state.c_fflush = None
    package.install()
    sys.meta_path.insert(0, package.ImportHook())
    builtins.display = display.display
    _setup_namespace()
    execute.get_loop()
    signal.signal(signal.SIGINT, interrupts.on_sigint)
    try:
        signal.signal(signal.SIGTERM, interrupts.on_sigterm)
    except Exception:
        pass
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    for r in state.readers:
        r.start()
    threading.Thread(target=channel.reader, name="mcp-bridge-frames", daemon=True).start()
    threading.Thread(target=interrupts.watchdog, name="mcp-bridge-interrupts", daemon=True).start()
    installs.add_to_path()
    _preload()
    channel.send({"type": "ready", "python": platform.python_version(), "pid": os.getpid(), "kernel": seen,
                  "target": installs.target(), "compiled": bool(frame.get("compiled"))})
    execute.serve()

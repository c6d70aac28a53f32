"""Interrupts: an `interrupt` frame (or the engine's SIGINT) becomes KeyboardInterrupt, or the
cancellation of the task a cell awaits, in the user's code and nowhere else.

They arrive as SIGINT to the main thread and take effect only while user code runs (`Exec.in_user`).
An interrupt frame is level-triggered: until the exec has seen it (a KeyboardInterrupt raised,
or its task really cancelled), the watchdog thread sends SIGINT again, so no moment of arrival
can lose it. While the main thread writes a frame, a SIGINT is held back until the frame is
whole (`defer_enter` / `defer_exit`), so an interrupt never cuts a frame in two.
"""

import _thread
import asyncio
import os
import signal
import threading
import time

from . import constants, state


class Exec:
    """One exec frame being run by the main thread."""

    def __init__(self, exec_id, cap):
        self.id = exec_id
        self.cap = cap
        self.in_user = False
        self.interrupt_requested = False  # an interrupt frame named this exec
        self.delivered = False  # ... and the code has seen it since (see watchdog)
        self.done = False  # the user's code has finished, one way or another
        self.interrupted = False
        self.cancel_sent = False
        self.kicks = 0  # SIGINTs sent again by the watchdog
        self.task = None


def block_sigint():
    """For the runtime's own threads: SIGINT and SIGTERM are the main thread's."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    except Exception:
        pass


def _cancel_task(ex, task):
    try:
        task.cancel()
    except Exception:
        pass
    # A cancelled task sees CancelledError at its next step, whether it waits on a future or is
    # about to start: the interrupt has reached the code.
    ex.delivered = True


def interrupt_now():
    ex = state.running
    if ex is None or not ex.in_user:
        return  # not in user code: the watchdog signals again, execute checks the flag
    ex.interrupted = True
    loop = state.loop
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


def on_sigint(signum, frame):
    if state.sig_defer:
        state.sig_pending = True
        return
    interrupt_now()


def on_sigterm(signum, frame):
    os._exit(0)


def defer_enter():
    """Hold SIGINT back while the main thread writes a frame; True when it did."""
    if threading.get_ident() == state.main_ident:
        state.sig_defer += 1
        return True
    return False


def defer_exit(entered):
    if not entered:
        return
    state.sig_defer -= 1
    if state.sig_defer == 0 and state.sig_pending:
        state.sig_pending = False
        interrupt_now()


def _kick_main():
    try:
        signal.pthread_kill(state.main_ident, signal.SIGINT)
    except Exception:
        _thread.interrupt_main()


def handle_interrupt(msg):
    """An `interrupt` frame (on the frame reader's thread)."""
    eid = msg.get("id")
    ex = state.running
    if ex is not None and ex.id == eid:
        # A repeated frame (the host sends one more when the first went unanswered) is a second
        # Ctrl-C: delivered again, even to code that caught the first.
        ex.delivered = False
        ex.interrupt_requested = True
        _kick_main()
        _wake.set()
    elif eid in state.queued:
        state.cancelled.add(eid)


_wake = threading.Event()


def watchdog():
    """Signal the main thread again until the running exec has seen its interrupt.

    One SIGINT is not always enough: it can land where the runtime, not the user's code, is
    running (between two steps of the event loop, just before a cell's task first runs, before
    `in_user` is set), where it is only noted. Until `delivered` is set, SIGINT follows at
    growing intervals (KICK_FIRST up to KICK_MAX), so an interrupt is level-triggered: whenever
    it arrives, it reaches the code before the exec ends."""
    block_sigint()
    while True:
        _wake.wait()
        _wake.clear()
        delay = constants.KICK_FIRST
        while True:
            time.sleep(delay)
            ex = state.running
            if ex is None or ex.done or ex.delivered or not ex.interrupt_requested:
                break
            ex.kicks += 1
            _kick_main()
            delay = min(delay * 2, constants.KICK_MAX)

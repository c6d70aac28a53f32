"""The process-wide state every part of the runtime shares, as this module's attributes
(`state.running`, `state.loaded`, ...), and the queue of frames waiting for the main thread
(execs, and the snapshots taken and restored between them).

It holds references only (descriptors, the running exec, the user's namespace, the servers of
this exec); the code that changes each one lives in the module that owns that concern.
"""

import collections
import queue

main_ident = None
frame_out = None  # private fd: frames to the host
frame_in = None  # private fd: frames from the host
forked = False
running = None  # the interrupts.Exec being run by the main thread
loop = None
ns = None  # the user's namespace (dict of the __main__ module)
main_module = None
loaded = collections.OrderedDict()  # server name -> metadata (this exec)
discovered = ()  # ({name, alias, description}, ...)
proxies = {}  # server name -> proxy (this exec)
globals_set = {}  # global name -> object the runtime put into ns
queued = set()  # exec ids waiting in the queue
cancelled = set()  # queued exec ids interrupted before they started
sig_defer = 0  # >0 while the main thread writes a frame
sig_pending = False
std_objects = ()  # our sys.stdin/stdout/stderr
fd_targets = {}  # fd -> (private fd, (st_dev, st_ino))
readers = []  # output.PipeReader of fd 1 and fd 2
c_fflush = None
exec_queue = queue.Queue()  # exec, snapshot and restore frames, in arrival order, for the main thread

"""The numbers the runtime works with, in one place.

Two kinds. The runtime's own (how output is coalesced, how much of a value or a traceback is
shown, how large the notebook record grows) are written here. The host's (the longest frame it
reads, the largest image it keeps, where files out are and how many entries it copies, how deep
a skill's default values may nest, how large a snapshot of the session may be) are written once, in the bridge, and arrive in the boot
frame's `constants`: they are None until `apply` takes them, which `boot.main` does before
anything else runs.

Other modules read a constant as `constants.NAME` when they use it, never copied into their own
names, so the host's values are the ones in force (and a test may change one for a session).
"""

import ast
import sys

# -------------------------------------------------------------------------- the runtime's own

# The loader names each module's code "<mcp-bridge-runtime/NAME.py>": frames of the runtime's own
# code are known by this prefix and left out of the tracebacks the code sees.
RUNTIME_FILES = sys._getframe().f_code.co_filename.rpartition("/")[0] + "/"
CELL_PREFIX = "<cell-"
READ_CHUNK = 64 * 1024  # one read of an output pipe / largest live output frame
TAIL_FRAME_BYTES = 256 * 1024  # largest output frame built from the kept tail
BATCH_DELAY = 0.02  # small writes are coalesced for this long
DRAIN_TIMEOUT = 5.0
VALUE_CAP = 10_000  # characters of the last expression's repr
TEXT_DISPLAY_CAP = 100_000
TRACEBACK_CAP = 32_000
MESSAGE_CAP = 8_000
DEFAULT_OUTPUT_CAP = 1024 * 1024  # an exec frame without output_cap (the host always sends one)
KICK_FIRST = 0.05  # an undelivered interrupt is signalled again after this long ...
KICK_MAX = 0.2  # ... and then at most this far apart, until the exec has seen it
TLA_FLAG = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
SKILL_NOTICE_CAP = 4000  # characters of the "[skills] not defined" line
NOTEBOOK_MAX_CELLS = 500
NOTEBOOK_MAX_BYTES = 32 * 1024 * 1024  # code + output text + base64 images held in the record
NOTEBOOK_EXPORT_CAP = 48 * 1024 * 1024  # the JSON written, framing and escapes included
SNAPSHOT_PIECE = 1024 * 1024  # bytes of a snapshot per `snap` frame: 1.4 MB of base64
SNAPSHOT_LIST_CAP = 200  # names (and lost names) a snapshot's info lists; the rest are counted
SNAPSHOT_NAME_CAP = 200  # characters of a name, a type or a module in that info
SNAPSHOT_WHY_CAP = 300  # characters of why a name was lost
SNAPSHOT_LARGEST = 5  # the largest values named, for a snapshot over the limit

# ------------------------------------------------------------------ the host's, from the boot frame

MAX_FRAME_BYTES = None  # the host discards longer lines
MAX_IMAGE_BYTES = None  # raw bytes of one display() image; the host refuses larger ones
OUT_DIR = None  # the directory whose files the host copies out after a call
OUT_ENTRIES = None  # the host reads at most as many entries of one copy
KEPT_DIR = None  # the directory under OUT_DIR that `keep` frames write to
SKILL_DEFAULT_DEPTH = None  # deepest nesting of a skill's literal default value

# key of the boot frame's `constants` -> (name here, type)
FROM_HOST = {
    "max_frame_bytes": ("MAX_FRAME_BYTES", int),
    "max_image_bytes": ("MAX_IMAGE_BYTES", int),
    "out_dir": ("OUT_DIR", str),
    "out_entries": ("OUT_ENTRIES", int),
    "kept_dir": ("KEPT_DIR", str),
    "skill_default_depth": ("SKILL_DEFAULT_DEPTH", int),
}


def apply(values):
    """Take the host's constants (the boot frame's `constants`). Returns the keys missing or of
    the wrong type (none when all is well); those keep None."""
    wrong = []
    for key, (name, kind) in FROM_HOST.items():
        value = values.get(key) if isinstance(values, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            wrong.append(key)
            continue
        globals()[name] = value
    return wrong

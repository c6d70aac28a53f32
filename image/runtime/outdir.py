"""The host's OUT_DIR as the runtime sees it: the digest each result frame carries (the host
copies the directory out only when it changed), and the parts of an exec's output that were too
long for its result, which the host sends back in `keep` frames to be written under
`OUT_DIR/KEPT_DIR/` for the next call's code to read.
"""

import base64
import binascii
import hashlib
import os
import stat

from . import channel, constants


def keep(msg):
    """Write a `keep` frame's data to OUT_DIR/KEPT_DIR/<name> and answer with a `kept` frame
    (its error, if any, and the directory's digest after). Only a plain name under .outputs is
    taken; the file is replaced, never written through a link the code left there."""
    eid = msg.get("id")
    path, data = msg.get("path"), msg.get("data")
    error = None
    try:
        if not channel.is_int(eid) or not isinstance(path, str) or not isinstance(data, str):
            raise ValueError("a keep frame needs an integer id and path and data strings")
        parent, _, name = path.partition("/")
        if parent != constants.KEPT_DIR or not name or "/" in name or name in (".", ".."):
            raise ValueError("not a path under %s/: %r" % (constants.KEPT_DIR, path))
        raw = base64.b64decode(data, validate=True)
        directory = os.path.join(constants.OUT_DIR, constants.KEPT_DIR)
        os.makedirs(directory, exist_ok=True)
        flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0)
        dfd = os.open(directory, flags)
        try:
            try:
                os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                pass
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                         0o644, dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb", closefd=False) as f:
                    f.write(raw)
            except BaseException:
                os.close(fd)
                os.unlink(name, dir_fd=dfd)
                raise
            os.close(fd)
        finally:
            os.close(dfd)
    except binascii.Error as e:
        error = "the data is not base64: %s" % e
    except Exception as e:
        error = "%s: %s" % (type(e).__name__, e.strerror if isinstance(e, OSError) and e.strerror else e)
    answer = {"type": "kept", "id": eid if channel.is_int(eid) else 0}
    if error is not None:
        answer["error"] = error
    stamp = out_stamp()
    if stamp is not None:
        answer["out"] = stamp
    channel.send(answer)


channel.handlers["keep"] = keep


def out_stamp(root=None):
    """A digest of what `root` (default: the host's OUT_DIR) holds (each entry's path, mode,
    size, mtime, ctime and inode; no link followed), "empty" when it is missing or empty, None
    when it cannot tell (more entries than the host reads, an error): the host copies the
    directory out only when this changed, so a call that writes no file costs no copy. ctime is
    in it because code cannot set it back."""
    if root is None:
        root = constants.OUT_DIR
    limit = constants.OUT_ENTRIES
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
                    if n > limit:
                        return None
                    st = e.stat(follow_symlinks=False)
                    h.update(b"%s\0%d %d %d %d %d\n" % (os.fsencode(e.path), st.st_mode, st.st_size,
                                                        st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(e.path)
    except OSError:
        return None
    return "empty" if n == 0 else h.hexdigest()

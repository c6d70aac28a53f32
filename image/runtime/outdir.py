"""The host's OUT_DIR as the runtime sees it: the digest each result frame carries (the host
copies the directory out only when it changed), the parts of an exec's output that were too
long for its result, which the host sends back in `keep` frames to be written under
`OUT_DIR/KEPT_DIR/` for the next call's code to read, and, under gVisor (whose tmpfs the engine
cannot read), the directory itself as a tar in `tar` frames when a `files` frame asks for it.
"""

import base64
import binascii
import hashlib
import os
import stat
import sys
import time

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

TAR_PIECE = 1024 * 1024  # bytes of tar per `tar` frame: 1.4 MB of base64, far below MAX_FRAME_BYTES


class _Stop(Exception):
    pass


class _TarFrames:
    """A write-only file for tarfile: the tar's bytes go out as `tar` frames of exec `eid`, in
    pieces of TAR_PIECE, at most `limit` bytes and until `deadline`. Past either, `stopped` says
    why, the write raises _Stop, and every later write is dropped (tarfile's close writes)."""

    def __init__(self, eid, limit, deadline):
        self.eid, self.limit, self.deadline = eid, limit, deadline
        self.pos = 0
        self.buf = bytearray()
        self.stopped = None

    def write(self, data):
        n = len(data)
        if self.stopped is not None:
            return n
        room = self.limit - self.pos
        self.buf += memoryview(data)[:room]
        self.pos += min(n, room)
        while len(self.buf) >= TAR_PIECE:
            self.send(self.buf[:TAR_PIECE])
            del self.buf[:TAR_PIECE]
        if n > room:
            self.stopped = "full"  # the host's read limit: it says so itself
            raise _Stop()
        if time.monotonic() > self.deadline:
            self.stopped = "it took too long"
            raise _Stop()
        return n

    def tell(self):
        return self.pos

    def flush(self):
        pass

    def send(self, piece):
        channel.send({"type": "tar", "id": self.eid, "data": base64.b64encode(piece).decode("ascii")})

    def finish(self, error=None):
        if self.buf:
            self.send(self.buf)
            self.buf = bytearray()
        end = {"type": "tar", "id": self.eid, "end": True}
        if error is not None:
            end["error"] = str(error)[:constants.MESSAGE_CAP]
        channel.send(end)


def _add_regular(tar, info, path, ino):
    """A regular file's entry: opened without following a link or waiting (a fifo put in its
    place), checked to be the file that was listed, and its bytes at the size it has now."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return False  # gone or replaced since it was listed: not copied
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_ino != ino:
            return False
        info.size = st.st_size
        try:
            tar.addfile(info, f)
        except _Stop:
            raise
        except OSError as e:
            # Shorter than it was a moment ago: the tar is cut inside the entry, and the host
            # names it a file that changed while being copied.
            raise _Stop("%r changed while being copied (%s)" % (path, e))
    return True


def send_files(msg):
    """Answer a `files` frame: OUT_DIR as a tar (the engine's names, `out/...`; directories,
    regular files, links and other entries as they are, never followed) in `tar` frames, the
    last with `end`. At most `limit` bytes of tar, `timeout` seconds and the host's entry bound
    plus one (so the host sees there were more). The host judges every entry itself."""
    import tarfile

    eid, limit, timeout = msg.get("id"), msg.get("limit"), msg.get("timeout")
    if not channel.is_int(eid) or not channel.is_int(limit) or not channel.is_int(timeout):
        channel.log("ignored a files frame without integer id, limit and timeout")
        return
    out = _TarFrames(eid, max(0, limit), time.monotonic() + max(0, timeout))
    error = None
    tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT, encoding="utf-8",
                       errors="surrogateescape")
    try:
        entries = 0
        stack = [(constants.OUT_DIR, "out")]
        while stack:
            path, arc = stack.pop()
            entries += 1
            if entries > constants.OUT_ENTRIES + 1:
                break
            try:
                ino = os.lstat(path).st_ino
                info = tar.gettarinfo(path, arc)
            except OSError:
                continue  # gone since it was listed
            if info is None:
                continue  # a socket: nothing tar can hold
            if info.isreg():
                _add_regular(tar, info, path, ino)
                continue
            tar.addfile(info)
            if info.isdir():
                try:
                    with os.scandir(path) as it:
                        names = sorted(e.name for e in it)
                except OSError:
                    continue
                stack.extend((os.path.join(path, n), arc + "/" + n) for n in reversed(names))
            if time.monotonic() > out.deadline:
                out.stopped = "it took too long"
                raise _Stop()
    except _Stop as e:
        if e.args:
            error = e.args[0]
        elif out.stopped != "full":
            error = "%s took more than %ds" % (constants.OUT_DIR, timeout)
    except Exception as e:
        error = "%s: %s" % (type(e).__name__, e)
    if out.stopped is None and error is not None:
        out.stopped = "error"  # the tar is cut where it stopped: not closed as if whole
    try:
        tar.close()
    except Exception:
        pass
    out.finish(error)


channel.handlers["files"] = send_files


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


FULL_DATA_MAX_BYTES = 256 * 1024 * 1024  # a DataFrame held in more memory is not written out


def full_data(value, eid):
    """For a pandas DataFrame (or Series) as the last value whose preview leaves rows or columns
    out: its whole data written under OUT_DIR/KEPT_DIR/ (Parquet when pyarrow is there, else
    CSV), as a large print is kept whole, and a line naming the file; the host lists it with
    the call's files. "" for anything else, or when it cannot be written (the line says why)."""
    pd = sys.modules.get("pandas")
    if pd is None or not isinstance(value, (pd.DataFrame, pd.Series)) or not constants.OUT_DIR:
        return ""
    frame = value.to_frame() if isinstance(value, pd.Series) else value
    rows, cols = frame.shape
    if rows <= 60 and cols <= 20:
        return ""
    try:
        size = int(frame.memory_usage(index=True, deep=False).sum())
    except Exception:
        size = 0
    if size > FULL_DATA_MAX_BYTES:
        return ("\nfull data: not written (%d bytes in memory, over %d); write it yourself, "
                "e.g. df.to_parquet('/workspace/out/data.parquet')" % (size, FULL_DATA_MAX_BYTES))
    try:
        import pyarrow  # noqa: F401
        kind, ext = "Parquet", "parquet"
    except Exception:
        kind, ext = "CSV", "csv"
    name = "%d.value.%s" % (eid, ext)
    directory = os.path.join(constants.OUT_DIR, constants.KEPT_DIR)
    path = os.path.join(directory, name)
    tmp = os.path.join(directory, ".%s.tmp" % name)
    try:
        os.makedirs(directory, exist_ok=True)
        if ext == "parquet":
            frame.to_parquet(tmp)
        else:
            frame.to_csv(tmp)
        os.replace(tmp, path)
    except Exception as e:
        try:
            os.unlink(tmp)
        except Exception:
            pass
        return "\nfull data: could not be written (%s: %s)" % (type(e).__name__, e)
    reader = "pd.read_parquet" if ext == "parquet" else "pd.read_csv(..., index_col=0)"
    return "\nfull data: %s (%s, %d rows \u00d7 %d columns; %s reads it back)" % (
        path, kind, rows, cols, reader)

"""Snapshots of a session: its namespace and its notebook's cells written as one stream of bytes,
which the host stores without reading and later streams back into a new sandbox of the same
session, where `restore` binds them again (docs/protocol.md, "Snapshots"); and `runtime.fork()`,
which writes one during an exec for the host to start another session from.

A snapshot keeps every name of the namespace but the runtime's own (dunder names, the proxies
and `mcp_servers` it binds, the saved skills it defines, the `mcp` package). A module is kept as
its name and imported again. Any other value is pickled on its own, with cloudpickle when the
image has it (so the functions and classes the cells defined go by value), else with the
standard pickle (and a function or class a cell defined is kept as the text of its statement,
run again); protocol 5, its buffers (numpy, pandas) out of band and written to the host straight
from the values' memory. A value that cannot be pickled is lost, named with its type and why,
and the others are kept. An object that is the value of another kept name is written as a
reference to that name: what two names shared they share again after a restore, no data is
written twice, and a function's globals are the namespace it is restored into.

The stream, numbers little-endian; a name, type, file or module is a u32 length and UTF-8, a
source or the notebook a u64 length and UTF-8:
  MAGIC (b"MCBSNAP" and the format's version, b"1"), a u32 length and a JSON header,
  then records, each a kind byte and its fields:
  M name module          a module, imported again
  S name type file src   a def or class statement, run again (written by the standard pickle)
  V name type pickle     a pickled value: u64 length of the pickle, u32 count and u64 length of
                         each buffer, the pickle, each buffer at an offset aligned to ALIGN
  N notebook             the notebook record's cells (JSON)
  E count                the end: how many records came before it.
A restore reads the whole stream before it binds anything: one that is not whole, of another
version or malformed anywhere is refused, and the namespace is left as it was.
"""

import ast
import base64
import binascii
import builtins
import heapq
import importlib
import io
import json
import linecache
import pickle
import platform
import struct
import sys
import types

from . import channel, constants, discovery, interrupts, notebook, output, proxies, rpc, skills, state

MAGIC = b"MCBSNAP"
VERSION = b"1"
ALIGN = 64  # buffers start at such offsets: restored numpy arrays are aligned for any dtype

SnapshotError = rpc.SnapshotError


def _cap(text, cap):
    text = str(text)
    return text if len(text) <= cap else text[: cap - 1] + "\u2026"


def _why(e):
    """An exception as a short reason."""
    try:
        text = "%s: %s" % (type(e).__name__, e)
    except Exception:
        text = type(e).__name__
    return _cap(text, constants.SNAPSHOT_WHY_CAP)


def _lost(name, kind, why):
    return {"name": _cap(name, constants.SNAPSHOT_NAME_CAP), "type": _cap(kind, constants.SNAPSHOT_NAME_CAP),
            "why": _cap(why, constants.SNAPSHOT_WHY_CAP)}


def _type_name(value):
    return getattr(type(value), "__qualname__", None) or type(value).__name__


# ------------------------------------------------------------------------------- pickling

_classes = {}  # base pickler class -> ours


def _pickler():
    """(name, class) of the pickler snapshots use: cloudpickle's when it can be imported, else
    the standard one's, each with the references of `_Refs`."""
    try:
        import cloudpickle

        base, name = cloudpickle.Pickler, "cloudpickle"
    except Exception:
        base, name = pickle.Pickler, "pickle"
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = type("SnapshotPickler", (_Refs, base), {})
    return name, cls


class _Refs:
    """Pickles one name's value: the namespace, and every object that is another kept name's
    value, as persistent ids (restored as the new namespace and that name's restored value);
    out-of-band buffers kept as views of the values' own memory, not copied."""

    def __init__(self, file, name, owners):
        super().__init__(file, protocol=5, buffer_callback=self._buffer)
        self.name = name
        self.owners = owners  # id(value) -> the name it is written under
        self.refs = set()
        self.buffers = []

    def _buffer(self, buf):
        try:
            view = buf.raw()
        except BufferError:
            return True  # not contiguous: written in band, inside the pickle
        self.buffers.append(view)
        return False

    def persistent_id(self, obj):
        if type(obj) is dict:
            # cloudpickle gives the functions of one module a globals dict of its own making.
            if obj is state.ns or obj is getattr(self, "globals_ref", {}).get(id(state.ns)):
                return ("ns",)
        owner = self.owners.get(id(obj))
        if owner is None or owner == self.name:
            return None
        self.refs.add(owner)
        return ("name", owner)

    def _dynamic_function_reduce(self, func):
        # cloudpickle writes with a function the values of the globals it names, which a
        # restore puts into its globals. A function of the namespace finds them there when it
        # runs: left out, a value is not written twice, nor lost with a function that names it.
        reduced = super()._dynamic_function_reduce(func)
        if func.__globals__ is state.ns:
            try:
                slots = reduced[2][1]
                if isinstance(slots, dict) and isinstance(slots.get("__globals__"), dict):
                    slots["__globals__"] = {}
            except (TypeError, IndexError, KeyError):
                pass
        return reduced


class _Value:
    """One name's pickle: its bytes and out-of-band buffers (views), the names it refers to."""

    __slots__ = ("kind", "data", "buffers", "refs", "size")

    def __init__(self, kind, data, buffers, refs):
        self.kind = kind
        self.data = data
        self.buffers = buffers
        self.refs = refs
        self.size = data.nbytes + sum(b.nbytes for b in buffers)


def _pickle(cls, name, value, owners):
    f = io.BytesIO()
    p = cls(f, name, owners)
    p.dump(value)
    return _Value(_type_name(value), f.getbuffer(), p.buffers, p.refs)


def _tangled(refs):
    """The names whose values refer to each other round a cycle (or lie on a path between two):
    no order restores them. Sinks and sources are peeled off until none is left; what remains
    is tangled."""
    out = {n: set(r) & refs.keys() for n, r in refs.items()}
    into = {n: set() for n in out}
    for n, targets in out.items():
        for t in targets:
            into[t].add(n)
    todo = [n for n in out if not out[n] or not into[n]]
    while todo:
        n = todo.pop()
        if n not in out:
            continue
        for t in out.pop(n):
            into[t].discard(n)
            if t in out and not into[t]:
                todo.append(t)
        for s in into.pop(n):
            out[s].discard(n)
            if s in out and not out[s]:
                todo.append(s)
    return set(out)


# ------------------------------------------------------------------------ what is kept


def _of_servers(value):
    """Why `value` is not kept when it is an object of the loaded MCP servers, else None."""
    if isinstance(value, (proxies.ServerProxy, discovery.ServerMap)) or (
            isinstance(value, types.ModuleType) and str(getattr(value, "__name__", "")).startswith("mcp.servers.")):
        return "an MCP server's proxy: bound again when a call loads the server (servers=[...])"
    if isinstance(value, types.FunctionType) and "__mcp_tool__" in value.__dict__:
        return "an MCP server's tool: bound again when a call loads the server (servers=[...])"
    return None


def _module_name(value):
    """The name a module is imported under, when it is that module; else None."""
    if not isinstance(value, types.ModuleType):
        return None
    name = value.__dict__.get("__name__")
    return name if isinstance(name, str) and sys.modules.get(name) is value else None


def _from_cells(value):
    return isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == "__main__"


def _cell_number(filename):
    digits = filename[len(constants.CELL_PREFIX):-1]
    return int(digits) if digits.isdigit() else 0


def _class_files(cls):
    """The files whose text may hold the statement of a class: those of its methods' code,
    then the cells', the latest first (a class without methods)."""
    files = []
    for attr in list(vars(cls).values()):
        func = attr.fget if isinstance(attr, property) else getattr(attr, "__func__", attr)
        code = getattr(func, "__code__", None)
        if isinstance(code, types.CodeType) and code.co_filename not in files:
            files.append(code.co_filename)
    cells = [f for f in list(linecache.cache) if isinstance(f, str) and f.startswith(constants.CELL_PREFIX)]
    cells.sort(key=_cell_number, reverse=True)
    return files + [f for f in cells if f not in files] + ["<restored %s>" % cls.__name__]


def _statement(name, value):
    """(file, text) of the top-level `def` or `class` statement that made `value`, a function
    or class a cell (or a restore) defined under `name`, from the text the cache keeps of its
    cell; None when there is none. The standard pickle writes such a value by reference only."""
    if getattr(value, "__qualname__", None) != name:
        return None
    if isinstance(value, types.FunctionType):
        files, first = [value.__code__.co_filename], value.__code__.co_firstlineno
    else:
        files, first = _class_files(value), None
    for filename in files:
        entry = linecache.cache.get(filename)
        if not entry or len(entry) < 3 or not isinstance(entry[2], list):
            continue
        lines = entry[2]
        try:
            tree = compile("".join(lines), filename, "exec", ast.PyCF_ONLY_AST | constants.TLA_FLAG,
                           dont_inherit=True)
        except (SyntaxError, ValueError):
            continue
        for node in reversed(tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                if first is not None and first not in (start, node.lineno):
                    continue  # another definition of the same name in that cell
                if isinstance(node, ast.ClassDef) != isinstance(value, type):
                    continue
                return filename, "".join(lines[start - 1:node.end_lineno])
    return None


class _Snapshot:
    """What a snapshot of the namespace holds, pickled and measured before any of it is sent."""

    def __init__(self, pickler):
        self.pickler = pickler
        self.modules = {}  # name -> module name
        self.sources = {}  # name -> (type, file, source)
        self.values = {}  # name -> _Value
        self.lost = []  # {name, type, why}
        self.notebook = b""
        self.cells = 0

    def lose(self, name, value, why):
        self.lost.append(_lost(name, _type_name(value), why))

    def info(self):
        """The end frame's `info`, every list and string bounded."""
        cap = constants.SNAPSHOT_LIST_CAP
        name_cap = constants.SNAPSHOT_NAME_CAP
        names = sorted(list(self.modules) + list(self.sources) + list(self.values))
        lost = sorted(self.lost, key=lambda e: e["name"])
        largest = heapq.nlargest(constants.SNAPSHOT_LARGEST, self.values.items(), key=lambda kv: kv[1].size)
        info = {
            "names": [_cap(n, name_cap) for n in names[:cap]],
            "modules": {_cap(n, name_cap): _cap(m, name_cap) for n, m in sorted(self.modules.items())[:cap]},
            "lost": lost[:cap],
            "cells": self.cells,
            "size": 0,
            "largest": [{"name": _cap(n, name_cap), "size": v.size} for n, v in largest],
            "pickler": self.pickler,
        }
        if len(names) > cap:
            info["more_names"] = len(names) - cap
        if len(lost) > cap:
            info["more_lost"] = len(lost) - cap
        return info


def _selected(snap):
    """(name, value) of every name of the namespace a snapshot may keep: not the runtime's own,
    and not the MCP servers' objects (lost, saying how they come back)."""
    ns = state.ns
    mcp = sys.modules.get("mcp")
    for name, value in list(ns.items()):
        if not isinstance(name, str):
            snap.lose(repr(name), value, "the name is not a string")
            continue
        if name.startswith("__") and name.endswith("__"):
            continue
        if (name in state.globals_set and state.globals_set[name] is value) or skills.defined(name, value):
            continue
        if mcp is not None and value is mcp:
            continue
        why = _of_servers(value)
        if why is not None:
            snap.lose(name, value, why)
            continue
        yield name, value


def collect():
    """Pickle and measure the namespace and the notebook record: a _Snapshot, nothing sent."""
    pickler, cls = _pickler()
    snap = _Snapshot(pickler)
    kept, candidates = {}, {}
    for name, value in _selected(snap):
        module = _module_name(value)
        if module is not None:
            snap.modules[name] = module
            kept[name] = value
            continue
        if pickler == "pickle" and _from_cells(value):
            try:
                found = _statement(name, value)
            except Exception:  # a class whose attributes answer strangely
                found = None
            if found is not None:
                snap.sources[name] = ("class" if isinstance(value, type) else "function",) + found
                kept[name] = value
                continue
        candidates[name] = value
    # Each object is written under one name, and the other names refer to it: a module's or a
    # statement's name first, then the first in order, `_` and private names last (the largest
    # values are named by the name the code gave them). Immutable atoms are not shared: a small
    # int or an empty tuple is the same object everywhere, and so would tie unrelated names.
    owners = {}
    for name in sorted(kept, key=_public_first):
        owners.setdefault(id(kept[name]), name)
    for name in sorted(candidates, key=_public_first):
        value = candidates[name]
        if not isinstance(value, (int, float, complex, str, bytes, tuple, frozenset, range, type(None))):
            owners.setdefault(id(value), name)
    for name in sorted(candidates):
        value = candidates[name]
        if pickler == "pickle" and _from_cells(value) and owners.get(id(value)) == name:
            snap.lose(name, value, "a %s a cell defined: without cloudpickle in the image only a top-level "
                      "def or class statement is kept" % ("class" if isinstance(value, type) else "function"))
            continue
        try:
            snap.values[name] = _pickle(cls, name, value, owners)
        except Exception as e:
            snap.lose(name, value, _why(e))
    _untangle(snap, cls, candidates, owners)
    _drop_dangling(snap, candidates)
    snap.notebook, snap.cells = notebook.record.saved()
    return snap


def _public_first(name):
    return name.startswith("_"), name


def _untangle(snap, cls, candidates, owners):
    """Values that refer to each other round a cycle are pickled again, each whole (by value),
    without references to the others: kept, though no longer shared."""
    tangled = _tangled({n: v.refs for n, v in snap.values.items()})
    if not tangled:
        return
    free = {k: n for k, n in owners.items() if n not in tangled}
    for name in sorted(tangled):
        del snap.values[name]
        try:
            snap.values[name] = _pickle(cls, name, candidates[name], free)
        except Exception as e:
            snap.lose(name, candidates[name], _why(e))


def _drop_dangling(snap, candidates):
    """A value that refers to a lost name could not be restored: it is lost too."""
    kept = set(snap.modules) | set(snap.sources) | set(snap.values)
    changed = True
    while changed:
        changed = False
        for name, v in list(snap.values.items()):
            missing = sorted(v.refs - kept)
            if missing:
                del snap.values[name]
                kept.discard(name)
                snap.lose(name, candidates[name], "it refers to %s, which is not kept" % missing[0])
                changed = True


# ------------------------------------------------------------------------------ the stream


def _text(s, wide=False):
    data = s.encode("utf-8", "surrogatepass")
    return struct.pack("<Q" if wide else "<I", len(data)) + data


def _layout(snap):
    """The stream's parts in order (bytes, and memoryviews of the pickles and the values' own
    buffers) and its size in bytes."""
    parts = []
    size = 0

    def add(part):
        nonlocal size
        parts.append(part)
        size += part.nbytes if isinstance(part, memoryview) else len(part)

    header = json.dumps({"pickler": snap.pickler, "python": platform.python_version()}).encode("ascii")
    add(MAGIC + VERSION + struct.pack("<I", len(header)) + header)
    for name, module in sorted(snap.modules.items()):
        add(b"M" + _text(name) + _text(module))
    for name, (kind, filename, source) in sorted(snap.sources.items()):
        add(b"S" + _text(name) + _text(kind) + _text(filename) + _text(source, wide=True))
    for name, v in sorted(snap.values.items()):
        lengths = b"".join(struct.pack("<Q", b.nbytes) for b in v.buffers)
        add(b"V" + _text(name) + _text(v.kind) + struct.pack("<QI", v.data.nbytes, len(v.buffers)) + lengths)
        add(v.data)
        for b in v.buffers:
            if size % ALIGN:
                add(bytes(-size % ALIGN))
            add(b)
    add(b"N" + struct.pack("<Q", len(snap.notebook)))
    add(snap.notebook)
    add(b"E" + struct.pack("<I", len(snap.modules) + len(snap.sources) + len(snap.values) + 1))
    return parts, size


class _Frames:
    """The stream's bytes as `snap` frames of `eid`, SNAPSHOT_PIECE bytes each, then one end."""

    def __init__(self, eid):
        self.eid = eid
        self.buf = bytearray()
        self.sent = 0
        self.ended = False

    def write(self, data):
        piece = constants.SNAPSHOT_PIECE
        view = memoryview(data).cast("B")
        while view:
            if not self.buf and len(view) >= piece:
                self._send(view[:piece])  # straight from the value's memory
                view = view[piece:]
                continue
            room = piece - len(self.buf)
            self.buf += view[:room]
            view = view[room:]
            if len(self.buf) >= piece:
                self._send(self.buf)
                self.buf = bytearray()

    def _send(self, data):
        channel.send({"type": "snap", "id": self.eid, "data": base64.b64encode(data).decode("ascii")})
        self.sent += len(data)

    def end(self, info, error=None):
        """The one end frame (an interrupt waits until it is written)."""
        entered = interrupts.defer_enter()
        try:
            if self.ended:
                return
            if self.buf and error is None:
                self._send(self.buf)
            self.buf = bytearray()
            frame = {"type": "snap", "id": self.eid, "end": True, "info": dict(info, size=self.sent)}
            if error is not None:
                frame["error"] = _cap(error, constants.MESSAGE_CAP)
            channel.send(frame)
            self.ended = True
        finally:
            interrupts.defer_exit(entered)


def _fit(snap, limit):
    """Make the snapshot fit in `limit` bytes by leaving out what does not: the largest values
    first (each named as lost, with its size), with the values that refer to them, then the
    notebook's cells. Returns the stream's (parts, size) once it fits, or None when even the
    modules and statements alone are larger."""
    parts, size = _layout(snap)
    over = "%d bytes; the snapshot with it would be over snapshot_max_size (%d bytes)"
    while size > limit and snap.values:
        name, v = max(snap.values.items(), key=lambda kv: kv[1].size)
        del snap.values[name]
        snap.lost.append(_lost(name, v.kind, over % (v.size, limit)))
        kept = set(snap.modules) | set(snap.sources) | set(snap.values)
        changed = True
        while changed:
            changed = False
            for other, w in list(snap.values.items()):
                missing = sorted(w.refs - kept)
                if missing:
                    del snap.values[other]
                    kept.discard(other)
                    snap.lost.append(_lost(other, w.kind, "it refers to %s, which is not kept" % missing[0]))
                    changed = True
        parts, size = _layout(snap)
    if size > limit and snap.notebook:
        snap.lost.append(_lost("the notebook's cells", "notebook", over % (len(snap.notebook), limit)))
        snap.notebook, snap.cells = b"", 0
        parts, size = _layout(snap)
    return (parts, size) if size <= limit else None


def write(eid, limit, partial=False):
    """Write the session's state as `snap` frames of `eid`: everything pickled and measured
    first, then the stream when it is at most `limit` bytes, else only the end frame saying so;
    with `partial` (a session closed by the host), what fits is written instead and the rest
    named as lost (`_fit`). Returns (error or None, info). An interrupt (a fork's exec) ends
    the frames and is raised."""
    out = _Frames(eid)
    info, error = {}, None
    try:
        snap = collect()
        info = snap.info()
        parts, size = _layout(snap)
        if size > limit and partial:
            fitted = _fit(snap, limit)
            if fitted is not None:
                parts, size = fitted
                info = snap.info()
        if size > limit:
            error = "the session's state is %d bytes, over snapshot_max_size (%d bytes)" % (size, limit)
        else:
            for part in parts:
                out.write(part)
    except Exception as e:
        error = "the snapshot could not be written: %s" % _why(e)
        channel.log("snapshot %s: %r" % (eid, e))
    except BaseException:
        out.end(info, "the snapshot was interrupted")
        raise
    out.end(info, error)
    return error, dict(info, size=out.sent)


def take(msg):
    """A `snapshot` frame, on the main thread between execs. What the pickling prints belongs
    to no exec: it is dropped, all of it before the next exec starts."""
    try:
        write(msg["id"], msg["limit"], partial=True)
    finally:
        output.flush_std()
        output.drain()


# ------------------------------------------------------------------------------- reading


class _Malformed(Exception):
    """The stream is not a whole snapshot this runtime can read; the message says why."""


class _Reader:
    def __init__(self, view):
        self.view = view
        self.pos = 0

    def take(self, n):
        if n > len(self.view) - self.pos:
            raise _Malformed("it ends in the middle of a record (cut short?)")
        part = self.view[self.pos:self.pos + n]
        self.pos += n
        return part

    def number(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def text(self, wide=False):
        data = self.take(self.number("<Q" if wide else "<I"))
        try:
            return str(data, "utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise _Malformed("a name or text in it is not UTF-8") from None


def _value_record(r):
    vtype = r.text()
    length, count = struct.unpack("<QI", r.take(12))
    lengths = struct.unpack("<%dQ" % count, r.take(8 * count))  # taken first: count is bounded
    data = r.take(length)
    buffers = []
    for n in lengths:
        r.take(-r.pos % ALIGN)
        buffers.append(r.take(n))
    return ("V", vtype, data, buffers)


def parse(view):
    """The records of a snapshot stream, {name: (kind, type, ...)}, and the notebook's JSON
    (None without one); _Malformed when it is not a whole stream of this format."""
    r = _Reader(view)
    if len(view) < len(MAGIC) + 1 or bytes(view[:len(MAGIC)]) != MAGIC:
        raise _Malformed("it is not a snapshot (it does not start with %s)" % MAGIC.decode())
    version = bytes(r.take(len(MAGIC) + 1)[len(MAGIC):])
    if version != VERSION:
        raise _Malformed("it is a snapshot of format %r, and this runtime reads format %r"
                         % (version.decode("latin-1"), VERSION.decode()))
    try:
        header = json.loads(bytes(r.take(r.number("<I"))))
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise _Malformed("its header is not a JSON object")
    records, nb, count = {}, None, 0
    while True:
        kind = bytes(r.take(1))
        if kind == b"E":
            if r.number("<I") != count:
                raise _Malformed("its end does not count the records before it")
            break
        count += 1
        if kind == b"N":
            if nb is not None:
                raise _Malformed("it has two notebook records")
            nb = bytes(r.take(r.number("<Q")))
            continue
        if kind not in (b"M", b"S", b"V"):
            raise _Malformed("it has a record of unknown kind %r" % kind)
        name = r.text()
        if kind == b"M":
            record = ("M", "module", r.text())
        elif kind == b"S":
            record = ("S", r.text(), r.text(), r.text(wide=True))
        else:
            record = _value_record(r)
        if name in records:
            raise _Malformed("it has two records of %r" % name)
        records[name] = record
    if r.pos != len(view):
        raise _Malformed("it has %d bytes after its end" % (len(view) - r.pos))
    return records, nb


class _Missing(Exception):
    """A value refers to a name that could not be restored."""

    def __init__(self, name, why):
        super().__init__(why)
        self.name = name


class _Restorer:
    """Binds a snapshot's records into the namespace: modules first, then statements, then
    values. A value's references to other names restore those first (whatever their order);
    a statement that needs a name not yet bound (a decorator, a base class) is tried again
    after the values."""

    def __init__(self, records):
        self.records = records
        self.status = {}  # name -> "busy", "done", "failed"
        self.names = []
        self.lost = []
        self.modules = []

    def run(self):
        by_kind = {"M": [], "S": [], "V": []}
        for name, record in sorted(self.records.items()):
            by_kind[record[0]].append(name)
        for name in by_kind["M"]:
            self.resolve(name)
        later = [n for n in by_kind["S"] if not self.resolve(n, defer=True)]
        for name in by_kind["V"] + later:
            self.resolve(name)
        state.ns["__builtins__"] = builtins  # cloudpickle sets its own (the dict): the module, as at boot

    def resolve(self, name, defer=False):
        """Restore `name` unless done; False when deferred (a statement's NameError)."""
        status = self.status.get(name)
        if status == "busy":
            raise _Missing(name, "it and %s refer to each other" % name)
        if status is not None:
            return True
        self.status[name] = "busy"
        record = self.records[name]
        try:
            state.ns[name] = self._make(name, record)
        except NameError as e:
            if defer and record[0] == "S":
                del self.status[name]
                return False
            self._fail(name, record, _why(e))
        except _Missing as e:
            self._fail(name, record, "it refers to %s, which could not be restored" % e.name)
        except BaseException as e:  # whatever a value's own reconstruction raises
            self._fail(name, record, _why(e))
        else:
            self.status[name] = "done"
            self.names.append(name)
        return True

    def _fail(self, name, record, why):
        self.status[name] = "failed"
        self.lost.append(_lost(name, record[1], why))
        if record[0] == "M" and record[2] not in self.modules:
            self.modules.append(record[2])

    def _make(self, name, record):
        kind = record[0]
        if kind == "M":
            return importlib.import_module(record[2])
        if kind == "S":
            return self._define(name, record[3])
        unpickler = pickle.Unpickler(io.BytesIO(record[2]), buffers=record[3])
        unpickler.persistent_load = self._persistent
        return unpickler.load()

    def _define(self, name, source):
        """Run a def or class statement again, in the namespace, under a file of its own (the
        cells' file names are the new sandbox's), kept for tracebacks and the next snapshot."""
        filename = "<restored %s>" % name
        code = compile(source, filename, "exec", dont_inherit=True)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(code, state.ns)
        value = state.ns.get(name)
        if not isinstance(value, (types.FunctionType, type)):
            raise ValueError("its statement did not define it")
        return value

    def _persistent(self, pid):
        if pid == ("ns",):
            return state.ns
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "name" and pid[1] in self.records):
            raise pickle.UnpicklingError("a reference to no name of the snapshot")
        name = pid[1]
        self.resolve(name)
        if self.status.get(name) != "done":
            raise _Missing(name, "not restored")
        return state.ns[name]


def restore(msg):
    """A snapshot whose bytes have all arrived (`msg["snapshot"]`), on the main thread before
    the sandbox's first exec: bind it, and answer with a `restored` frame. What the restore
    prints belongs to no exec: it is dropped."""
    answer = {"type": "restored", "id": msg["id"]}
    try:
        try:
            records, nb = parse(memoryview(msg.pop("snapshot")))
        except _Malformed as e:
            answer["error"] = "the snapshot cannot be read: %s" % e
        except Exception as e:
            answer["error"] = "the snapshot cannot be read: %s" % _why(e)
        else:
            try:
                _bind(answer, records, nb)
            except Exception as e:  # the runtime's own failure: said, not hidden
                answer["error"] = "the restore failed: %s" % _why(e)
    finally:
        output.flush_std()
        output.drain()
        channel.send(answer)


def _bind(answer, records, nb):
    done = _Restorer(records)
    done.run()
    if nb is not None:
        try:
            notebook.record.restore(nb)
        except Exception as e:
            channel.log("the snapshot's notebook record was not restored: %s" % _why(e))
    cap = constants.SNAPSHOT_LIST_CAP
    names = sorted(done.names)
    answer.update(names=[_cap(n, constants.SNAPSHOT_NAME_CAP) for n in names[:cap]],
                  lost=sorted(done.lost, key=lambda e: e["name"])[:cap],
                  modules=[_cap(m, constants.SNAPSHOT_NAME_CAP) for m in done.modules[:cap]])
    if len(names) > cap:
        answer["more_names"] = len(names) - cap
    if len(done.lost) > cap:
        answer["more_lost"] = len(done.lost) - cap


# ----------------------------------------------------------------- frames from the host


class _Incoming:
    """A restore whose bytes are arriving: one bytearray of the announced size, filled in place."""

    __slots__ = ("id", "data", "pos", "failed")

    def __init__(self, rid, data):
        self.id = rid
        self.data = data
        self.pos = 0
        self.failed = False


_incoming = None  # the restore being received (the reader thread's alone)


def _refuse(rid, why):
    channel.send({"type": "restored", "id": rid, "error": why})


def _fail(inc, why):
    """Refuse the restore being received; its frames still to come are dropped."""
    inc.failed = True
    inc.data = None
    _refuse(inc.id, why)


def on_snapshot(msg):
    """A `snapshot` frame (reader thread): carried out on the main thread, between execs."""
    eid, limit = msg.get("id"), msg.get("limit")
    if not channel.is_int(eid):
        channel.log("ignored a snapshot frame without an integer id")
    elif not channel.is_int(limit) or limit < 0:
        channel.send({"type": "snap", "id": eid, "end": True, "info": {},
                      "error": "a snapshot frame needs an integer limit of 0 or more"})
    else:
        state.exec_queue.put(msg)


def on_restore(msg):
    """A `restore` frame (reader thread): its bytes follow, into a bytearray of its size."""
    global _incoming
    rid, size = msg.get("id"), msg.get("size")
    if not channel.is_int(rid):
        channel.log("ignored a restore frame without an integer id")
        return
    if _incoming is not None and not _incoming.failed:
        _fail(_incoming, "another restore (id %d) began before this one ended" % rid)
    _incoming = None
    if not channel.is_int(size) or size < 0:
        _refuse(rid, "a restore frame needs an integer size of 0 or more")
        return
    try:
        data = bytearray(size)
    except (MemoryError, OverflowError):
        _refuse(rid, "the sandbox cannot hold a snapshot of %d bytes" % size)
        return
    _incoming = _Incoming(rid, data)


def on_restore_data(msg):
    """A `restore_data` frame (reader thread): the next bytes, or the end, which hands the
    whole snapshot to the main thread."""
    global _incoming
    inc, rid = _incoming, msg.get("id")
    if inc is None:
        channel.log("ignored a restore_data frame: no restore is under way")
        return
    if rid != inc.id:
        if not inc.failed:
            _fail(inc, "a restore_data frame of another restore (id %r) came" % (rid,))
        return
    if inc.failed:
        if msg.get("end") is True:
            _incoming = None
        return
    data = msg.get("data")
    if data is not None:
        room = len(inc.data) - inc.pos
        if not isinstance(data, str) or len(data) // 4 * 3 > room + 3:
            _fail(inc, "more than the %d bytes announced arrived" % len(inc.data)
                  if isinstance(data, str) else "restore_data's data is not a string")
            return
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            _fail(inc, "restore_data's data is not base64")
            return
        if len(raw) > room:
            _fail(inc, "more than the %d bytes announced arrived" % len(inc.data))
            return
        inc.data[inc.pos:inc.pos + len(raw)] = raw
        inc.pos += len(raw)
    if msg.get("end") is True:
        _incoming = None
        if inc.pos != len(inc.data):
            _fail(inc, "the snapshot ended after %d of its %d bytes" % (inc.pos, len(inc.data)))
        else:
            state.exec_queue.put({"type": "restore", "id": inc.id, "snapshot": inc.data})


channel.handlers["snapshot"] = on_snapshot
channel.handlers["restore"] = on_restore
channel.handlers["restore_data"] = on_restore_data


# ------------------------------------------------------------------------------- fork


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _fork_check(name):
    """Check a fork's name (ValueError) and that it is made during a cell (McpError). The rule
    is run_python's for `session`, the one the bridge checks again."""
    if not isinstance(name, str) or not 1 <= len(name) <= 64 or not set(name) <= _NAME_CHARS:
        raise ValueError("the session name %s must be 1-64 characters of letters, digits, '-', '_' "
                         "or '.' (the names run_python takes)" % ascii(name)[:160])
    if state.forked:
        raise rpc.McpError("runtime.fork() is not available in a forked child process")
    if state.running is None:
        raise rpc.McpError("no run_python call is active: runtime.fork() works only while a cell runs")


def _fork_limit(answer):
    """The limit in the host's answer to the fork's first request (`begin`)."""
    limit = answer.get("limit") if isinstance(answer, dict) else None
    if not channel.is_int(limit) or limit < 0:
        raise rpc.McpError("the bridge did not say how large a snapshot may be")
    if limit == 0:
        raise SnapshotError("snapshots are off (snapshot_max_size = 0)")
    return limit


def _fork_snapshot(limit):
    """Send the snapshot as `snap` frames of the running exec; SnapshotError when it could not
    be written."""
    ex = state.running
    if ex is None:
        raise rpc.McpError("no run_python call is active: runtime.fork() works only while a cell runs")
    error, info = write(ex.id, limit)
    if error is not None:
        largest = ", ".join("%s (%d bytes)" % (v["name"], v["size"]) for v in info.get("largest") or ())
        raise SnapshotError("%s; the largest values: %s" % (error, largest) if largest else error, info)


def _fork_params(name, reset, begin=False):
    params = {"session": name}
    if reset:
        params["reset"] = True
    if begin:
        params["begin"] = True
    return params


async def fork(name, reset=False):
    """Start another session, `name`, from this one: a snapshot of this session's state (its
    variables, functions, classes and imports, and its notebook's cells) becomes the state of
    session `name`, which a later run_python call with session="<name>" continues; this
    session goes on unchanged. Values that cannot be pickled (open files, sockets, threads,
    generators...) are left out and listed. Returns the bridge's answer: {session, size, lost}.
    A session `name` that exists is replaced only with reset=True (else the bridge refuses).
    Raises ValueError for a bad name (1-64 characters of letters, digits, '-', '_' or '.', as
    run_python's session), SnapshotError
    when the state is larger than the bridge's snapshot_max_size (it names the largest values)
    or snapshots are off, McpError when the bridge refuses."""
    _fork_check(name)
    limit = _fork_limit(await rpc.request("fork", _fork_params(name, reset, begin=True)))
    _fork_snapshot(limit)
    return await rpc.request("fork", _fork_params(name, reset))


def fork_sync(name, reset=False):
    """Blocking variant of fork()."""
    _fork_check(name)
    limit = _fork_limit(rpc.request_sync("fork", _fork_params(name, reset, begin=True)))
    _fork_snapshot(limit)
    return rpc.request_sync("fork", _fork_params(name, reset))
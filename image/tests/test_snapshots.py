"""Tests of session snapshots (image/runtime/snapshot.py), driven over the frame protocol of
docs/protocol.md ("Snapshots") as the bridge drives it: a `snapshot` frame between execs,
answered by `snap` frames; their bytes streamed back into a new runtime in `restore` and
`restore_data` frames, answered by `restored`; and `runtime.fork()`, whose `snap` frames carry
its exec's id and come before its `fork` rpc.

The runtime pickles with cloudpickle when its Python has it, else with the standard pickle: the
round trip runs with each (the standard pickle's case by hiding cloudpickle from the runtime), and
a case that needs a package its Python lacks (cloudpickle, numpy, pandas) is skipped saying so.
"""

import base64
import json
import re
import time

import pytest

from test_runtime import MAX_FRAME_BYTES, TEST_IMAGE, HostError, Sandbox, _export
from test_runtime import _shared, fresh, sb  # noqa: F401  (the runtimes the tests drive)

PIECE = 1024 * 1024  # the most bytes a `snap` frame carries


def _frame(sb):
    """The runtime's next frame that is not a `log` frame."""
    while True:
        frame = sb.next_frame()
        if frame["type"] != "log":
            return frame


def snapshot(sb, limit=1 << 30):
    """Ask for a snapshot as the host does between execs: (its bytes, its frames, the end frame)."""
    sid = next(sb._ids)
    sb.send({"type": "snapshot", "id": sid, "limit": limit})
    frames = []
    while True:
        frame = _frame(sb)
        assert frame["type"] == "snap" and frame["id"] == sid, frame
        frames.append(frame)
        if frame.get("end"):
            return snap_bytes(frames), frames, frame


def snap_bytes(frames):
    """The bytes of a snapshot's `snap` frames, each checked to be one bounded piece."""
    data = bytearray()
    for frame in frames:
        if frame.get("end"):
            assert "data" not in frame and frame is frames[-1], frame
            continue
        piece = base64.b64decode(frame["data"], validate=True)
        assert 0 < len(piece) <= PIECE
        assert len(json.dumps(frame)) < MAX_FRAME_BYTES // 8
        data += piece
    return bytes(data)


def restore(sb, data, piece=768 << 10):
    """Stream a snapshot into `sb` as the host does (`restore`, `restore_data` pieces, the end):
    the `restored` frame."""
    rid = next(sb._ids)
    sb.send({"type": "restore", "id": rid, "size": len(data)})
    for i in range(0, len(data), piece):
        sb.send({"type": "restore_data", "id": rid, "data": base64.b64encode(data[i:i + piece]).decode()})
    sb.send({"type": "restore_data", "id": rid, "end": True})
    return restored(sb, rid)


def restored(sb, rid):
    frame = _frame(sb)
    assert frame["type"] == "restored" and frame["id"] == rid, frame
    return frame


HAS = "__import__('importlib.util').util.find_spec(%r) is not None"


def has(sb, module):
    """Whether the runtime's Python can import `module` (a cell that binds no name but `_`)."""
    return sb.ok(HAS % module).value == "True"


@pytest.fixture
def second():
    """Another runtime, fresh: where a snapshot is restored."""
    s = Sandbox()
    yield s
    s.close()


# ------------------------------------------------------------------------------ round trip


@pytest.mark.parametrize("pickler", ["cloudpickle", "pickle"])
def test_a_snapshot_restores_values_functions_classes_and_imports_in_a_new_runtime(fresh, second, pickler, tmp_path):
    # The first cell: whether cloudpickle is there, or hiding it, as an image without it is.
    first = HAS % "cloudpickle" if pickler == "cloudpickle" else "import sys\nsys.modules['cloudpickle'] = None"
    if fresh.ok(first).value == "False":
        pytest.skip("the runtime's Python has no cloudpickle (the standard pickle's case runs)")
    cells = [first,
        "x = [1, 2, 3]\ny = x\nfrom dataclasses import dataclass",
        "def total(n):\n    return sum(x) * n",
        "class Box:\n    def __init__(self, v):\n        self.v = v\n    def double(self):\n        return Box(self.v * 2)",
        "@dataclass\nclass Point:\n    a: int\n    b: int = 2",
        "import json as j\ng = (i for i in range(3))\nb = Box(21)\npt = Point(1)\nprint('shown')",
    ]
    for code in cells[1:]:
        fresh.ok(code)
    data, frames, end = snapshot(fresh)
    info = end["info"]
    assert "error" not in end and info["pickler"] == pickler
    assert info["size"] == len(data) and data.startswith(b"MCBSNAP1")
    assert info["names"] == sorted(info["names"])
    assert {"x", "y", "total", "Box", "Point", "dataclass", "j", "b", "pt"} <= set(info["names"])
    assert "g" not in info["names"] and info["modules"]["j"] == "json"
    assert [(lost["name"], lost["type"]) for lost in info["lost"]] == [("g", "generator")]
    assert "generator" in info["lost"][0]["why"]
    assert info["cells"] == len(cells)
    assert not [n for n in info["names"] if n.startswith("__") or n == "mcp_servers"]

    r = restore(second, data)
    assert "error" not in r, r
    assert r["lost"] == [] and r["modules"] == [] and r["names"] == info["names"]
    value = second.ok("x, y is x, total(2), Box(4).double().v, isinstance(b, Box), b.v, pt, j.dumps({'a': 1}), "
                      "'g' in globals()").value
    assert value == "([1, 2, 3], True, 12, 8, True, 21, Point(a=1, b=2), '{\"a\": 1}', False)"
    # The functions run in the namespace they were restored into, not in a copy of the old one.
    assert second.ok("x = [10]\ntotal(1)").value == "10"
    # The notebook carries on: the first session's cells, then this one's.
    path = "/workspace/snap.ipynb" if TEST_IMAGE else str(tmp_path / "snap.ipynb")
    _, nb = _export(second, path)
    sources = [c["source"] for c in nb["cells"]]
    assert sources[:len(cells)] == cells and len(sources) == len(cells) + 3
    assert nb["cells"][len(cells) - 1]["outputs"][0]["text"] == "shown\n"
    assert [c["execution_count"] for c in nb["cells"]] == list(range(1, len(cells) + 4))
    # The first runtime is untouched, its generator included.
    assert fresh.ok("next(g), x, total(1), b.v, y is x").value == "(0, [1, 2, 3], 6, 21, True)"


def test_what_the_runtime_put_in_the_namespace_is_left_out(fresh, second):
    server = {"name": "files", "alias": "files", "description": "", "tools": [
        {"name": "read", "alias": "read", "description": "", "input_schema": {"type": "object"}}]}
    fresh.skills = {"skills": [{"name": "double", "description": "", "source": "def double(x):\n    return 2 * x\n"}],
                    "broken": []}
    fresh.ok("import mcp\nfrom mcp import runtime\nfs = mcp_files\nkeep = 1", servers=[server])
    data, _, end = snapshot(fresh)
    info = end["info"]
    # mcp_files, mcp_servers, the skill `double`, the mcp package and dunders: not kept. `runtime`
    # is a module (mcp.runtime), imported again. A proxy the code bound itself is lost, saying why.
    assert info["names"] == ["keep", "runtime"], info
    assert [(lost["name"], lost["type"]) for lost in info["lost"]] == [("fs", "mcp_files")]
    assert "servers=[...]" in info["lost"][0]["why"]
    assert "error" not in restore(second, data)
    assert second.ok("keep, runtime.__name__, 'mcp' in globals()").value == "(1, 'mcp.runtime', False)"


def test_shared_values_stay_shared_and_values_in_a_cycle_are_kept(fresh, second):
    fresh.ok("d = {'k': [1]}\nalias = d['k']\np = []\nq = [p]\np.append(q)")
    data, _, end = snapshot(fresh)
    assert {"d", "alias", "p", "q"} <= set(end["info"]["names"]) and end["info"]["lost"] == []
    assert "error" not in restore(second, data)
    # A value of another name is that name's value; values that contain each other are kept,
    # each whole (the cycle inside each is kept, the sharing between the two is not).
    assert second.ok("alias is d['k'], p[0][0] is p, q[0][0] is q").value == "(True, True, True)"


def test_a_value_that_cannot_be_pickled_is_lost_and_so_is_what_refers_to_it(fresh, second):
    fresh.ok("import threading\nlock = threading.Lock()\nholder = [lock]\nfine = 1\n"
             "def locked():\n    with lock:\n        return fine")
    data, _, end = snapshot(fresh)
    lost = {entry["name"]: entry for entry in end["info"]["lost"]}
    assert set(lost) == {"lock", "holder"} and lost["lock"]["type"] == "lock"
    assert lost["holder"]["why"] == "it refers to lock, which is not kept"
    # A function is kept whatever the globals it names: it finds them in the namespace it runs in.
    assert {"fine", "threading", "locked"} <= set(end["info"]["names"])
    assert "error" not in restore(second, data)
    assert second.ok("lock = threading.Lock()\nlocked()").value == "1"


def test_what_cannot_be_restored_is_lost_and_the_rest_restored(fresh, second):
    # A module that cannot be imported again, and a value whose reconstruction fails there.
    fresh.ok("import sys, types\nsys.modules['made_here'] = fake = types.ModuleType('made_here')\n"
             "class Bomb:\n    def __reduce__(self):\n        return (int, ('not a number',))\n"
             "bomb = Bomb()\nsafe = {'a': 1}")
    data, _, end = snapshot(fresh)
    assert "error" not in end and {"fake", "bomb", "safe"} <= set(end["info"]["names"])
    r = restore(second, data)
    assert "error" not in r and r["modules"] == ["made_here"]
    lost = {entry["name"]: entry for entry in r["lost"]}
    assert set(lost) == {"fake", "bomb"} and lost["fake"]["type"] == "module"
    assert "made_here" in lost["fake"]["why"] and "ValueError" in lost["bomb"]["why"]
    assert lost["bomb"]["type"] == "Bomb"
    assert second.ok("safe, 'bomb' in globals(), 'fake' in globals()").value == "({'a': 1}, False, False)"


def test_what_pickling_and_unpickling_print_belongs_to_no_exec(fresh, second):
    fresh.ok("import sys\nclass Loud:\n    def __reduce__(self):\n        print('pickling!')\n"
             "        print('to stderr', file=sys.stderr)\n        return (print, ('unpickling!',))\nloud = Loud()")
    data, _, end = snapshot(fresh)
    assert "error" not in end
    r = fresh.run("print('after')")
    assert r.stdout == "after\n" and r.stderr == ""
    assert "error" not in restore(second, data)
    r = second.run("print('after')")
    assert r.stdout == "after\n" and r.stderr == ""


def test_a_large_snapshot_is_sent_in_pieces_and_restored_from_small_ones(fresh, second):
    fresh.ok("import os\nblob = os.urandom(3 * 1024 * 1024 + 5)\nwords = ['w%d' % i for i in range(50000)]")
    data, frames, end = snapshot(fresh)
    assert len(frames) >= 5 and end["info"]["size"] == len(data)
    assert end["info"]["largest"][0]["name"] == "blob"
    assert "error" not in restore(second, data, piece=100_003)
    digest = "import hashlib\nhashlib.sha256(blob).hexdigest(), len(blob), words[-1]"
    assert second.ok(digest).value == fresh.ok(digest).value


def test_the_info_of_a_snapshot_is_bounded_and_says_how_much_it_left_out(fresh, second):
    fresh.ok("for i in range(250):\n    globals()['v%03d' % i] = i\n    globals()['g%03d' % i] = (n for n in ())\n"
             "globals()['long' * 100] = 1\nglobals()[7] = 'not a name'\ndel i")
    data, _, end = snapshot(fresh)
    info = end["info"]
    assert len(info["names"]) == 200 and info["more_names"] == 51 and len(info["lost"]) == 200
    assert info["more_lost"] == 51  # 250 generators and the key 7
    assert all(len(n) <= 200 for n in info["names"]) and len(json.dumps(end)) < 200_000
    r = restore(second, data)
    assert len(r["names"]) == 200 and r["more_names"] == 51 and r["lost"] == []
    assert second.ok("v249 + len(globals()['long' * 100] * 'x')").value == "250"


# ------------------------------------------------------------------------------ the limit


def test_a_state_over_the_limit_keeps_what_fits_and_names_the_rest_lost(fresh, second):
    # `holder` refers to `big`: it cannot be restored without it, so it goes too.
    fresh.ok("big = bytearray(300000)\nmid = 'y' * 50000\nsmall = list(range(10))\nholder = [big]")
    data, frames, end = snapshot(fresh, limit=100000)
    assert "error" not in end and 0 < len(data) <= 100000 and end["info"]["size"] == len(data), end
    lost = {entry["name"]: entry for entry in end["info"]["lost"]}
    assert set(lost) == {"big", "holder"}, lost
    assert re.fullmatch(r"3\d{5} bytes; the snapshot with it would be over snapshot_max_size \(100000 bytes\)",
                        lost["big"]["why"]), lost["big"]
    assert lost["holder"]["why"] == "it refers to big, which is not kept"
    assert {"mid", "small"} <= set(end["info"]["names"]) and "big" not in end["info"]["names"]
    r = restore(second, data)
    assert "error" not in r, r
    assert second.ok("len(mid), small[-1], 'big' in globals()").value == "(50000, 9, False)"


def test_a_state_whose_kept_part_is_over_the_limit_sends_no_data(fresh):
    # Modules and statements are always kept: when they alone do not fit, nothing is sent.
    fresh.ok("import json, os, sys, re, math, struct, base64, textwrap")
    data, frames, end = snapshot(fresh, limit=40)
    assert frames == [end] and data == b""
    assert re.fullmatch(r"the session's state is \d+ bytes, over snapshot_max_size \(40 bytes\)", end["error"])


# -------------------------------------------------------------------- what is not a snapshot


def test_a_snapshot_frame_without_a_limit_is_answered_with_an_error(sb):
    sb.send({"type": "snapshot", "id": 99_999, "limit": "all"})
    frame = _frame(sb)
    assert frame["type"] == "snap" and frame["id"] == 99_999 and frame["end"] and "limit" in frame["error"]
    assert sb.ok("'served'").value == "'served'"



def test_a_snapshot_that_cannot_be_read_is_refused_and_the_runtime_serves_on(fresh, second):
    fresh.ok("kept = 42")
    data, _, _ = snapshot(fresh)
    for bad, words in [
        (b"", "not a snapshot"),
        (b"garbage, not a snapshot at all" * 10, "not a snapshot"),
        (data[:7] + b"9" + data[8:], "format '9'"),
        (data[:len(data) // 2], "cut short"),
        (data[:-1], "cut short"),
        (data + b"\0", "1 bytes after its end"),
        (data[:12] + b"\xff" + data[13:], "header"),
    ]:
        r = restore(second, bad)
        assert words in r.get("error", ""), (words, r)
        assert set(r) == {"type", "id", "error"}

    # Frames that do not make a snapshot are refused at once; the rest of that restore is dropped.
    def start(size):
        rid = next(second._ids)
        second.send({"type": "restore", "id": rid, "size": size})
        return rid

    def piece(rid, raw=b"abcd", text=None):
        second.send({"type": "restore_data", "id": rid, "data": text or base64.b64encode(raw).decode()})

    def finish(rid):
        second.send({"type": "restore_data", "id": rid, "end": True})

    rid = start(3)
    piece(rid, b"abcd")
    assert "more than the 3 bytes" in restored(second, rid)["error"]
    finish(rid)
    rid = start(8)
    piece(rid, text="not base64!")
    assert "not base64" in restored(second, rid)["error"]
    finish(rid)
    rid = start(8)
    piece(rid + 1000)
    assert "another restore" in restored(second, rid)["error"]
    finish(rid)
    rid = start(8)
    piece(rid)
    finish(rid)
    assert restored(second, rid)["error"] == "the snapshot ended after 4 of its 8 bytes"
    second.send({"type": "restore", "id": next(second._ids), "size": -1})
    assert "size" in _frame(second)["error"]
    # Nothing was bound, and the runtime still takes a good snapshot and runs code.
    assert second.ok("'kept' in globals()").value == "False"
    assert "error" not in restore(second, data)
    assert second.ok("kept").value == "42"


# ----------------------------------------------------------------------------------- fork


def test_fork_sends_its_snapshot_as_frames_of_its_exec_then_asks_the_host(fresh, second):
    calls = []

    def host(method, params):
        calls.append((method, params))
        if params.get("begin"):
            return {"limit": 256 << 20}
        return {"session": params["session"], "size": 1234, "lost": []}

    r = fresh.run("from mcp import runtime\nw = 41\nres = await runtime.fork('b')\nres", rpc=host)
    assert r.status == "ok", r.error
    # First: may it, and how large; then the snapshot; then: keep it.
    assert calls == [("fork", {"session": "b", "begin": True}), ("fork", {"session": "b"})]
    assert r.value == "{'session': 'b', 'size': 1234, 'lost': []}"
    snaps = [f for f in r.frames if f["type"] == "snap"]
    eid = r.result["id"]
    assert snaps and all(f["id"] == eid for f in snaps)
    assert snaps[-1].get("end") and "error" not in snaps[-1]
    assert r.frames.index(r.rpcs[0]) < r.frames.index(snaps[0])
    assert r.frames.index(snaps[-1]) < r.frames.index(r.rpcs[1])
    data = snap_bytes(snaps)
    assert snaps[-1]["info"]["size"] == len(data) and "w" in snaps[-1]["info"]["names"]
    # What it sent is the session as it was at the fork: `res` came after it.
    assert "error" not in restore(second, data)
    assert second.ok("w, 'res' in globals(), runtime.__name__").value == "(41, False, 'mcp.runtime')"
    # The blocking variant, and a refusal by the host raised as other requests' are.
    r = fresh.run("runtime.fork_sync('c')", rpc=host)
    assert r.status == "ok" and "'session': 'c'" in r.value
    # reset=True asks the host to replace a session of that name; said only when asked.
    r = fresh.run("await runtime.fork('c', reset=True)", rpc=host)
    assert r.status == "ok" and calls[-2:] == [("fork", {"session": "c", "reset": True, "begin": True}),
                                               ("fork", {"session": "c", "reset": True})]

    def refuse(method, params):
        raise HostError("a session named 'c' exists")

    r = fresh.run("runtime.fork_sync('c')", rpc=refuse)
    assert r.error["type"] == "McpError" and "exists" in r.error["message"]
    # Refused at the first request: nothing was pickled or sent.
    assert not [f for f in r.frames if f["type"] == "snap"] and len(r.rpcs) == 1


def _limit(n):
    """A host that allows forks of at most `n` bytes (and keeps none: it is never asked)."""
    def host(method, params):
        assert params.get("begin"), params
        return {"limit": n}
    return host


def test_fork_over_the_limit_raises_snapshot_error_and_asks_nothing(fresh):
    fresh.ok("big = b'x' * 5000\nfrom mcp import runtime")
    r = fresh.run("try:\n    await runtime.fork('b')\nexcept runtime.SnapshotError as e:\n    err = e\n"
                  "str(err), isinstance(err, runtime.McpError), err.info['largest'][0]['name']",
                  rpc=_limit(2000))
    assert r.status == "ok" and len(r.rpcs) == 1, r.error
    message, is_mcp, largest = eval(r.value)
    assert re.fullmatch(r"the session's state is \d+ bytes, over snapshot_max_size \(2000 bytes\); "
                        r"the largest values: big \(\d+ bytes\).*", message), message
    assert is_mcp and largest == "big"
    snaps = [f for f in r.frames if f["type"] == "snap"]
    assert len(snaps) == 1 and snaps[0]["end"] and snaps[0]["id"] == r.result["id"]
    # Snapshots off: nothing is written at all.
    r = fresh.run("runtime.fork_sync('b')", rpc=_limit(0))
    assert r.error["type"] == "SnapshotError" and r.error["message"] == "snapshots are off (snapshot_max_size = 0)"
    assert not [f for f in r.frames if f["type"] == "snap"] and len(r.rpcs) == 1


def test_an_interrupted_fork_ends_its_frames_and_asks_nothing(fresh):
    fresh.ok("import time\nclass Slow:\n    def __reduce__(self):\n        print('started', flush=True)\n"
             "        time.sleep(100)\nslow = Slow()\nfrom mcp import runtime")
    eid = fresh.start("await runtime.fork('b')")

    def on_frame(frame):
        if frame["type"] == "output" and "started" in frame["data"]:
            fresh.send({"type": "interrupt", "id": eid})

    t0 = time.monotonic()
    r = fresh.collect(eid, rpc=_limit(256 << 20), on_frame=on_frame, timeout=20)
    elapsed = time.monotonic() - t0
    assert r.status == "interrupted" and elapsed < 10 and len(r.rpcs) == 1
    snaps = [f for f in r.frames if f["type"] == "snap"]
    assert [f.get("error") for f in snaps] == ["the snapshot was interrupted"] and snaps[0]["end"]
    assert fresh.ok("del slow\n1").value == "1"


@pytest.mark.parametrize("name", ["''", "'a\\nb'", "'x' * 65", "5", "'tab\\there'", "'\\x85'", "'../x'", "'a/b'",
                                  "'/abs'", "'alice/work'", "' '", "'\\u202ework'", "'a\\u200bb'", "'\\u2066x'"])
def test_fork_refuses_a_bad_session_name(sb, name):
    r = sb.run("from mcp import runtime\nruntime.fork_sync(%s)" % name)
    assert r.error["type"] == "ValueError" and "must be 1-64 characters of letters, digits" in r.error["message"], r.error
    assert not [f for f in r.frames if f["type"] in ("snap", "rpc")]


def test_fork_outside_a_cell_is_an_mcp_error(fresh):
    # A thread the code left running calls fork() after its cell ended: no exec to send it with.
    fresh.ok("import threading, time\nfrom mcp import runtime\nout = []\n"
             "def later():\n    time.sleep(0.2)\n"
             "    try:\n        runtime.fork_sync('b')\n    except Exception as e:\n        out.append(e)\n"
             "t = threading.Thread(target=later)\nt.start()")
    time.sleep(1)
    r = fresh.run("t.join()\ntype(out[0]).__name__, str(out[0])")
    assert eval(r.value) == ("McpError", "no run_python call is active: runtime.fork() works only while a cell runs")
    assert not [f for f in r.frames if f["type"] in ("snap", "rpc")]


# --------------------------------------------------------------------------- numpy, pandas


def test_numpy_arrays_are_written_out_of_band_and_restored_without_copies(fresh, second):
    if not has(fresh, "numpy"):
        pytest.skip("numpy is not importable by the runtime's Python")
    fresh.ok("import numpy as np\na = np.arange(1_000_000, dtype=np.float64)\nf = np.asfortranarray(a.reshape(1000, 1000))\n"
             "s = a[::3]\nro = np.ones(10)\nro.flags.writeable = False")
    data, _, end = snapshot(fresh)
    info = end["info"]
    assert "error" not in end and info["modules"] == {"np": "numpy"}
    # The buffers are the arrays' bytes, once each: no copy inside the pickle as well.
    assert 2 * 8_000_000 < info["size"] < 2 * 8_000_000 + 3_000_000
    assert {v["name"] for v in info["largest"][:2]} == {"a", "f"}
    assert "error" not in restore(second, data)
    r = second.ok("float(a.sum()), a.flags.writeable, a.flags.owndata, a.ctypes.data % 16, f.flags.f_contiguous, "
                  "bool((f == a.reshape(1000, 1000)).all()), bool((s == a[::3]).all()), ro.flags.writeable")
    assert r.value == "(499999500000.0, True, False, 0, True, True, True, False)"


def test_pandas_frames_round_trip(fresh, second):
    if not has(fresh, "pandas"):
        pytest.skip("pandas is not importable by the runtime's Python")
    fresh.ok("import pandas as pd\ndf = pd.DataFrame({'k': range(100000), 'v': [i / 7 for i in range(100000)], "
             "'s': ['r%d' % (i % 13) for i in range(100000)]})\ncats = df['s'].astype('category')")
    data, _, end = snapshot(fresh)
    assert "error" not in end and end["info"]["modules"] == {"pd": "pandas"}
    assert "error" not in restore(second, data)
    digest = "import hashlib\nhashlib.sha256(pd.util.hash_pandas_object(df).values.tobytes()).hexdigest(), str(cats.dtype)"
    assert second.ok(digest).value == fresh.ok(digest).value

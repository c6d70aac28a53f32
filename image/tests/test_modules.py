"""Tests of the runtime's modules one by one, in this process: the package is installed by the
real loader (image/loader.py) from a boot frame whose entry module only takes the host's
constants, so each module is compiled when first used, as in the sandbox, and nothing is started
(no fds moved, no threads, no seccomp filter). What only the whole runtime does (frames, fds,
interrupts) is tested through the frame protocol in test_runtime.py.
"""

import ast
import asyncio
import collections
import inspect
import json
import os
import struct
import sys
import threading
import typing

import pytest

from test_runtime import HOST_CONSTANTS, LOADER, MODULES, PNG_1x1, boot_frame

PACKAGE = "__mcp_bridge_runtime__"


@pytest.fixture(scope="module")
def rt():
    probe = ("from . import constants\n\n\ndef main(frame, frames_in):\n    frames_in.close()\n"
             "    assert not constants.apply(frame['constants'])\n")
    data = json.dumps(boot_frame(modules=dict(MODULES, test_probe=probe), entry="test_probe")).encode() + b"\n"
    try:  # the loader reads fd 0: a pipe holding the frame is put there for the time it takes
        saved = os.dup(0)
    except OSError:  # no fd 0 at all: the pipe's read end becomes it
        saved = None
    r, w = os.pipe()

    def feed():
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
        os.close(w)

    writer = threading.Thread(target=feed)
    writer.start()
    if r != 0:
        os.dup2(r, 0)
        os.close(r)
    try:
        exec(LOADER, {"__name__": "loader"})
    finally:
        if saved is None:
            os.close(0)
        else:
            os.dup2(saved, 0)
            os.close(saved)
        writer.join()
    yield sys.modules[PACKAGE]
    for name in [k for k in sys.modules if k == PACKAGE or k.startswith(PACKAGE + ".")]:
        del sys.modules[name]


# ------------------------------------------------------------------------- the package's shape


def _imports(source):
    """The sibling modules a module imports, and whether it imports names out of one."""
    mods, names = set(), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module is None:
                mods.update(a.name for a in node.names)
            else:
                names.append(node.module)
    return mods, names


def test_modules_import_modules_downwards_only_and_the_api_only_from_package():
    graph = {}
    for name, source in MODULES.items():
        mods, names = _imports(source)
        # `from . import x` and `x.name` at the point of use: a module's names are looked up when
        # used (the host's constants are set at boot, a test may replace one), and the loader
        # compiles a module when it is first imported this way.
        assert names == [], "%s imports names out of %s" % (name, names)
        assert mods <= set(MODULES), (name, mods - set(MODULES))
        graph[name] = mods
    done, order = set(), []

    def visit(name, path):
        assert name not in path, "import cycle: %s" % " -> ".join(path + [name])
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, path + [name])
        done.add(name)
        order.append(name)

    for name in sorted(graph):
        visit(name, [])
    # The public API imports the machinery; only the `mcp` package's builder imports it.
    assert [m for m in graph if "api" in graph[m]] == ["package"]
    # Everything is reachable from the entry module: the loader compiles nothing else.
    reach, todo = set(), ["boot"]
    while todo:
        m = todo.pop()
        if m not in reach:
            reach.add(m)
            todo.extend(graph[m])
    assert reach == set(MODULES)


def test_every_module_says_what_it_is_for():
    for name, source in MODULES.items():
        doc = ast.get_docstring(ast.parse(source))
        assert doc and len(doc) > 80, name


def test_the_loader_installs_a_package_of_lazily_compiled_modules(rt):
    assert rt.__name__ == PACKAGE and rt.__path__ == []
    assert rt.values is sys.modules[PACKAGE + ".values"] and rt.values.__package__ == PACKAGE
    with pytest.raises(AttributeError):
        rt.no_such_module
    assert not hasattr(rt, "__wrapped__")  # what tools probe for is an AttributeError, not another
    code = rt.values.convert_result.__code__
    assert code.co_filename == "<mcp-bridge-runtime/values.py>"
    assert code.co_filename.startswith(rt.constants.RUNTIME_FILES)


# --------------------------------------------------------------------------------- constants


def test_the_hosts_constants_are_taken_from_the_boot_frame(rt, monkeypatch):
    c = rt.constants
    assert (c.MAX_FRAME_BYTES, c.MAX_IMAGE_BYTES, c.OUT_DIR, c.OUT_ENTRIES, c.SKILL_DEFAULT_DEPTH) == (
        HOST_CONSTANTS["max_frame_bytes"], HOST_CONSTANTS["max_image_bytes"], HOST_CONSTANTS["out_dir"],
        HOST_CONSTANTS["out_entries"], HOST_CONSTANTS["skill_default_depth"])
    for name, _ in c.FROM_HOST.values():
        monkeypatch.setattr(c, name, getattr(c, name))
    assert c.apply(dict(HOST_CONSTANTS, out_entries=5)) == [] and c.OUT_ENTRIES == 5
    # Missing, of another type, a bool for a number: named, and not taken.
    wrong = c.apply({"max_frame_bytes": True, "max_image_bytes": "6", "out_dir": 1, "out_entries": 7})
    assert wrong == ["max_frame_bytes", "max_image_bytes", "out_dir", "kept_dir", "skill_default_depth"]
    assert c.OUT_ENTRIES == 7 and c.MAX_FRAME_BYTES == HOST_CONSTANTS["max_frame_bytes"]
    assert c.apply(None) == list(c.FROM_HOST)


# ----------------------------------------------------------------------------------- channel


def test_frames_are_one_line_of_utf8_whatever_the_values(rt):
    enc = rt.channel.encode
    line = enc({"type": "output", "data": "a\nb \u2026 \ud800 end"})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line)["data"] == "a\nb \u2026 ? end"  # a lone surrogate cannot be UTF-8
    assert json.loads(enc({"v": float("nan"), "o": object()}))["o"].startswith("<object object")
    with pytest.raises(ValueError):
        enc({"v": float("nan")}, strict=True)
    Point = collections.namedtuple("Point", "x y")
    import dataclasses
    import datetime
    import pathlib

    @dataclasses.dataclass
    class D:
        a: int

    args = {"set": {1}, "path": pathlib.PurePosixPath("/a"), "when": datetime.date(2024, 1, 2),
            "dc": D(3), "tuple": Point(1, 2), "map": collections.OrderedDict(k=1)}
    assert json.loads(enc(args, strict=True)) == {
        "set": [1], "path": "/a", "when": "2024-01-02", "dc": {"a": 3}, "tuple": [1, 2], "map": {"k": 1}}
    with pytest.raises(TypeError):
        enc({"o": object()}, strict=True)


def test_frames_in_go_where_they_belong(rt, monkeypatch):
    import queue

    q = queue.Queue()
    monkeypatch.setattr(rt.state, "exec_queue", q)
    monkeypatch.setattr(rt.state, "queued", set())
    logged = []
    monkeypatch.setattr(rt.channel, "log", logged.append)
    rt.channel.dispatch({"type": "exec", "id": 3, "code": "1"})
    rt.channel.dispatch({"type": "exec", "id": True, "code": "1"})  # a bool is not an id
    assert q.get_nowait()["id"] == 3 and q.empty() and rt.state.queued == {3}
    assert logged == ["ignored an exec frame without an integer id and a code string"]
    waiting = rt.channel.Pending(event=threading.Event())
    monkeypatch.setitem(rt.channel.pending, 9, waiting)
    rt.channel.dispatch({"type": "rpc_result", "id": 8, "ok": True})  # nobody waits for 8
    assert not waiting.event.is_set()
    rt.channel.dispatch({"type": "rpc_result", "id": 9, "ok": True, "result": 1})
    assert waiting.event.is_set() and waiting.msg["result"] == 1
    rt.channel.dispatch({"type": "something new"})  # ignored


# ------------------------------------------------------------------------------------- rpc


def test_a_request_names_the_running_exec_and_must_fit_in_a_frame(rt, monkeypatch):
    with pytest.raises(rt.rpc.McpError, match="no run_python call is active"):
        rt.rpc.request_sync("list_servers", {})
    monkeypatch.setattr(rt.state, "running", rt.interrupts.Exec(7, 100))
    sent = []

    def answer(data):
        frame = json.loads(data)
        sent.append(frame)
        rt.channel.pending[frame["id"]].resolve({"ok": False, "kind": "denied", "error": "no"})
        return True

    monkeypatch.setattr(rt.channel, "send_bytes", answer)
    with pytest.raises(rt.rpc.ToolDenied, match="no"):
        rt.rpc.request_sync("call_tool", {"server": "s"})
    assert sent[0]["exec"] == 7 and sent[0]["method"] == "call_tool" and not rt.channel.pending
    monkeypatch.setattr(rt.constants, "MAX_FRAME_BYTES", 2048)
    with pytest.raises(rt.rpc.McpError, match="request too large: .* at most 2048 bytes"):
        rt.rpc.request_sync("call_tool", {"x": "y" * 2000})
    with pytest.raises(TypeError, match="cannot be sent as JSON"):
        rt.rpc.request_sync("call_tool", {"x": float("inf")})


# ---------------------------------------------------------------------------------- values


def _result(*content, **fields):
    return dict({"content": list(content)}, **fields)


def test_tool_results_become_python_values(rt):
    conv = rt.values.convert_result
    res = _result({"type": "text", "text": "ignored"}, structuredContent={"a": [1, 2]})
    v = conv(res)
    assert v == {"a": [1, 2]} and type(v).__name__ == "ToolDict" and v.mcp_result is res
    # FastMCP wraps a non-object result as {"result": ...} and says so in its output schema.
    wrapped = _result(structuredContent={"result": [3]})
    assert conv(wrapped, {"output_schema": {"x-fastmcp-wrap-result": True}}) == [3]
    assert conv(wrapped) == {"result": [3]}
    assert conv(_result({"type": "text", "text": ' {"k": 1} '})) == {"k": 1}
    text = conv(_result({"type": "text", "text": "plain words"}))
    assert text == "plain words" and type(text).__name__ == "ToolStr"
    assert conv(_result({"type": "text", "text": "[1, 2"})) == "[1, 2"  # not JSON: the text
    assert conv(_result({"type": "text", "text": "a"}, {"type": "text", "text": "b"})) == ["a", "b"]
    assert conv(_result()) is None and conv("not a dict") == "not a dict"
    import base64

    img = conv(_result({"type": "image", "data": base64.b64encode(PNG_1x1).decode(), "mimeType": "image/png"}))
    assert isinstance(img, rt.values.Image) and img.data == PNG_1x1 and img.mcp_result is not None
    assert repr(img) == "<Image image/png, %d bytes 1x1>" % len(PNG_1x1)
    bad = conv(_result({"type": "audio", "data": "!!not base64!!"}))
    assert isinstance(bad, rt.values.Audio) and bad.data == b"" and bad.mime == "audio/wav"
    mixed = conv(_result({"type": "text", "text": "t"},
                         {"type": "resource", "resource": {"uri": "file:///a", "blob": "aGk=", "x": 1}},
                         {"type": "resource_link", "uri": "file:///b", "name": "b", "other": 2}))
    assert mixed[0] == "t" and mixed[1] == {"type": "resource", "uri": "file:///a", "blob": b"hi"}
    assert mixed[1].uri == "file:///a" and mixed[2] == {"type": "resource_link", "uri": "file:///b", "name": "b"}
    with pytest.raises(AttributeError):
        mixed[2].blob


def test_a_tool_error_raises_with_its_text_and_result(rt, monkeypatch):
    conv = rt.values.convert_result
    res = _result({"type": "text", "text": "disk full"}, {"type": "text", "text": "try later"}, isError=True)
    with pytest.raises(rt.rpc.McpToolError) as e:
        conv(res, where="fs.write: ")
    assert str(e.value) == "fs.write: disk full\ntry later" and e.value.mcp_result is res
    monkeypatch.setattr(rt.constants, "MESSAGE_CAP", 10)
    with pytest.raises(rt.rpc.McpToolError, match=r'^\{"code": 5$'):
        conv({"isError": True, "structuredContent": {"code": 5, "detail": "x" * 100}})
    with pytest.raises(rt.rpc.McpToolError, match="the tool reported an error"):
        conv({"isError": True})


# ---------------------------------------------------------------------------------- output


@pytest.fixture
def sent(rt, monkeypatch):
    frames = []
    monkeypatch.setattr(rt.channel, "send", frames.append)
    return frames


def _text(frames, stream=None):
    return "".join(f["data"] for f in frames if stream in (None, f["stream"]))


def test_output_under_the_cap_is_forwarded_live_and_whole(rt, sent):
    router = rt.output.Router()
    router.feed("stdout", b"before any exec")  # belongs to nobody
    router.begin(4, 100)
    router.feed("stdout", b"hello ")
    router.feed("stderr", b"warn\n")
    assert [(f["id"], f["stream"], f["data"]) for f in sent] == [(4, "stdout", "hello "), (4, "stderr", "warn\n")]
    assert router.end() == 0 and len(sent) == 2
    router.feed("stdout", b"after the exec")
    assert router.end() == 0 and len(sent) == 2


def test_output_over_the_cap_keeps_the_head_and_the_tail_and_counts_the_rest(rt, sent):
    router = rt.output.Router()
    router.begin(1, 100)
    for i in range(100):
        router.feed("stdout", b"%04d\n" % i)
    live = _text(sent)
    assert live == "".join("%04d\n" % i for i in range(10))  # the first half, as it came
    dropped = router.end()
    out = _text(sent)
    assert dropped == 500 - 100
    assert out.startswith(live + "\n\u2026 [output truncated: 400 bytes omitted] \u2026\n")
    assert out.endswith("".join("%04d\n" % i for i in range(90, 100)))  # the last half
    assert len(out.encode()) == 100 + len("\n\u2026 [output truncated: 400 bytes omitted] \u2026\n".encode())


def test_each_stream_keeps_half_of_the_tail_when_the_other_floods(rt, sent):
    router = rt.output.Router()
    router.begin(1, 200)
    router.feed("stdout", b"o" * 100)  # the head, all stdout
    router.feed("stderr", b"the last error\n")
    router.feed("stdout", b"x" * 10_000)
    dropped = router.end()
    assert _text(sent, "stderr").endswith("the last error\n")
    tail_out = _text(sent, "stdout")[100:]
    assert tail_out.endswith("x" * (100 - 15)) and "output truncated: %d bytes" % dropped in tail_out
    assert dropped == 100 + 15 + 10_000 - 200


def test_utf8_split_between_writes_or_by_the_cap_is_never_garbled(rt, sent):
    router = rt.output.Router()
    router.begin(1, 1000)
    word = "h\u00e9\u20ac\U0001f600".encode()
    for i in range(len(word)):
        router.feed("stdout", word[i:i + 1])
    router.end()
    assert _text(sent) == "h\u00e9\u20ac\U0001f600"
    del sent[:]
    router.begin(2, 40)
    router.feed("stdout", "\u20ac".encode() * 100)  # 300 bytes of 3-byte characters
    router.end()
    out = _text(sent)
    head, _, tail = out.partition("\n\u2026 [output truncated")
    tail = tail.split("\u2026\n", 1)[1]
    # The head is cut inside a character (a replacement mark at most, never a wrong one); the
    # tail starts at a character's first byte.
    assert set(head) <= {"\u20ac", "\ufffd"} and set(tail) == {"\u20ac"} and head.count("\ufffd") <= 1


def test_trim_left_drops_the_oldest_bytes(rt):
    chunks = collections.deque([(1, b"abc"), (2, b"defg")])
    assert rt.output.trim_left(chunks, 7, 5) == 5 and list(chunks) == [(1, b"c"), (2, b"defg")]
    assert rt.output.trim_left(chunks, 5, 2) == 2 and list(chunks) == [(2, b"fg")]


# ---------------------------------------------------------------------------------- skills


def sales_total(rows, *, column="amount", scale=(1, {"x": [-2.5, None]})):
    """Sum a column."""
    import math

    return math.fsum(r[column] for r in rows)


def decorated(x=len("ab")):
    return x


def test_a_skill_is_exactly_one_function_that_runs_nothing_when_defined(rt):
    definition = rt.skills.definition
    ns = {}
    exec(definition("f", "def f(x: undefined_name = 1) -> also_undefined:\n    return boom()\n", "<s>"), ns)
    assert ns["f"].__annotations__ == {"x": "undefined_name", "return": "also_undefined"}
    exec(definition("g", "async def g():\n    pass\n", "<s>"), ns)
    assert inspect.iscoroutinefunction(ns["g"])
    refused = {
        "def f(): pass\nprint('side effect')\n": "not exactly one function definition (2 top-level",
        "import os\n": "not exactly one function definition (1 top-level",
        "def g(): pass\n": "defines g, not f",
        "@deco\ndef f(): pass\n": "has a decorator",
        "def f(x=len('ab')): pass\n": "a default value is not a literal",
        "def f(*, x=[i for i in range(3)]): pass\n": "a default value is not a literal",
        "def f(x=-y): pass\n": "a default value is not a literal",
    }
    for source, why in refused.items():
        with pytest.raises(ValueError, match=why.replace("(", r"\(")):
            definition("f", source, "<s>")
    definition("f", "def f(x=(1, -2.5, {'a': [None, {1, 2}]}), *, y=+3j): pass\n", "<s>")


def test_a_skills_default_may_nest_as_deep_as_the_host_allows(rt, monkeypatch):
    depth = rt.constants.SKILL_DEFAULT_DEPTH
    ok = "def f(x=%s1%s): pass\n" % ("[" * depth, "]" * depth)
    deep = "def f(x=%s1%s): pass\n" % ("[" * (depth + 1), "]" * (depth + 1))
    rt.skills.definition("f", ok, "<s>")
    with pytest.raises(ValueError, match="not a literal"):
        rt.skills.definition("f", deep, "<s>")
    monkeypatch.setattr(rt.constants, "SKILL_DEFAULT_DEPTH", depth + 1)
    rt.skills.definition("f", deep, "<s>")


def test_save_skill_takes_a_def_with_its_source(rt):
    name, source = rt.skills.skill_source(sales_total)
    assert name == "sales_total" and source.startswith("def sales_total(rows, *") and "math.fsum" in source
    with pytest.raises(ValueError, match="decorated\\(\\) cannot be a skill: a default value is not a literal"):
        rt.skills.skill_source(decorated)
    with pytest.raises(TypeError, match="function defined with def; got builtin_function_or_method"):
        rt.skills.skill_source(len)
    with pytest.raises(ValueError, match="a lambda has no name"):
        rt.skills.skill_source(lambda: 1)
    ns = {}
    exec("def made(): pass", ns)
    with pytest.raises(ValueError, match="source of made\\(\\) is not available"):
        rt.skills.skill_source(ns["made"])


def test_skills_join_the_search_by_their_words(rt, monkeypatch):
    monkeypatch.setattr(rt.skills, "_skills", {"sales_total": "Sum a column.\nMore.", "plot_sales": ""})
    hits = rt.discovery.SearchResults([{"tool": "t", "score": 0.7}])
    hits.skipped = ({"server": "s", "reason": "starting"},)
    merged = rt.skills.with_skill_hits(hits, "sales total", 2)
    assert merged == [{"skill": "sales_total", "description": "Sum a column.", "score": 1.0}, {"tool": "t", "score": 0.7}]
    assert merged.skipped == hits.skipped
    assert rt.skills.with_skill_hits(hits, "nothing alike", 5) is hits


# -------------------------------------------------------------------------------- notebook


def test_the_record_becomes_notebook_cells(rt):
    rec = rt.notebook.NotebookRecord()
    rec.begin(1, "print('a')\nx")
    for frame in ({"type": "output", "id": 1, "stream": "stdout", "data": "a"},
                  {"type": "output", "id": 1, "stream": "stdout", "data": "\n"},
                  {"type": "output", "id": 2, "stream": "stdout", "data": "another exec's"},
                  {"type": "display", "id": 1, "mime": "image/png", "data": "iVBO"},
                  {"type": "output", "id": 1, "stream": "stderr", "data": "warn"}):
        rec.frame(frame)
    rec.finish(1, "ok", "42", None)
    rec.begin(2, "1/0")
    rec.finish(2, "error", None, {"type": "ZeroDivisionError", "message": "division by zero",
                                  "traceback": "Traceback:\n  1/0\nZeroDivisionError"})
    rec.begin(3, "while True: pass")
    rec.finish(3, "interrupted", None, None)
    nb = rec.notebook()
    assert nb["nbformat"] == 4 and nb["nbformat_minor"] == 5
    one, two, three = nb["cells"]
    assert one["id"] == "cell-1" and one["execution_count"] == 1 and one["source"] == "print('a')\nx"
    assert one["outputs"] == [
        {"output_type": "stream", "name": "stdout", "text": "a\n"},
        {"output_type": "display_data", "data": {"image/png": "iVBO", "text/plain": "<image/png image>"}, "metadata": {}},
        {"output_type": "stream", "name": "stderr", "text": "warn"},
        {"output_type": "execute_result", "execution_count": 1, "data": {"text/plain": "42"}, "metadata": {}},
    ]
    assert two["outputs"] == [{"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
                               "traceback": ["Traceback:", "  1/0", "ZeroDivisionError"]}]
    assert three["outputs"][0]["ename"] == "KeyboardInterrupt"


def test_the_record_drops_the_oldest_cells_and_says_so(rt, monkeypatch):
    monkeypatch.setattr(rt.constants, "NOTEBOOK_MAX_CELLS", 3)
    monkeypatch.setattr(rt.constants, "NOTEBOOK_MAX_BYTES", 1 << 20)
    rec = rt.notebook.NotebookRecord()
    for i in range(5):
        rec.begin(i, "cell %d" % i)
        rec.finish(i, "ok", None, None)
    cells = rec.notebook()["cells"]
    assert cells[0]["cell_type"] == "markdown" and cells[0]["source"].startswith("*2 earlier cell(s)")
    assert [c["source"] for c in cells[1:]] == ["cell 2", "cell 3", "cell 4"]
    # A cell's own outputs past the byte bound are counted, not kept; the cell itself stays.
    monkeypatch.setattr(rt.constants, "NOTEBOOK_MAX_BYTES", 100)
    rec.begin(9, "big")
    for _ in range(3):
        rec.frame({"type": "output", "id": 9, "stream": "stdout", "data": "y" * 40})
    rec.finish(9, "ok", None, None)
    last = rec.notebook()["cells"][-1]
    assert last["source"] == "big" and last["outputs"][0]["text"] == "y" * 80
    assert last["outputs"][-1]["text"].startswith("[1 output(s) of this cell not recorded")


def test_a_notebook_larger_than_the_cap_is_not_written(rt, monkeypatch, tmp_path):
    rec = rt.notebook.NotebookRecord()
    rec.begin(1, "print('z' * 5000)")
    rec.frame({"type": "output", "id": 1, "stream": "stdout", "data": "z" * 5000})
    rec.finish(1, "ok", None, None)
    path = rec.write(tmp_path / "sub" / "s.ipynb")
    assert path == str(tmp_path / "sub" / "s.ipynb")
    assert json.loads(open(path, encoding="utf-8").read())["cells"][0]["outputs"][0]["text"] == "z" * 5000
    monkeypatch.setattr(rt.constants, "NOTEBOOK_EXPORT_CAP", 4000)
    with pytest.raises(rt.notebook.NotebookTooLarge, match="would be .* bytes"):
        rec.write(tmp_path / "big.ipynb")
    assert not (tmp_path / "big.ipynb").exists()


def test_saved_cells_come_back_as_the_oldest_of_a_record(rt):
    old = rt.notebook.NotebookRecord()
    old.begin(7, "print('a')")
    old.frame({"type": "output", "id": 7, "stream": "stdout", "data": "a\n"})
    old.finish(7, "ok", "1", None)
    data, count = old.saved()
    assert count == 1
    new = rt.notebook.NotebookRecord()
    new.restore(data)
    new.begin(1, "2")
    new.finish(1, "ok", "2", None)
    cells = new.notebook()["cells"]
    assert [(c["execution_count"], c["source"]) for c in cells] == [(1, "print('a')"), (2, "2")]
    assert cells[0]["outputs"] == old.notebook()["cells"][0]["outputs"]
    for bad in (b"[]", b'{"cells": [{"number": 1}]}', b'{"cells": [{"number": 1, "source": "", "omitted": 0, '
                b'"outputs": [{"output_type": "stream", "text": "not a list"}]}]}', b"not json"):
        with pytest.raises(ValueError):
            rt.notebook.NotebookRecord().restore(bad)


# ------------------------------------------------------------------- discovery and proxies


def test_names_become_identifiers(rt):
    ident = rt.discovery.ident
    assert ident("max-bytes") == "max_bytes" and ident("class") == "class_" and ident("2fa") == "_2fa"
    assert ident("__mcp_x") == "__mcp_x_" and ident("") == "arg" and ident("", fallback="tool") == "tool"
    assert ident("a-b", used={"a_b", "a_b_2"}) == "a_b_3"


def test_a_server_not_loaded_is_explained(rt, monkeypatch):
    monkeypatch.setattr(rt.state, "discovered", ({"name": "file-system", "alias": "file_system"},
                                                 {"name": "git", "alias": "git"}))
    msg = rt.discovery.not_loaded_message("file_system")
    assert msg.startswith("MCP server 'file-system' is not loaded in this run_python call: "
                          'pass "servers": ["file-system"]')
    assert rt.discovery.not_loaded_message("gti") == (
        "No MCP server 'gti' is configured. Did you mean 'git'? Discovered servers: file-system, git.")
    with pytest.raises(KeyError) as e:
        rt.discovery.ServerMap()["git"]
    assert str(e.value).startswith("MCP server 'git' is not loaded")
    err = NameError("name 'mcp_git' is not defined")
    rt.discovery.explain_name_error(err)
    assert str(err).startswith("name 'mcp_git' is not defined. MCP server 'git' is not loaded")


def test_schemas_become_annotations_and_docs(rt):
    py, label = rt.proxies.py_type, rt.proxies.type_label
    assert py({"type": "integer"}) is int and py({"type": ["string", "null"]}) == typing.Optional[str]
    assert py({"anyOf": [{"type": "number"}, {}]}) is typing.Any and py({"enum": ["a", "b"]}) is str
    assert py({"const": 3}) is int and py("nonsense") is typing.Any
    assert label({"type": "array", "items": {"type": "string"}}) == "list[str]"
    assert label({"type": ["integer", "null"]}) == "int | None" and label({"oneOf": [{"type": "boolean"}]}) == "bool"


def test_a_tool_function_has_the_tools_signature_and_calls_it(rt, monkeypatch):
    tool = {"name": "read-file", "alias": "read_file", "description": "Read a file.",
            "input_schema": {"type": "object", "required": ["path"], "properties": {
                "path": {"type": "string"}, "max-bytes": {"type": "integer", "default": 10}, "class": {"type": "boolean"}}},
            "output_schema": {"type": "object"}}
    func = rt.proxies.make_tool("file-system", "file_system", tool)
    assert func is rt.proxies.make_tool("file-system", "file_system", dict(tool))  # built once
    assert str(inspect.signature(func)) == "(path: str, *, max_bytes: int = 10, class_: bool = None)"
    assert func.__module__ == "mcp.servers.file_system" and "(sent as 'max-bytes')" in func.__doc__
    calls = []

    async def request(method, params):
        calls.append((method, params))
        return {"content": [{"type": "text", "text": "[1]"}]}

    monkeypatch.setattr(rt.rpc, "request", request)
    with pytest.raises(rt.rpc.McpError, match="No MCP server 'file-system' is configured"):
        asyncio.run(func("/a"))
    monkeypatch.setattr(rt.state, "loaded", {"file-system": {"name": "file-system"}})
    monkeypatch.setattr(rt.state, "running", rt.interrupts.Exec(1, 100))
    assert asyncio.run(func("/a", class_=True)) == [1]
    # Optional arguments left at their default are not sent; the real names are.
    assert calls == [("call_tool", {"server": "file-system", "tool": "read-file",
                                    "arguments": {"path": "/a", "class": True}})]


# -------------------------------------------------------------------------------- snapshot


def test_values_that_refer_to_each_other_round_a_cycle_are_tangled(rt):
    tangled = rt.snapshot._tangled
    assert tangled({"a": {"b"}, "b": {"c"}, "c": set()}) == set()
    assert tangled({"a": {"b"}, "b": {"a"}, "c": {"a"}, "d": {"c"}}) == {"a", "b"}
    # Between two cycles: no order restores it either. References to names that are no values
    # (modules, statements) are no edges.
    assert tangled({"a": {"b"}, "b": {"a", "m"}, "x": {"a", "y"}, "y": {"x"}}) == {"a", "b", "x", "y"}
    assert tangled({"a": {"a", "m"}}) == {"a"}


def test_a_snapshot_stream_is_read_whole_or_refused(rt, monkeypatch):
    snap = rt.snapshot
    monkeypatch.setattr(rt.state, "ns", {"xs": [1, 2.5, "three"], "same": None, "mod": json, "__name__": "__main__"})
    rt.state.ns["same"] = rt.state.ns["xs"]
    parts, size = snap._layout(snap.collect())
    data = b"".join(bytes(p) for p in parts)
    assert len(data) == size and data.startswith(b"MCBSNAP1")
    records, nb = snap.parse(memoryview(data))
    assert sorted(records) == ["mod", "same", "xs"] and records["mod"] == ("M", "module", "json")
    assert records["xs"][:2] == ("V", "list") and nb is not None
    # Every cut is refused, and every byte changed either still reads or is refused: never
    # another exception, never a read past the end.
    for n in range(len(data)):
        with pytest.raises(snap._Malformed):
            snap.parse(memoryview(data[:n]))
    for i in range(len(data)):
        for flip in (0x01, 0x80, 0xFF):
            changed = bytearray(data)
            changed[i] ^= flip
            try:
                snap.parse(memoryview(changed))
            except snap._Malformed:
                pass


# --------------------------------------------------------------------------------- display


def test_text_is_capped_in_the_middle_and_values_at_the_end(rt):
    assert rt.display.cap_middle("abcdef", 10) == "abcdef"
    assert rt.display.cap_middle("a" * 10 + "b" * 10, 10) == "aaaaa\n\u2026 [10 characters omitted] \u2026\nbbbbb"
    text = rt.display.repr_value("x" * 50, 20)
    assert text.startswith("'xxxx") and text.endswith("\u2026 [2 more characters]")

    class Broken:
        def __repr__(self):
            raise RuntimeError("no")

    assert rt.display.repr_value(Broken()) == "<repr of Broken failed: RuntimeError: no>"
    assert len(rt.display.repr_value(list(range(100_000)))) < rt.constants.VALUE_CAP


def test_images_are_known_by_their_bytes(rt):
    rich = rt.display._rich
    assert rich(PNG_1x1) == ("image/png", PNG_1x1)
    assert rich(b"GIF89a...") == ("image/gif", b"GIF89a...") and rich(b"RIFF\0\0\0\0WEBPVP8 ")[0] == "image/webp"
    assert rich(b"plain bytes") is None and rich("text") is None
    assert rich(rt.values.Image(b"\xff\xd8\xff", "image/jpeg")) == ("image/jpeg", b"\xff\xd8\xff")


# --------------------------------------------------------------------------------- seccomp


def _verdict(prog, arch, nr, *args):
    """What the classic-BPF program answers for one call (seccomp_data: nr at 0, arch at 4,
    args[i] at 16 + 8 * i, low half first; little-endian)."""
    s = rt_seccomp_codes
    words = {0: nr & 0xFFFFFFFF, 4: arch}
    for i in range(6):
        a = args[i] if i < len(args) else 0
        words[16 + 8 * i], words[20 + 8 * i] = a & 0xFFFFFFFF, (a >> 32) & 0xFFFFFFFF
    pc = acc = 0
    for _ in range(len(prog)):
        code, jt, jf, k = prog[pc]
        if code == s["LD_ABS"]:
            acc, pc = words[k], pc + 1
        elif code == s["AND"]:
            acc, pc = acc & k, pc + 1
        elif code == s["RET"]:
            return k
        else:
            taken = {s["JEQ"]: acc == k, s["JGE"]: acc >= k, s["JSET"]: bool(acc & k)}[code]
            pc += 1 + (jt if taken else jf)
    raise AssertionError("the program did not return")


rt_seccomp_codes = {"LD_ABS": 0x20, "JEQ": 0x15, "JGE": 0x35, "JSET": 0x45, "AND": 0x54, "RET": 0x06}
ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050001, 0x00050026
# Independent of the runtime's table: (AUDIT_ARCH, {call: number}) of the kernel's ABI.
ARCHES = {
    "x86_64": (0xC000003E, {"read": 0, "write": 1, "clone": 56, "clone3": 435, "unshare": 272, "setns": 308,
                            "ptrace": 101, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
                            "perf_event_open": 298, "userfaultfd": 323, "mount": 165,
                            "mknod": 133, "mknodat": 259}),
    "aarch64": (0xC00000B7, {"read": 63, "write": 64, "clone": 220, "clone3": 435, "unshare": 97, "setns": 268,
                             "ptrace": 117, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280,
                             "perf_event_open": 241, "userfaultfd": 282, "mount": 40,
                             "mknodat": 33}),
}
CLONE_NEW = {"NS": 0x00020000, "CGROUP": 0x02000000, "UTS": 0x04000000, "IPC": 0x08000000,
             "USER": 0x10000000, "PID": 0x20000000, "NET": 0x40000000}
THREAD_FLAGS = 0x003D0F00  # CLONE_VM | FS | FILES | SIGHAND | THREAD | SYSVSEM | SETTLS | PARENT_SETTID | CHILD_CLEARTID


@pytest.mark.parametrize("machine", sorted(ARCHES))
def test_the_seccomp_program_refuses_exactly_what_it_says(rt, machine):
    arch, nrs = ARCHES[machine]
    prog = rt.seccomp.program(*rt.seccomp._SECCOMP[machine])
    assert len(prog) < 4096 and prog[-1][0] == rt_seccomp_codes["RET"]
    assert all(0 <= i + 1 + j < len(prog) for i, (code, jt, jf, _) in enumerate(prog)
               if code not in (0x20, 0x06) for j in (jt, jf))
    assert rt.seccomp.program(*rt.seccomp._SECCOMP[machine]) == prog
    for name in ("unshare", "setns", "ptrace", "keyctl", "add_key", "request_key", "bpf",
                 "perf_event_open", "userfaultfd"):
        assert _verdict(prog, arch, nrs[name]) == EPERM, name
    assert _verdict(prog, arch, nrs["clone3"]) == ENOSYS
    for flag, bit in CLONE_NEW.items():
        assert _verdict(prog, arch, nrs["clone"], 0x11 | bit) == EPERM, flag
    assert _verdict(prog, arch, nrs["clone"], 0x11) == ALLOW  # fork
    assert _verdict(prog, arch, nrs["clone"], THREAD_FLAGS) == ALLOW  # a thread
    for name in ("read", "write", "mount"):  # the engine's profile decides those
        assert _verdict(prog, arch, nrs[name]) == ALLOW, name
    # A device node is refused wherever it is asked for (gVisor's kernel would make one);
    # fifos, sockets and regular files are the engine's profile's to decide.
    dev = (1 << 8) | 3
    for mode, want in ((0o020666, EPERM), (0o060600, EPERM), (0o010644, ALLOW),
                       (0o140755, ALLOW), (0o100644, ALLOW), (0o644, ALLOW)):
        if "mknod" in nrs:
            assert _verdict(prog, arch, nrs["mknod"], 0x1000, mode, dev) == want, oct(mode)
        assert _verdict(prog, arch, nrs["mknodat"], -100, 0x1000, mode, dev) == want, oct(mode)
        # The mode's bits above the type do not hide it.
        assert _verdict(prog, arch, nrs["mknodat"], -100, 0x1000, mode | (1 << 40), dev) == want
    assert _verdict(prog, arch, 0x40000000 | 1) == EPERM  # x32 ABI
    other = ARCHES["aarch64" if machine == "x86_64" else "x86_64"][0]
    assert _verdict(prog, other, 0) == EPERM and _verdict(prog, 0x40000003, 0) == EPERM  # i386
    # The instructions as the kernel reads them: 8 bytes each.
    assert len(b"".join(struct.pack("=HBBI", *i) for i in prog)) == 8 * len(prog)

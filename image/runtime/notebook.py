"""The session as a notebook: every exec is recorded as a cell (its code, and the output,
display, value and error frames exactly as sent to the host, so what the model saw is what the
notebook shows); `write` turns the record into nbformat 4.5 JSON.

The record lives in this interpreter, so `reset` (a new one) starts an empty record, unless the
session is restored from a snapshot, which carries the record (`saved`, `restore`). It is
bounded in cells and bytes (constants.NOTEBOOK_*), the oldest cells dropped first. The channel
hands it every output and display frame it sends (`record.frame`); the exec loop opens and closes
the cells. `mcp.runtime.export_notebook` is `api.export_notebook`, which settles the output first.
"""

import collections
import json
import os
import platform
import threading

from . import constants


class NotebookTooLarge(ValueError):
    """export_notebook() would write more than NOTEBOOK_EXPORT_CAP bytes."""


class _Cell:
    __slots__ = ("number", "source", "outputs", "size", "omitted", "exec_id")

    def __init__(self, number, exec_id, source):
        self.number = number
        self.exec_id = exec_id
        self.source = source
        self.outputs = []
        self.size = len(source)
        self.omitted = 0  # outputs left out: this cell alone reached NOTEBOOK_MAX_BYTES


class NotebookRecord:
    """The session's cells, oldest first, bounded in number and bytes (oldest dropped)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.cells = collections.deque()
        self.size = 0
        self.count = 0  # execution_count of the last cell begun
        self.dropped = 0
        self.current = None

    def begin(self, exec_id, code):
        half = constants.NOTEBOOK_MAX_BYTES // 2
        with self.lock:
            self.count += 1
            if len(code) > half:
                code = code[:half] + "\n# \u2026 [%d more characters of this cell not recorded]\n" % (len(code) - half)
            cell = _Cell(self.count, exec_id, code)
            self.cells.append(cell)
            self.size += cell.size
            self.current = cell
            self._trim()

    def _trim(self):
        while len(self.cells) > 1 and (len(self.cells) > constants.NOTEBOOK_MAX_CELLS
                                       or self.size > constants.NOTEBOOK_MAX_BYTES):
            old = self.cells.popleft()
            self.size -= old.size
            self.dropped += 1

    def _add(self, cell, output, size):
        if cell.size + size > constants.NOTEBOOK_MAX_BYTES:
            cell.omitted += 1
            return
        outs = cell.outputs
        if (output.get("output_type") == "stream" and outs and outs[-1].get("output_type") == "stream"
                and outs[-1]["name"] == output["name"]):
            outs[-1]["text"].append(output["text"])  # one stream output per run of a stream
        else:
            if output.get("output_type") == "stream":
                output["text"] = [output["text"]]
            outs.append(output)
        cell.size += size
        self.size += size
        self._trim()

    def frame(self, obj):
        """An output or display frame on its way to the host (any thread)."""
        cell = self.current
        if cell is None or obj.get("id") != cell.exec_id:
            return
        kind = obj.get("type")
        data = obj.get("data")
        if not isinstance(data, str) or not data:
            return
        if kind == "output":
            output = {"output_type": "stream", "name": obj.get("stream", "stdout"), "text": data}
        elif kind == "display":
            mime = obj.get("mime") or "text/plain"
            bundle = {mime: data}
            if mime != "text/plain":
                bundle["text/plain"] = "<%s image>" % mime
            output = {"output_type": "display_data", "data": bundle, "metadata": {}}
        else:
            return
        with self.lock:
            if cell is self.current:
                self._add(cell, output, len(data))

    def finish(self, exec_id, status, value, error):
        with self.lock:
            cell = self.current
            if cell is None or cell.exec_id != exec_id:
                return
            self.current = None
            if value is not None:
                self._add(cell, {"output_type": "execute_result", "execution_count": cell.number,
                                 "data": {"text/plain": value}, "metadata": {}}, len(value))
            if error is not None or status == "interrupted":
                error = error or {"type": "KeyboardInterrupt", "message": "", "traceback": ""}
                tb = error.get("traceback") or ""
                self._add(cell, {"output_type": "error", "ename": str(error.get("type", "")),
                                 "evalue": str(error.get("message", "")),
                                 "traceback": tb.splitlines() or [str(error.get("type", ""))]}, len(tb))

    def saved(self):
        """The record as JSON (ASCII bytes) for a snapshot of the session, and how many cells
        it holds; `restore` takes it back in the next sandbox."""
        with self.lock:
            cells = [{"number": c.number, "source": c.source, "outputs": c.outputs, "omitted": c.omitted}
                     for c in self.cells]
            data = json.dumps({"count": self.count, "dropped": self.dropped, "cells": cells})
        return data.encode("ascii"), len(cells)

    def restore(self, data):
        """Take back the cells of a snapshot (`saved`'s JSON) as the oldest of this record, so
        that export_notebook() shows the session's history; ValueError when they are not cells
        `saved` wrote. Bounded as the record is (the oldest dropped)."""
        saved = json.loads(data)
        if not isinstance(saved, dict) or not isinstance(saved.get("cells"), list):
            raise ValueError("the notebook record is not an object with a list of cells")
        cells = [_restored_cell(c) for c in saved["cells"]]
        count, dropped = saved.get("count"), saved.get("dropped")
        with self.lock:
            self.cells.extendleft(reversed(cells))
            self.size += sum(c.size for c in cells)
            self.count = max([self.count] + [c.number for c in cells] + ([count] if _is_int(count) else []))
            self.dropped += dropped if _is_int(dropped) and dropped > 0 else 0
            self._trim()

    def notebook(self):
        """The record as an nbformat 4.5 notebook (a dict)."""
        cells = []
        max_mib = constants.NOTEBOOK_MAX_BYTES >> 20
        with self.lock:
            if self.dropped:
                cells.append({
                    "cell_type": "markdown", "id": "dropped", "metadata": {},
                    "source": "*%d earlier cell(s) of this session were dropped: the record keeps "
                              "at most %d cells and %d MiB.*" % (self.dropped, constants.NOTEBOOK_MAX_CELLS,
                                                                  max_mib),
                })
            for c in self.cells:
                outputs = []
                for o in c.outputs:
                    if o["output_type"] == "stream":
                        o = dict(o, text="".join(o["text"]))
                    outputs.append(o)
                if c.omitted:
                    outputs.append({"output_type": "stream", "name": "stderr",
                                    "text": "[%d output(s) of this cell not recorded: the record keeps at most "
                                            "%d MiB]\n" % (c.omitted, max_mib)})
                cells.append({
                    "cell_type": "code", "id": "cell-%d" % c.number, "metadata": {},
                    "execution_count": c.number,
                    "source": c.source, "outputs": outputs,
                })
        return {
            "nbformat": 4, "nbformat_minor": 5,
            "metadata": {
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                "language_info": {"name": "python", "version": platform.python_version()},
            },
            "cells": cells,
        }

    def write(self, path):
        """Write the record to `path` as a notebook; NotebookTooLarge beyond NOTEBOOK_EXPORT_CAP
        (nothing is written then). Returns the absolute path."""
        path = os.path.abspath(os.fspath(path))
        data = json.dumps(self.notebook(), ensure_ascii=False, indent=1)
        data = data.encode("utf-8", "replace") + b"\n"
        cap = constants.NOTEBOOK_EXPORT_CAP
        if len(data) > cap:
            raise NotebookTooLarge(
                "the notebook would be %d bytes, more than the %d MiB export_notebook() writes; "
                "clear large outputs (images, long prints) by restarting the session with reset, or "
                "save the results you need as files" % (len(data), cap >> 20))
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return path


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _output_size(o):
    """What an output counts in the record's bytes: its text, as `_add` counted it."""
    if o["output_type"] == "stream":
        return sum(len(t) for t in o["text"])
    if o["output_type"] == "error":
        return sum(len(t) for t in o["traceback"])
    return sum(len(v) for v in o["data"].values())


def _restored_cell(c):
    """One cell of a snapshot's record, checked to be what `notebook()` reads."""
    outputs = c.get("outputs") if isinstance(c, dict) else None
    if not (isinstance(c, dict) and _is_int(c.get("number")) and isinstance(c.get("source"), str)
            and isinstance(outputs, list) and _is_int(c.get("omitted"))):
        raise ValueError("a cell of the notebook record is malformed")
    for o in outputs:
        kind = o.get("output_type") if isinstance(o, dict) else None
        if kind == "stream":
            ok = isinstance(o.get("name"), str) and isinstance(o.get("text"), list) and all(
                isinstance(t, str) for t in o["text"])
        elif kind == "error":
            ok = isinstance(o.get("traceback"), list) and all(isinstance(t, str) for t in o["traceback"])
        elif kind in ("display_data", "execute_result"):
            ok = isinstance(o.get("data"), dict) and all(isinstance(v, str) for v in o["data"].values())
        else:
            ok = False
        if not ok:
            raise ValueError("an output of the notebook record is malformed")
    cell = _Cell(c["number"], None, c["source"])  # no exec of this interpreter's: never current
    cell.outputs = outputs
    cell.omitted = c["omitted"]
    cell.size += sum(_output_size(o) for o in outputs)
    return cell


record = NotebookRecord()

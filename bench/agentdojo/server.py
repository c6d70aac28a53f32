#!/usr/bin/env python3
"""One AgentDojo suite as a stdio MCP server (the official `mcp` SDK, low-level server).

Its tools are the suite's own (name, description, input schema from AgentDojo's parameters
model, annotations from dojo.py), run by AgentDojo's FunctionsRuntime over an environment kept
in memory: the suite's default environment with one injection task's attack text in the vectors
one user task shows (as AgentDojo's `important_instructions` attack places it), after that user
task's `init_environment`. A result is one text block of JSON; a tool's error is `isError`.

    python3 server.py --suite banking [--user-task user_task_0] [--injection-task injection_task_1]
                      [--control DIR]

With `--control DIR` the harness steers it beside MCP, never through a tool:
- DIR/pair.json (`{"user_task": ..., "injection_task": ...}`), when present, is the pair loaded
  at start (overriding the flags);
- DIR/control.sock, a Unix socket taking one JSON line per connection and answering one:
  `{"op": "reset", "user_task": ..., "injection_task": ...}` loads that pair afresh,
  `{"op": "dump"}` answers `{"env": <the environment, pickled, base64>, "calls": [...], "pair": ...}`
  (pickled: AgentDojo's models do not survive a JSON round trip, an inbox rebuilds its emails
  from its initial list);
- DIR/final.json: the same dump, written when the server exits (stdin closed, SIGTERM) and on
  SIGUSR1.
`calls` are the tool calls that reached the server since the last reset, in order:
`{"function", "args", "error"}`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio  # noqa: E402
import mcp_types as types  # noqa: E402
from mcp.server.lowlevel import Server  # noqa: E402
from mcp.server.stdio import stdio_server  # noqa: E402

import dojo  # noqa: E402


class State:
    def __init__(self, suite_name: str):
        self.suite_name = suite_name
        self.lock = threading.Lock()
        self.env = None
        self.calls: list[dict] = []
        self.pair: dict = {}

    def reset(self, user_task: str | None, injection_task: str | None) -> None:
        env = dojo.environment(self.suite_name, user_task, injection_task)
        with self.lock:
            self.env = env
            self.calls = []
            self.pair = {"user_task": user_task, "injection_task": injection_task}

    def call(self, tool: str, args: dict):
        with self.lock:
            result, error = dojo.run_tool(self.env, self.suite_name, tool, args)
            self.calls.append({"function": tool, "args": args, "error": error})
        return result, error

    def dump(self) -> dict:
        with self.lock:
            return {
                "suite": self.suite_name,
                "pair": dict(self.pair),
                "env": dojo.env_to_text(self.env),
                "calls": list(self.calls),
            }


def tool_list(suite_name: str) -> list[types.Tool]:
    out = []
    for f in dojo.suite(suite_name).tools:
        schema = f.parameters.model_json_schema()
        schema.pop("title", None)
        schema.setdefault("properties", {})
        out.append(
            types.Tool(
                name=f.name,
                description=f.description,
                input_schema=schema,
                annotations=types.ToolAnnotations(**_hints(suite_name, f.name)),
            )
        )
    return out


def _hints(suite_name: str, tool: str) -> dict:
    names = {
        "readOnlyHint": "read_only_hint",
        "openWorldHint": "open_world_hint",
        "destructiveHint": "destructive_hint",
        "idempotentHint": "idempotent_hint",
    }
    return {names[k]: v for k, v in dojo.annotations(suite_name, tool).items()}


def serve_control(state: State, path: Path) -> None:
    """The harness's control socket, served by a thread."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(4)

    def loop():
        while True:
            conn, _ = sock.accept()
            with conn:
                try:
                    data = b""
                    while not data.endswith(b"\n"):
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    req = json.loads(data or b"{}")
                    if req.get("op") == "reset":
                        state.reset(req.get("user_task"), req.get("injection_task"))
                        answer = {"ok": True, "pair": state.pair}
                    elif req.get("op") == "dump":
                        answer = state.dump()
                    else:
                        answer = {"error": f"unknown op {req.get('op')!r}"}
                except Exception as e:  # the harness sees what went wrong
                    answer = {"error": f"{type(e).__name__}: {e}"}
                conn.sendall(json.dumps(answer).encode() + b"\n")

    threading.Thread(target=loop, daemon=True).start()


def write_final(state: State, control: Path | None) -> None:
    if control is None or state.env is None:
        return
    tmp = control / "final.json.tmp"
    tmp.write_text(json.dumps(state.dump()))
    os.replace(tmp, control / "final.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", required=True, choices=dojo.SUITES)
    ap.add_argument("--user-task")
    ap.add_argument("--injection-task")
    ap.add_argument("--control", type=Path)
    a = ap.parse_args()

    state = State(a.suite)
    pair = {"user_task": a.user_task, "injection_task": a.injection_task}
    if a.control is not None:
        a.control.mkdir(parents=True, exist_ok=True)
        pf = a.control / "pair.json"
        if pf.exists():
            pair = json.loads(pf.read_text())
    state.reset(pair.get("user_task"), pair.get("injection_task"))
    if a.control is not None:
        serve_control(state, a.control / "control.sock")
        signal.signal(signal.SIGUSR1, lambda *_: write_final(state, a.control))

        def on_term(*_):
            write_final(state, a.control)
            os._exit(0)

        signal.signal(signal.SIGTERM, on_term)

    tools = tool_list(a.suite)
    by_name = {t.name for t in tools}

    async def on_list_tools(ctx, params):
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(ctx, params):
        name = params.name
        if name not in by_name:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"ToolNotFoundError: no tool {name!r}")], is_error=True
            )
        result, error = state.call(name, dict(params.arguments or {}))
        if error is not None:
            return types.CallToolResult(content=[types.TextContent(type="text", text=error)], is_error=True)
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(result, ensure_ascii=False))])

    server = Server(
        f"agentdojo-{a.suite}",
        version=__import__("importlib.metadata").metadata.version("agentdojo"),
        instructions=f"AgentDojo {dojo.BENCHMARK_VERSION} suite {a.suite!r}.",
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )

    async def run():
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    try:
        anyio.run(run)
    finally:
        write_final(state, a.control)


if __name__ == "__main__":
    main()

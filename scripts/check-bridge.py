#!/usr/bin/env python3
"""Check that a bridge answers an MCP client: start it on stdio (`BRIDGE run`, with this process's
environment, so it reads the configuration a user's bridge reads), complete the handshake, list the
tools, run `print(1 + 1)` with `run_python`, draw a matplotlib figure and receive it as a PNG, then
close stdin and expect the bridge to exit. Standard library only.

Usage: scripts/check-bridge.py [--timeout SECONDS] BRIDGE [ARG...]
Exit status 0 when every step answered as expected; otherwise 1, with the bridge's log.
"""

import argparse
import base64
import json
import os
import select
import subprocess
import sys
import tempfile
import time

PLOT = """\
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(3, 2), dpi=50)
ax.plot([1, 3, 2])
display(fig)
"""


class Failed(Exception):
    pass


class Client:
    def __init__(self, argv, timeout):
        self.timeout = timeout
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            argv + ["run"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log
        )
        self.buf = b""
        self.next_id = 0

    def send(self, message):
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, method, params):
        self.next_id += 1
        rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                message = json.loads(line)
                if message.get("id") == rid and "method" not in message:
                    if "error" in message:
                        raise Failed(f"{method}: error {message['error']}")
                    return message["result"]
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failed(f"{method}: no answer within {self.timeout}s")
            if not select.select([self.proc.stdout], [], [], left)[0]:
                continue
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise Failed(f"{method}: the bridge closed its stdout (exit {self.proc.wait()})")
            self.buf += chunk

    def bridge_log(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def close(self):
        """Close stdin; the bridge should exit by itself."""
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise Failed("the bridge did not exit within 30s of its stdin closing")


def run_python(client, code):
    result = client.request("tools/call", {"name": "run_python", "arguments": {"code": code}})
    if result.get("isError"):
        text = "\n".join(c.get("text", "") for c in result.get("content", []))
        raise Failed(f"run_python failed:\n{text}")
    return result


def part(result, name):
    """The text of the content block that carries part NAME (`_meta["mcp-code-bridge/part"]`)."""
    for c in result.get("content", []):
        if (c.get("_meta") or {}).get("mcp-code-bridge/part") == name:
            return c.get("text")
    return None


def check(client):
    info = client.request(
        "initialize",
        {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "check-bridge", "version": "1"},
        },
    )
    client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    server = info["serverInfo"]
    print(f"    initialize: {server['name']} {server.get('version', '')}")

    tools = [t["name"] for t in client.request("tools/list", {})["tools"]]
    if tools != ["run_python"]:
        raise Failed(f"tools/list: expected [run_python], got {tools}")

    started = time.monotonic()
    result = run_python(client, "print(1 + 1)")
    stdout = part(result, "stdout")
    if stdout != "2\n":
        raise Failed(f"print(1 + 1): expected stdout '2\\n', got {result}")
    print(f"    run_python print(1 + 1) -> 2 ({time.monotonic() - started:.1f}s)")

    result = run_python(client, PLOT)
    images = [c for c in result.get("content", []) if c.get("type") == "image"]
    if not images or images[0].get("mimeType") != "image/png":
        raise Failed(f"display(fig): expected a PNG image, got {result}")
    png = base64.b64decode(images[0]["data"])
    if not png.startswith(b"\x89PNG"):
        raise Failed("display(fig): the image is not a PNG")
    print(f"    run_python display(fig) -> PNG, {len(png)} bytes")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=300, help="per request (default 300)")
    parser.add_argument("bridge", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if not args.bridge:
        parser.error("give the bridge's command, e.g. target/release/mcp-code-bridge")
    client = Client(args.bridge, args.timeout)
    try:
        check(client)
        status = client.close()
        if status != 0:
            raise Failed(f"the bridge exited with status {status}")
    except (Failed, OSError, ValueError, KeyError) as e:
        if client.proc.poll() is None:
            client.proc.kill()
            client.proc.wait()
        sys.stderr.write(f"check-bridge: {e}\n--- bridge log ---\n{client.bridge_log()}\n")
        return 1
    print("    the bridge answered and exited cleanly")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real MCP client (the Python SDK) driving `mcp-code-bridge run` over stdio.

Usage: mcp_client.py BRIDGE_COMMAND
Checks: one tool (run_python); the capabilities resource; code that calls the upstream `time`
server declared in the NixOS module (started with secrets from envFile and a {file:} reference,
which the sandbox must not see); state kept between calls of a session; errors reported as tool
errors. Prints MCP-CLIENT-OK at the end.
"""

import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

TIME_CODE = """
from mcp import runtime
names = [s["name"] if isinstance(s, dict) else s for s in runtime.discovered_servers()]
assert "time" in names, names
result = await mcp_time.get_current_time(timezone="UTC")
print("TIME-RESULT", result)
import os
leaked = [k for k, v in os.environ.items() if "s3cr3t" in v]
assert not leaked, f"upstream secrets visible in the sandbox: {leaked}"
"""


def text_of(result) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def is_error(result) -> bool:
    """CallToolResult's error flag: `is_error` in the SDK 2.x, `isError` before."""
    return bool(getattr(result, "is_error", getattr(result, "isError", False)))


async def main(command: str) -> None:
    params = StdioServerParameters(command=command, args=["run"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()

            tools = [t.name for t in (await session.list_tools()).tools]
            assert tools == ["run_python"], tools

            resources = [str(r.uri) for r in (await session.list_resources()).resources]
            assert "resource://mcp-code-bridge/capabilities" in resources, resources

            res = await session.call_tool(
                "run_python", {"code": TIME_CODE, "servers": ["time"], "timeout": 90}
            )
            out = text_of(res)
            print(out)
            assert not is_error(res), out
            assert "TIME-RESULT" in out and "UTC" in out, out

            res = await session.call_tool("run_python", {"code": "answer = 41"})
            assert not is_error(res), text_of(res)
            res = await session.call_tool("run_python", {"code": "print(answer + 1)"})
            assert not is_error(res) and "42" in text_of(res), text_of(res)

            res = await session.call_tool("run_python", {"code": "1 / 0"})
            assert is_error(res) and "ZeroDivisionError" in text_of(res), text_of(res)

    print("MCP-CLIENT-OK")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))

"""The helper API the code sees as `mcp.runtime`: what is public, and nothing else.

The functions defined here are the public face of the machinery below them (discovery, calls,
the notebook); the other public names (display, the skills functions, the exceptions and the
value classes) are defined by the modules whose job they are and only listed here. `NAMES` is
the namespace of `mcp.runtime` (`package` builds it from this list); `HIDDEN` are in it but left
out of its `__all__`, and so out of `help(runtime)`'s listing.

This module imports the machinery; no module of the machinery imports it (`package` alone does,
to build `mcp`).
"""

import os
import platform
import threading

from . import discovery, installs, notebook, output, proxies, rpc, skills, snapshot, state, values
from . import display as _display

DOC = """Helpers of the mcp-code-bridge sandbox.

discovered_servers(), await list_servers(), list_servers_sync(), describe_server(name),
list_loaded_server_metadata(), list_tools_sync(server),
await query_tool_docs(server, tool=None, detail="summary"|"full") / query_tool_docs_sync(...),
await search_tool_docs(query, limit=5) / search_tool_docs_sync(...), capability_summary(),
await call_tool(server, tool, arguments=None, raw=False),
export_notebook(path="/workspace/out/session.ipynb") (the session as a Jupyter notebook),
save_skill(func, description=None) (alias save_tool), list_skills(), delete_skill(name),
await install(*requirements) (packages into this session, by the bridge; PackageDenied,
PackageError), installed(),
await fork(name, reset=False) / fork_sync(...) (a new session `name` starting from this one's
variables, functions, classes, imports and notebook; SnapshotError when the state is too large).
"""


def discovered_servers():
    """Names of every MCP server the bridge discovered (loaded or not), as a tuple."""
    return tuple(d["name"] for d in state.discovered)


async def list_servers():
    """Ask the bridge which servers are selectable in this call (the loaded ones)."""
    result = await rpc.request("list_servers", {})
    return tuple(result) if isinstance(result, list) else result


def list_servers_sync():
    """Names of the servers loaded for this call (from the metadata sent with it)."""
    return tuple(state.loaded)


def describe_server(name):
    """Metadata of a server loaded for this call: name, alias, description, cwd, tools
    (each with name, alias, description, input_schema, and policy "ask" or "deny" when the
    user's policy asks before calling it or refuses it), and how old the tool list is:
    catalog_age_seconds, catalog_updated_at (epoch seconds), catalog_source ("catalog": read
    from the bridge's saved catalog; "live": listed from the running server)."""
    meta = discovery.lookup_loaded(name)
    if meta is None:
        raise discovery.not_loaded_error(name)
    return discovery.public_server(meta)


def list_loaded_server_metadata():
    """Metadata of every server loaded for this call, as a tuple of dicts."""
    return tuple(discovery.public_server(m) for m in state.loaded.values())


def list_tools_sync(server):
    """[{name, alias, description}] of a server's tools (cached when loaded, else asks the bridge)."""
    meta = discovery.lookup_loaded(server)
    if meta is not None:
        return [discovery.public_tool(t, full=False) for t in meta.get("tools") or [] if isinstance(t, dict)]
    return rpc.request_sync("list_tools", {"server": discovery.canonical_server(server)})


async def query_tool_docs(server, tool=None, detail="summary"):
    """Tool docs of a discovered server: [{server, serverAlias, tool, toolAlias, description}]
    plus inputSchema / outputSchema when detail="full". `tool` narrows to one tool."""
    return await rpc.request("query_tool_docs", discovery.docs_params(server, tool, detail))


def query_tool_docs_sync(server, tool=None, detail="summary"):
    """Blocking variant of query_tool_docs()."""
    return rpc.request_sync("query_tool_docs", discovery.docs_params(server, tool, detail))


async def search_tool_docs(query, limit=5):
    """Fuzzy, ranked search over the tools of every discovered server:
    [{server, serverAlias, tool, toolAlias, description, score}], and over the saved skills
    (defined in this session's namespace): {skill, description, score}. Servers left out (failed
    or still starting) are printed to stderr and listed in the result's `.skipped`."""
    hits = discovery.search_results(await rpc.request("search_tool_docs", discovery.search_params(query, limit)))
    return skills.with_skill_hits(hits, query, limit)


def search_tool_docs_sync(query, limit=5):
    """Blocking variant of search_tool_docs()."""
    hits = discovery.search_results(rpc.request_sync("search_tool_docs", discovery.search_params(query, limit)))
    return skills.with_skill_hits(hits, query, limit)


async def call_tool(server, tool, arguments=None, raw=False):
    """Call a tool of a loaded server by name or alias. Returns the converted value
    (raw=True: the whole CallToolResult dict)."""
    params, tool_meta = discovery.resolve_call(server, tool, arguments)
    result = await rpc.request("call_tool", params)
    return result if raw else values.convert_result(result, tool_meta)


def call_tool_sync(server, tool, arguments=None, raw=False):
    """Blocking variant of call_tool()."""
    params, tool_meta = discovery.resolve_call(server, tool, arguments)
    result = rpc.request_sync("call_tool", params)
    return result if raw else values.convert_result(result, tool_meta)


def capability_summary():
    """A one-paragraph overview of what this sandbox can do."""
    disc = discovered_servers()
    loaded = ["%s (mcp_%s)" % (n, discovery.server_alias(m)) for n, m in state.loaded.items()]
    return (
        "This is a persistent, network-less Python %s sandbox (variables, imports and functions "
        "persist between run_python calls; top-level `await` works). %d MCP server(s) discovered: %s. "
        "Loaded for this call: %s. Each loaded server is a `mcp_<alias>` object (also "
        "`mcp_servers[name]` and `from mcp.servers.<alias> import *`) whose tools are async "
        "functions with real signatures and docstrings (`await mcp_x.tool(arg=...)`, "
        "`help(mcp_x.tool)`). Discover with `from mcp import runtime`: runtime.discovered_servers(), "
        "await runtime.search_tool_docs('what you need'), await runtime.query_tool_docs(server, "
        "detail='full'), runtime.describe_server(name); call with await runtime.call_tool(server, "
        "tool, {...}); load more servers by passing servers=[...] to run_python. Tool results come "
        "back as Python values (structured content or parsed JSON/text, the whole result in "
        "`.mcp_result`); display(obj) shows images and matplotlib figures."
        % (platform.python_version(), len(disc), ", ".join(disc) or "none",
           ", ".join(loaded) or "none (pass servers=[...] to run_python)")
    )


def export_notebook(path="/workspace/out/session.ipynb"):
    """Write this session's cells (code, printed output, last values, displayed images, errors)
    as a Jupyter notebook (nbformat 4.5) and return the path written. The cell calling this is
    included with what it has printed so far. The record keeps the last 500 cells / 32 MiB;
    NotebookTooLarge if the file would exceed 48 MiB; OSError if the path is not writable."""
    path = os.path.abspath(os.fspath(path))
    if threading.get_ident() == state.main_ident and state.running is not None:
        output.flush_std()
        output.drain()  # what this cell printed so far is in the record
    return notebook.record.write(path)


# The public names whose job is another module's: defined there, listed here.
display = _display.display
save_skill = skills.save_skill
save_tool = skills.save_tool
list_skills = skills.list_skills
delete_skill = skills.delete_skill
install = installs.install
installed = installs.installed
fork = snapshot.fork
fork_sync = snapshot.fork_sync
SnapshotError = snapshot.SnapshotError
PackageError = installs.PackageError
PackageDenied = installs.PackageDenied
NotebookTooLarge = notebook.NotebookTooLarge
McpError = rpc.McpError
McpToolError = rpc.McpToolError
ToolDenied = rpc.ToolDenied
Image = values.Image
Audio = values.Audio
Media = values.Media
Resource = values.Resource
ToolDict = values.ToolDict
ToolList = values.ToolList
ToolStr = values.ToolStr
ServerProxy = proxies.ServerProxy
ServerNotLoadedError = discovery.ServerNotLoadedError

NAMES = (
    "discovered_servers",
    "list_servers",
    "list_servers_sync",
    "describe_server",
    "list_loaded_server_metadata",
    "list_tools_sync",
    "query_tool_docs",
    "query_tool_docs_sync",
    "search_tool_docs",
    "search_tool_docs_sync",
    "capability_summary",
    "call_tool",
    "call_tool_sync",
    "save_skill",
    "save_tool",
    "list_skills",
    "delete_skill",
    "install",
    "installed",
    "PackageError",
    "PackageDenied",
    "fork",
    "fork_sync",
    "SnapshotError",
    "display",
    "export_notebook",
    "NotebookTooLarge",
    "McpError",
    "McpToolError",
    "ToolDenied",
    "Image",
    "Audio",
    "Media",
    "Resource",
    "ToolDict",
    "ToolList",
    "ToolStr",
    "ServerProxy",
    "ServerNotLoadedError",
)
# In mcp.runtime but left out of its __all__ (and so out of help(runtime)'s listing).
HIDDEN = ("Audio", "Media", "Resource", "ToolDict", "ToolList", "ToolStr", "ServerProxy")

"""What the code can learn about the servers, and the words for a server it cannot use.

The servers of this exec (`state.loaded`, full metadata) and every discovered one
(`state.discovered`, names and aliases only) as the host sent them; names and aliases resolved
to the host's real names (the host makes aliases, the runtime uses them as given); metadata in
the shape `describe_server` shows; the parameters of the docs and search requests and their
results; and, for a server not loaded in this call, a message saying how to load it or which
configured server is closest (as McpError, KeyError or NameError, the type the code expects).
"""

import collections.abc
import copy
import json
import keyword
import re
import sys
import time

from . import rpc, state


def ident(name, used=(), fallback="arg"):
    """A Python identifier made of `name`, not a keyword, not in `used`."""
    s = re.sub(r"\W", "_", str(name))
    if not s:
        s = fallback
    if s[0].isdigit():
        s = "_" + s
    if keyword.iskeyword(s) or s.startswith("__mcp"):
        s += "_"
    if not s.isidentifier():
        s = fallback
    base, n = s, 2
    while s in used:
        s = "%s_%d" % (base, n)
        n += 1
    return s


def server_alias(meta):
    alias = meta.get("alias")
    if isinstance(alias, str) and alias.isidentifier() and not keyword.iskeyword(alias):
        return alias
    return ident(alias or meta.get("name"), fallback="server")


def lookup_loaded(server):
    """The metadata of a loaded server named by name or alias, else None."""
    if server in state.loaded:
        return state.loaded[server]
    for meta in state.loaded.values():
        if meta.get("alias") == server or server_alias(meta) == server:
            return meta
    return None


# ------------------------------------------------------------------ a server that is not there


def not_loaded_message(server):
    """Why `server` (a name or an alias) has no proxy in this call, and what to do: load it, or
    pick one of the servers that exist."""
    discovered = [d.get("name") for d in state.discovered]
    name = next((d.get("name") for d in state.discovered if server in (d.get("name"), d.get("alias"))), None)
    if name is not None:
        # Spelled as run_python's JSON argument (the host's message says the same), with the
        # server's real name even when its alias was typed.
        return (
            'MCP server %r is not loaded in this run_python call: pass "servers": [%s] to run_python '
            "to use its tools (its docs are available via runtime.query_tool_docs(%r))."
            % (name, json.dumps(name), name)
        )
    import difflib

    keys = {}
    for d in state.discovered:
        keys[d.get("name")] = d.get("name")
        keys[d.get("alias")] = d.get("name")
    close = difflib.get_close_matches(str(server), [k for k in keys if isinstance(k, str)], n=1)
    guess = " Did you mean %r?" % keys[close[0]] if close else ""
    return "No MCP server %r is configured.%s Discovered servers: %s." % (
        server, guess, ", ".join(map(str, discovered)) or "none")


def not_loaded_error(server):
    return rpc.McpError(not_loaded_message(server))


class ServerNotLoadedError(KeyError):
    """`mcp_servers[name]` for a server not loaded in this call (a KeyError, as before), with a
    message saying how to load it or which servers exist."""

    def __str__(self):
        # KeyError's own str() is the repr of its key, quotes and escapes included.
        return str(self.args[0]) if self.args else ""


class ServerMap(dict):
    """`mcp_servers`: the loaded proxies by name and alias; a missing key says why."""

    __slots__ = ()

    def __missing__(self, key):
        raise ServerNotLoadedError(not_loaded_message(key))


def explain_name_error(exc):
    """A NameError for `mcp_<alias>` gets the reason and the fix: the server exists and is loaded
    with "servers", or no such server is configured. Done where the error is reported, since
    name lookups in the user's namespace cannot be hooked; the type stays NameError."""
    if type(exc) is not NameError:
        return
    name = getattr(exc, "name", None)
    if name is None:
        m = re.match(r"name '([^']+)' is not defined", str(exc))
        name = m.group(1) if m else None
    if not isinstance(name, str) or not name.startswith("mcp_") or name == "mcp_servers":
        return
    exc.args = ("name %r is not defined. %s" % (name, not_loaded_message(name[len("mcp_"):])),)
    try:
        # Python's own "Did you mean" would be computed from `name` and contradict the above.
        exc.name = None
    except AttributeError:
        pass


# ------------------------------------------------------------------------- metadata as shown


def public_tool(tool, full=True):
    out = {"name": tool.get("name"), "alias": tool.get("alias") or ident(tool.get("name"), fallback="tool"),
           "description": tool.get("description") or ""}
    if tool.get("policy") in ("ask", "deny"):
        out["policy"] = tool["policy"]  # the user's policy asks before calling it, or refuses it
    if isinstance(tool.get("flows"), dict):
        out["flows"] = copy.deepcopy(tool["flows"])  # [policy.flows]: its labels, guarded arguments
    if full:
        out["input_schema"] = copy.deepcopy(tool.get("input_schema") or {})
        if tool.get("output_schema"):
            out["output_schema"] = copy.deepcopy(tool.get("output_schema"))
    return out


def public_server(meta):
    out = {
        "name": meta.get("name"),
        "alias": server_alias(meta),
        "description": meta.get("description") or "",
        "cwd": meta.get("cwd"),
        "tools": [public_tool(t) for t in meta.get("tools") or [] if isinstance(t, dict)],
    }
    catalog = meta.get("catalog")
    if isinstance(catalog, dict) and isinstance(catalog.get("updated_at"), (int, float)):
        # The host sends when the tool list was taken; the age is computed here, so the
        # metadata stays the same bytes from one call to the next.
        out["catalog_updated_at"] = catalog["updated_at"]
        out["catalog_age_seconds"] = max(0, int(time.time() - catalog["updated_at"]))
        out["catalog_source"] = catalog.get("source")
    return out


# --------------------------------------------------------------- names the host will know


def canonical_server(server):
    """The server's name when `server` is a known name or alias, else `server` unchanged."""
    meta = lookup_loaded(server)
    if meta is not None:
        return meta["name"]
    for d in state.discovered:
        if server == d["name"]:
            return server
    for d in state.discovered:
        if server == d["alias"]:
            return d["name"]
    return server


def canonical_tool(server, tool):
    meta = lookup_loaded(server)
    for t in (meta or {}).get("tools") or []:
        if isinstance(t, dict) and tool == t.get("name"):
            return tool
    for t in (meta or {}).get("tools") or []:
        if isinstance(t, dict) and tool == t.get("alias"):
            return t.get("name")
    return tool


def docs_params(server, tool, detail):
    if detail not in ("summary", "full"):
        raise ValueError("detail must be 'summary' or 'full'")
    params = {"server": canonical_server(server), "detail": detail}
    if tool is not None:
        params["tool"] = canonical_tool(server, tool)
    return params


def search_params(query, limit):
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError("limit must be a positive integer")
    return {"query": str(query), "limit": limit}


class SearchResults(list):
    """The hits of a search, best first; `.skipped` lists the servers left out of it, each as
    {server, reason} (one that failed to start, or is still starting)."""

    skipped = ()


def search_results(result):
    # The host answers {results, skipped}; a bare list is an answer without skipped servers.
    if isinstance(result, dict):
        hits = SearchResults(result.get("results") or [])
        hits.skipped = tuple(s for s in result.get("skipped") or () if isinstance(s, dict))
    else:
        hits = SearchResults(result or [])
    for s in hits.skipped:
        print("search_tool_docs: skipped server %r: %s" % (s.get("server"), s.get("reason")),
              file=sys.stderr)
    return hits


def resolve_call(server, tool, arguments):
    """The call_tool request's params and the tool's metadata (None when it is not listed)."""
    meta = lookup_loaded(server)
    if meta is None:
        raise not_loaded_error(server)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, collections.abc.Mapping):
        raise TypeError("arguments must be a dict of the tool's parameters")
    tool_name = canonical_tool(server, tool)
    tool_meta = None
    for t in meta.get("tools") or []:
        if isinstance(t, dict) and t.get("name") == tool_name:
            tool_meta = t
            break
    params = {"server": meta["name"], "tool": tool_name, "arguments": dict(arguments)}
    return params, tool_meta

"""The servers loaded for a call as Python objects: `mcp_<alias>`, `mcp_servers[name]` and the
modules `mcp.servers.<alias>`, whose tools are async functions with the tool's real signature,
annotations and docstring, made from its input schema.

The host renders each schema once (its `rendering`: every parameter's Python type as text,
`Literal[...]` for an enum, `list[T]`, `A | None`, the names of object types; its line with
required/optional, default, format, bounds and description; the object types' fields; what was
left out of a huge schema): the annotations show those types and `help()` those lines, the
same ones `query_tool_docs` and the catalog's search use. Metadata without a rendering (made
by hand) gets plain types from the schema (`py_type`, `type_label`).

`install` makes an exec's servers current (a server whose metadata did not change keeps its
proxy, so warm calls do not rebuild every tool) and `bind_globals` puts their names in the
user's namespace. A tool function checks its arguments by its signature, sends `call_tool`,
and converts the result (`values`).
"""

import builtins
import collections
import importlib.machinery
import json
import keyword
import sys
import types

from . import channel, discovery, rpc, state, values

# The file name of this module's code, which the tool functions get too: frames of theirs are
# the runtime's, left out of the code's tracebacks.
_FILENAME = sys._getframe().f_code.co_filename


class ServerProxy:
    """An MCP server loaded for this run_python call; its attributes are the tools."""

    __slots__ = ()
    _mcp_server_ = ""
    _mcp_alias_ = ""
    _mcp_tools_ = {}
    _mcp_by_name_ = {}

    def __getattr__(self, item):
        cls = type(self)
        func = cls._mcp_by_name_.get(item)
        if func is not None:
            return func
        if item.startswith("__"):
            raise AttributeError(item)
        names = ", ".join(sorted(cls._mcp_tools_)) or "none"
        raise AttributeError("MCP server %r has no tool %r. Tools: %s" % (cls._mcp_server_, item, names))

    def __getitem__(self, key):
        cls = type(self)
        func = cls._mcp_tools_.get(key) or cls._mcp_by_name_.get(key)
        if func is None:
            raise KeyError(key)
        return func

    def __dir__(self):
        return sorted(type(self)._mcp_tools_)

    def __iter__(self):
        return iter(type(self)._mcp_tools_)

    def __len__(self):
        return len(type(self)._mcp_tools_)

    def __repr__(self):
        cls = type(self)
        names = sorted(cls._mcp_tools_)
        shown = ", ".join(names[:20]) + (", \u2026" if len(names) > 20 else "")
        return "<MCP server %r (mcp_%s): %d tools: %s>" % (cls._mcp_server_, cls._mcp_alias_, len(names), shown)


# ------------------------------------------------------------------- schemas as Python types

_JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


def py_type(schema):
    """The annotation of a parameter with this JSON schema."""
    import typing  # when a proxy is first made, not at boot

    if not isinstance(schema, dict):
        return typing.Any
    t = schema.get("type")
    if isinstance(t, str):
        return _JSON_TYPES.get(t, typing.Any)
    if isinstance(t, list):
        types_ = tuple(_JSON_TYPES[x] for x in t if isinstance(x, str) and x in _JSON_TYPES)
        if len(types_) == 1:
            return types_[0]
        if types_:
            return typing.Union[types_]
        return typing.Any
    for key in ("anyOf", "oneOf"):
        alts = schema.get(key)
        if isinstance(alts, list) and alts:
            types_ = tuple(dict.fromkeys(py_type(a) for a in alts))
            if typing.Any in types_:
                return typing.Any
            return types_[0] if len(types_) == 1 else typing.Union[types_]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        kinds = tuple(dict.fromkeys(type(v) for v in enum))
        return kinds[0] if len(kinds) == 1 else typing.Any
    if "const" in schema:
        return type(schema["const"])
    return typing.Any


def type_label(schema):
    """The type of a parameter with this JSON schema, as the docstring writes it."""
    if not isinstance(schema, dict):
        return "any"
    t = schema.get("type")
    if isinstance(t, list):
        return " | ".join(type_label(dict(schema, type=x)) for x in t)
    if t == "array":
        items = schema.get("items")
        return "list[%s]" % type_label(items) if isinstance(items, dict) and items else "list"
    if isinstance(t, str):
        return {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
                "object": "dict", "null": "None"}.get(t, t)
    for key in ("anyOf", "oneOf"):
        alts = schema.get(key)
        if isinstance(alts, list) and alts:
            return " | ".join(dict.fromkeys(type_label(a) for a in alts))
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return type(enum[0]).__name__
    return "any"


class TypeText:
    """A parameter's type as the host rendered it (`Literal['r', 'rw']`, `list[Email] | None`):
    shown as written by `inspect.signature` and `help()`."""

    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text

    def __eq__(self, other):
        return isinstance(other, TypeText) and other.text == self.text

    def __hash__(self):
        return hash(self.text)


_PLAIN = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict,
          "None": type(None)}


def rendered_type(text):
    """The annotation of a rendered type: the builtin itself for a plain one, else its text."""
    if text == "Any":
        import typing

        return typing.Any
    return _PLAIN.get(text) or TypeText(text)


def _short_json(value, limit=200):
    try:
        s = json.dumps(value, ensure_ascii=False)
    except Exception:
        s = repr(value)
    return s if len(s) <= limit else s[: limit - 1] + "\u2026"


def _tool_doc(server_name, tool_name, description, params, output_schema, rendering=None):
    lines = [(description or "").strip() or "MCP tool %r." % tool_name, ""]
    if rendering is not None:
        # The host's lines, with the Python names (Rendering::text writes the schema's).
        if params:
            lines.append("Args:")
            for p in params:
                sent = " (sent as %r)" % p["name"] if p["py"] != p["name"] else ""
                lines.append("    %s %s%s" % (p["py"], p["line"], sent))
        types_ = [t for t in rendering.get("types") or () if isinstance(t, str)]
        if types_:
            lines.append("Types:")
            lines.extend("    " + t for t in types_)
        if isinstance(rendering.get("more"), str):
            lines.append(rendering["more"])
        if params or types_:
            lines.append("")
    elif params:
        lines.append("Args:")
        for p in params:
            schema = p["schema"] if isinstance(p["schema"], dict) else {}
            bits = [type_label(schema), "required" if p["required"] else "optional"]
            if "default" in schema:
                bits.append("default " + _short_json(schema["default"]))
            desc = [" ".join(str(schema.get("description") or "").split())]
            enum = schema.get("enum")
            if isinstance(enum, list) and enum:
                desc.append("One of: %s." % ", ".join(_short_json(v, 60) for v in enum[:30]))
            if p["py"] != p["name"]:
                desc.append("(sent as %r)" % p["name"])
            desc = " ".join(d for d in desc if d)
            lines.append("    %s (%s)%s" % (p["py"], ", ".join(bits), (": " + desc) if desc else ""))
        lines.append("")
    if isinstance(output_schema, dict) and output_schema:
        lines.append("Output schema: " + _short_json(output_schema, 600))
    lines.append(
        "MCP tool %r of server %r (async: use `await`). Returns a Python value (`.mcp_result` holds "
        "the full result); raises McpToolError if the tool fails." % (tool_name, server_name)
    )
    return "\n".join(lines)


# ------------------------------------------------------------------------ tools and proxies

_tool_cache = {}  # (server, alias, tool json) -> function
# server name -> (metadata, proxy, module) as last built: an exec that loads a server with the
# same metadata reuses them instead of rebuilding every tool (~1 ms per call for 50 tools).
_server_cache = {}


def make_tool(server_name, server_alias, tool):
    """The async function of one tool, with its real signature, annotations and docstring."""
    try:
        key = (server_name, server_alias, json.dumps(tool, sort_keys=True, default=str))
    except Exception:
        key = None
    if key is not None and key in _tool_cache:
        return _tool_cache[key]
    tool_name = str(tool.get("name"))
    alias = tool.get("alias")
    if not isinstance(alias, str) or not alias.isidentifier() or keyword.iskeyword(alias):
        alias = discovery.ident(alias or tool_name, fallback="tool")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        schema = tool.get("inputSchema") if isinstance(tool.get("inputSchema"), dict) else {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [r for r in (schema.get("required") or []) if isinstance(r, str)]
    rendering = tool.get("rendering") if isinstance(tool.get("rendering"), dict) else None
    rendered = {}
    for rp in (rendering or {}).get("params") or ():
        if isinstance(rp, dict) and isinstance(rp.get("name"), str):
            rendered[rp["name"]] = rp
    req_set = set(required)
    order = [n for n in props if n in req_set]
    order += [n for n in required if n not in props and n not in order]
    order += [n for n in props if n not in req_set]
    used = set()
    params = []
    for name in order:
        py = discovery.ident(name, used)
        used.add(py)
        pschema = props.get(name, {})
        is_req = name in req_set
        default = None
        if not is_req and isinstance(pschema, dict) and "default" in pschema:
            default = pschema["default"]
        rp = rendered.get(name, {})
        params.append({"name": name, "py": py, "required": is_req, "default": default, "schema": pschema,
                       "annotation": str(rp.get("annotation") or "Any"),
                       "line": str(rp.get("line") or "(Any, %s)" % ("required" if is_req else "optional"))})

    glb = {"__builtins__": builtins}
    parts = []
    star = False
    for i, p in enumerate(params):
        if p["required"]:
            parts.append(p["py"])
        else:
            if not star:
                parts.append("*")
                star = True
            glb["__mcp_d%d__" % i] = p["default"]
            parts.append("%s=__mcp_d%d__" % (p["py"], i))
    vals = "".join("%s, " % p["py"] for p in params)
    src = "async def %s(%s):\n    return await __mcp_invoke__((%s))\n" % (alias, ", ".join(parts), vals)

    specs = [(p["name"], p["required"], p["default"]) for p in params]
    output_schema = tool.get("output_schema") or tool.get("outputSchema")
    tool_meta = {"name": tool_name, "output_schema": output_schema}

    async def invoke(vals):
        args = {}
        for (orig, is_req, default), v in zip(specs, vals):
            if not is_req and (v is None or v is default):
                continue
            args[orig] = v
        return await _call_loaded_tool(server_name, tool_meta, args)

    glb["__mcp_invoke__"] = invoke
    exec(compile(src, _FILENAME, "exec"), glb)
    func = glb[alias]
    func.__qualname__ = alias
    func.__module__ = "mcp.servers." + server_alias
    func.__doc__ = _tool_doc(server_name, tool_name, tool.get("description"), params, output_schema, rendering)
    if rendering is not None:
        func.__annotations__ = {p["py"]: rendered_type(p["annotation"]) for p in params}
    else:
        func.__annotations__ = {p["py"]: py_type(p["schema"]) for p in params}
    func.__mcp_tool__ = tool_name
    func._mcp_server_ = server_name
    if key is not None:
        _tool_cache[key] = func
    return func


def make_proxy(meta):
    """The proxy object and the `mcp.servers.<alias>` module of one loaded server."""
    name = str(meta.get("name"))
    alias = discovery.server_alias(meta)
    tools = collections.OrderedDict()
    by_name = {}
    for tool in meta.get("tools") or []:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        func = make_tool(name, alias, tool)
        if func.__name__.startswith("__") or func.__name__ in tools:
            continue
        tools[func.__name__] = func
        by_name[tool["name"]] = func
    desc = (meta.get("description") or "").strip()
    doc = "MCP server %r%s. Tools (async; `await mcp_%s.<tool>(...)`): %s." % (
        name, (": " + desc) if desc else "", alias, ", ".join(tools) or "none")
    body = {name_: staticmethod(f) for name_, f in tools.items()}
    body.update({
        "__doc__": doc,
        "__module__": "mcp.servers." + alias,
        "__slots__": (),
        "_mcp_server_": name,
        "_mcp_alias_": alias,
        "_mcp_tools_": tools,
        "_mcp_by_name_": by_name,
        "_mcp_meta_": meta,
    })
    cls = type("mcp_" + alias, (ServerProxy,), body)
    module = types.ModuleType("mcp.servers." + alias, doc)
    module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    module.__package__ = "mcp.servers"
    for tname, f in tools.items():
        setattr(module, tname, f)
    module.__all__ = list(tools)
    proxy = cls()
    module.server = proxy
    return proxy, module


async def _call_loaded_tool(server_name, tool_meta, args):
    if server_name not in state.loaded or state.running is None:
        raise discovery.not_loaded_error(server_name)
    result = await rpc.request("call_tool", {"server": server_name, "tool": tool_meta["name"], "arguments": args})
    return values.convert_result(result, tool_meta)


# --------------------------------------------------------------------- an exec's servers


def install(servers, discovered, fresh=False):
    """Make this exec's servers and discovery list current. The host leaves both out (None)
    when they equal the previous exec's: then only the proxies' global names are bound again
    (the code may have deleted or rebound them). `fresh`: the `mcp` package was just built
    again (the code had removed it), so the servers kept are installed into it again."""
    if fresh:
        servers = servers if servers is not None else [dict(m) for m in state.loaded.values()]
        discovered = discovered if discovered is not None else [dict(d) for d in state.discovered]
    if servers is None and discovered is None:
        bind_globals()
        return
    disc = []
    for d in discovered if isinstance(discovered, list) else []:
        if isinstance(d, dict) and isinstance(d.get("name"), str):
            disc.append({"name": d["name"], "alias": d.get("alias") or d["name"],
                         "description": d.get("description") or ""})
    state.discovered = tuple(disc)
    loaded = collections.OrderedDict()
    for meta in servers if isinstance(servers, list) else []:
        if isinstance(meta, dict) and isinstance(meta.get("name"), str):
            loaded[meta["name"]] = meta
    state.loaded = loaded

    servers_pkg = sys.modules["mcp.servers"]
    for name in list(sys.modules):
        if name.startswith("mcp.servers."):
            del sys.modules[name]
            try:
                delattr(servers_pkg, name.rsplit(".", 1)[1])
            except AttributeError:
                pass
    proxies = collections.OrderedDict()
    for name, meta in loaded.items():
        cached = _server_cache.get(name)
        if cached is not None and cached[0] == meta:
            proxy, module = cached[1], cached[2]
        else:
            try:
                proxy, module = make_proxy(meta)
            except Exception as e:
                channel.log("could not build the proxy of server %r: %r" % (name, e))
                continue
            _server_cache[name] = (meta, proxy, module)
        alias = type(proxy)._mcp_alias_
        proxies[name] = proxy
        sys.modules[module.__name__] = module
        setattr(servers_pkg, alias, module)
    state.proxies = proxies
    bind_globals()


def bind_globals():
    """`mcp_<alias>` and `mcp_servers` in the user's namespace, for the current proxies; names
    this runtime set earlier and the code has not rebound are removed first."""
    proxies = state.proxies
    by_key = discovery.ServerMap()
    for name, proxy in proxies.items():
        by_key[name] = proxy
        by_key[type(proxy)._mcp_alias_] = proxy
    ns = state.ns
    for gname, obj in list(state.globals_set.items()):
        if ns.get(gname) is obj:
            del ns[gname]
    new = {}
    for proxy in proxies.values():
        new["mcp_" + type(proxy)._mcp_alias_] = proxy
    new["mcp_servers"] = by_key
    for gname, obj in new.items():
        ns[gname] = obj
    state.globals_set = new

"""The `mcp` package the code imports: `mcp.runtime` (the public API, built from `api.NAMES`),
`mcp.servers` (one module per server loaded for the call, filled by `proxies.install`) and
`mcp.ToolDenied`; and the import hook that patches `matplotlib.pyplot.show` when pyplot is
imported and explains a missing `mcp.servers.X`.

The package's modules are made here, not imported from files: the code sees the names of
`api.NAMES` in `mcp.runtime`, never the runtime's own modules.
"""

import importlib.machinery
import sys
import types

from . import api, discovery, display


def _new_module(name, doc, package=False):
    mod = types.ModuleType(name, doc)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        mod.__path__ = []
        mod.__package__ = name
    else:
        mod.__package__ = name.rpartition(".")[0]
    return mod


def install():
    """Build `mcp`, `mcp.runtime` and `mcp.servers` afresh (whatever the code left of them)."""
    for name in list(sys.modules):
        if name == "mcp" or name.startswith("mcp."):
            del sys.modules[name]
    pkg = _new_module("mcp", "MCP servers available inside the mcp-code-bridge sandbox.", True)
    rt = _new_module("mcp.runtime", api.DOC)
    for name in api.NAMES:
        obj = getattr(api, name)
        try:
            obj.__module__ = "mcp.runtime"
        except (AttributeError, TypeError):
            pass
        setattr(rt, name, obj)
    rt.__all__ = [n for n in api.NAMES if n not in api.HIDDEN]
    servers = _new_module("mcp.servers", "One module per MCP server loaded for this call.", True)
    pkg.runtime = rt
    pkg.servers = servers
    pkg.ToolDenied = api.ToolDenied  # `from mcp import ToolDenied`, as well as runtime.ToolDenied
    sys.modules["mcp"] = pkg
    sys.modules["mcp.runtime"] = rt
    sys.modules["mcp.servers"] = servers
    return pkg


def ensure():
    """Build `mcp` again when the code removed it (or its runtime); True when it did."""
    pkg = sys.modules.get("mcp")
    if pkg is None or getattr(pkg, "runtime", None) is None:
        install()
        return True
    return False


class ImportHook:
    """Patches matplotlib.pyplot.show when pyplot is imported; explains missing mcp.servers.X."""

    def __init__(self):
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("mcp.servers.") and fullname.count(".") == 2:
            alias = fullname.rsplit(".", 1)[1]
            raise ModuleNotFoundError(str(discovery.not_loaded_error(alias)), name=fullname)
        if fullname != "matplotlib.pyplot" or self.busy:
            return None
        self.busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            original = spec.loader.exec_module

            def exec_module(module):
                original(module)
                display.patch_pyplot(module)

            spec.loader.exec_module = exec_module
            return spec
        except Exception:
            return None
        finally:
            self.busy = False

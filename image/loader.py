# The container's command (python3 -c). Reads the boot frame (docs/protocol.md) from a buffered
# private copy of stdin, runs the runtime's modules as the package __mcp_bridge_runtime__ (each
# compiled when first imported) and calls the entry module's main() with the frame and that copy,
# from which the runtime reads the host's next frames.
import sys, os, json, types
i = open(os.dup(0), "rb", buffering=1 << 16)
f = json.loads(i.readline())
n, s = "__mcp_bridge_runtime__", dict(f.pop("modules"))
p = sys.modules[n] = types.ModuleType(n)
p.__path__ = []
def load(k):
    if k not in s: raise AttributeError(k)
    m = sys.modules[n + "." + k] = types.ModuleType(n + "." + k)
    m.__package__ = n; setattr(p, k, m)
    exec(compile(s.pop(k), "<mcp-bridge-runtime/%s.py>" % k, "exec"), m.__dict__)
    return m
p.__getattr__ = load
load(f["entry"]).main(f, i)

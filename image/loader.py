# The container's command (python3 -c). Reads the boot frame (docs/protocol.md) from a buffered
# private copy of stdin, runs the runtime's modules as the package __mcp_bridge_runtime__ (each
# made when first imported: from the frame's compiled `code` when this kind of interpreter made
# it, else compiled from its source) and calls the entry module's main() with the frame and that
# copy, from which the runtime reads the host's next frames.
import sys, os, json, types, marshal, binascii
i = open(os.dup(0), "rb", buffering=1 << 16)
f = json.loads(i.readline())
n, s = "__mcp_bridge_runtime__", set(f["modules"])
f["magic"] = g = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"").hex()
c = f.pop("code", None) or {}
c = g and c.get("magic") == g and c.get("modules") or {}
p = sys.modules[n] = types.ModuleType(n)
p.__path__ = []
f["compiled"] = {}  # the modules compiled from their source here, by name
def source(k):
    o = f["compiled"][k] = compile(f["modules"][k], "<mcp-bridge-runtime/%s.py>" % k, "exec")
    return o
f["source"] = source
def code(k):
    try:
        o = marshal.loads(binascii.a2b_base64(c[k]))
        if type(o) is types.CodeType: return o
    except Exception: pass
    return source(k)
def load(k):
    if k not in s: raise AttributeError(k)
    s.remove(k)
    m = sys.modules[n + "." + k] = types.ModuleType(n + "." + k)
    m.__package__ = n; setattr(p, k, m)
    exec(code(k), m.__dict__)
    return m
p.__getattr__ = load
load(f["entry"]).main(f, i)

import sys, json, types
m = types.ModuleType("__mcp_bridge_runtime__")
sys.modules[m.__name__] = m
exec(compile(json.loads(sys.stdin.buffer.raw.readline())["source"], "<mcp-bridge-runtime>", "exec"), m.__dict__)
m.main()

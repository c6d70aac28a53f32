# VM test: `services.mcp-code-bridge.http` serving a second machine. The client reaches
# `mcp-code-bridge serve` over the test network with a bearer token of the module's tokenFile:
# without a token it gets 401, with alice's it runs run_python (an MCP session of 2025-11-25,
# spoken with curl: initialize, initialized, tools/call), bob's token cannot use alice's MCP
# session, and a foreign Host is 403. The sandbox is the module's, on root's podman.
{ pkgs, module }:

pkgs.testers.runNixOSTest {
  name = "mcp-code-bridge-http";

  nodes.server =
    { ... }:
    {
      imports = [ module ];

      virtualisation = {
        memorySize = 4096;
        diskSize = 8192;
        cores = 2;
      };

      # A copy, not a store link, as a secret would be; systemd hands it to the service.
      environment.etc."mcp-code-bridge/tokens" = {
        mode = "0600";
        text = ''
          alice:alice-0123456789abcdef0123
          bob:bob-fedcba9876543210fedcba98
        '';
      };

      services.mcp-code-bridge = {
        enable = true;
        preloadImage = true;
        http = {
          enable = true;
          listen = "0.0.0.0:8931";
          tokenFile = "/etc/mcp-code-bridge/tokens";
          openFirewall = true;
        };
        settings.http.allowed_hosts = [ "server" ];
      };
    };

  nodes.client = { pkgs, ... }: { environment.systemPackages = [ pkgs.curl ]; };

  testScript = ''
    import json

    url = "http://server:8931/mcp"
    accept = "-H 'content-type: application/json' -H 'accept: application/json, text/event-stream'"

    def post(token, body, extra=""):
        auth = f"-H 'authorization: Bearer {token}'" if token else ""
        return client.succeed(
            f"curl -s -D /tmp/headers -o /tmp/body -w '%{{http_code}}' {accept} {auth} {extra} "
            f"-X POST {url} --data '{json.dumps(body)}'; echo; cat /tmp/headers; echo; cat /tmp/body"
        )

    start_all()
    server.wait_for_unit("mcp-code-bridge-image.service")
    server.wait_for_unit("mcp-code-bridge-http.service")
    server.wait_for_open_port(8931)
    client.wait_for_unit("multi-user.target")

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "vm", "version": "1"}}}

    with subtest("no token: 401 with a Bearer challenge"):
        out = post(None, init)
        assert out.startswith("401"), out
        assert "www-authenticate: bearer" in out.lower(), out

    with subtest("alice's token: an MCP session that runs run_python"):
        out = post("alice-0123456789abcdef0123", init)
        assert out.startswith("200"), out
        sid = [l.split(":", 1)[1].strip() for l in out.splitlines() if l.lower().startswith("mcp-session-id:")][0]
        session = f"-H 'mcp-session-id: {sid}' -H 'mcp-protocol-version: 2025-11-25'"
        post("alice-0123456789abcdef0123", {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "run_python", "arguments": {"code": "print(6 * 7)"}}}
        out = post("alice-0123456789abcdef0123", call, session)
        print(out)
        assert out.startswith("200") and "42" in out, out

    with subtest("bob's token cannot use alice's MCP session"):
        out = post("bob-fedcba9876543210fedcba98", {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, session)
        assert out.startswith("404"), out

    with subtest("a foreign Host is 403"):
        out = post("alice-0123456789abcdef0123", init, "-H 'host: rebound.example'")
        assert out.startswith("403"), out
  '';
}

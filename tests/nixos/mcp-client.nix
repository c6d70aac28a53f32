# VM test: a real MCP client (the Python SDK's stdio client) calls run_python through
# `mcp-code-bridge run`, and the code calls an upstream server declared in the NixOS module
# (mcp-server-time from nixpkgs), proxied into the sandbox.
{ pkgs, module }:

let
  # `optional`: the offline evaluation stub of nixpkgs (docs/nix.md) has no python3Packages.mcp;
  # nixpkgs has, so there this is always [ ps.mcp ].
  client = pkgs.python3.withPackages (ps: pkgs.lib.optional (ps ? mcp) ps.mcp);
in
pkgs.testers.runNixOSTest {
  name = "mcp-code-bridge-mcp-client";

  nodes.machine =
    { lib, pkgs, ... }:
    {
      imports = [ module ];

      virtualisation = {
        memorySize = 4096;
        diskSize = 8192;
        cores = 2;
      };

      services.mcp-code-bridge = {
        enable = true;
        preloadImage = true;
        servers.time = {
          # `if`: the offline evaluation stub of nixpkgs (docs/nix.md) has no mcp-server-time;
          # nixpkgs has, so there this is always its store path.
          command =
            if pkgs ? mcp-server-time then lib.getExe pkgs.mcp-server-time else "mcp-server-time";
          args = [
            "--local-timezone"
            "UTC"
          ];
          description = "Current time and time-zone conversion";
          # Written by the test script; the bridge reads it when it starts the server.
          envFile = "/run/secrets/time.env";
          env.MCB_TEST_TOKEN = "{file:/run/secrets/time-token}";
        };
      };
    };

  testScript = ''
    machine.wait_for_unit("multi-user.target")
    machine.wait_for_unit("mcp-code-bridge-image.service")

    with subtest("the bridge sees the server declared in the module"):
        out = machine.succeed("mcp-code-bridge servers")
        print(out)
        assert "time" in out, out

    # Secrets of the upstream server, outside the store; the sandbox code checks it cannot see them.
    machine.succeed(
        "install -d -m 0700 /run/secrets",
        "echo MCB_TEST_SECRET=s3cr3t-4242 > /run/secrets/time.env",
        "echo s3cr3t-4343 > /run/secrets/time-token",
    )

    with subtest("an MCP client calls run_python, which calls the time server"):
        out = machine.succeed("${client}/bin/python3 ${./mcp_client.py} mcp-code-bridge")
        print(out)
        assert "MCP-CLIENT-OK" in out, out
  '';
}

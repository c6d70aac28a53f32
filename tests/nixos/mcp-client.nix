# VM test: a real MCP client (the Python SDK's stdio client) calls run_python through
# `mcp-code-bridge run`, and the code calls an upstream server declared in the NixOS module
# (mcp-server-time from nixpkgs), proxied into the sandbox.
{ pkgs, module }:

let
  # The offline evaluation stub of nixpkgs (docs/nix.md) has no python3Packages.mcp, and only there
  # is it left out (nix/eval-stub.nix); with nixpkgs a missing one is an error.
  stub = import ../../nix/eval-stub.nix pkgs;
  client = pkgs.python3.withPackages (ps: pkgs.lib.toList (stub.lookup ps "mcp" [ ]));
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
          # The bare name only under the offline evaluation stub of nixpkgs, which lacks the
          # package (nix/eval-stub.nix); with nixpkgs always its store path.
          command =
            let
              time = stub.lookup pkgs "mcp-server-time" null;
            in
            if time == null then "mcp-server-time" else lib.getExe time;
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

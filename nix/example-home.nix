# A small home-manager configuration using programs.mcp-code-bridge; evaluated as
# homeConfigurations.example and as a check (it is not meant to be activated).
{ lib, pkgs, ... }:
{
  home = {
    username = "alice";
    homeDirectory = "/home/alice";
    stateVersion = "26.05";
  };

  # Servers shared by the MCP clients that integrate them; the bridge proxies them
  # (programs.mcp-code-bridge.enableMcpIntegration below).
  programs.mcp = {
    enable = true;
    servers = {
      time = {
        # The bare name only under the offline evaluation stub of nixpkgs, which lacks the
        # package (nix/eval-stub.nix); with nixpkgs always its store path.
        command =
          let
            time = (import ./eval-stub.nix pkgs).lookup pkgs "mcp-server-time" null;
          in
          if time == null then "mcp-server-time" else lib.getExe time;
        args = [
          "--local-timezone"
          "UTC"
        ];
      };
      forge = {
        command = "forgejo-mcp";
        args = [ "--cli" ];
        # Read from the file when the server starts; never written to the store.
        env.FORGEJO_ACCESS_TOKEN.file = "/run/user/1000/secrets/forgejo";
      };
    };
  };

  programs.mcp-code-bridge = {
    enable = true;
    # programs.mcp.servers above become upstream servers (off by default, as in every module).
    enableMcpIntegration = true;
    registerWithMcp = true;
    limits.memory = "768m";
    servers.docs = {
      url = "https://mcp.example.com/mcp";
      description = "Project documentation";
    };
    # `mcp-code-bridge serve` as a user service, on the bridge's default listen address, a
    # loopback one (so no token is needed).
    http.enable = true;
  };
}

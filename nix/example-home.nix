# A small home-manager configuration using programs.mcp-code-bridge; evaluated as
# homeConfigurations.example and as a check (it is not meant to be activated).
{ lib, pkgs, ... }:
{
  home = {
    username = "alice";
    homeDirectory = "/home/alice";
    stateVersion = "26.05";
  };

  # Servers shared by every MCP client; the bridge proxies them (enableMcpIntegration, the default).
  programs.mcp = {
    enable = true;
    servers = {
      time = {
        # `if`: the offline evaluation stub of nixpkgs (docs/nix.md) has no mcp-server-time;
        # nixpkgs has, so there this is always its store path.
        command =
          if pkgs ? mcp-server-time then lib.getExe pkgs.mcp-server-time else "mcp-server-time";
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

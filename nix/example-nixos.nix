# A small NixOS configuration using services.mcp-code-bridge; evaluated as
# nixosConfigurations.example (it is not meant to be deployed).
{ lib, pkgs, ... }:
{
  boot.loader.grub.enable = false;
  fileSystems."/" = {
    device = "/dev/disk/by-label/nixos";
    fsType = "ext4";
  };
  system.stateVersion = "26.05";

  users.users.alice = {
    isNormalUser = true;
    linger = true;
  };

  services.mcp-code-bridge = {
    enable = true;
    preloadImage = true;
    limits = {
      memory = "1g";
      cpus = 2;
      timeout = "45s";
    };
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
        description = "Current time and time-zone conversion";
      };
      github = {
        command = "github-mcp-server";
        args = [ "stdio" ];
        # GITHUB_PERSONAL_ACCESS_TOKEN=... lives in this file, outside the Nix store.
        envFile = "/run/secrets/github-mcp.env";
      };
      remote = {
        url = "https://mcp.example.com/mcp";
        description = "A remote streamable-HTTP server";
      };
    };
    settings.log_level = "debug";
    # `mcp-code-bridge serve` for the team: MCP over HTTP at http://<host>:8931/mcp.
    http = {
      enable = true;
      listen = "0.0.0.0:8931";
      # Lines of `name:token`, outside the Nix store; the service gets a copy at start.
      tokenFile = "/run/secrets/mcp-code-bridge-tokens";
      openFirewall = true;
    };
  };
}

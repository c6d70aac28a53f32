# services.mcp-code-bridge: the bridge for every user of the machine.
# Writes /etc/mcp-code-bridge/config.toml (the lowest-precedence config file the bridge reads;
# a user's ~/.config/mcp-code-bridge/config.toml and MCP_BRIDGE_* variables still override it),
# enables podman, and can preload the sandbox image into root's podman storage at boot. Users'
# MCP clients start `mcp-code-bridge` themselves (as that user, rootless); it loads the image
# archive named in config.toml into their own storage on first use.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.services.mcp-code-bridge;
  common = import ../nix/common.nix { inherit lib pkgs; };
  opt = "services.mcp-code-bridge";

  image = common.effectiveImage cfg;
  configFile = common.configFile {
    inherit (cfg) settings;
    inherit image;
  };

  inherit (lib)
    literalExpression
    mkDefault
    mkEnableOption
    mkIf
    mkOption
    mkPackageOption
    types
    ;
in
{
  options.services.mcp-code-bridge = common.options // {
    enable = mkEnableOption "mcp-code-bridge, an MCP server whose one tool, run_python, runs code in a rootless podman sandbox";

    package = mkPackageOption pkgs "mcp-code-bridge" { };

    preloadImage = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Load the sandbox image into root's podman storage at boot (a oneshot unit,
        `mcp-code-bridge-image.service`, running `mcp-code-bridge image load`), and again whenever
        the image changes. Rootless users load it into their own storage on first use either way.
      '';
    };

    configFile = mkOption {
      type = types.package;
      readOnly = true;
      defaultText = literalExpression "the rendered config.toml";
      description = "The generated /etc/mcp-code-bridge/config.toml (read-only; for tests and other modules).";
    };
  };

  config = mkIf cfg.enable {
    services.mcp-code-bridge = {
      settings = lib.mapAttrs (_: mkDefault) (common.typedSettings cfg) // {
        servers = lib.mapAttrs (_: common.serverToToml) cfg.servers;
      };
      inherit configFile;
    };

    assertions = common.serverAssertions opt cfg.servers ++ [
      {
        assertion = cfg.preloadImage -> image != null;
        message = ''
          ${opt}.preloadImage needs ${opt}.image (a docker-archive such as the flake's
          packages.<system>.sandbox-image); set one, or set preloadImage = false.
        '';
      }
      {
        assertion = config.virtualisation.podman.enable;
        message = ''
          ${opt} runs its sandbox in podman; keep virtualisation.podman.enable = true (the module
          sets it by default).
        '';
      }
    ];
    warnings = common.serverWarnings opt cfg.servers;

    virtualisation.podman.enable = mkDefault true;

    environment.etc."mcp-code-bridge/config.toml".source = configFile;
    environment.systemPackages = [ cfg.package ];

    systemd.services.mcp-code-bridge-image = mkIf cfg.preloadImage {
      description = "Load the mcp-code-bridge sandbox image into podman";
      wantedBy = [ "multi-user.target" ];
      wants = [ "podman.socket" ];
      after = [ "podman.socket" ];
      # Load again when the image (hence config.toml) changes.
      restartTriggers = [ configFile ];
      # `or`: the offline evaluation stub of NixOS (docs/nix.md) does not declare podman's options;
      # NixOS does, so there this is always virtualisation.podman.package.
      path = [ (config.virtualisation.podman.package or pkgs.podman) ];
      environment = {
        MCP_BRIDGE_STATE_DIR = "/var/lib/mcp-code-bridge";
        HOME = "/var/lib/mcp-code-bridge";
      };
      serviceConfig = {
        Type = "oneshot";
        RemainAfterExit = true;
        StateDirectory = "mcp-code-bridge";
        ExecStart = "${lib.getExe cfg.package} image load";
      };
    };
  };
}

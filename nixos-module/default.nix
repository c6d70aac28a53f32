# services.mcp-code-bridge: the bridge for every user of the machine.
# Writes /etc/mcp-code-bridge/config.toml (the lowest-precedence config file the bridge reads;
# a user's ~/.config/mcp-code-bridge/config.toml and MCP_BRIDGE_* variables still override it),
# enables podman (unless settings.runtime picks docker), and can preload the sandbox image into
# root's storage of that engine at boot. Users' MCP clients start `mcp-code-bridge` themselves
# (as that user, rootless); it loads the image archive named in config.toml into their own
# storage on first use.
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
    inherit (cfg) settings package;
    inherit image;
    check = cfg.checkConfig;
  };

  # Which engine the bridge will use, from `settings.runtime` as the bridge reads it (unset is
  # the bridge's `auto`: podman's sockets first, then docker's, then a podman service of its
  # own). A socket URL names its engine by its path (/run/podman/podman.sock,
  # /run/docker.sock); any other URL (tcp://, a socket elsewhere) is the user's to run, and
  # nothing is asserted about it.
  runtime = cfg.settings.runtime or null;
  engine = common.engineOf runtime;
  podmanOn = config.virtualisation.podman.enable;
  # `or false`: the offline evaluation stub of NixOS (docs/nix.md) does not declare docker's
  # options; NixOS does (default false), so there this is always the option's value.
  dockerOn =
    (config.virtualisation.docker.enable or false)
    || (config.virtualisation.docker.rootless.enable or false);
  # The socket units the preload unit starts after.
  engineSockets =
    lib.optional (podmanOn && engine != "docker") "podman.socket"
    ++ lib.optional (dockerOn && engine != "podman") "docker.socket";

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
  # `http`: `mcp-code-bridge serve` as a service, for a team or remote clients.
  imports = [ ../nix/http-nixos.nix ];

  options.services.mcp-code-bridge = common.options // {
    # /etc/mcp-code-bridge/config.toml is read by every user's bridge, so a fixed directory or
    # file there is one that every user would write to (root's, or nobody's): these two are the
    # HTTP service's own, passed in its environment, and never written to that file.
    stateDir = mkOption {
      type = types.nullOr (types.strMatching "/var/lib/[^/].*");
      default = null;
      example = "/var/lib/mcp-code-bridge-team";
      description = ''
        State directory of the `mcp-code-bridge-http` service ({option}`http.enable`), under
        /var/lib (systemd creates it, owned by the service's user, mode 0700):
        `MCP_BRIDGE_STATE_DIR` of that service. `null`: /var/lib/mcp-code-bridge-http. Not
        written to /etc/mcp-code-bridge/config.toml: every user's own bridge keeps its state in
        its own `$XDG_STATE_HOME/mcp-code-bridge` (a user can choose another in
        ~/.config/mcp-code-bridge/config.toml).
      '';
    };

    audit = common.options.audit // {
      path = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "/var/log/mcp-code-bridge/audit.jsonl";
        description = ''
          Audit log of the `mcp-code-bridge-http` service ({option}`http.enable`): an absolute
          path, or "off" (`MCP_BRIDGE_AUDIT_PATH` of that service). Under /var/log/<dir>/,
          systemd creates <dir> for the service's user (`LogsDirectory`); elsewhere the directory
          must exist. `null`: the service's `<state_dir>/audit.jsonl`. Not written to
          /etc/mcp-code-bridge/config.toml: every user's own bridge logs to its own
          `<state_dir>/audit.jsonl`.
        '';
      };
    };

    enable = mkEnableOption "mcp-code-bridge, an MCP server whose one tool, run_python, runs code in a rootless podman sandbox";

    package = mkPackageOption pkgs "mcp-code-bridge" { };

    preloadImage = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Load the sandbox image into root's storage of the engine (podman, or docker when
        {option}`settings.runtime` says so) at boot (a oneshot unit,
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
      settings =
        # stateDir and audit.path are the HTTP service's alone (nix/http-nixos.nix).
        common.typedDefaults (
          cfg
          // {
            stateDir = null;
            audit = cfg.audit // {
              path = null;
            };
          }
        )
        // lib.optionalAttrs (cfg.servers != { }) {
          servers = lib.mapAttrs (_: common.serverToToml) cfg.servers;
        };
      inherit configFile;
      gvisor.wrapper = common.gvisorRuntime cfg;
    };

    assertions =
      common.serverAssertions opt cfg.servers
      ++ common.packagesAssertions opt cfg
      ++ common.settingsFileAssertions opt cfg.settings
      ++ common.gvisorAssertions opt cfg (engine == "podman" || (engine == "auto" && podmanOn))
      ++ [
        {
          assertion = cfg.preloadImage -> image != null;
          message = ''
            ${opt}.preloadImage needs ${opt}.image (a docker-archive such as the flake's
            packages.<system>.sandbox-image); set one, or set preloadImage = false.
          '';
        }
        {
          assertion = engine != "podman" || podmanOn;
          message = ''
            ${opt}.settings.runtime = "${runtime}" uses podman, but virtualisation.podman.enable
            is false. Remove the line that sets it to false (this module enables podman), or point
            ${opt}.settings.runtime at the engine you run (e.g. "docker", with
            virtualisation.docker.enable = true).
          '';
        }
        {
          assertion = engine != "docker" || dockerOn;
          message = ''
            ${opt}.settings.runtime = "${runtime}" uses docker, but neither
            virtualisation.docker.enable nor virtualisation.docker.rootless.enable is true. Set
            virtualisation.docker.enable = true (and add the bridge's users to the "docker"
            group), or remove ${opt}.settings.runtime to use podman, which this module then enables.
          '';
        }
        {
          assertion = engine != "auto" || podmanOn || dockerOn;
          message = ''
            ${opt}: no container engine is enabled. With settings.runtime unset (or "auto") the
            bridge uses podman or docker: keep virtualisation.podman.enable = true (this module
            enables it), or enable virtualisation.docker and set ${opt}.settings.runtime = "docker".
          '';
        }
        {
          assertion = cfg.stateDir == null || cfg.http.enable;
          message = ''
            ${opt}.stateDir is the state directory of the mcp-code-bridge-http service, which
            ${opt}.http.enable turns on; it is not written to /etc/mcp-code-bridge/config.toml,
            which every user's bridge reads (one directory for all of them is writable by none).
            Set ${opt}.http.enable = true, or remove stateDir: each user's bridge keeps its state in
            its own $XDG_STATE_HOME/mcp-code-bridge (state_dir in ~/.config/mcp-code-bridge/config.toml
            moves it).
          '';
        }
        {
          assertion = cfg.audit.path == null || cfg.http.enable;
          message = ''
            ${opt}.audit.path is the audit log of the mcp-code-bridge-http service, which
            ${opt}.http.enable turns on; it is not written to /etc/mcp-code-bridge/config.toml,
            which every user's bridge reads (one file for all of them is writable by none). Set
            ${opt}.http.enable = true, or remove audit.path: each user's bridge logs to its own
            <state_dir>/audit.jsonl.
          '';
        }
      ];
    warnings = common.serverWarnings opt cfg.servers;

    # gVisor's runsc as an OCI runtime of podman, rootful and rootless: containers.conf's
    # [engine.runtimes], through nixpkgs' containers module (its TOML option, merged into
    # /etc/containers/containers.conf).
    virtualisation.containers.containersConf.settings = mkIf cfg.gvisor.enable (
      common.gvisorContainersConf cfg
    );

    # podman unless the configuration chose docker (or an engine elsewhere) in settings.runtime.
    virtualisation.podman.enable = mkDefault (engine == "auto" || engine == "podman");

    # A host uid of each sandbox's own: rootful podman gives each --userns=auto container a range
    # of the subordinate ids of the name `containers`, which NixOS writes into /etc/subuid and
    # /etc/subgid from that user's subUidRanges and subGidRanges. 2^31 ids from 2147483647
    # (podman's own example): room for 32768 sandboxes of 65535 ids. The bridge asks for
    # --userns=auto when they hold its max_sessions + pool_size + 1 sandboxes, so the kernel's
    # per-uid limits are per sandbox (`mcp-code-bridge doctor`: host identity).
    users.users.containers = mkIf (podmanOn && engine != "docker") {
      isSystemUser = mkDefault true;
      group = mkDefault "containers";
      description = mkDefault "subordinate ids of rootful podman's --userns=auto containers";
      subUidRanges = mkDefault [
        {
          startUid = 2147483647;
          count = 2147483648;
        }
      ];
      subGidRanges = mkDefault [
        {
          startGid = 2147483647;
          count = 2147483648;
        }
      ];
    };
    users.groups.containers = mkIf (podmanOn && engine != "docker") { };

    environment.etc."mcp-code-bridge/config.toml".source = configFile;
    environment.systemPackages = [ cfg.package ];

    systemd.services.mcp-code-bridge-image = mkIf cfg.preloadImage {
      description = "Load the mcp-code-bridge sandbox image into the container engine";
      wantedBy = [ "multi-user.target" ];
      wants = engineSockets;
      after = engineSockets;
      # Load again when the image (hence config.toml) changes.
      restartTriggers = [ configFile ];
      # `or`: the offline evaluation stub of NixOS (docs/nix.md) does not declare podman's options;
      # NixOS does, so there this is always virtualisation.podman.package.
      path = lib.optional podmanOn (config.virtualisation.podman.package or pkgs.podman);
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

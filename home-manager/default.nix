# programs.mcp-code-bridge: the bridge for one user.
# Writes $XDG_CONFIG_HOME/mcp-code-bridge/config.toml. Its upstream servers are
# programs.mcp-code-bridge.servers, plus programs.mcp.servers (home-manager's shared MCP server
# list) with enableMcpIntegration; with registerWithMcp the bridge itself joins
# programs.mcp.servers, so every client with enableMcpIntegration (claude-code, opencode, codex,
# vscode, ...) gets it.
# Podman itself is not installed here: on NixOS enable virtualisation.podman (or the NixOS module),
# elsewhere install podman with the distribution's packages (rootless podman needs its setuid
# newuidmap helpers).
{
  config,
  options,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.programs.mcp-code-bridge;
  common = import ../nix/common.nix { inherit lib pkgs; };
  opt = "programs.mcp-code-bridge";

  image = common.effectiveImage cfg;

  # home-manager's programs.mcp (a shared list of MCP servers for every client) exists only in
  # recent home-manager, and its typed servers with `lib.hm.mcp` only since
  # nix-community/home-manager#9081. Both are looked up, never assumed: without programs.mcp
  # the module works with its own `servers`, and registerWithMcp is refused with a message.
  hasMcp = options ? programs.mcp.servers;
  canImportMcp = hasMcp && lib ? hm.mcp.transformMcpServer && lib ? hm.mcp.resolveEnabled;
  mcpCfg = lib.attrByPath [ "programs" "mcp" ] {
    enable = false;
    servers = { };
  } config;

  # A programs.mcp entry that would start this bridge again.
  isBridge =
    name: server:
    name == cfg.mcpServerName
    || (
      (server.command or null) != null && baseNameOf (toString server.command) == "mcp-code-bridge"
    );

  # programs.mcp.servers.<name> -> [servers.<name>]. A secret given as `env.X.file = "/path"`
  # becomes the reference "{file:/path}", which the bridge reads when it starts the server, so it
  # stays out of the store; disabled servers are left out.
  fromMcp =
    _name: server:
    let
      t = lib.hm.mcp.transformMcpServer {
        inherit server;
        mkFileRef = path: "{file:${path}}";
      };
    in
    lib.filterAttrs (_: v: v != null && v != [ ] && v != { }) {
      command = if t ? command then toString t.command else null;
      args = t.args or [ ];
      env = t.env or { };
      cwd = t.cwd or null;
      url = t.url or null;
      headers = t.headers or { };
      description = t.description or null;
    };

  mcpServers = lib.optionalAttrs (cfg.enableMcpIntegration && canImportMcp && mcpCfg.enable) (
    lib.mapAttrs fromMcp (
      lib.filterAttrs (
        name: server: !(isBridge name server) && lib.hm.mcp.resolveEnabled server != false
      ) mcpCfg.servers
    )
  );

  configFile = common.configFile {
    inherit (cfg) settings package;
    inherit image;
    check = cfg.checkConfig;
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
  # `http`: `mcp-code-bridge serve` as a service, for a team or remote clients.
  imports = [ ../nix/http-home.nix ];

  options.programs.mcp-code-bridge = common.options // {
    enable = mkEnableOption "mcp-code-bridge, an MCP server whose one tool, run_python, runs code in a rootless podman sandbox";

    package = mkPackageOption pkgs "mcp-code-bridge" { };

    # Off unless asked for, as every home-manager module with this option declares it (claude-code,
    # codex, opencode, vscode, zed-editor, ...): programs.mcp.servers reach a client only when
    # its configuration says so.
    enableMcpIntegration = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Whether to use the servers of {option}`programs.mcp.servers` (when
        {option}`programs.mcp.enable`) as upstream servers, besides
        {option}`programs.mcp-code-bridge.servers` (which win on a name clash). The bridge's own
        entry is left out.
      '';
    };

    registerWithMcp = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Add the bridge to {option}`programs.mcp.servers` as {option}`mcpServerName` (and enable
        programs.mcp), so MCP clients with `enableMcpIntegration` see it. To give a client the
        bridge alone, declare the upstream servers in {option}`programs.mcp-code-bridge.servers`
        rather than in programs.mcp.servers.
      '';
    };

    mcpServerName = mkOption {
      type = types.str;
      default = "mcp-code-bridge";
      description = "The bridge's name in {option}`programs.mcp.servers`.";
    };

    configFile = mkOption {
      type = types.package;
      readOnly = true;
      defaultText = literalExpression "the rendered config.toml";
      description = "The generated config.toml (read-only).";
    };
  };

  config = mkIf cfg.enable (
    lib.mkMerge [
      {
        programs.mcp-code-bridge = {
          settings =
            common.typedDefaults cfg
            // lib.optionalAttrs (mcpServers != { } || cfg.servers != { }) {
              servers =
                lib.mapAttrs (_: mkDefault) mcpServers // lib.mapAttrs (_: common.serverToToml) cfg.servers;
            };
          inherit configFile;
          gvisor.wrapper = common.gvisorRuntime cfg;
        };

        assertions =
          common.serverAssertions opt cfg.servers
          ++ common.packagesAssertions opt cfg
          ++ common.settingsFileAssertions opt cfg.settings
          ++ common.gvisorAssertions opt cfg (
            lib.elem (common.engineOf (cfg.settings.runtime or null)) [
              "auto"
              "podman"
            ]
          )
          ++ [
            {
              assertion = pkgs.stdenv.hostPlatform.isLinux;
              message = ''
                ${opt} runs its sandbox in rootless podman containers on Linux, and the
                mcp-code-bridge flake builds for x86_64-linux and aarch64-linux only; this home
                configuration is for ${pkgs.stdenv.hostPlatform.system}. Enable ${opt} only in the
                configurations of Linux machines (e.g. lib.mkIf pkgs.stdenv.hostPlatform.isLinux).
              '';
            }
            {
              assertion = cfg.registerWithMcp -> hasMcp;
              message = ''
                ${opt}.registerWithMcp needs home-manager's programs.mcp module, which this
                home-manager does not have. Update home-manager, or set registerWithMcp = false and
                register the bridge with each MCP client yourself (command
                "${lib.getExe cfg.package}", args [ "run" ]).
              '';
            }
          ];
        warnings =
          common.serverWarnings opt cfg.servers
          ++ lib.optional (
            cfg.enableMcpIntegration && hasMcp && !canImportMcp && mcpCfg.enable && mcpCfg.servers != { }
          ) (
            "${opt}: programs.mcp.servers are not used as upstream servers: this home-manager's "
            + "programs.mcp predates its typed servers (lib.hm.mcp). Update home-manager, or declare "
            + "them in ${opt}.servers (and set ${opt}.enableMcpIntegration = false to silence this)."
          );

        home.packages = [ cfg.package ];
        xdg.configFile."mcp-code-bridge/config.toml".source = configFile;
      }

      # gVisor's runsc as an OCI runtime of your rootless podman: a drop-in of containers.conf,
      # which podman reads from $XDG_CONFIG_HOME/containers/containers.conf.d/*.conf after
      # /etc/containers/containers.conf and ~/.config/containers/containers.conf (so it leaves
      # those, and home-manager's services.podman, as they are).
      (mkIf cfg.gvisor.enable {
        xdg.configFile."containers/containers.conf.d/50-mcp-code-bridge-gvisor.conf".source =
          common.tomlFormat.generate "50-mcp-code-bridge-gvisor.conf" (common.gvisorContainersConf cfg);
      })

      # optionalAttrs, not mkIf: a definition under an option that does not exist is an error
      # even when its mkIf condition is false.
      (lib.optionalAttrs hasMcp {
        programs.mcp = mkIf cfg.registerWithMcp {
          enable = mkDefault true;
          servers.${cfg.mcpServerName} = {
            command = lib.getExe cfg.package;
            args = [ "run" ];
          };
        };
      })
    ]
  );
}

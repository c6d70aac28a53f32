# programs.mcp-code-bridge.http: `mcp-code-bridge serve` (MCP over Streamable HTTP at /mcp) as a
# user service, mcp-code-bridge-http, with the user's rootless podman. Imported by
# home-manager/ (its `imports`); it reads that module's options (package, settings,
# configFile) and its $XDG_CONFIG_HOME/mcp-code-bridge/config.toml.
#
# The engine is found as by a bridge started from a client: the user's podman socket
# ($XDG_RUNTIME_DIR/podman/podman.sock, podman.socket), else a `podman system service` the
# bridge starts itself. Hence little sandboxing here: rootless podman needs the setuid
# newuidmap/newgidmap (no NoNewPrivileges) and its own user namespaces (no PrivateTmp or
# PrivateUsers, which user units get only inside one).
{
  config,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.programs.mcp-code-bridge;
  http = cfg.http;
  common = import ./common.nix { inherit lib pkgs; };
  opt = "programs.mcp-code-bridge";

  engine = common.engineOf (cfg.settings.runtime or null);
  on = cfg.enable && http.enable;
  podmanSocket = lib.optional (engine == "auto" || engine == "podman") "podman.socket";
in
{
  options.programs.mcp-code-bridge.http = common.httpOptions;

  # Conditions at the second level, not around the whole config (see nix/http-nixos.nix).
  config = {
    assertions = lib.mkIf http.enable (common.httpAssertions opt cfg);

    # The file stays where it is and the user's bridge reads it, so its path goes into
    # config.toml (where `mcp-code-bridge serve` run by hand finds it too).
    programs.mcp-code-bridge.settings = lib.mkIf on (
      common.httpDefaults http
      // lib.optionalAttrs (http.tokenFile != null) { token_file = lib.mkDefault http.tokenFile; }
    );

    systemd.user.services.mcp-code-bridge-http = lib.mkIf on {
      Unit = {
        Description = "mcp-code-bridge: MCP over Streamable HTTP (mcp-code-bridge serve)";
        Wants = podmanSocket;
        After = podmanSocket;
        # config.toml is read at start.
        X-Restart-Triggers = [ "${cfg.configFile}" ];
      };
      Service = {
        ExecStart = "${lib.getExe cfg.package} serve";
        Restart = "on-failure";
        RestartSec = 5;
        # SIGTERM to the bridge alone: it lets calls in flight finish, removes its containers
        # and stops a podman service it started; the rest is killed after it exits or at the
        # timeout, max_timeout + 30 s.
        KillSignal = "SIGTERM";
        KillMode = "mixed";
        TimeoutStopSec = common.httpStopTimeout cfg.settings;
        UMask = "0077";
      };
      Install.WantedBy = [ "default.target" ];
    };
  };
}

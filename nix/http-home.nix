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
  tokenFile = common.fileRef http.tokenFile;
  tlsCert = common.fileRef http.tlsCertFile;
  tlsKey = common.fileRef http.tlsKeyFile;

  # The user manager's PATH is not the login shell's: with standalone home-manager on another
  # distribution it lacks the profile's bin (~/.nix-profile/bin, or ~/.local/state/nix/profile/bin),
  # so an upstream server given as a bare command (`command = "uvx";`) would not start, while the
  # bridge a client starts, which inherits the shell's PATH, finds it. The profile's bin goes
  # first, as in the shell; the rest of the manager's PATH stays (on NixOS, /run/wrappers/bin
  # with the setuid newuidmap that rootless podman needs).
  serve = pkgs.writeShellScript "mcp-code-bridge-http" ''
    export PATH=${lib.escapeShellArg "${config.home.profileDirectory}/bin"}''${PATH:+:$PATH}
    exec ${lib.getExe cfg.package} serve
  '';
in
{
  options.programs.mcp-code-bridge.http = common.httpOptions;

  # Conditions at the second level, not around the whole config (see nix/http-nixos.nix).
  config = {
    assertions = lib.mkIf http.enable (common.httpAssertions opt cfg);

    # The files stay where they are and the user's bridge reads them, so their paths go into
    # config.toml (where `mcp-code-bridge serve` run by hand finds them too). Only strings
    # outside the store get here (common.fileRef); the assertions refuse the rest.
    programs.mcp-code-bridge.settings = lib.mkIf on (
      common.httpDefaults http
      // lib.optionalAttrs (tokenFile != null) { token_file = lib.mkDefault tokenFile; }
      // lib.optionalAttrs (tlsCert != null && tlsKey != null) {
        http = {
          tls_cert = lib.mkDefault tlsCert;
          tls_key = lib.mkDefault tlsKey;
        };
      }
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
        ExecStart = serve;
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

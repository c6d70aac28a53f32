# services.mcp-code-bridge.http: `mcp-code-bridge serve` (MCP over Streamable HTTP at /mcp) as a
# hardened system service, mcp-code-bridge-http, for clients on other machines. Imported by the
# nixos-module/ (its `imports`); it reads that module's options (package,
# settings, configFile) and its /etc/mcp-code-bridge/config.toml.
#
# The engine is the one the NixOS module already enables: rootful podman, reached through its
# socket /run/podman/podman.sock, whose group is `podman` (docker's socket and group `docker`
# when settings.runtime picks docker). The service runs as the system user `mcp-code-bridge` in
# that group. A member of that group can start any container, so it is as good as root: the
# sandboxing below bounds the bridge and its upstream servers, not the engine.
#
# With gvisor.enable the engine is another root podman service on a socket of its own,
# mcp-code-bridge-gvisor-podman (socket-activated as podman.socket activates podman.service),
# started with `--runtime <gvisor_runtime>`: podman's Docker-compatible API runs every container
# under its service's default runtime, whatever the container asks for, so the bridge uses only a
# service whose default is gVisor's (crates/sandbox/src/engine) and passes /run/podman/podman.sock over.
# Its socket belongs to the service's group alone.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.services.mcp-code-bridge;
  http = cfg.http;
  common = import ./common.nix { inherit lib pkgs; };
  opt = "services.mcp-code-bridge";

  user = "mcp-code-bridge";
  # services.mcp-code-bridge.stateDir and audit.path are this service's (nixos-module/ keeps them
  # out of the users' config.toml); stateDir is under /var/lib (its type says so).
  stateDir = if cfg.stateDir != null then cfg.stateDir else "/var/lib/mcp-code-bridge-http";

  listen = common.parseListen (cfg.settings.listen or "");
  engine = common.engineOf (cfg.settings.runtime or null);
  podmanOn = config.virtualisation.podman.enable;
  # `or false`: the offline evaluation stub of NixOS (docs/nix.md) does not declare docker's
  # options; NixOS does (default false), so there this is always the option's value. Rootless
  # docker is the user's own and cannot serve this system user.
  dockerOn = config.virtualisation.docker.enable or false;
  usePodman = podmanOn && (engine == "auto" || engine == "podman");
  useDocker = dockerOn && (engine == "auto" || engine == "docker");

  # gVisor: the podman service of the HTTP service's own, whose default runtime is gVisor's.
  gvisor = cfg.gvisor.enable && usePodman;
  gvisorPodman = "mcp-code-bridge-gvisor-podman";
  gvisorSocket = "/run/${gvisorPodman}/podman.sock";
  # `or`: the offline evaluation stub of NixOS (docs/nix.md) does not declare podman's options;
  # NixOS does, so there this is always virtualisation.podman.package (podman with its helpers).
  podmanPackage = config.virtualisation.podman.package or pkgs.podman;

  # A port below 1024 needs CAP_NET_BIND_SERVICE, the one capability the service may then keep.
  bindCaps = lib.optional (listen != null && listen.port < 1024) "CAP_NET_BIND_SERVICE";

  # The files `serve` reads at start: each typed option, else its config.toml key given by hand
  # in `settings`. Either way the service gets them from systemd, never where they lie: the
  # service's user cannot read a root-only secret, and a key set by hand would otherwise make the
  # service fail at start while the assertions count it as authentication.
  secretFiles = [
    {
      name = "tokens";
      option = "http.tokenFile";
      key = "token_file";
      typed = http.tokenFile;
      given = cfg.settings.token_file or null;
      env = "MCP_BRIDGE_TOKEN_FILE";
    }
    {
      name = "tls-cert";
      option = "http.tlsCertFile";
      key = "http.tls_cert";
      typed = http.tlsCertFile;
      given = cfg.settings.http.tls_cert or null;
      env = "MCP_BRIDGE_HTTP_TLS_CERT";
    }
    {
      name = "tls-key";
      option = "http.tlsKeyFile";
      key = "http.tls_key";
      typed = http.tlsKeyFile;
      given = cfg.settings.http.tls_key or null;
      env = "MCP_BRIDGE_HTTP_TLS_KEY";
    }
  ];
  # Files systemd hands the service (LoadCredential, read as root at each start, so they may
  # belong to root or to the `acme` group alone), as $CREDENTIALS_DIRECTORY/<name> (`%d/<name>`
  # in the unit), and the variable that points the bridge at each, which wins over the key in
  # config.toml. Only strings outside the store get here (common.fileRef); the assertions refuse
  # the rest (a certificate in the store, public, is read where it lies).
  credentials = lib.filter (c: c.file != null) (
    map (f: {
      inherit (f) name env;
      file = common.fileRef (if f.typed != null then f.typed else f.given);
    }) secretFiles
  );

  # The audit log: the typed option (this service's alone), else one set by hand in settings.
  # Under /var/log/<dir>/ systemd creates <dir> for the service's user (LogsDirectory);
  # elsewhere, outside the state directory, the directory must exist and is made writable.
  auditPath = if cfg.audit.path != null then cfg.audit.path else cfg.settings.audit.path or null;
  auditAbsolute = auditPath != null && lib.hasPrefix "/" auditPath;
  auditLogsDir =
    if auditAbsolute && lib.hasPrefix "/var/log/" (dirOf auditPath) then
      lib.removePrefix "/var/log/" (dirOf auditPath)
    else
      null;
  auditDir = lib.optional (
    auditAbsolute && auditLogsDir == null && !lib.hasPrefix "${stateDir}/" auditPath
  ) (dirOf auditPath);

  on = cfg.enable && http.enable;

  inherit (lib) mkIf mkOption types;
in
{
  options.services.mcp-code-bridge.http = common.httpOptions // {
    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Open the port of {option}`listen` in the firewall (TCP), on every interface. Needs
        {option}`listen` set to an address other than loopback.
      '';
    };
  };

  # Conditions at the second level, not around the whole config: a definition that is
  # `mkIf false` at the top level still creates that attribute in a free-form module (the
  # offline stub of NixOS, nix/module-tests.nix), and reading it fails.
  config = {
    # Whenever http.enable (one says that enable is needed too).
    assertions = mkIf http.enable (
      common.httpAssertions opt cfg
      ++ [
        {
          assertion = http.openFirewall -> (listen != null && !common.isLoopback listen);
          message = ''
            ${opt}.http.openFirewall opens the port of ${opt}.http.listen, but the service listens
            on ${
              if cfg.settings ? listen then "\"${cfg.settings.listen}\"" else "the bridge's default address"
            }, a loopback address that other machines cannot reach anyway. Set
            ${opt}.http.listen = "0.0.0.0:8931"; (with tokenFile or oauth), or openFirewall = false.
          '';
        }
      ]
      # A typed file option and its key set by hand: two names for the one file `serve` reads.
      ++ map (f: {
        assertion = f.typed == null || f.given == null;
        message = ''
          ${opt}.${f.option} and ${opt}.settings.${f.key} both name the file that
          mcp-code-bridge serve reads as ${f.key}; the service is handed one (LoadCredential).
          Keep ${opt}.${f.option} (remove settings.${f.key}), or remove ${f.option}.
        '';
      }) secretFiles
      ++ lib.optional cfg.enable {
        # A runtime URL is the bridge's one candidate: the gVisor service's socket would not be
        # tried, and podman's own socket is passed over under gVisor.
        assertion = !cfg.gvisor.enable || engine == "auto" || cfg.settings.runtime == "podman";
        message = ''
          ${opt}.http with ${opt}.gvisor.enable: the service runs its sandboxes through a podman
          service of its own whose default runtime is gVisor's (${gvisorSocket}), which it
          finds only when settings.runtime is unset, "auto" or "podman"; it is
          "${toString (cfg.settings.runtime or "")}". Remove ${opt}.settings.runtime (or set it
          to "podman").
        '';
      }
      ++ lib.optional cfg.enable {
        assertion = engine == "other" || usePodman || useDocker;
        message = ''
          ${opt}.http: the service runs as the system user ${user} and reaches the container
          engine through a rootful socket, podman's (virtualisation.podman.enable, which
          ${opt} enables unless settings.runtime picks docker) or docker's
          (virtualisation.docker.enable; rootless docker is not reachable from it). Enable one
          of them, or point ${opt}.settings.runtime at an engine URL the service can reach.
        '';
      }
    );

    # The rest with the bridge's module enabled too: the service reads its config.toml.
    services.mcp-code-bridge.settings = mkIf on (common.httpDefaults http);

    users.users.${user} = mkIf on {
      isSystemUser = true;
      group = user;
      description = "mcp-code-bridge HTTP service";
    };
    users.groups.${user} = mkIf on { };

    networking.firewall.allowedTCPPorts = mkIf (on && http.openFirewall && listen != null) [
      listen.port
    ];

    # The podman service of the HTTP service alone when gVisor is on: as podman's own
    # podman.socket and podman.service (their units in the podman package), with the gVisor
    # runtime as its default and a socket only the service's group can use.
    systemd.sockets.${gvisorPodman} = mkIf (on && gvisor) {
      description = "Podman API socket of mcp-code-bridge-http (containers under gVisor)";
      wantedBy = [ "sockets.target" ];
      listenStreams = [ gvisorSocket ];
      socketConfig = {
        SocketMode = "0660";
        SocketUser = "root";
        SocketGroup = user;
        DirectoryMode = "0755";
      };
    };
    systemd.services.${gvisorPodman} = mkIf (on && gvisor) {
      description = "Podman API service of mcp-code-bridge-http, gVisor's runtime its default";
      requires = [ "${gvisorPodman}.socket" ];
      after = [ "${gvisorPodman}.socket" ];
      # Podman's own service runs `podman $LOGGING system service`: socket-activated, it exits
      # when idle and the socket starts it again.
      unitConfig.StartLimitIntervalSec = 0;
      serviceConfig = {
        Type = "exec";
        KillMode = "process";
        Delegate = true;
        ExecStart = "${lib.getExe podmanPackage} --runtime ${common.gvisorRuntimeOf cfg.settings} system service";
      };
    };

    systemd.services.mcp-code-bridge-http = mkIf on (
      let
        sockets =
          if gvisor then
            [ "${gvisorPodman}.socket" ]
          else
            lib.optional usePodman "podman.socket" ++ lib.optional useDocker "docker.socket";
        # The issuer's keys are fetched over the network.
        online = lib.optional ((cfg.settings.oauth.issuer or null) != null) "network-online.target";
        image = lib.optional cfg.preloadImage "mcp-code-bridge-image.service";
      in
      {
        description = "mcp-code-bridge: MCP over Streamable HTTP (mcp-code-bridge serve)";
        wantedBy = [ "multi-user.target" ];
        wants = sockets ++ online ++ image;
        after = [ "network.target" ] ++ sockets ++ online ++ image;
        # /etc/mcp-code-bridge/config.toml is read at start.
        restartTriggers = [ cfg.configFile ];
        environment = {
          HOME = stateDir;
          # Like the image preload unit: the service's state (audit log, skills) in its
          # StateDirectory, whatever state_dir the users' bridges share in config.toml.
          MCP_BRIDGE_STATE_DIR = stateDir;
        }
        # Tried first when the bridge looks for podman (runtime unset, "auto" or "podman"); a
        # runtime URL in settings still wins.
        // lib.optionalAttrs usePodman {
          CONTAINER_HOST = "unix://${if gvisor then gvisorSocket else "/run/podman/podman.sock"}";
        }
        // lib.optionalAttrs (cfg.audit.path != null) { MCP_BRIDGE_AUDIT_PATH = cfg.audit.path; }
        # Above config.toml; `%d` is the unit's credentials directory.
        // lib.listToAttrs (map (c: lib.nameValuePair c.env "%d/${c.name}") credentials);
        serviceConfig = {
          ExecStart = "${lib.getExe cfg.package} serve";
          User = user;
          Group = user;
          SupplementaryGroups =
            lib.optional (usePodman && !gvisor) "podman" ++ lib.optional (useDocker && !gvisor) "docker";
          LoadCredential = map (c: "${c.name}:${c.file}") credentials;
          StateDirectory = lib.removePrefix "/var/lib/" stateDir;
          StateDirectoryMode = "0700";
          LogsDirectory = lib.optional (auditLogsDir != null) auditLogsDir;
          LogsDirectoryMode = "0750";
          ReadWritePaths = map (d: "-${d}") auditDir;
          Restart = "on-failure";
          RestartSec = 5;

          # Stop: SIGTERM to the bridge alone, which lets calls in flight finish and removes its
          # containers; what is left (upstream servers) gets SIGKILL after it exits or at the
          # timeout, max_timeout + 30 s.
          KillSignal = "SIGTERM";
          KillMode = "mixed";
          TimeoutStopSec = common.httpStopTimeout cfg.settings;

          # Sandboxing that leaves the engine's socket and /proc (the bridge reads other
          # bridges' /proc/<pid>/stat to tell orphaned containers, so no ProtectProc) reachable.
          # No MemoryDenyWriteExecute: upstream servers may be node or other JITs.
          NoNewPrivileges = true;
          ProtectSystem = "strict";
          ProtectHome = true;
          PrivateTmp = true;
          PrivateDevices = true;
          ProtectKernelTunables = true;
          ProtectKernelModules = true;
          ProtectKernelLogs = true;
          ProtectControlGroups = true;
          ProtectClock = true;
          ProtectHostname = true;
          RestrictAddressFamilies = [
            "AF_UNIX"
            "AF_INET"
            "AF_INET6"
          ];
          RestrictNamespaces = true;
          RestrictRealtime = true;
          RestrictSUIDSGID = true;
          LockPersonality = true;
          RemoveIPC = true;
          # "" (an empty list would write no line at all, keeping every capability).
          CapabilityBoundingSet = if bindCaps == [ ] then "" else bindCaps;
          AmbientCapabilities = bindCaps;
          SystemCallArchitectures = "native";
          SystemCallFilter = [
            "@system-service"
            "~@privileged"
          ];
          UMask = "0077";
        };
      }
    );
  };
}

# What the NixOS module (services.mcp-code-bridge) and the home-manager module
# (programs.mcp-code-bridge) share: the typed options, how they become config.toml settings,
# the checks of upstream server declarations, and the rendering of config.toml.
{ lib, pkgs }:

let
  inherit (lib)
    literalExpression
    mkOption
    types
    ;

  tomlFormat = pkgs.formats.toml { };
  # The offline evaluation stub of nixpkgs has no gvisor; nix/eval-stub.nix gives it a stand-in
  # there and only there.
  stub = import ./eval-stub.nix pkgs;

  # What the bridge parses (crates/core/src/config/values.rs): durations are seconds as a number, or "30s", "1.5s",
  # "500ms", "2m", "1h"; sizes are bytes as a number, or "512m", "1g", "64k" (binary units).
  duration = types.either types.ints.unsigned (
    types.strMatching "[0-9]+(\\.[0-9]+)?(ms|s|sec|secs|m|min|h)?"
  );
  size = types.either types.ints.positive (
    types.strMatching "[0-9]+(\\.[0-9]+)?([bBkKmMgG]|[kKmMgG][bB]|[kKmMgG]i[bB])?"
  );

  serverModule = types.submodule {
    options = {
      command = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = literalExpression ''lib.getExe pkgs.mcp-server-time'';
        description = ''
          Executable of a local (stdio) MCP server. Exactly one of `command` and `url` must be set.
        '';
      };
      args = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [
          "--local-timezone"
          "Europe/Paris"
        ];
        description = "Arguments of {option}`command`.";
      };
      env = mkOption {
        type = types.attrsOf types.str;
        default = { };
        example = {
          LOG_LEVEL = "warning";
        };
        description = ''
          Environment variables of the server process. They are written into config.toml, which
          lives in the world-readable Nix store, so give secrets by reference, resolved by the
          bridge when it starts the server: `"{file:/run/secrets/token}"` (the file's content),
          `"''${GITHUB_TOKEN}"` / `"{env:GITHUB_TOKEN}"` (the bridge's environment), or put them
          in {option}`envFile`. Upstream servers' environments never reach the sandbox.
        '';
      };
      envFile = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "/run/secrets/github-mcp.env";
        description = ''
          Absolute path (`''${VAR}` references allowed) of a file of `KEY=VALUE` lines that the
          bridge reads each time it starts this server, under {option}`env` (which wins). This is the way to pass tokens: the file stays
          where it is (sops-nix, agenix, systemd credentials, a file in your home directory) and
          never enters the Nix store. Give it as a string, not a Nix path (a Nix path would be
          copied into the store).
        '';
      };
      cwd = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "Working directory of the server process.";
      };
      url = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "https://mcp.example.com/mcp";
        description = "Endpoint of a remote (streamable HTTP) MCP server, instead of {option}`command`.";
      };
      headers = mkOption {
        type = types.attrsOf types.str;
        default = { };
        description = ''
          HTTP headers sent to a remote server. Like {option}`env` they end up in the Nix store:
          give credentials by reference, e.g. `Authorization = "Bearer {file:/run/secrets/token}";`.
        '';
      };
      description = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "What the server is for; shown to the model by the discovery helpers.";
      };
    };
  };

  # A name (env variable or HTTP header) that suggests a secret: one of its parts, split at `_`
  # and `-`, is KEY, TOKEN, SECRET, ... So OPENAI_API_KEY, GITHUB_TOKEN, CLIENT_SECRET,
  # Authorization and X-Api-Key match; KEYBOARD_LAYOUT, MAX_TOKENS, TOKENIZERS_PARALLELISM and
  # GIT_AUTHOR_NAME do not.
  secretLike =
    n:
    builtins.match "(.*[_-])?(KEY|APIKEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|AUTH|AUTHORIZATION|COOKIE)([_-].*)?" (
      lib.toUpper n
    ) != null;
  # A value that the bridge resolves at start (`{file:/path}`, `''${VAR}`, `{env:VAR}`) is no secret.
  isReference = v: lib.hasInfix "{file:" v || lib.hasInfix "\${" v || lib.hasInfix "{env:" v;
  isStorePath = p: lib.hasPrefix builtins.storeDir (toString p);

  # A file the bridge or systemd reads where it lies (tokens, TLS keys): its absolute path on the
  # machine, as a string. A Nix path value (`./tokens`) is accepted by the type only so that an
  # assertion can say why it is refused (fileAssertions): Nix copies a path into the
  # world-readable store as soon as it is turned into a string, and a string like
  # "/run/secrets/x" is never copied. Nothing here turns the value into a string before the
  # assertions have passed (fileRef).
  secretFile = types.mkOptionType {
    name = "secretFile";
    description = "absolute path outside the Nix store, as a string";
    descriptionClass = "noun";
    check = x: builtins.isString x || builtins.isPath x;
    merge = lib.options.mergeEqualOption;
  };
  # The value to use: the string when it is a usable one, else null (the assertions refuse it).
  fileRef =
    v: if builtins.isString v && lib.hasPrefix "/" v && !isStorePath v then v else null;
  fileAssertions =
    optName: v:
    lib.optionals (v != null) [
      {
        assertion = !builtins.isPath v;
        message = ''
          ${optName} is a Nix path (${toString v}), and Nix copies a path into the
          world-readable Nix store as soon as it is used. Give the file's location on the machine as
          a string instead, e.g. ${optName} = "/run/secrets/${baseNameOf (toString v)}"; (sops-nix,
          agenix, or a file you `chmod 600`).
        '';
      }
      {
        assertion = !builtins.isString v || lib.hasPrefix "/" v;
        message = ''
          ${optName} = "${toString v}" must be an absolute path, e.g. "/run/secrets/${baseNameOf (toString v)}".
        '';
      }
      {
        assertion = !builtins.isString v || !isStorePath v;
        message = ''
          ${optName} points into the Nix store, which every user can read. Give the path of a
          file outside it as a string, e.g. "/run/secrets/mcp-code-bridge-tokens".
        '';
      }
    ];

  nonEmpty = lib.filterAttrs (_: v: v != null && v != [ ] && v != { });

  # `mkDefault` on each value, and on each key of a section (`policy`, `audit`, `packages`,
  # `oauth`), so a key set by hand in `settings` wins over a typed option without dropping its
  # neighbours.
  withDefaults = lib.mapAttrs (
    _: v: if lib.isAttrs v && !lib.isDerivation v then lib.mapAttrs (_: lib.mkDefault) v else lib.mkDefault v
  );

  # `listen` as the bridge parses it (a socket address, crates/core/src/config/http.rs: `[v6]:port` or
  # `v4:port`, no host names) -> { ip; v6; port; }, or null when it is not one.
  parseListen =
    l:
    let
      v6 = builtins.match "\\[([0-9a-fA-F:.]+)]:([0-9]+)" l;
      v4 = builtins.match "([0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+):([0-9]+)" l;
      m = if v6 != null then v6 else v4;
    in
    if m == null then
      null
    else
      {
        ip = builtins.elemAt m 0;
        v6 = v6 != null;
        port = lib.toInt (builtins.elemAt m 1);
      };
  # Loopback as Rust's `IpAddr::is_loopback` says: 127.0.0.0/8, and ::1 however it is written.
  isLoopback =
    a:
    if a.v6 then
      builtins.match "[0:]*:[0:]*1" a.ip != null
    else
      lib.hasPrefix "127." a.ip;

  # Which engine the bridge uses, from `settings.runtime` as the bridge reads it: "auto" (unset:
  # podman's sockets, then docker's), "podman", "docker", or "other" (a URL that names neither,
  # the user's to run). nixos-module/ and nix/http-*.nix all ask this.
  engineOf =
    runtime:
    let
      isUrl = runtime != null && builtins.match "(unix|tcp|http)://.*|/.*" runtime != null;
    in
    if runtime == null || runtime == "auto" then
      "auto"
    else if runtime == "podman" || (isUrl && lib.hasInfix "podman" runtime) then
      "podman"
    else if runtime == "docker" || (isUrl && lib.hasSuffix "/docker.sock" runtime) then
      "docker"
    else
      "other";

  # A duration as the bridge reads it (see `duration` above) -> whole seconds, rounded up; null
  # when it is not one (the bridge's check of config.toml then says so at build time).
  durationSeconds =
    d:
    let
      m = if builtins.isString d then builtins.match "([0-9]+)(\\.[0-9]+)?(ms|s|sec|secs|m|min|h)?" d else null;
    in
    if builtins.isInt d then
      d
    else if m == null then
      null
    else
      let
        whole = lib.toInt (builtins.elemAt m 0);
        frac = if builtins.elemAt m 1 == null then 0 else builtins.fromJSON "0${builtins.elemAt m 1}";
        unit = builtins.elemAt m 2;
        scale =
          if unit == "ms" then
            0.001
          else if unit == "m" || unit == "min" then
            60
          else if unit == "h" then
            3600
          else
            1;
      in
      builtins.ceil ((whole + frac) * scale);
in
rec {
  inherit
    tomlFormat
    serverModule
    secretLike
    parseListen
    isLoopback
    durationSeconds
    engineOf
    fileRef
    fileAssertions
    ;

  # The options both modules declare, given the prefix used in descriptions.
  options = {
    image = mkOption {
      type = types.nullOr types.package;
      default = pkgs.mcp-code-bridge-sandbox-image or null;
      defaultText = literalExpression "the sandbox image of the mcp-code-bridge flake (pkgs.mcp-code-bridge-sandbox-image with its overlay)";
      description = ''
        The sandbox image: a docker-archive built by dockerTools (see image/default.nix). Its
        name:tag, store path and sha256 go into config.toml (`image`, `image_archive`,
        `image_sha256`), so the bridge loads it on first use with no other set-up.
        `null` leaves `image`/`image_archive` to {option}`settings` (for an image you load yourself).
      '';
    };

    imageProfile = mkOption {
      type = types.nullOr (
        types.enum [
          "default"
          "data"
        ]
      );
      default = null;
      example = "data";
      description = ''
        The sandbox image's profile: `default` (pandas, numpy, matplotlib) or `data` (also scipy,
        scikit-learn and pyarrow). Applied with `image.override`, so the image must come from
        image/default.nix; `null` keeps the image as it is. `mcp-code-bridge doctor` names the
        profile in use.
      '';
    };

    extraPythonPackages = mkOption {
      type = types.functionTo (types.listOf types.package);
      default = _: [ ];
      defaultText = literalExpression "ps: [ ]";
      example = literalExpression "ps: [ ps.scipy ]";
      description = ''
        Python packages added to the sandbox image besides pandas, numpy and matplotlib (applied with
        `image.override`, so the image must come from image/default.nix).
      '';
    };

    stateDir = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = literalExpression ''"''${config.home.homeDirectory}/.local/share/mcp-code-bridge-state"'';
      description = ''
        Where the bridge keeps its own podman socket and state (`state_dir`): the audit log,
        saved skills, the tool catalog. `null` keeps the bridge's default,
        `$XDG_STATE_HOME/mcp-code-bridge` of the user running it. It is never shared with the
        sandbox.
      '';
    };

    servers = mkOption {
      type = types.attrsOf serverModule;
      default = { };
      example = literalExpression ''
        {
          time = {
            command = lib.getExe pkgs.mcp-server-time;
            description = "Current time and time-zone conversion";
          };
          github = {
            command = lib.getExe pkgs.github-mcp-server;
            args = [ "stdio" ];
            envFile = "/run/secrets/github-mcp.env"; # GITHUB_PERSONAL_ACCESS_TOKEN=...
          };
          docs = {
            url = "https://mcp.example.com/mcp";
          };
        }
      '';
      description = ''
        Upstream MCP servers, written as `[servers.<name>]` tables of config.toml. Inside the
        sandbox each one is `mcp_<name>` when the model loads it.
      '';
    };

    # Each typed option below defaults to `null`, which writes nothing to config.toml, so the
    # bridge's own default holds (crates/core/src/config/mod.rs is its one source; `mcp-code-bridge config`
    # prints the effective values and where each came from). A value set here is written with
    # `mkDefault`, so a value given in `settings` wins.
    limits = {
      memory = mkOption {
        type = types.nullOr size;
        default = null;
        example = "1g";
        description = "Memory limit of a sandbox container, swap included (`memory`). `null`: the bridge's default.";
      };
      pids = mkOption {
        type = types.nullOr types.ints.positive;
        default = null;
        example = 256;
        description = "Process/thread limit of a sandbox container (`pids`). `null`: the bridge's default.";
      };
      cpus = mkOption {
        type = types.nullOr (types.either types.ints.positive types.float);
        default = null;
        example = 1.5;
        description = "CPU limit of a sandbox container (`cpus`). `null`: the bridge's default.";
      };
      timeout = mkOption {
        type = types.nullOr duration;
        default = null;
        example = "60s";
        description = "Default time limit of one run_python call (`timeout`). `null`: the bridge's default.";
      };
      maxTimeout = mkOption {
        type = types.nullOr duration;
        default = null;
        example = "300s";
        description = "Upper bound of the per-call `timeout` argument (`max_timeout`). `null`: the bridge's default.";
      };
      maxSessions = mkOption {
        type = types.nullOr types.ints.positive;
        default = null;
        example = 4;
        description = ''
          Most sandbox sessions (containers) alive at once (`max_sessions`). A new session beyond
          it closes the least recently used idle one; with every session running code it is
          refused. Host memory in use is at most this times `memory`. `null`: the bridge's default.
        '';
      };
    };

    # The `[policy]` of proxied tool calls (docs/policy.md).
    policy = {
      default = mkOption {
        type = types.nullOr (
          types.enum [
            "allow"
            "ask"
            "deny"
          ]
        );
        default = null;
        example = "ask";
        description = "What a proxied tool call no rule matches gets (`policy.default`). `null`: the bridge's default.";
      };
      allow = mkOption {
        type = types.nullOr (types.listOf types.str);
        default = null;
        example = [ "time.*" "filesystem.read_*" ];
        description = "`server.tool` globs (real names) of calls that run (`policy.allow`).";
      };
      ask = mkOption {
        type = types.nullOr (types.listOf types.str);
        default = null;
        example = [ "github.create_*" ];
        description = "Globs of calls the user approves first, in the MCP client (`policy.ask`).";
      };
      deny = mkOption {
        type = types.nullOr (types.listOf types.str);
        default = null;
        example = [ "github.delete_*" "*.drop_*" ];
        description = "Globs of calls refused (`policy.deny`); of all matching rules the most restrictive wins.";
      };
      destructive = mkOption {
        type = types.nullOr (
          types.enum [
            "allow"
            "ask"
            "deny"
            "unset"
          ]
        );
        default = null;
        example = "ask";
        description = "For unmatched tools annotated destructiveHint (`policy.destructive`). `null`: the bridge's default.";
      };
      askFallback = mkOption {
        type = types.nullOr (
          types.enum [
            "allow"
            "deny"
          ]
        );
        default = null;
        example = "deny";
        description = "What `ask` means when the client cannot be asked (`policy.ask_fallback`). `null`: the bridge's default.";
      };
    };

    # The audit log (docs/policy.md, Audit log).
    audit = {
      path = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = literalExpression ''"''${config.home.homeDirectory}/audit/mcp-code-bridge.jsonl"'';
        description = ''An absolute path, or "off" (`audit.path`), that the user running the bridge can write. `null`: `<state_dir>/audit.jsonl`.'';
      };
      code = mkOption {
        type = types.nullOr (
          types.enum [
            "sha256"
            "full"
          ]
        );
        default = null;
        example = "full";
        description = "What of the executed code a record keeps (`audit.code`). `null`: the bridge's default.";
      };
      maxSize = mkOption {
        type = types.nullOr size;
        default = null;
        example = "64m";
        description = "Size at which the log is rotated (`audit.max_size`). `null`: the bridge's default.";
      };
      keep = mkOption {
        type = types.nullOr (types.ints.between 1 100);
        default = null;
        example = 10;
        description = "Rotated files kept (`audit.keep`). `null`: the bridge's default.";
      };
    };

    # Packages on demand: `runtime.install` in the sandbox, resolved by uv on the host
    # (`[packages]`, configuration.md's key table). The other keys (`ask_fallback`, `index_url`,
    # `offline`, `max_size`, `cache_max_size`, `timeout`) go in `settings.packages`.
    packages = {
      allow = mkOption {
        type = types.nullOr (types.listOf types.str);
        default = null;
        example = [
          "tabulate"
          "scikit-*"
        ];
        description = ''
          Distribution-name globs (normalized names: `scikit-*`) the code may install with
          `runtime.install` without asking (`packages.allow`).
        '';
      };
      deny = mkOption {
        type = types.nullOr (types.listOf types.str);
        default = null;
        example = [ "*" ];
        description = ''
          Distribution-name globs refused (`packages.deny`; `PackageDenied` in Python); deny wins
          over allow, and a name neither matches is asked.
        '';
      };
      preinstall = mkOption {
        type = types.nullOr (types.listOf types.str);
        default = null;
        example = [
          "tabulate==0.9.0"
          "openpyxl"
        ];
        description = ''
          Requirements (a name, extras, version clauses) installed into every new session before
          its first call (`packages.preinstall`).
        '';
      };
      wheelhouse = mkOption {
        type = types.nullOr types.path;
        default = null;
        example = literalExpression ''
          pkgs.runCommand "wheels" { } '''
            mkdir $out
            cp ''${pkgs.fetchurl {
              url = "https://files.pythonhosted.org/packages/40/44/4a5f08c96eb108af5cb50b41f76142f0afa346dfa99d5296fe7202a11854/tabulate-0.9.0-py3-none-any.whl";
              hash = "sha256-AkykeN8i6TQGYUhvhSmM/19tzboU84E+iDABW57RlI8=";
            }} $out/tabulate-0.9.0-py3-none-any.whl
          '''
        '';
        description = ''
          A directory of wheel files built or fetched by Nix, written as `packages.find_links`
          (its store path): the host's uv resolves from it besides the index, or alone with
          `settings.packages.offline = true`. The wheels must be files of the directory itself,
          under their wheel file names: the bridge installs no file whose real path lies outside
          `find_links`, so a directory of symlinks (`linkFarm`, `symlinkJoin`) does not do; copy
          them (`cp -L`). Do not also set `settings.packages.find_links`.
        '';
      };
      uv = mkOption {
        type = types.nullOr types.package;
        default = stub.lookup pkgs "uv" (pkgs.writeShellScriptBin "uv" "exit 1");
        defaultText = literalExpression "pkgs.uv";
        description = ''
          The uv the bridge resolves and downloads packages with, written as `packages.uv`
          (`<uv>/bin/uv`), so every bridge that reads this config.toml finds it whatever its
          `PATH`. `null` writes nothing: the bridge then runs `uv` from its `PATH`.
        '';
      };
    };

    outputMode = mkOption {
      type = types.nullOr (
        types.enum [
          "compact"
          "toon"
        ]
      );
      default = null;
      example = "toon";
      description = "Format of run_python's text output (`output_mode`). `null`: the bridge's default.";
    };

    # gVisor (https://gvisor.dev): the sandbox's code runs on gVisor's own kernel (runsc) instead
    # of the host's, behind the same container limits.
    gvisor = {
      enable = lib.mkEnableOption ''
        gVisor for the sandbox: registers runsc (from {option}`gvisor.package`, with
        {option}`gvisor.platform`) with podman as the OCI runtime `mcp-code-bridge-runsc` and
        writes `isolation = "gvisor"` and `gvisor_runtime = "mcp-code-bridge-runsc"` into
        config.toml, so every sandbox container runs under it (the bridge refuses to run code if
        podman does not know that runtime). The runtime gives its containers no network at all
        (`runsc --network=none`, besides the bridge's own `--network none`), so it is the
        bridge's alone. Under rootless podman runsc cannot create cgroups through the system's
        systemd and is run with `--ignore-cgroups`: the bridge's memory, pids and cpus limits are
        then not applied by the host to that container, and the bridge refuses to run code there
        unless settings.allow_unenforced_limits = true accepts it: so with gvisor.enable,
        {option}`settings.allow_unenforced_limits` must be set, `true` or `false`, or the
        configuration is refused. runsc is run without `--oci-seccomp` (with it, this
        runsc refuses select(2) with EPERM inside the sandbox). NixOS: registered in /etc/containers/containers.conf, for root's podman
        and every user's; the HTTP service gets a podman service of its own whose default runtime
        is this one. home-manager: in ~/.config/containers/containers.conf.d/, for your rootless
        podman'';
      platform = mkOption {
        type = types.enum [
          "systrap"
          "kvm"
          "ptrace"
        ];
        default = "systrap";
        description = ''
          How gVisor intercepts the sandbox's system calls (`runsc --platform`): `systrap` works
          everywhere, including inside VMs; `kvm` is faster on bare metal and needs /dev/kvm
          (for rootless users: membership of the `kvm` group); `ptrace` is the slowest.
        '';
      };
      # The stand-in only under the offline evaluation stub of nixpkgs, which has no gvisor
      # (nix/eval-stub.nix); with nixpkgs a missing gvisor is mkPackageOption's error.
      package =
        lib.mkPackageOption (stub.withStandIn pkgs "gvisor" (pkgs.writeShellScriptBin "runsc" "exit 1"))
          "gvisor"
          { extraDescription = "Its `bin/runsc` is what {option}`gvisor.wrapper` runs."; };
      wrapper = mkOption {
        type = types.package;
        readOnly = true;
        defaultText = literalExpression "a script running gvisor.package's runsc with the platform";
        description = ''
          The script registered with podman as the runtime (read-only): runsc with
          {option}`gvisor.platform` and `--network=none`, and `--ignore-cgroups`
          under rootless podman. For registering the same runtime with another engine, e.g.
          `virtualisation.docker.daemon.settings.runtimes.runsc.path`.
        '';
      };
    };

    checkConfig = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Check the generated config.toml with the bridge itself when it is built
        (`mcp-code-bridge --config FILE config`, reading no other file), so that a value the
        bridge rejects (an unknown key, a bad duration, size or output mode) fails the
        build rather than the bridge's first start. Skipped when cross-compiling, where the
        binary cannot run on the build machine.
      '';
    };

    settings = mkOption {
      type = types.submodule { freeformType = tomlFormat.type; };
      default = { };
      example = literalExpression ''
        {
          runtime = "unix:///run/podman/podman.sock";
          log_level = "debug";
          tmp_size = "128m";
        }
      '';
      description = ''
        config.toml, as Nix (every key of `mcp-code-bridge config`; unknown keys are an error of
        the bridge). The typed options above set their keys here with `mkDefault`, so a value
        given here wins.
      '';
    };
  };

  # The image actually used: `image` with imageProfile and extraPythonPackages applied.
  effectiveImage =
    cfg:
    if
      cfg.image != null
      && cfg.image ? override
      && (lib.functionArgs cfg.image.override) ? extraPythonPackages
    then
      cfg.image.override (
        {
          inherit (cfg) extraPythonPackages;
        }
        // lib.optionalAttrs (cfg.imageProfile != null) { profile = cfg.imageProfile; }
      )
    else
      cfg.image;

  # The OCI runtime name gvisor.enable registers and writes as `gvisor_runtime` (a name of the
  # modules' own, so that an admin's own `runsc` registration, and podman's built-in one, stay as
  # they are). A `settings.gvisor_runtime` given by hand wins, and the runtime is then registered
  # under that name (gvisorRuntimeOf).
  gvisorRuntimeName = "mcp-code-bridge-runsc";
  gvisorRuntimeOf = settings: settings.gvisor_runtime or gvisorRuntimeName;

  # What podman runs as that runtime: runsc with the platform, and no network inside gVisor
  # either (the bridge's containers have none; this keeps it so whatever podman is asked). Not
  # --oci-seccomp: with it runsc answers the profile's refusals with EPERM, and Python's
  # select.select failed with EPERM in the sandbox (security::privilege_setuid_binaries_do_not_elevate
  # under gVisor); the runtime's own filter is on the code's processes either way. Under
  # rootless podman (a user namespace that does not map every uid: /proc/self/uid_map is not
  # "0 0 4294967295") runsc cannot set up cgroups through the system's systemd ("Interactive
  # authentication required", google/gvisor#11543) and leaves them alone (--ignore-cgroups).
  # runsc's flags are global ones: they come before podman's arguments and its subcommand.
  # A script rather than containers.conf's [engine.runtimes_flags] (which newer podman has): the
  # flags there are the same rootful and rootless, and --ignore-cgroups must be rootless only.
  gvisorRuntime =
    cfg:
    pkgs.writeShellScript "mcp-code-bridge-runsc" ''
      flags=(--platform=${cfg.gvisor.platform} --network=none)
      read -r _ outside count < /proc/self/uid_map || true
      if [ "$outside $count" != "0 4294967295" ]; then
        flags+=(--ignore-cgroups)
      fi
      exec ${lib.getExe' cfg.gvisor.package "runsc"} "''${flags[@]}" "$@"
    '';

  # containers.conf: the runtime registered under its name (NixOS:
  # virtualisation.containers.containersConf.settings; home-manager: a containers.conf.d drop-in).
  gvisorContainersConf = cfg: {
    engine.runtimes.${gvisorRuntimeOf cfg.settings} = [ "${cfg.gvisor.wrapper}" ];
  };

  # gvisor.enable asks for podman; another engine is refused with what to do instead.
  gvisorAssertions = opt: cfg: engineOk: [
    {
      assertion = !cfg.gvisor.enable || engineOk;
      message = ''
        ${opt}.gvisor.enable registers gVisor with podman, but the bridge uses another engine
        (settings.runtime = "${toString (cfg.settings.runtime or "auto")}"). Use podman (remove
        ${opt}.settings.runtime), or register runsc with your engine yourself (docker:
        virtualisation.docker.daemon.settings.runtimes.runsc.path), set
        ${opt}.gvisor.enable = false and ${opt}.settings.isolation = "gvisor" with
        ${opt}.settings.gvisor_runtime = "runsc".
      '';
    }
    # Rootless podman runs runsc with --ignore-cgroups, so a rootless sandbox under gVisor is not
    # held to memory, pids and cpus by the host, and the bridge refuses to run code there unless
    # allow_unenforced_limits says to accept it. Whose bridges are rootless (every user's on
    # NixOS, yours in home-manager) only the configuration's author knows: refused until the
    # choice is written down, either way.
    {
      assertion = !cfg.gvisor.enable || cfg.settings ? allow_unenforced_limits;
      message = ''
        ${opt}.gvisor.enable: under rootless podman runsc applies no cgroups
        (--ignore-cgroups), so a rootless sandbox on gVisor is not held to the memory, pids and
        cpus limits by the host, and the bridge refuses to run code there unless
        allow_unenforced_limits is true. Say which you want:
        ${opt}.settings.allow_unenforced_limits = true; (rootless bridges run under gVisor,
        without those limits; `mcp-code-bridge doctor` names them), or = false; (rootless bridges
        refuse, naming the limits; rootful podman${
          if lib.hasPrefix "services." opt then ", the HTTP service's included," else ""
        } keeps them).
      '';
    }
  ];

  # config.toml keys naming files the bridge reads where they lie, given by hand in `settings`:
  # checked as the typed options that write them are (fileAssertions), before the TOML rendering
  # would turn a Nix path into a copy in the world-readable store. (http.tls_cert is a
  # certificate, public: a store path is fine there.)
  settingsFileAssertions =
    opt: settings:
    fileAssertions "${opt}.settings.token_file" (settings.token_file or null)
    ++ fileAssertions "${opt}.settings.http.tls_key" (settings.http.tls_key or null);

  # One server declaration -> a [servers.<name>] table.
  serverToToml =
    s:
    nonEmpty {
      inherit (s)
        command
        args
        env
        cwd
        url
        headers
        description
        ;
      env_file = s.envFile;
    };

  # packages.wheelhouse as `packages.find_links`: its store path (a Nix path value is copied into
  # the store here), or null.
  wheelhouseOf = cfg: if cfg.packages.wheelhouse == null then null else "${cfg.packages.wheelhouse}";

  # The wheelhouse is written as `packages.find_links` with `mkDefault`, so a find_links set by
  # hand would silently win over it: refused instead, saying which to keep.
  packagesAssertions =
    opt: cfg:
    let
      wheelhouse = wheelhouseOf cfg;
      given = cfg.settings.packages.find_links or null;
    in
    [
      {
        assertion = wheelhouse == null || given == wheelhouse;
        message = ''
          ${opt}.packages.wheelhouse and ${opt}.settings.packages.find_links both name the
          directory of wheels the bridge installs from (packages.find_links), which is one. Keep
          the wheelhouse (remove settings.packages.find_links), or remove packages.wheelhouse to
          use "${toString given}".
        '';
      }
    ];

  # Typed options -> settings with `mkDefault` on each value, a section's (`policy`, `audit`,
  # `packages`) on each of its keys, so `settings.policy.deny` set by hand keeps the typed
  # `policy.allow`.
  typedDefaults = cfg: withDefaults (typedSettings cfg);

  # Typed options -> settings.
  typedSettings =
    cfg:
    let
      image = effectiveImage cfg;
    in
    nonEmpty {
      memory = cfg.limits.memory;
      pids = cfg.limits.pids;
      cpus = cfg.limits.cpus;
      timeout = cfg.limits.timeout;
      max_timeout = cfg.limits.maxTimeout;
      max_sessions = cfg.limits.maxSessions;
      output_mode = cfg.outputMode;
      state_dir = cfg.stateDir;
      policy = nonEmpty {
        inherit (cfg.policy)
          default
          allow
          ask
          deny
          destructive
          ;
        ask_fallback = cfg.policy.askFallback;
      };
      audit = nonEmpty {
        inherit (cfg.audit) path code keep;
        max_size = cfg.audit.maxSize;
      };
      packages = nonEmpty {
        inherit (cfg.packages) allow deny preinstall;
        find_links = wheelhouseOf cfg;
        uv = if cfg.packages.uv == null then null else lib.getExe' cfg.packages.uv "uv";
      };
    }
    // lib.optionalAttrs cfg.gvisor.enable {
      isolation = "gvisor";
      gvisor_runtime = gvisorRuntimeName;
    }
    // lib.optionalAttrs (image != null) {
      image = "${image.imageName}:${image.imageTag}";
      image_archive = "${image}";
    };

  # `mcp-code-bridge serve` as a service (NixOS: services.mcp-code-bridge.http, a system
  # service; home-manager: programs.mcp-code-bridge.http, a user service). These options are
  # declared by nix/http-nixos.nix and nix/http-home.nix; the NixOS one adds `openFirewall`.
  httpOptions = {
    enable = lib.mkEnableOption ''
      `mcp-code-bridge serve` as a service, `mcp-code-bridge-http`: MCP over Streamable HTTP at
      `/mcp`, for clients on other machines or in other users' sessions. It reads the same
      config.toml as the bridge started by a client; `serve`'s own keys (`[http]`, e.g.
      `settings.http.allowed_hosts`, `public_url`, `tls_cert`/`tls_key`, the per-identity limits)
      go in {option}`settings`'';

    listen = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "0.0.0.0:8931";
      description = ''
        Address and port `serve` listens on (`listen`): an IP address, not a host name, e.g.
        `"0.0.0.0:8931"` or `"[::]:8931"`. `null`: the bridge's default, a loopback address.
        An address other than loopback needs {option}`tokenFile` or {option}`oauth.issuer`:
        whoever reaches the port can run code.
      '';
    };

    tokenFile = mkOption {
      type = types.nullOr secretFile;
      default = null;
      example = "/run/secrets/mcp-code-bridge-tokens";
      description = ''
        File of bearer tokens `serve` accepts, one `name:token` per line; the name is the caller's
        identity (in the audit log, and for the per-identity limits). Give its path as a string
        (a Nix path such as `./tokens` is refused: Nix would copy it into the world-readable
        store), outside the Nix store (sops-nix, agenix, or a `chmod 600` file). NixOS: it may
        belong to root alone; systemd hands the service a copy (`LoadCredential`), read at each
        start. home-manager: you must be able to read it; it is written as `token_file`. Restart
        the service after changing it.
      '';
    };

    tlsCertFile = mkOption {
      type = types.nullOr secretFile;
      default = null;
      example = "/var/lib/acme/bridge.example.com/fullchain.pem";
      description = ''
        PEM certificate chain `serve` presents (`http.tls_cert`); with {option}`tlsKeyFile`,
        `serve` speaks HTTPS. A path as a string, like {option}`tokenFile`. NixOS: the files may
        belong to root or to the `acme` group alone (security.acme's certificates): systemd hands
        the service a copy of each (`LoadCredential`) at start, so after a renewal restart it, e.g.
        `security.acme.certs."bridge.example.com".reloadServices = [ "mcp-code-bridge-http.service" ];`.
        home-manager: you must be able to read them; they are written as `http.tls_cert` and
        `http.tls_key`.
      '';
    };

    tlsKeyFile = mkOption {
      type = types.nullOr secretFile;
      default = null;
      example = "/var/lib/acme/bridge.example.com/key.pem";
      description = "PEM private key of {option}`tlsCertFile` (`http.tls_key`); handed over the same way.";
    };

    oauth = {
      issuer = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "https://auth.example.com/realms/dev";
        description = ''
          Accept OAuth access tokens (JWTs) of this authorization server (`oauth.issuer`),
          checked against its published keys; needs {option}`oauth.audience`.
        '';
      };
      audience = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "https://bridge.example.com/mcp";
        description = "The `aud` a token must carry (`oauth.audience`): this server's URL as the issuer knows it.";
      };
      otherIssuers = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [ "https://login.partner.example" ];
        description = ''
          Further authorization servers whose tokens are accepted (`oauth.other_issuers`), each
          checked against its own metadata and keys; their identities are `sub@issuer` (those of
          {option}`oauth.issuer` stay `sub`). Needs {option}`oauth.issuer`.
        '';
      };
    };
  };

  # The `http` options -> settings (with `mkDefault`, so `settings` wins).
  httpDefaults =
    http:
    withDefaults (nonEmpty {
      inherit (http) listen;
      oauth = nonEmpty {
        inherit (http.oauth) issuer audience;
        other_issuers = http.oauth.otherIssuers;
      };
    });

  # What the service is given from the effective settings: its listen address (null: the
  # bridge's default, loopback), and the stop timeout. `serve` lets calls in flight finish for up
  # to max_timeout + 5 s after SIGTERM, then closes the sessions (another 5 s at most) and removes
  # the containers; systemd waits 30 s beyond max_timeout before it kills. 120: the bridge's
  # max_timeout when none is set (crates/core/src/config/mod.rs); keep the two in step.
  httpListen = settings: settings.listen or null;
  httpStopTimeout =
    settings:
    let
      given = durationSeconds (settings.max_timeout or null);
    in
    (if given == null then 120 else given) + 30;

  # Assertions of the `http` options, against the effective settings (a key set in `settings`
  # counts as much as the option that writes it). `opt` is the option path for messages.
  httpAssertions =
    opt: cfg:
    let
      inherit (cfg) http settings;
      listen = httpListen settings;
      parsed = if listen == null then null else parseListen listen;
      issuer = settings.oauth.issuer or null;
      audience = settings.oauth.audience or null;
      hasAuth = http.tokenFile != null || (settings.token_file or null) != null || issuer != null;
    in
    [
      {
        assertion = cfg.enable;
        message = ''
          ${opt}.http.enable needs ${opt}.enable = true: the service reads the bridge's
          config.toml, which that writes. Set ${opt}.enable = true.
        '';
      }
      {
        assertion = listen == null || parsed != null;
        message = ''
          ${opt}.http.listen = "${toString listen}" is not an address and port: write an IP
          address (not a host name) and a port, like "127.0.0.1:8931", "0.0.0.0:8931" or "[::]:8931".
        '';
      }
      {
        assertion = parsed == null || isLoopback parsed || hasAuth;
        message = ''
          ${opt}.http.listen = "${toString listen}" can be reached from other machines, and
          `mcp-code-bridge serve` refuses to run code for anyone who reaches it unauthenticated.
          Set ${opt}.http.tokenFile = "/run/secrets/mcp-code-bridge-tokens"; (lines of
          `name:token`), or ${opt}.http.oauth.issuer and ${opt}.http.oauth.audience, or listen
          on a loopback address ("127.0.0.1:8931", e.g. behind a reverse proxy that authenticates).
        '';
      }
      {
        assertion = issuer == null || audience != null;
        message = ''
          ${opt}.http.oauth.issuer = "${toString issuer}" needs ${opt}.http.oauth.audience: the
          `aud` its tokens carry for this server, usually the URL clients reach it at, e.g.
          ${opt}.http.oauth.audience = "https://bridge.example.com/mcp";
        '';
      }
      {
        assertion = (http.tlsCertFile == null) == (http.tlsKeyFile == null);
        message = ''
          ${opt}.http.tlsCertFile and ${opt}.http.tlsKeyFile go together: set both for HTTPS
          (e.g. security.acme's "/var/lib/acme/<domain>/fullchain.pem" and ".../key.pem"), or
          neither.
        '';
      }
    ]
    ++ fileAssertions "${opt}.http.tokenFile" http.tokenFile
    ++ fileAssertions "${opt}.http.tlsCertFile" http.tlsCertFile
    ++ fileAssertions "${opt}.http.tlsKeyFile" http.tlsKeyFile;

  # Assertions about the server declarations; `opt` is the option path for messages.
  serverAssertions =
    opt: servers:
    lib.concatLists (
      lib.mapAttrsToList (name: s: [
        {
          assertion = (s.command != null) != (s.url != null);
          message = ''
            ${opt}.servers.${name}: set exactly one of `command` (a local stdio server, e.g.
            command = lib.getExe pkgs.mcp-server-time;) or `url` (a remote HTTP server).
            It has ${if s.command == null then "neither" else "both"}.
          '';
        }
        {
          assertion = s.url == null || (s.args == [ ] && s.env == { } && s.envFile == null && s.cwd == null);
          message = ''
            ${opt}.servers.${name}: `args`, `env`, `envFile` and `cwd` only apply to local servers
            (`command`); this one has `url`. Remove them, or pass credentials in `headers`.
          '';
        }
        {
          assertion = s.headers == { } || s.url != null;
          message = ''
            ${opt}.servers.${name}: `headers` only apply to remote servers (`url`); for a local
            server pass values through `env` or `envFile`.
          '';
        }
        {
          assertion = s.envFile == null || lib.hasPrefix "/" s.envFile || lib.hasPrefix "\${" s.envFile;
          message = ''
            ${opt}.servers.${name}.envFile = "${toString s.envFile}" must be an absolute path
            (e.g. "/run/secrets/${name}.env") or start with a variable ("''${XDG_RUNTIME_DIR}/...").
          '';
        }
      ]) servers
    );

  serverWarnings =
    opt: servers:
    lib.concatLists (
      lib.mapAttrsToList (
        name: s:
        map (
          var:
          "${opt}.servers.${name}.env.${var} looks like a secret. Values in `env` are written to the "
          + "world-readable Nix store; use a reference resolved at start instead, "
          + "env.${var} = \"{file:/run/secrets/${lib.toLower var}}\", or put `${var}=...` in a file "
          + "outside the store and set ${opt}.servers.${name}.envFile = \"/run/secrets/${name}.env\"."
        ) (lib.attrNames (lib.filterAttrs (n: v: secretLike n && !isReference v) s.env))
        ++ lib.optional (s.envFile != null && isStorePath s.envFile) (
          "${opt}.servers.${name}.envFile points into the Nix store, which every user can read; "
          + "keep secrets in a file outside the store (sops-nix, agenix, systemd credentials)."
        )
        ++ lib.optional (lib.any (v: !isReference v) (lib.attrValues (lib.filterAttrs (n: _: secretLike n) s.headers))) (
          "${opt}.servers.${name}.headers look like credentials; they are written to the "
          + "world-readable Nix store. Use a reference resolved at start, e.g. "
          + "\"Bearer {file:/run/secrets/${name}-token}\"."
        )
      ) servers
    );

  # config.toml. When `image_archive` is the image, `image_sha256` (the sha256 of the archive's
  # bytes) is computed here at build time and put first in the file (a top-level key must come
  # before the [servers.*] tables). With `check`, the bridge (`package`) then loads the file, and
  # with no other file, environment or flag in play any value it rejects fails the build with
  # the bridge's own message (as nixpkgs' modules check configs with the program, e.g.
  # prometheus' `promtool check config`). `MCP_BRIDGE_SYSTEM_CONFIG=none` and a fresh HOME keep
  # /etc and the builder's home out of it; `config` reads and prints, it starts no engine.
  configFile =
    {
      settings,
      image ? null,
      package ? null,
      check ? package != null,
      name ? "mcp-code-bridge-config.toml",
    }:
    let
      generated = tomlFormat.generate "mcp-code-bridge-settings.toml" settings;
      addSha =
        image != null && !(settings ? image_sha256) && (settings.image_archive or null) == "${image}";
      canRun = pkgs.stdenv.buildPlatform.canExecute pkgs.stdenv.hostPlatform;
      doCheck = check && package != null && canRun;
      file =
        if !addSha && !doCheck then
          generated
        else
          pkgs.runCommand name { } (
            (
              if addSha then
                ''
                  sha=$(sha256sum ${image} | cut -d' ' -f1)
                  {
                    echo "# sha256 of ${image}, computed when this file was built"
                    echo "image_sha256 = \"$sha\""
                    cat ${generated}
                  } > $out
                ''
              else
                ''
                  cp ${generated} $out
                ''
            )
            + lib.optionalString doCheck ''
              export HOME=$(mktemp -d) MCP_BRIDGE_SYSTEM_CONFIG=none
              unset XDG_CONFIG_HOME XDG_STATE_HOME
              if ! ${lib.getExe package} --config $out config > check.log 2>&1; then
                cat check.log >&2
                echo "mcp-code-bridge rejects the generated config.toml (above). Fix the option or" \
                  "settings value it names; checkConfig = false skips this check." >&2
                exit 1
              fi
            ''
          );
    in
    # `generated` (the rendering of `settings` alone) is kept as an attribute: scripts/nix-pieces.sh
    # runs this build script on Debian against a TOML file of the same settings.
    lib.extendDerivation true { inherit generated; } file;
}

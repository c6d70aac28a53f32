# Evaluation tests of the NixOS and home-manager modules: what they write into config.toml, what
# they assert and what they warn about. They run when the check is evaluated (`nix flake check`,
# and the offline evaluation check that CI runs), so a failure needs no build to show; the
# derivation only records how many passed. Each NixOS case evaluates the module alone with the
# real module system and every option it does not declare accepted free-form (as the offline
# stub of NixOS does), so the cases are the same with real nixpkgs; the home-manager cases use
# home-manager's real module system, and one stand-in without programs.mcp (an older home-manager).
{
  lib,
  pkgs,
  home-manager,
  nixosModule,
  homeModule,
  overlay,
  runtimeTests,
  vmTests,
}:

let
  common = import ./common.nix { inherit lib pkgs; };

  # Declares what the modules read besides their own options; the rest is free-form.
  shim = {
    options = {
      assertions = lib.mkOption {
        type = lib.types.listOf lib.types.unspecified;
        default = [ ];
      };
      warnings = lib.mkOption {
        type = lib.types.listOf lib.types.str;
        default = [ ];
      };
    };
    config = {
      _module.freeformType = lib.types.lazyAttrsOf lib.types.anything;
      _module.args.pkgs = pkgs;
    };
  };

  nixos =
    cfg:
    (lib.evalModules {
      modules = [
        shim
        nixosModule
        { services.mcp-code-bridge = { enable = true; } // cfg; }
      ];
    }).config;
  nixosWith =
    extra: cfg:
    (lib.evalModules {
      modules = [
        shim
        nixosModule
        extra
        { services.mcp-code-bridge = { enable = true; } // cfg; }
      ];
    }).config;

  # The options of a NixOS evaluation (for their declarations: defaults, descriptions).
  nixosOptions =
    (lib.evalModules {
      modules = [
        shim
        nixosModule
      ];
    }).options;

  home =
    cfg:
    (home-manager.lib.homeManagerConfiguration {
      inherit pkgs;
      modules = [
        homeModule
        {
          home = {
            username = "alice";
            homeDirectory = "/home/alice";
            stateVersion = "26.05";
          };
        }
        cfg
      ];
    }).config;

  # A home-manager without programs.mcp (nor lib.hm): the module alone on plain nixpkgs lib.
  homeWithoutMcp =
    cfg:
    (lib.evalModules {
      modules = [
        shim
        homeModule
        cfg
      ];
    }).config;

  # The same on another platform's pkgs (only the platform differs).
  homeWithoutMcpOn =
    system: cfg:
    (lib.evalModules {
      modules = [
        shim
        { _module.args.pkgs = lib.mkForce (pkgs // { stdenv = pkgs.stdenv // { hostPlatform = lib.systems.elaborate system; }; }); }
        homeModule
        cfg
      ];
    }).config;

  failed = c: map (a: a.message) (lib.filter (a: !a.assertion) c.assertions);
  # The text of a script written with writeShellScript (`text` in nixpkgs' writeTextFile and in
  # the offline stub's).
  textOf = drv: drv.text or "";
  # A Nix path value (what `tokenFile = ./tokens;` gives): this file, which is never copied
  # anywhere by these tests (the assertions only call toString on it).
  pathLiteral = ./module-tests.nix;

  # image/default.nix on stand-ins of its inputs, so that what it selects and writes is seen
  # without building anything and the same with nixpkgs and with the offline stub.
  imageOn =
    args:
    import ../image/default.nix (
      {
        inherit lib;
        dockerTools.buildLayeredImage = a: {
          name = "image";
          outPath = "/nix/store/00000000000000000000000000000000-image";
        };
        runCommand = name: _env: _cmd: {
          inherit name;
          outPath = "/nix/store/00000000000000000000000000000000-${name}";
        };
        python314 = {
          name = "python3-3.14";
          withPackages = f: {
            name = "python3-3.14-env";
            outPath = "/nix/store/00000000000000000000000000000000-python3-3.14-env";
          };
        };
      }
      // args
    );
  # A Python package set of names: `ps.<name>` is the name.
  psOf = names: lib.genAttrs names (n: n);
  allPython = psOf [
    "pandas"
    "numpy"
    "matplotlib"
    "cloudpickle"
    "scipy"
    "scikit-learn"
    "pyarrow"
    "pytest"
  ];
  # The needle when one of the messages holds it, else the messages themselves (so a failure
  # shows what was said instead).
  saying = needle: msgs: if lib.any (lib.hasInfix needle) msgs then needle else msgs;
  # The build script of a config file: `buildCommand` of nixpkgs' runCommand, `cmd` in the
  # offline stub's.
  script = drv: drv.buildCommand or drv.cmd or "";
  withoutImage = s: removeAttrs s [ "image" "image_archive" ];

  # No image and no uv (both are written by default): the settings hold what a test sets.
  noImage = {
    image = null;
    packages.uv = null;
  };
  # gVisor with the choice about rootless limits written down (gvisorAssertions asks for it).
  gvisorOn = {
    enable = true;
  };
  allowed.allow_unenforced_limits = true;

  tests = {
    # Typed options left alone write nothing: the bridge's own defaults hold.
    testNullOptionsWriteNothing = {
      expr = (nixos noImage).services.mcp-code-bridge.settings;
      expected = { };
    };
    testImageIsWrittenWithItsArchive = {
      expr = lib.attrNames (nixos { packages.uv = null; }).services.mcp-code-bridge.settings;
      expected = [
        "image"
        "image_archive"
      ];
    };
    # The data profile is the image rebuilt with its packages: another archive, another tag.
    testImageProfileDataIsAnotherImage = {
      expr =
        let
          s = (nixos { imageProfile = "data"; }).services.mcp-code-bridge.settings;
          plain = (nixos { }).services.mcp-code-bridge.settings;
        in
        {
          differs = s.image_archive != plain.image_archive && s.image != plain.image;
          profile = (pkgs.mcp-code-bridge-sandbox-image.override { profile = "data"; }).imageTag != pkgs.mcp-code-bridge-sandbox-image.imageTag;
        };
      expected = {
        differs = true;
        profile = true;
      };
    };
    testTypedOptionsAreWrittenUnderTheirKeys = {
      expr =
        (nixos (
          noImage
          // {
            limits = {
              memory = "1g";
              pids = 256;
              cpus = 1.5;
              timeout = "45s";
              maxTimeout = "5m";
              maxSessions = 4;
            };
            outputMode = "toon";
          }
        )).services.mcp-code-bridge.settings;
      expected = {
        memory = "1g";
        pids = 256;
        cpus = 1.5;
        timeout = "45s";
        max_timeout = "5m";
        max_sessions = 4;
        output_mode = "toon";
      };
    };
    testPolicyAndAuditAreSectionsMergedKeyByKey = {
      expr =
        (nixos (
          noImage
          // {
            policy = {
              default = "ask";
              allow = [ "time.*" ];
              deny = [ "github.delete_*" ];
              askFallback = "deny";
            };
            audit = {
              code = "full";
              maxSize = "64m";
            };
            settings.policy.deny = [ "*.drop_*" ];
          }
        )).services.mcp-code-bridge.settings;
      expected = {
        policy = {
          default = "ask";
          allow = [ "time.*" ];
          deny = [ "*.drop_*" ];
          ask_fallback = "deny";
        };
        audit = {
          code = "full";
          max_size = "64m";
        };
      };
    };
    # Packages on demand: uv, which resolves runtime.install's packages on the host, is written
    # by its store path, so every bridge reading the file finds it whatever its PATH; the `nix
    # run` wrapper has the same uv last on PATH. A packages.uv of your own wins, keeping the
    # typed keys beside it.
    testPackagesUvIsReachable =
      let
        uvOf = c: c.services.mcp-code-bridge.packages.uv;
        c = nixos { image = null; };
        h = homeWithoutMcp {
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
          };
        };
        own = nixos {
          image = null;
          packages.allow = [ "tabulate" ];
          settings.packages.uv = "/opt/uv/bin/uv";
        };
      in
      {
        expr = {
          name = lib.getName (uvOf c);
          nixos = c.services.mcp-code-bridge.settings;
          home = h.programs.mcp-code-bridge.settings;
          wrapper = lib.hasInfix (builtins.unsafeDiscardStringContext "--suffix PATH : ${uvOf c}/bin") (
            script pkgs.mcp-code-bridge-with-image
          );
          own = own.services.mcp-code-bridge.settings;
        };
        expected = {
          name = "uv";
          nixos.packages.uv = "${uvOf c}/bin/uv";
          home.packages.uv = "${h.programs.mcp-code-bridge.packages.uv}/bin/uv";
          wrapper = true;
          own.packages = {
            allow = [ "tabulate" ];
            uv = "/opt/uv/bin/uv";
          };
        };
      };
    # The typed [packages] keys, and a Nix-built wheelhouse written as find_links (its store
    # path), beside keys of settings.packages.
    testPackagesWheelhouseIsFindLinks =
      let
        wheels = pkgs.runCommand "wheels" { } "mkdir $out";
        packages = {
          allow = [ "tabulate" ];
          deny = [ "*-nightly" ];
          preinstall = [ "tabulate==0.9.0" ];
          wheelhouse = wheels;
          uv = null;
        };
        c = nixos (
          noImage
          // {
            inherit packages;
            settings.packages.offline = true;
          }
        );
        h = homeWithoutMcp {
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
            inherit packages;
          };
        };
      in
      {
        expr = {
          nixos = c.services.mcp-code-bridge.settings;
          home = h.programs.mcp-code-bridge.settings;
          failed = failed c ++ failed h;
        };
        expected = {
          nixos.packages = {
            allow = [ "tabulate" ];
            deny = [ "*-nightly" ];
            preinstall = [ "tabulate==0.9.0" ];
            find_links = "${wheels}";
            offline = true;
          };
          home.packages = {
            allow = [ "tabulate" ];
            deny = [ "*-nightly" ];
            preinstall = [ "tabulate==0.9.0" ];
            find_links = "${wheels}";
          };
          failed = [ ];
        };
      };
    # Both would set find_links, and settings' would silently win: refused, saying which to keep.
    testPackagesWheelhouseAndFindLinksSaysWhichToKeep =
      let
        needle = opt: "${opt}.packages.wheelhouse and ${opt}.settings.packages.find_links both name the";
        both = {
          packages.wheelhouse = pkgs.runCommand "wheels" { } "mkdir $out";
          settings.packages.find_links = "/srv/wheels";
        };
      in
      {
        expr = {
          nixos = saying (needle "services.mcp-code-bridge") (failed (nixos both));
          home = saying (needle "programs.mcp-code-bridge") (
            failed (homeWithoutMcp { programs.mcp-code-bridge = both // { enable = true; }; })
          );
        };
        expected = {
          nixos = needle "services.mcp-code-bridge";
          home = needle "programs.mcp-code-bridge";
        };
      };
    testSettingsWinOverTypedOptions = {
      expr =
        (nixos (
          noImage
          // {
            limits.memory = "1g";
            settings.memory = "2g";
          }
        )).services.mcp-code-bridge.settings;
      expected = {
        memory = "2g";
      };
    };
    testServersAreTablesWithoutEmptyKeys = {
      expr =
        (nixos (
          noImage
          // {
            servers = {
              github = {
                command = "github-mcp-server";
                args = [ "stdio" ];
                envFile = "/run/secrets/github-mcp.env";
              };
              docs.url = "https://mcp.example.com/mcp";
            };
          }
        )).services.mcp-code-bridge.settings;
      expected = {
        servers = {
          github = {
            command = "github-mcp-server";
            args = [ "stdio" ];
            env_file = "/run/secrets/github-mcp.env";
          };
          docs.url = "https://mcp.example.com/mcp";
        };
      };
    };

    # The generated file is loaded by the bridge when it is built, unless checkConfig = false.
    testConfigFileIsCheckedWithTheBridge = {
      expr = lib.hasInfix "/bin/mcp-code-bridge --config $out config" (
        script (nixos { }).services.mcp-code-bridge.configFile
      );
      expected = true;
    };
    testCheckConfigFalseSkipsTheCheck = {
      expr = lib.hasInfix "--config" (
        script (nixos { checkConfig = false; }).services.mcp-code-bridge.configFile
      );
      expected = false;
    };

    # The engine assertions follow settings.runtime.
    testDefaultRuntimeEnablesPodmanAndAssertsNothing = {
      expr = {
        failed = failed (nixos { });
        podman = (nixos { }).virtualisation.podman.enable;
      };
      expected = {
        failed = [ ];
        podman = true;
      };
    };
    # Rootful podman's subordinate ids for --userns=auto (a host uid of each sandbox's own), and
    # none where the engine is Docker.
    testPodmanGetsSubordinateIdsForUsernsAuto =
      let
        c = nixos { };
        d = nixosWith { virtualisation.docker.enable = true; } { settings.runtime = "docker"; };
      in
      {
        expr = {
          uids = c.users.users.containers.subUidRanges;
          gids = c.users.users.containers.subGidRanges;
          system = c.users.users.containers.isSystemUser;
          group = c.users.groups ? containers;
          docker = d.users.users or { } ? containers;
        };
        expected = {
          uids = [
            {
              startUid = 2147483647;
              count = 2147483648;
            }
          ];
          gids = [
            {
              startGid = 2147483647;
              count = 2147483648;
            }
          ];
          system = true;
          group = true;
          docker = false;
        };
      };
    testDockerSocketNeedsNoPodman =
      let
        c = nixosWith { virtualisation.docker.enable = true; } {
          settings.runtime = "unix:///run/docker.sock";
        };
      in
      {
        expr = {
          failed = failed c;
          podman = c.virtualisation.podman.enable;
        };
        expected = {
          failed = [ ];
          podman = false;
        };
      };
    testDockerRuntimeWithoutDockerSaysWhatToSet = {
      expr = saying "Set\nvirtualisation.docker.enable = true" (
        failed (nixos { settings.runtime = "docker"; })
      );
      expected = "Set\nvirtualisation.docker.enable = true";
    };
    testPodmanRuntimeWithPodmanOffSaysWhatToDo = {
      expr = saying "uses podman, but virtualisation.podman.enable" (
        failed (
          nixosWith { virtualisation.podman.enable = false; } { settings.runtime = "podman"; }
        )
      );
      expected = "uses podman, but virtualisation.podman.enable";
    };
    testAutoWithNoEngineSaysWhatToEnable = {
      expr = saying "no container engine is enabled" (
        failed (nixosWith { virtualisation.podman.enable = false; } { })
      );
      expected = "no container engine is enabled";
    };
    testRemoteEngineIsNotAsserted = {
      expr = failed (
        nixosWith { virtualisation.podman.enable = false; } { settings.runtime = "tcp://builder:2375"; }
      );
      expected = [ ];
    };
    testServerWithCommandAndUrlIsRefused = {
      expr = saying "set exactly one of `command`" (
        failed (
          nixos {
            servers.both = {
              command = "x";
              url = "https://x";
            };
          }
        )
      );
      expected = "set exactly one of `command`";
    };

    # Secret-looking names warn when their value is a literal, not when it is a reference.
    testSecretNames = {
      expr = lib.filter common.secretLike [
        "OPENAI_API_KEY"
        "APIKEY"
        "GITHUB_TOKEN"
        "CLIENT_SECRET"
        "DB_PASSWORD"
        "Authorization"
        "X-Api-Key"
        "KEYBOARD_LAYOUT"
        "MAX_TOKENS"
        "TOKENIZERS_PARALLELISM"
        "GIT_AUTHOR_NAME"
        "MONKEY"
        "LOG_LEVEL"
      ];
      expected = [
        "OPENAI_API_KEY"
        "APIKEY"
        "GITHUB_TOKEN"
        "CLIENT_SECRET"
        "DB_PASSWORD"
        "Authorization"
        "X-Api-Key"
      ];
    };
    testLiteralSecretWarnsAndReferenceDoesNot = {
      expr =
        map (w: lib.head (lib.splitString " " w))
          (nixos {
            servers.s = {
              command = "s";
              env = {
                OPENAI_API_KEY = "sk-literal";
                GITHUB_TOKEN = "{file:/run/secrets/gh}";
                KEYBOARD_LAYOUT = "us";
              };
            };
          }).warnings;
      expected = [ "services.mcp-code-bridge.servers.s.env.OPENAI_API_KEY" ];
    };

    # http: `mcp-code-bridge serve` as a hardened system service on the rootful podman socket.
    testHttpServiceRunsServeOnThePodmanSocket =
      let
        c = nixos (noImage // { http.enable = true; });
        s = c.systemd.services.mcp-code-bridge-http;
      in
      {
        expr = {
          serve = lib.hasSuffix "/bin/mcp-code-bridge serve" s.serviceConfig.ExecStart;
          inherit (s.serviceConfig)
            User
            SupplementaryGroups
            NoNewPrivileges
            ProtectSystem
            StateDirectory
            RestrictAddressFamilies
            CapabilityBoundingSet
            KillSignal
            KillMode
            TimeoutStopSec
            LoadCredential
            ;
          inherit (s.environment) CONTAINER_HOST MCP_BRIDGE_STATE_DIR;
          after = lib.elem "podman.socket" s.after;
          user = c.users.users.mcp-code-bridge.isSystemUser;
          # No listen set: nothing written, the bridge's loopback default holds.
          settings = c.services.mcp-code-bridge.settings;
          failed = failed c;
        };
        expected = {
          serve = true;
          User = "mcp-code-bridge";
          SupplementaryGroups = [ "podman" ];
          NoNewPrivileges = true;
          ProtectSystem = "strict";
          StateDirectory = "mcp-code-bridge-http";
          RestrictAddressFamilies = [
            "AF_UNIX"
            "AF_INET"
            "AF_INET6"
          ];
          CapabilityBoundingSet = "";
          KillSignal = "SIGTERM";
          KillMode = "mixed";
          # The bridge's max_timeout (120 s) + 30 s.
          TimeoutStopSec = 150;
          LoadCredential = [ ];
          CONTAINER_HOST = "unix:///run/podman/podman.sock";
          MCP_BRIDGE_STATE_DIR = "/var/lib/mcp-code-bridge-http";
          after = true;
          user = true;
          settings = { };
          failed = [ ];
        };
      };
    testHttpTokenFileIsACredentialAndListenIsWritten =
      let
        c = nixos (
          noImage
          // {
            http = {
              enable = true;
              listen = "0.0.0.0:8931";
              tokenFile = "/run/secrets/mcp-tokens";
            };
            limits.maxTimeout = "5m";
          }
        );
        s = c.systemd.services.mcp-code-bridge-http;
      in
      {
        expr = {
          inherit (s.serviceConfig) LoadCredential TimeoutStopSec;
          inherit (s.environment) MCP_BRIDGE_TOKEN_FILE;
          settings = c.services.mcp-code-bridge.settings;
          failed = failed c;
        };
        expected = {
          LoadCredential = [ "tokens:/run/secrets/mcp-tokens" ];
          TimeoutStopSec = 330;
          MCP_BRIDGE_TOKEN_FILE = "%d/tokens";
          settings = {
            listen = "0.0.0.0:8931";
            max_timeout = "5m";
          };
          failed = [ ];
        };
      };
    # A token file given by hand as settings.token_file (and the TLS files as settings.http.*) is
    # handed over by systemd like the typed options' (the service's user cannot read a root-only
    # secret where it lies); the typed option and the key together are refused.
    testHttpFilesGivenInSettingsAreCredentials =
      let
        c = nixos (
          noImage
          // {
            http = {
              enable = true;
              listen = "0.0.0.0:8931";
            };
            settings = {
              token_file = "/run/secrets/mcp-tokens";
              http.tls_cert = "/var/lib/acme/b/fullchain.pem";
              http.tls_key = "/var/lib/acme/b/key.pem";
            };
          }
        );
        s = c.systemd.services.mcp-code-bridge-http;
        both = nixos (
          noImage
          // {
            http = {
              enable = true;
              tokenFile = "/run/secrets/a";
            };
            settings.token_file = "/run/secrets/b";
          }
        );
      in
      {
        expr = {
          inherit (s.serviceConfig) LoadCredential;
          # `or null`: a variable left out is a failed test with its value, not an error.
          MCP_BRIDGE_TOKEN_FILE = s.environment.MCP_BRIDGE_TOKEN_FILE or null;
          MCP_BRIDGE_HTTP_TLS_CERT = s.environment.MCP_BRIDGE_HTTP_TLS_CERT or null;
          MCP_BRIDGE_HTTP_TLS_KEY = s.environment.MCP_BRIDGE_HTTP_TLS_KEY or null;
          failed = failed c;
          both = saying "services.mcp-code-bridge.http.tokenFile and services.mcp-code-bridge.settings.token_file both name" (
            failed both
          );
        };
        expected = {
          LoadCredential = [
            "tokens:/run/secrets/mcp-tokens"
            "tls-cert:/var/lib/acme/b/fullchain.pem"
            "tls-key:/var/lib/acme/b/key.pem"
          ];
          MCP_BRIDGE_TOKEN_FILE = "%d/tokens";
          MCP_BRIDGE_HTTP_TLS_CERT = "%d/tls-cert";
          MCP_BRIDGE_HTTP_TLS_KEY = "%d/tls-key";
          failed = [ ];
          both = "services.mcp-code-bridge.http.tokenFile and services.mcp-code-bridge.settings.token_file both name";
        };
      };
    testHttpPublicListenWithoutAuthSaysHowToFix = {
      expr = saying "Set services.mcp-code-bridge.http.tokenFile = " (
        failed (
          nixos {
            http = {
              enable = true;
              listen = "0.0.0.0:8931";
            };
          }
        )
      );
      expected = "Set services.mcp-code-bridge.http.tokenFile = ";
    };
    testHttpLoopbackListenNeedsNoAuth = {
      expr = map (
        listen:
        failed (
          nixos {
            http = {
              enable = true;
              inherit listen;
            };
          }
        )
      ) [ "127.0.0.1:9000" "[::1]:9000" ];
      expected = [ [ ] [ ] ];
    };
    testHttpIssuerNeedsAudience = {
      expr = saying "needs services.mcp-code-bridge.http.oauth.audience" (
        failed (
          nixos {
            http = {
              enable = true;
              listen = "[::]:8931";
              oauth.issuer = "https://auth.example.com";
            };
          }
        )
      );
      expected = "needs services.mcp-code-bridge.http.oauth.audience";
    };
    testHttpBadListenSaysHowToWriteIt = {
      expr = saying "is not an address and port" (
        failed (
          nixos {
            http = {
              enable = true;
              listen = "localhost:8931";
            };
          }
        )
      );
      expected = "is not an address and port";
    };
    testHttpNeedsTheBridgeEnabled = {
      expr = saying "Set services.mcp-code-bridge.enable = true" (
        failed (
          nixos {
            enable = false;
            http.enable = true;
          }
        )
      );
      expected = "Set services.mcp-code-bridge.enable = true";
    };
    testHttpOpenFirewallOpensTheListenPort =
      let
        c = nixos (
          noImage
          // {
            http = {
              enable = true;
              listen = "[::]:9443";
              oauth = {
                issuer = "https://auth.example.com";
                audience = "https://bridge.example.com/mcp";
                otherIssuers = [ "https://login.partner.example" ];
              };
              openFirewall = true;
            };
          }
        );
      in
      {
        expr = {
          ports = c.networking.firewall.allowedTCPPorts;
          oauth = c.services.mcp-code-bridge.settings.oauth;
          online = lib.elem "network-online.target" c.systemd.services.mcp-code-bridge-http.after;
          failed = failed c;
        };
        expected = {
          ports = [ 9443 ];
          oauth = {
            issuer = "https://auth.example.com";
            audience = "https://bridge.example.com/mcp";
            other_issuers = [ "https://login.partner.example" ];
          };
          online = true;
          failed = [ ];
        };
      };
    testHttpOpenFirewallOnLoopbackIsRefused = {
      expr = saying "a loopback address that other machines cannot reach" (
        failed (
          nixos {
            http = {
              enable = true;
              openFirewall = true;
            };
          }
        )
      );
      expected = "a loopback address that other machines cannot reach";
    };
    testHttpPrivilegedPortKeepsOnlyBindCapability = {
      expr =
        (nixos {
          http = {
            enable = true;
            listen = "0.0.0.0:443";
            tokenFile = "/run/secrets/t";
          };
        }).systemd.services.mcp-code-bridge-http.serviceConfig.CapabilityBoundingSet;
      expected = [ "CAP_NET_BIND_SERVICE" ];
    };
    testHttpDockerRuntimeUsesTheDockerGroup =
      let
        s =
          (nixosWith { virtualisation.docker.enable = true; } {
            settings.runtime = "docker";
            http.enable = true;
          }).systemd.services.mcp-code-bridge-http;
      in
      {
        expr = {
          groups = s.serviceConfig.SupplementaryGroups;
          podmanHost = s.environment ? CONTAINER_HOST;
        };
        expected = {
          groups = [ "docker" ];
          podmanHost = false;
        };
      };
    testListenParsingAndDurations = {
      expr = {
        loopback = map (l: common.isLoopback (common.parseListen l)) [
          "127.0.0.1:8931"
          "127.1.2.3:1"
          "[::1]:8931"
          "[0:0:0:0:0:0:0:1]:8931"
          "0.0.0.0:8931"
          "[::]:8931"
          "192.168.1.2:8931"
          "[::ffff:127.0.0.1]:8931"
        ];
        unparsed = map common.parseListen [
          "localhost:8931"
          "0.0.0.0"
          ":8931"
        ];
        seconds = map common.durationSeconds [
          120
          "120"
          "45s"
          "1.5s"
          "500ms"
          "2m"
          "1h"
          "5 minutes"
        ];
      };
      expected = {
        loopback = [
          true
          true
          true
          true
          false
          false
          false
          false
        ];
        unparsed = [
          null
          null
          null
        ];
        seconds = [
          120
          120
          45
          2
          1
          120
          3600
          null
        ];
      };
    };

    # home-manager: with enableMcpIntegration, programs.mcp.servers become upstream servers, the
    # bridge itself does not.
    testHomeImportsProgramsMcpAndWritesNoDefaults =
      let
        c = home {
          programs.mcp = {
            enable = true;
            servers.time.command = "mcp-server-time";
            servers.off = {
              command = "off";
              enabled = false;
            };
          };
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
            packages.uv = null;
            enableMcpIntegration = true;
            registerWithMcp = true;
          };
        };
      in
      {
        expr = {
          settings = c.programs.mcp-code-bridge.settings;
          registered = c.programs.mcp.servers ? mcp-code-bridge;
        };
        expected = {
          settings.servers.time.command = "mcp-server-time";
          registered = true;
        };
      };
    # enableMcpIntegration is off unless set, as in every home-manager module that has it
    # (claude-code, codex, opencode, vscode, zed-editor, ... at the pinned home-manager): the
    # shared servers are not imported, while registerWithMcp still adds the bridge to them.
    testHomeMcpIntegrationIsOffByDefault =
      let
        c = home {
          programs.mcp = {
            enable = true;
            servers.time.command = "mcp-server-time";
          };
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
            packages.uv = null;
            registerWithMcp = true;
          };
        };
      in
      {
        expr = {
          default = c.programs.mcp-code-bridge.enableMcpIntegration;
          settings = c.programs.mcp-code-bridge.settings;
          registered = lib.attrNames c.programs.mcp.servers;
        };
        expected = {
          default = false;
          settings = { };
          registered = [
            "mcp-code-bridge"
            "time"
          ];
        };
      };
    testHomeWithoutProgramsMcpEvaluates =
      let
        c = homeWithoutMcp {
          programs.mcp-code-bridge = {
            enable = true;
            limits.memory = "1g";
            servers.docs.url = "https://mcp.example.com/mcp";
          };
        };
      in
      {
        expr = {
          inherit (c.programs.mcp-code-bridge) settings;
          failed = failed c;
        };
        expected = {
          settings = {
            image = (pkgs.mcp-code-bridge-sandbox-image).imageName + ":" + pkgs.mcp-code-bridge-sandbox-image.imageTag;
            image_archive = "${pkgs.mcp-code-bridge-sandbox-image}";
            memory = "1g";
            packages.uv = "${c.programs.mcp-code-bridge.packages.uv}/bin/uv";
            servers.docs.url = "https://mcp.example.com/mcp";
          };
          failed = [ ];
        };
      };
    # An older home-manager: programs.mcp with free-form servers, no lib.hm.mcp.
    testHomeOlderProgramsMcpWarnsAndImportsNothing =
      let
        c = homeWithoutMcp {
          options.programs.mcp = {
            enable = lib.mkEnableOption "mcp";
            servers = lib.mkOption {
              type = lib.types.attrsOf lib.types.anything;
              default = { };
            };
          };
          config.programs = {
            mcp = {
              enable = true;
              servers.time.command = "mcp-server-time";
            };
            mcp-code-bridge = {
              enable = true;
              image = null;
              packages.uv = null;
              enableMcpIntegration = true;
            };
          };
        };
      in
      {
        expr = {
          inherit (c.programs.mcp-code-bridge) settings;
          warned = saying "programs.mcp.servers are not used as upstream servers" c.warnings;
        };
        expected = {
          settings = { };
          warned = "programs.mcp.servers are not used as upstream servers";
        };
      };
    # home-manager's http: a user service with the user's rootless podman.
    testHomeHttpIsAUserService =
      let
        c = home {
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
            packages.uv = null;
            http = {
              enable = true;
              listen = "0.0.0.0:8931";
              tokenFile = "/home/alice/.config/mcp-code-bridge/tokens";
            };
          };
        };
        u = c.systemd.user.services.mcp-code-bridge-http;
      in
      {
        expr = {
          serve = lib.hasSuffix "/bin/mcp-code-bridge serve\n" (textOf (lib.head (lib.toList u.Service.ExecStart)));
          inherit (u.Service) KillSignal KillMode TimeoutStopSec;
          wantedBy = u.Install.WantedBy;
          socket = u.Unit.After;
          settings = c.programs.mcp-code-bridge.settings;
          failed = failed c;
        };
        expected = {
          serve = true;
          KillSignal = "SIGTERM";
          KillMode = "mixed";
          TimeoutStopSec = 150;
          wantedBy = [ "default.target" ];
          socket = [ "podman.socket" ];
          settings = {
            listen = "0.0.0.0:8931";
            token_file = "/home/alice/.config/mcp-code-bridge/tokens";
          };
          failed = [ ];
        };
      };
    testHomeHttpPublicListenWithoutAuthSaysHowToFix = {
      expr = saying "Set programs.mcp-code-bridge.http.tokenFile = " (
        failed (
          homeWithoutMcp {
            programs.mcp-code-bridge = {
              enable = true;
              http = {
                enable = true;
                listen = "[::]:8931";
              };
            };
          }
        )
      );
      expected = "Set programs.mcp-code-bridge.http.tokenFile = ";
    };
    testHomeRegisterWithoutProgramsMcpSaysWhatToDo = {
      expr = saying "needs home-manager's programs.mcp module" (
        failed (
          homeWithoutMcp {
            programs.mcp-code-bridge = {
              enable = true;
              registerWithMcp = true;
            };
          }
        )
      );
      expected = "needs home-manager's programs.mcp module";
    };

    # Secret files (issue 35, 2): a Nix path literal is refused with a message, and never
    # interpolated (which would copy it into the store) on the way there.
    testHttpTokenFilePathLiteralIsRefusedAndNeverUsed =
      let
        c = nixos (
          noImage
          // {
            http = {
              enable = true;
              tokenFile = pathLiteral;
            };
          }
        );
        s = c.systemd.services.mcp-code-bridge-http;
      in
      {
        expr = {
          said = saying "services.mcp-code-bridge.http.tokenFile is a Nix path" (failed c);
          inherit (s.serviceConfig) LoadCredential;
          tokenVar = s.environment ? MCP_BRIDGE_TOKEN_FILE;
        };
        expected = {
          said = "services.mcp-code-bridge.http.tokenFile is a Nix path";
          LoadCredential = [ ];
          tokenVar = false;
        };
      };
    testHomeHttpTokenFilePathLiteralIsRefusedAndNeverWritten =
      let
        c = homeWithoutMcp {
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
            packages.uv = null;
            http = {
              enable = true;
              tokenFile = pathLiteral;
              tlsCertFile = pathLiteral;
              tlsKeyFile = "relative/key.pem";
            };
          };
        };
      in
      {
        expr = {
          token = saying "programs.mcp-code-bridge.http.tokenFile is a Nix path" (failed c);
          cert = saying "programs.mcp-code-bridge.http.tlsCertFile is a Nix path" (failed c);
          key = saying "tlsKeyFile = \"relative/key.pem\" must be an absolute path" (failed c);
          settings = c.programs.mcp-code-bridge.settings;
        };
        expected = {
          token = "programs.mcp-code-bridge.http.tokenFile is a Nix path";
          cert = "programs.mcp-code-bridge.http.tlsCertFile is a Nix path";
          key = "tlsKeyFile = \"relative/key.pem\" must be an absolute path";
          settings = { };
        };
      };

    # NixOS (issue 35, 3): /etc/mcp-code-bridge/config.toml is every user's, so stateDir and
    # audit.path are the HTTP service's, in its environment, with directories systemd creates.
    testNixosStateDirAndAuditPathAreTheServicesAlone =
      let
        c = nixos (
          noImage
          // {
            stateDir = "/var/lib/mcp-code-bridge-team";
            audit = {
              path = "/var/log/mcp-code-bridge/audit.jsonl";
              code = "full";
            };
            http.enable = true;
          }
        );
        s = c.systemd.services.mcp-code-bridge-http;
      in
      {
        expr = {
          settings = c.services.mcp-code-bridge.settings;
          inherit (s.environment) MCP_BRIDGE_STATE_DIR MCP_BRIDGE_AUDIT_PATH;
          inherit (s.serviceConfig) StateDirectory LogsDirectory ReadWritePaths;
          failed = failed c;
        };
        expected = {
          settings.audit.code = "full";
          MCP_BRIDGE_STATE_DIR = "/var/lib/mcp-code-bridge-team";
          MCP_BRIDGE_AUDIT_PATH = "/var/log/mcp-code-bridge/audit.jsonl";
          StateDirectory = "mcp-code-bridge-team";
          LogsDirectory = [ "mcp-code-bridge" ];
          ReadWritePaths = [ ];
          failed = [ ];
        };
      };
    testNixosStateDirAndAuditPathWithoutTheServiceSayWhatTheyAreFor = {
      expr =
        let
          msgs = failed (
            nixos {
              stateDir = "/var/lib/mcp-code-bridge";
              audit.path = "/var/log/mcp-code-bridge/audit.jsonl";
            }
          );
        in
        [
          (saying "services.mcp-code-bridge.stateDir is the state directory of the mcp-code-bridge-http service" msgs)
          (saying "services.mcp-code-bridge.audit.path is the audit log of the mcp-code-bridge-http service" msgs)
        ];
      expected = [
        "services.mcp-code-bridge.stateDir is the state directory of the mcp-code-bridge-http service"
        "services.mcp-code-bridge.audit.path is the audit log of the mcp-code-bridge-http service"
      ];
    };
    # home-manager's config.toml is the user's own: there they are written.
    testHomeStateDirAndAuditPathAreWritten = {
      expr =
        (homeWithoutMcp {
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
            packages.uv = null;
            stateDir = "/home/alice/state";
            audit.path = "/home/alice/audit/bridge.jsonl";
          };
        }).programs.mcp-code-bridge.settings;
      expected = {
        state_dir = "/home/alice/state";
        audit.path = "/home/alice/audit/bridge.jsonl";
      };
    };

    # home-manager (issue 35, 4): the user service's PATH starts with the profile's bin, so an
    # upstream server given as a bare command starts as it does from the shell.
    testHomeHttpServicePathHasTheProfile =
      let
        c = home {
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
            packages.uv = null;
            http.enable = true;
          };
        };
        script = textOf (lib.head (lib.toList c.systemd.user.services.mcp-code-bridge-http.Service.ExecStart));
      in
      {
        expr = {
          path = lib.hasInfix "export PATH=${c.home.profileDirectory}/bin\${PATH:+:$PATH}\n" script;
          profile = c.home.profileDirectory;
        };
        expected = {
          path = true;
          profile = "/home/alice/.nix-profile";
        };
      };

    # TLS (issue 35, 5): NixOS hands the service copies of the files (root- or acme-readable)
    # as credentials; home-manager writes their paths.
    testHttpTlsFilesAreCredentials =
      let
        c = nixos (
          noImage
          // {
            http = {
              enable = true;
              listen = "0.0.0.0:443";
              tokenFile = "/run/secrets/mcp-tokens";
              tlsCertFile = "/var/lib/acme/bridge.example.com/fullchain.pem";
              tlsKeyFile = "/var/lib/acme/bridge.example.com/key.pem";
            };
          }
        );
        s = c.systemd.services.mcp-code-bridge-http;
      in
      {
        expr = {
          inherit (s.serviceConfig) LoadCredential;
          inherit (s.environment) MCP_BRIDGE_TOKEN_FILE MCP_BRIDGE_HTTP_TLS_CERT MCP_BRIDGE_HTTP_TLS_KEY;
          # Paths, not contents, and not in config.toml.
          settings = c.services.mcp-code-bridge.settings;
          failed = failed c;
        };
        expected = {
          LoadCredential = [
            "tokens:/run/secrets/mcp-tokens"
            "tls-cert:/var/lib/acme/bridge.example.com/fullchain.pem"
            "tls-key:/var/lib/acme/bridge.example.com/key.pem"
          ];
          MCP_BRIDGE_TOKEN_FILE = "%d/tokens";
          MCP_BRIDGE_HTTP_TLS_CERT = "%d/tls-cert";
          MCP_BRIDGE_HTTP_TLS_KEY = "%d/tls-key";
          settings.listen = "0.0.0.0:443";
          failed = [ ];
        };
      };
    testHttpTlsCertWithoutKeySaysSo = {
      expr = saying "tlsCertFile and services.mcp-code-bridge.http.tlsKeyFile go together" (
        failed (
          nixos {
            http = {
              enable = true;
              tlsCertFile = "/var/lib/acme/x/fullchain.pem";
            };
          }
        )
      );
      expected = "tlsCertFile and services.mcp-code-bridge.http.tlsKeyFile go together";
    };
    testHomeHttpTlsFilesAreWritten = {
      expr =
        (homeWithoutMcp {
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
            packages.uv = null;
            http = {
              enable = true;
              tlsCertFile = "/home/alice/tls/cert.pem";
              tlsKeyFile = "/home/alice/tls/key.pem";
            };
          };
        }).programs.mcp-code-bridge.settings;
      expected = {
        http = {
          tls_cert = "/home/alice/tls/cert.pem";
          tls_key = "/home/alice/tls/key.pem";
        };
      };
    };

    # Conventions (issue 35, 6).
    # The overlay calls packages with the package set's own callPackage (which splices for
    # cross-compilation), and tells the image it is not the evaluation stub.
    testOverlayUsesCallPackage = {
      expr =
        let
          out = overlay {
            callPackage = fn: args: {
              called = baseNameOf fn;
              inherit args;
            };
          } { };
        in
        {
          bridge = out.mcp-code-bridge.called;
          image = out.mcp-code-bridge-sandbox-image;
          wrapped = out.mcp-code-bridge-with-image.called;
        };
      expected = {
        bridge = "package.nix";
        image = {
          called = "image";
          args.evaluationStub = false;
        };
        wrapped = "with-image.nix";
      };
    };
    # The runtime tests run with the image's own Python packages (matplotlib included), plus pytest.
    testRuntimeTestsUseTheImagesPackages = {
      expr = {
        image = pkgs.mcp-code-bridge-sandbox-image.pythonSelection allPython;
        tests = runtimeTests.pythonSelection allPython;
      };
      expected = {
        image = [
          "pandas"
          "numpy"
          "matplotlib"
          "cloudpickle"
        ];
        tests = [
          "pandas"
          "numpy"
          "matplotlib"
          "cloudpickle"
          "pytest"
        ];
      };
    };
    # A package the image needs and nixpkgs lacks (renamed, removed) is an error, not a smaller
    # image; only under the evaluation stub is it left out.
    testImageMissingPythonPackageIsAnError = {
      expr =
        let
          without = psOf [
            "pandas"
            "numpy"
          ];
        in
        {
          nixpkgs = (builtins.tryEval (builtins.deepSeq ((imageOn { }).pythonSelection without) true)).success;
          stub = (imageOn { evaluationStub = true; }).pythonSelection without;
          data = (imageOn { profile = "data"; }).pythonSelection allPython;
        };
      expected = {
        nixpkgs = false;
        stub = [
          "pandas"
          "numpy"
        ];
        data = [
          "pandas"
          "numpy"
          "matplotlib"
          "cloudpickle"
          "scipy"
          "scikit-learn"
          "pyarrow"
        ];
      };
    };
    # One MPLCONFIGDIR: the image's is the one the bridge gives every sandbox container.
    testImageMplConfigDirIsTheBridges =
      let
        valueIn =
          prefix: text: lib.head (lib.splitString "\"" (lib.elemAt (lib.splitString prefix text) 1));
        env = lib.filter (lib.hasPrefix "MPLCONFIGDIR=") (imageOn { }).imageConfig.Env;
      in
      {
        expr = env;
        expected = [
          "MPLCONFIGDIR=${valueIn "\"MPLCONFIGDIR=" (builtins.readFile ../crates/sandbox/src/container.rs)}"
        ];
      };
    # docs/nix.md describes every VM test by its check name, with what the Debian suite
    # (scripts/nix-pieces.sh) runs in its stead and what the IPv6 checks prove, and the input
    # `follows`.
    testDocsNameEveryVmTestAndFollows =
      let
        docs = builtins.readFile ../docs/nix.md;
        # Each VM test's paragraph (up to the next one) says what the Debian suite runs instead.
        chunks = lib.tail (lib.splitString "`nix build .#checks.x86_64-linux." docs);
        paragraph = t: lib.findFirst (lib.hasPrefix "${t}`") "" chunks;
      in
      {
        expr = {
          undocumented = lib.filter (t: !lib.hasInfix ".#checks.x86_64-linux.${t}`" docs) vmTests;
          withoutDebian = lib.filter (t: !lib.hasInfix "On Debian instead" (paragraph t)) vmTests;
          ipv6 = lib.hasInfix "`ipv6_enabled = false`" docs && lib.hasInfix "scripts/nix-pieces.sh" docs;
          follows = lib.hasInfix "inputs.mcp-code-bridge.inputs.nixpkgs.follows = \"nixpkgs\";" docs;
        };
        expected = {
          undocumented = [ ];
          withoutDebian = [ ];
          ipv6 = true;
          follows = true;
        };
      };
    # On macOS the home-manager module says what is wrong, instead of failing on an attribute.
    testHomeOnDarwinSaysItIsLinuxOnly = {
      expr = saying "runs its sandbox in rootless podman containers on Linux" (
        failed (
          homeWithoutMcpOn "aarch64-darwin" {
            programs.mcp-code-bridge.enable = true;
          }
        )
      );
      expected = "runs its sandbox in rootless podman containers on Linux";
    };

    # gVisor (issue 33, 4): runsc registered with podman under the name the bridge is told.
    testNixosGvisorRegistersTheRuntimeAndWritesIsolation =
      let
        c = nixos (
          noImage
          // {
            gvisor = gvisorOn;
            settings = allowed;
          }
        );
        runtimes = c.virtualisation.containers.containersConf.settings.engine.runtimes;
        script = c.services.mcp-code-bridge.gvisor.wrapper;
        wrapper = textOf script;
      in
      {
        expr = {
          settings = c.services.mcp-code-bridge.settings;
          names = lib.attrNames runtimes;
          registered = runtimes.mcp-code-bridge-runsc == [ "${script}" ];
          same = "${script}" == "${common.gvisorRuntime c.services.mcp-code-bridge}";
          platform = lib.hasInfix "flags=(--platform=systrap --network=none)" wrapper;
          runsc = lib.hasInfix "/bin/runsc \"\${flags[@]}\" \"$@\"" wrapper;
          rootless = lib.hasInfix "flags+=(--ignore-cgroups)" wrapper;
          failed = failed c;
        };
        expected = {
          settings = {
            isolation = "gvisor";
            gvisor_runtime = "mcp-code-bridge-runsc";
            allow_unenforced_limits = true;
          };
          names = [ "mcp-code-bridge-runsc" ];
          registered = true;
          same = true;
          platform = true;
          runsc = true;
          rootless = true;
          failed = [ ];
        };
      };
    testNixosGvisorPlatformAndARuntimeNameOfYourOwn =
      let
        c = nixos (
          noImage
          // {
            gvisor = {
              enable = true;
              platform = "kvm";
            };
            settings = {
              gvisor_runtime = "runsc-kvm";
              allow_unenforced_limits = false;
            };
          }
        );
        runtimes = c.virtualisation.containers.containersConf.settings.engine.runtimes;
      in
      {
        expr = {
          names = lib.attrNames runtimes;
          kvm = runtimes.runsc-kvm == [ "${c.services.mcp-code-bridge.gvisor.wrapper}" ]
            && lib.hasInfix "--platform=kvm" (textOf c.services.mcp-code-bridge.gvisor.wrapper);
          settings = c.services.mcp-code-bridge.settings;
          failed = failed c;
        };
        expected = {
          names = [ "runsc-kvm" ];
          kvm = true;
          settings = {
            isolation = "gvisor";
            gvisor_runtime = "runsc-kvm";
            allow_unenforced_limits = false;
          };
          failed = [ ];
        };
      };
    testNixosGvisorOffRegistersNothing = {
      expr =
        lib.attrByPath [ "virtualisation" "containers" "containersConf" "settings" "engine" "runtimes" ] { } (nixos noImage);
      expected = { };
    };
    testNixosGvisorWithDockerSaysWhatToDo = {
      expr = saying "gvisor.enable registers gVisor with podman" (
        failed (
          nixosWith { virtualisation.docker.enable = true; } {
            settings = allowed // {
              runtime = "docker";
            };
            gvisor.enable = true;
          }
        )
      );
      expected = "gvisor.enable registers gVisor with podman";
    };
    testHomeGvisorWritesTheContainersConfDropIn =
      let
        c = home {
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
            packages.uv = null;
            gvisor.enable = true;
            settings = allowed;
          };
        };
        dropIn = c.xdg.configFile."containers/containers.conf.d/50-mcp-code-bridge-gvisor.conf".source;
        conf = builtins.fromJSON (builtins.unsafeDiscardStringContext dropIn.value);
      in
      {
        expr = {
          settings = c.programs.mcp-code-bridge.settings;
          runtimes = conf.engine.runtimes;
          failed = failed c;
        };
        expected = {
          settings = {
            isolation = "gvisor";
            gvisor_runtime = "mcp-code-bridge-runsc";
            allow_unenforced_limits = true;
          };
          runtimes.mcp-code-bridge-runsc = [
            (builtins.unsafeDiscardStringContext "${c.programs.mcp-code-bridge.gvisor.wrapper}")
          ];
          failed = [ ];
        };
      };
    testHomeGvisorWithARemoteEngineSaysWhatToDo = {
      expr = saying "gvisor.enable registers gVisor with podman" (
        failed (
          homeWithoutMcp {
            programs.mcp-code-bridge = {
              enable = true;
              gvisor.enable = true;
              settings = allowed // {
                runtime = "tcp://builder:2375";
              };
            };
          }
        )
      );
      expected = "gvisor.enable registers gVisor with podman";
    };
  };

  # Issue 48: what the VM tests found, and what the Debian suite (scripts/nix-pieces.sh) runs.
  newTests = {
    # runsc loads the engine's seccomp profile inside the sandbox only with --oci-seccomp, and
    # then refuses select(2) with EPERM: the wrapper of both modules does not pass it.
    testGvisorRuntimeLeavesTheEnginesSeccompProfileOut =
      let
        flags = text: lib.head (lib.filter (lib.hasPrefix "flags=(") (lib.splitString "\n" text));
        n = nixos (
          noImage
          // {
            gvisor = gvisorOn;
            settings = allowed;
          }
        );
        h = homeWithoutMcp {
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
            packages.uv = null;
            gvisor = gvisorOn // {
              platform = "ptrace";
            };
            settings = allowed;
          };
        };
      in
      {
        expr = {
          nixos = flags (textOf n.services.mcp-code-bridge.gvisor.wrapper);
          home = flags (textOf h.programs.mcp-code-bridge.gvisor.wrapper);
        };
        expected = {
          nixos = "flags=(--platform=systrap --network=none)";
          home = "flags=(--platform=ptrace --network=none)";
        };
      };

    # Rootless gVisor drops the limits (runsc --ignore-cgroups) and the bridge then refuses
    # unless allow_unenforced_limits: the modules refuse gvisor.enable until the choice is
    # written, and write what was chosen.
    testGvisorAsksWhetherRootlessMayRunWithoutLimits =
      let
        needle = opt: "${opt}.gvisor.enable: under rootless podman runsc applies no cgroups";
        home =
          settings:
          homeWithoutMcp {
            programs.mcp-code-bridge = {
              enable = true;
              image = null;
              packages.uv = null;
              gvisor = gvisorOn;
              inherit settings;
            };
          };
        nixosWith = settings: nixos (noImage // { gvisor = gvisorOn; inherit settings; });
      in
      {
        expr = {
          nixos = saying (needle "services.mcp-code-bridge") (failed (nixosWith { }));
          home = saying (needle "programs.mcp-code-bridge") (failed (home { }));
          nixosTrue = {
            failed = failed (nixosWith allowed);
            written = (nixosWith allowed).services.mcp-code-bridge.settings.allow_unenforced_limits;
          };
          nixosFalse = {
            failed = failed (nixosWith { allow_unenforced_limits = false; });
            written =
              (nixosWith { allow_unenforced_limits = false; }).services.mcp-code-bridge.settings.allow_unenforced_limits;
          };
          homeTrue = failed (home allowed);
          # Without gVisor nothing is asked.
          off = failed (nixos noImage);
        };
        expected = {
          nixos = needle "services.mcp-code-bridge";
          home = needle "programs.mcp-code-bridge";
          nixosTrue = {
            failed = [ ];
            written = true;
          };
          nixosFalse = {
            failed = [ ];
            written = false;
          };
          homeTrue = [ ];
          off = [ ];
        };
      };

    # gVisor with the HTTP service: podman's API runs a container under its service's default
    # runtime, so the service gets a root podman service of its own whose default is gVisor's,
    # on a socket only its group can use, and is pointed at it.
    testNixosGvisorHttpHasAPodmanServiceOfItsOwn =
      let
        c = nixos (
          noImage
          // {
            gvisor = gvisorOn;
            settings = allowed;
            http.enable = true;
          }
        );
        name = "mcp-code-bridge-gvisor-podman";
        http = c.systemd.services.mcp-code-bridge-http;
        plain = nixos (noImage // { http.enable = true; });
      in
      {
        expr = {
          socket = {
            inherit (c.systemd.sockets.${name}) listenStreams wantedBy;
            inherit (c.systemd.sockets.${name}.socketConfig) SocketMode SocketUser SocketGroup;
          };
          service = {
            inherit (c.systemd.services.${name}) requires after;
            inherit (c.systemd.services.${name}.serviceConfig) Type KillMode Delegate;
            command = lib.hasSuffix "/bin/podman --runtime mcp-code-bridge-runsc system service" c.systemd.services.${name}.serviceConfig.ExecStart;
          };
          http = {
            inherit (http.environment) CONTAINER_HOST;
            inherit (http.serviceConfig) SupplementaryGroups;
            wants = lib.elem "${name}.socket" http.wants && lib.elem "${name}.socket" http.after;
            podmanSocket = lib.elem "podman.socket" http.wants;
          };
          failed = failed c;
          # Without gVisor: podman's own socket, as before, and no service of its own.
          plain = {
            inherit (plain.systemd.services.mcp-code-bridge-http.environment) CONTAINER_HOST;
            own = (plain.systemd.sockets or { }) ? ${name};
          };
        };
        expected = {
          socket = {
            listenStreams = [ "/run/${name}/podman.sock" ];
            wantedBy = [ "sockets.target" ];
            SocketMode = "0660";
            SocketUser = "root";
            SocketGroup = "mcp-code-bridge";
          };
          service = {
            requires = [ "${name}.socket" ];
            after = [ "${name}.socket" ];
            Type = "exec";
            KillMode = "process";
            Delegate = true;
            command = true;
          };
          http = {
            CONTAINER_HOST = "unix:///run/${name}/podman.sock";
            SupplementaryGroups = [ ];
            wants = true;
            podmanSocket = false;
          };
          failed = [ ];
          plain = {
            CONTAINER_HOST = "unix:///run/podman/podman.sock";
            own = false;
          };
        };
      };
    testNixosGvisorHttpWithARuntimeUrlSaysWhatToDo = {
      expr = saying "finds only when settings.runtime is unset, \"auto\" or \"podman\"" (
        failed (
          nixos {
            gvisor = gvisorOn;
            settings = allowed // {
              runtime = "unix:///run/podman/podman.sock";
            };
            http.enable = true;
          }
        )
      );
      expected = "finds only when settings.runtime is unset, \"auto\" or \"podman\"";
    };

    # A secret file's key given by hand in `settings` as a Nix path is refused like the typed
    # option (the TOML rendering would copy it into the store); a string outside it is written.
    testSettingsSecretFilesAsNixPathsAreRefused =
      let
        given = {
          token_file = pathLiteral;
          http.tls_key = pathLiteral;
        };
        n = nixos (noImage // { settings = given; });
        h = homeWithoutMcp {
          programs.mcp-code-bridge = {
            enable = true;
            image = null;
            packages.uv = null;
            settings = given;
          };
        };
        strings = nixos (
          noImage
          // {
            settings = {
              token_file = "/run/secrets/tokens";
              http.tls_key = "/var/lib/acme/x/key.pem";
            };
          }
        );
        inStore = nixos (noImage // { settings.token_file = "${builtins.storeDir}/x-tokens"; });
      in
      {
        expr = {
          nixos = map (o: saying "services.mcp-code-bridge.settings.${o} is a Nix path" (failed n)) [
            "token_file"
            "http.tls_key"
          ];
          home = saying "programs.mcp-code-bridge.settings.token_file is a Nix path" (failed h);
          strings = failed strings;
          store = saying "services.mcp-code-bridge.settings.token_file points into the Nix store" (failed inStore);
        };
        expected = {
          nixos = [
            "services.mcp-code-bridge.settings.token_file is a Nix path"
            "services.mcp-code-bridge.settings.http.tls_key is a Nix path"
          ];
          home = "programs.mcp-code-bridge.settings.token_file is a Nix path";
          strings = [ ];
          store = "services.mcp-code-bridge.settings.token_file points into the Nix store";
        };
      };

    # gvisor.package is declared as nixpkgs' package options are.
    testGvisorPackageIsAPackageOption =
      let
        opt = nixosOptions.services.mcp-code-bridge.gvisor.package;
      in
      {
        expr = {
          defaultText = opt.defaultText.text;
          description = lib.hasPrefix "The gvisor package to use." opt.description;
        };
        expected = {
          defaultText = "pkgs.gvisor";
          description = true;
        };
      };

    # The configuration file's build script can be run on Debian: the settings' own rendering is
    # an attribute of it (scripts/nix-pieces.sh).
    testConfigFileKeepsItsSettingsRendering =
      let
        c = (nixos { packages.uv = null; }).services.mcp-code-bridge;
      in
      {
        expr = {
          value = builtins.fromJSON (builtins.unsafeDiscardStringContext c.configFile.generated.value);
          inScript = lib.hasInfix (builtins.unsafeDiscardStringContext "cat ${c.configFile.generated}") (
            script c.configFile
          );
        };
        expected = {
          value = c.settings;
          inScript = true;
        };
      };
  };

  failures = lib.runTests (tests // newTests);
  count = toString (lib.length (lib.attrNames (tests // newTests)));
in
if failures == [ ] then
  pkgs.runCommand "mcp-code-bridge-module-tests" { } ''
    echo "${count} module evaluation tests passed" > $out
  ''
else
  # One line per failure: the offline check shows the first lines of an error.
  throw "mcp-code-bridge module tests: ${toString (lib.length failures)} of ${count} failed:\n${
    lib.concatMapStringsSep "\n" (
      f:
      "${f.name}: expected ${lib.generators.toPretty { multiline = false; } f.expected}, got ${
        lib.generators.toPretty { multiline = false; } f.result
      }"
    ) failures
  }"

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

  failed = c: map (a: a.message) (lib.filter (a: !a.assertion) c.assertions);
  # The needle when one of the messages holds it, else the messages themselves (so a failure
  # shows what was said instead).
  saying = needle: msgs: if lib.any (lib.hasInfix needle) msgs then needle else msgs;
  # The build script of a config file: `buildCommand` of nixpkgs' runCommand, `cmd` in the
  # offline stub's.
  script = drv: drv.buildCommand or drv.cmd or "";
  withoutImage = s: removeAttrs s [ "image" "image_archive" ];

  noImage = {
    image = null;
  };

  tests = {
    # Typed options left alone write nothing: the bridge's own defaults hold.
    testNullOptionsWriteNothing = {
      expr = (nixos noImage).services.mcp-code-bridge.settings;
      expected = { };
    };
    testImageIsWrittenWithItsArchive = {
      expr = lib.attrNames (nixos { }).services.mcp-code-bridge.settings;
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
            stateDir = "/var/lib/mcp-code-bridge";
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
        state_dir = "/var/lib/mcp-code-bridge";
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

    # home-manager: programs.mcp.servers become upstream servers, the bridge itself does not.
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
    testHomeWithoutProgramsMcpEvaluates = {
      expr =
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
          inherit (c.programs.mcp-code-bridge) settings;
          failed = failed c;
        };
      expected = {
        settings = {
          image = (pkgs.mcp-code-bridge-sandbox-image).imageName + ":" + pkgs.mcp-code-bridge-sandbox-image.imageTag;
          image_archive = "${pkgs.mcp-code-bridge-sandbox-image}";
          memory = "1g";
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
          serve = lib.hasSuffix "/bin/mcp-code-bridge serve" (toString u.Service.ExecStart);
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
  };

  failures = lib.runTests tests;
  count = toString (lib.length (lib.attrNames tests));
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

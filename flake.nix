{
  description = "mcp-code-bridge: an MCP server with one tool, run_python, that runs code in a hardened rootless podman sandbox with every configured MCP server proxied inside";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixpkgs-unstable";
    home-manager = {
      url = "github:nix-community/home-manager";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  outputs =
    {
      self,
      nixpkgs,
      home-manager,
    }:
    let
      inherit (nixpkgs) lib;

      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = f: lib.genAttrs systems (system: f system);

      pkgsFor = lib.genAttrs systems (
        system:
        import nixpkgs {
          inherit system;
          overlays = [ self.overlays.default ];
        }
      );

      # A home-manager configuration that uses the module: evaluated by checks and by
      # homeConfigurations.example.
      exampleHome =
        system:
        home-manager.lib.homeManagerConfiguration {
          pkgs = pkgsFor.${system};
          modules = [
            self.homeModules.default
            ./nix/example-home.nix
          ];
        };

      # A NixOS configuration that uses the module.
      exampleNixos =
        system:
        lib.nixosSystem {
          modules = [
            { nixpkgs.hostPlatform = system; }
            self.nixosModules.default
            ./nix/example-nixos.nix
          ];
        };
    in
    {
      # `final.callPackage`, so that cross-compilation splices build-time inputs (nativeBuildInputs
      # from the build platform). `or`: the offline evaluation stub of nixpkgs (docs/nix.md) has no
      # callPackage (every nixpkgs has, so there the fallback is never taken); the image leaves out
      # the Python packages the stub lacks, and the wrapper's uv is a stand-in, only there
      # (nix/eval-stub.nix).
      overlays.default =
        final: _prev:
        let
          stub = import ./nix/eval-stub.nix final;
          callPackage = final.callPackage or (lib.callPackageWith final);
        in
        {
          mcp-code-bridge = callPackage ./nix/package.nix { };
          mcp-code-bridge-sandbox-image = callPackage ./image { evaluationStub = stub.isStub; };
          mcp-code-bridge-with-image = callPackage ./nix/with-image.nix {
            uv = stub.lookup final "uv" (final.writeShellScriptBin "uv" "exit 1");
          };
        };

      packages = forAllSystems (
        system:
        let
          pkgs = pkgsFor.${system};
        in
        {
          default = pkgs.mcp-code-bridge-with-image;
          mcp-code-bridge = pkgs.mcp-code-bridge;
          sandbox-image = pkgs.mcp-code-bridge-sandbox-image;
          sandbox-image-data = pkgs.mcp-code-bridge-sandbox-image.override { profile = "data"; };
        }
      );

      apps = forAllSystems (system: {
        default = {
          type = "app";
          program = lib.getExe self.packages.${system}.default;
          meta.description = "mcp-code-bridge over stdio, with the Nix-built sandbox image";
        };
      });

      # The modules default to this flake's packages (built with its pinned nixpkgs, or with yours
      # under `inputs.mcp-code-bridge.inputs.nixpkgs.follows`), whatever nixpkgs the configuration
      # uses; override `package` / `image` to change that. On a system the flake does not build for
      # there are none, and the modules' assertions say so (not a missing attribute).
      nixosModules.default =
        { lib, pkgs, ... }:
        let
          own = self.packages.${pkgs.stdenv.hostPlatform.system} or null;
        in
        {
          imports = [ ./nixos-module ];
          # mkIf on the values: `own` depends on `pkgs`, a module argument, so it cannot decide
          # which attributes this module defines.
          services.mcp-code-bridge = {
            package = lib.mkIf (own != null) (lib.mkDefault own.mcp-code-bridge);
            image = lib.mkIf (own != null) (lib.mkDefault own.sandbox-image);
          };
        };

      homeModules.default =
        { lib, pkgs, ... }:
        let
          own = self.packages.${pkgs.stdenv.hostPlatform.system} or null;
        in
        {
          imports = [ ./home-manager ];
          # mkIf on the values: `own` depends on `pkgs`, a module argument, so it cannot decide
          # which attributes this module defines.
          programs.mcp-code-bridge = {
            package = lib.mkIf (own != null) (lib.mkDefault own.mcp-code-bridge);
            image = lib.mkIf (own != null) (lib.mkDefault own.sandbox-image);
          };
        };

      checks = forAllSystems (
        system:
        let
          pkgs = pkgsFor.${system};
          callPackage = pkgs.callPackage or (lib.callPackageWith pkgs);
          testArgs = {
            inherit pkgs;
            module = self.nixosModules.default;
          };
        in
        {
          # Builds the binary and runs its unit tests.
          package = self.packages.${system}.mcp-code-bridge;
          with-image = self.packages.${system}.default;
          runtime-tests = callPackage ./nix/runtime-tests.nix { };
          nixos-sandbox = import ./tests/nixos/sandbox.nix testArgs;
          nixos-sandbox-gvisor = import ./tests/nixos/sandbox.nix (testArgs // { gvisor = true; });
          nixos-mcp-client = import ./tests/nixos/mcp-client.nix testArgs;
          nixos-http = import ./tests/nixos/http.nix testArgs;
          home-manager = (exampleHome system).activationPackage;
          # What the modules write into config.toml, assert and warn, checked at evaluation.
          module-tests = import ./nix/module-tests.nix {
            inherit lib pkgs home-manager;
            nixosModule = self.nixosModules.default;
            homeModule = self.homeModules.default;
            overlay = self.overlays.default;
            runtimeTests = self.checks.${system}.runtime-tests;
            # Which VM tests there are, for the test that docs/nix.md describes each.
            vmTests = lib.filter (lib.hasPrefix "nixos-") (lib.attrNames self.checks.${system});
          };
        }
      );

      nixosConfigurations.example = exampleNixos "x86_64-linux";
      homeConfigurations.example = exampleHome "x86_64-linux";

      devShells = forAllSystems (system: {
        default = import ./nix/dev-shell.nix { pkgs = pkgsFor.${system}; };
      });

      formatter = forAllSystems (
        system:
        let
          pkgs = pkgsFor.${system};
        in
        # The stand-in is for the offline evaluation stub of nixpkgs only (nix/eval-stub.nix):
        # with nixpkgs a missing nixfmt-tree is an error.
        (import ./nix/eval-stub.nix pkgs).lookup pkgs "nixfmt-tree" (
          pkgs.writeShellScriptBin "nixfmt-tree" ''
            echo "nixfmt-tree is not in this nixpkgs" >&2
            exit 1
          ''
        )
      );
    };
}

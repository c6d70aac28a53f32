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
      # `lib.callPackageWith final` is what nixpkgs' own `callPackage` is built on (for a native
      # build it passes the same packages; callPackage only adds cross-compilation splicing), and
      # it also works against the offline evaluation stub of nixpkgs (docs/nix.md), which has no
      # `callPackage`.
      overlays.default =
        final: _prev:
        let
          callPackage = lib.callPackageWith final;
        in
        {
          mcp-code-bridge = callPackage ./nix/package.nix { };
          mcp-code-bridge-sandbox-image = callPackage ./image { };
          mcp-code-bridge-with-image = callPackage ./nix/with-image.nix { };
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

      # The modules default to this flake's packages (built with its pinned nixpkgs), whatever
      # nixpkgs the configuration uses; override `package` / `image` to change that.
      nixosModules.default =
        { lib, pkgs, ... }:
        let
          own = self.packages.${pkgs.stdenv.hostPlatform.system};
        in
        {
          imports = [ ./nixos-module ];
          services.mcp-code-bridge = {
            package = lib.mkDefault own.mcp-code-bridge;
            image = lib.mkDefault own.sandbox-image;
          };
        };

      homeModules.default =
        { lib, pkgs, ... }:
        let
          own = self.packages.${pkgs.stdenv.hostPlatform.system};
        in
        {
          imports = [ ./home-manager ];
          programs.mcp-code-bridge = {
            package = lib.mkDefault own.mcp-code-bridge;
            image = lib.mkDefault own.sandbox-image;
          };
        };

      checks = forAllSystems (
        system:
        let
          pkgs = pkgsFor.${system};
          testArgs = {
            inherit pkgs;
            module = self.nixosModules.default;
          };
        in
        {
          # Builds the binary and runs its unit tests.
          package = self.packages.${system}.mcp-code-bridge;
          with-image = self.packages.${system}.default;
          runtime-tests = lib.callPackageWith pkgs ./nix/runtime-tests.nix { };
          nixos-sandbox = import ./tests/nixos/sandbox.nix testArgs;
          nixos-mcp-client = import ./tests/nixos/mcp-client.nix testArgs;
          nixos-http = import ./tests/nixos/http.nix testArgs;
          home-manager = (exampleHome system).activationPackage;
          # What the modules write into config.toml, assert and warn, checked at evaluation.
          module-tests = import ./nix/module-tests.nix {
            inherit lib pkgs home-manager;
            nixosModule = self.nixosModules.default;
            homeModule = self.homeModules.default;
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
        # `or`: the offline evaluation stub of nixpkgs has no nixfmt-tree (nixpkgs has, so this
        # fallback, a script that says so, is never used there).
        pkgs.nixfmt-tree or (pkgs.writeShellScriptBin "nixfmt-tree" ''
          echo "nixfmt-tree is not in this nixpkgs" >&2
          exit 1
        '')
      );
    };
}

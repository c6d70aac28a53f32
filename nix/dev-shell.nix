# The development shell (`nix develop`): the Rust toolchain, podman, Python with the MCP SDK and
# pytest (the VM test's client, scripts), Node.js and mcp-server-time (upstream servers for the
# integration tests), uv (the host's resolver of `runtime.install`, which the tests run), nixfmt.
{ pkgs }:

let
  # The offline evaluation stub of nixpkgs (docs/nix.md) has no mkShell, and only there is the
  # stand-in used (nix/eval-stub.nix); with nixpkgs this is plain mkShell. The stand-in only gives
  # the stub a derivation to evaluate: the stub's mkDerivation reads nothing but `name` (here
  # mkShell's default), so the package list below is evaluated only against real nixpkgs.
  mkShell = (import ./eval-stub.nix pkgs).lookup pkgs "mkShell" (
    args: pkgs.stdenv.mkDerivation (args // { name = "nix-shell"; })
  );
in
mkShell {
  packages = [
    pkgs.cargo
    pkgs.rustc
    pkgs.clippy
    pkgs.rustfmt
    pkgs.rust-analyzer
    pkgs.podman
    (pkgs.python3.withPackages (ps: [
      ps.mcp
      ps.pytest
    ]))
    pkgs.nodejs
    pkgs.mcp-server-time
    pkgs.uv
    pkgs.nixfmt
  ];
  RUST_SRC_PATH = "${pkgs.rustPlatform.rustLibSrc}";
}

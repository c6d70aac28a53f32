# The mcp-code-bridge binary, built from this repository's Cargo.lock.
# The integration tests (tests/) need podman and real MCP servers, which the Nix build sandbox
# does not have: the check phase runs the unit tests only (the VM tests in tests/nixos cover the
# rest).
{
  lib,
  rustPlatform,
  python3,
}:

let
  root = ../.;
  cargoToml = lib.importTOML (root + "/Cargo.toml");
  # The top crate's [package], each key the workspace sets (`version.workspace = true`) read
  # from [workspace.package].
  package = lib.mapAttrs (
    name: value:
    if lib.isAttrs value && value.workspace or false then cargoToml.workspace.package.${name} else value
  ) cargoToml.package;
  lockedPackages = (lib.importTOML (root + "/Cargo.lock")).package or [ ];
  # No dependency links a library of the system, but two compile vendored C and assembly in
  # their build scripts: aws-lc-sys (rustls' crypto provider, through aws-lc-rs) and ring. On
  # x86_64 and aarch64 Linux both need only the C compiler that stdenv provides: aws-lc-sys
  # takes its `cc` builder and its pre-generated bindings there, so no CMake, Go, Perl, NASM or
  # libclang (those are for its FIPS variant, for other targets, or for
  # AWS_LC_SYS_CMAKE_BUILDER=1), and ring ships its assembly pre-generated. Should the lock
  # file gain a crate that needs more, say so here rather than fail deep inside cargo.
  lockedNames = map (p: p.name) lockedPackages;
  linksOpenssl = lib.elem "openssl-sys" lockedNames;
  usesAwsLcFips = lib.elem "aws-lc-fips-sys" lockedNames;
  hasLib = builtins.pathExists (root + "/src/lib.rs");

  inherit (lib) fileset;
in
assert lib.assertMsg (!linksOpenssl) ''
  mcp-code-bridge: Cargo.lock now has openssl-sys; add `pkg-config` to nativeBuildInputs and
  `openssl` to buildInputs in nix/package.nix (or keep the dependency on rustls).
'';
assert lib.assertMsg (!usesAwsLcFips) ''
  mcp-code-bridge: Cargo.lock now has aws-lc-fips-sys, which builds with CMake and Go; add
  `cmake` and `go` to nativeBuildInputs with `dontUseCmakeConfigure = true;` (the build is
  cargo's, not CMake's) and `rustPlatform.bindgenHook` in nix/package.nix.
'';
rustPlatform.buildRustPackage {
  pname = package.name;
  inherit (package) version;

  src = fileset.toSource {
    inherit root;
    fileset = fileset.unions [
      (root + "/Cargo.toml")
      (root + "/Cargo.lock")
      (root + "/src")
      # The workspace's other crates (the layers below src/; ARCHITECTURE.md)
      (fileset.maybeMissing (root + "/crates"))
      # image/runtime/*.py and image/loader.py are embedded with include_str! (their tests are not)
      (fileset.difference (fileset.fileFilter (file: file.hasExt "py") (root + "/image")) (
        fileset.maybeMissing (root + "/image/tests")
      ))
      (fileset.maybeMissing (root + "/build.rs"))
      (fileset.maybeMissing (root + "/README.md"))
      (fileset.maybeMissing (root + "/benches"))
      (fileset.maybeMissing (root + "/examples"))
      # Cargo wants the targets it finds under tests/ to exist, even when it does not build them.
      (fileset.difference (fileset.maybeMissing (root + "/tests")) (
        fileset.maybeMissing (root + "/tests/nixos")
      ))
    ];
  };

  cargoLock.lockFile = root + "/Cargo.lock";
  # The release profile (what buildRustPackage builds) is whole, not incremental; this keeps it so
  # whatever the environment says (the incremental profile for changing code is dev-release).
  env.CARGO_INCREMENTAL = "0";

  doCheck = true;
  # Unit tests only, of every crate of the workspace: `--bins` runs the #[cfg(test)] modules of
  # the binary, `--lib` those of the libraries. The integration tests under tests/ need podman.
  cargoTestFlags = [ "--workspace" ] ++ lib.optionals hasLib [ "--lib" ] ++ [ "--bins" ];
  # Unit tests of the embedded Python runtime may call python3.
  nativeCheckInputs = [ python3 ];
  # The build sandbox's HOME (/homeless-shelter) does not exist; config and state paths derive from it.
  preCheck = ''
    export HOME=$(mktemp -d)
  '';

  meta = {
    description = package.description or "MCP server with one tool, run_python, in a hardened rootless container";
    license =
      if package ? license then
        map lib.getLicenseFromSpdxId (lib.splitString " OR " package.license)
      else
        lib.licenses.unfree;
    mainProgram = "mcp-code-bridge";
    platforms = lib.platforms.linux;
  }
  # Cargo.toml is the one place the project's address is written (`homepage`, else
  # `repository`); until it has one there is none to give.
  // lib.optionalAttrs (package ? homepage || package ? repository) {
    homepage = package.homepage or package.repository;
  };
}

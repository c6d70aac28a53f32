# Whether `pkgs` is the offline evaluation stub of nixpkgs (docs/nix.md, "What was checked")
# rather than nixpkgs itself, and lookups that are strict with nixpkgs and lenient only with the stub.
# The stub has no `callPackage`, which every nixpkgs has: with nixpkgs `isStub` is false and no
# stand-in below is ever used, so a package that nixpkgs renamed or removed is an error naming it,
# never a package silently left out.
pkgs:
let
  isStub = !(pkgs ? callPackage);
in
{
  inherit isStub;

  # `set.${name}` (a package set: pkgs, python3Packages, ...); when the set lacks it, `standIn`
  # under the stub, else an error.
  lookup =
    set: name: standIn:
    if set ? ${name} then
      set.${name}
    else if isStub then
      standIn
    else
      throw "mcp-code-bridge: this nixpkgs has no package `${name}` (renamed or removed?); the flake needs it. Pin a nixpkgs that has it, or report it.";

  # `set` with `standIn` as `set.${name}` when the set lacks it, under the stub only (for
  # mkPackageOption, which looks the name up itself): with nixpkgs `set` as it is, so a missing
  # package is mkPackageOption's own error.
  withStandIn =
    set: name: standIn:
    if isStub && !(set ? ${name}) then set // { ${name} = standIn; } else set;
}

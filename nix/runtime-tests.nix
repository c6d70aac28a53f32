# The sandbox runtime's own tests (image/tests, pytest), run with the image's Python (3.14 with
# pandas and numpy) in the build sandbox: no podman needed, the tests play the host over pipes.
{
  lib,
  runCommand,
  python314,
}:

let
  root = ../.;
  src = lib.fileset.toSource {
    inherit root;
    fileset = lib.fileset.fileFilter (file: file.hasExt "py") (root + "/image");
  };
  python = python314.withPackages (ps: [
    ps.pytest
    ps.pandas
    ps.numpy
  ]);
in
runCommand "mcp-code-bridge-runtime-tests"
  {
    nativeBuildInputs = [ python ];
  }
  ''
    cp -r ${src}/image image
    chmod -R u+w image
    python3 -m pytest image/tests -q -p no:cacheprovider
    touch $out
  ''

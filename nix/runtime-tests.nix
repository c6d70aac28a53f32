# The sandbox runtime's own tests (image/tests, pytest), run with the image's Python in the build
# sandbox: no podman needed, the tests play the host over pipes. "The image's Python" is the same
# interpreter with the same packages (the image's own list, `pythonSelection`: pandas, numpy,
# matplotlib and whatever the image was built with), plus pytest.
{
  lib,
  runCommand,
  mcp-code-bridge-sandbox-image,
}:

let
  image = mcp-code-bridge-sandbox-image;
  root = ../.;
  src = lib.fileset.toSource {
    inherit root;
    fileset = lib.fileset.fileFilter (file: file.hasExt "py") (root + "/image");
  };
  pythonSelection = ps: image.pythonSelection ps ++ [ ps.pytest ];
  python = image.pythonInterpreter.withPackages pythonSelection;
in
# For nix/module-tests.nix: what the tests' Python is made of.
lib.extendDerivation true { inherit pythonSelection; } (
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
)

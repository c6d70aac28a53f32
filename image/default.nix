# The sandbox image: Python 3.14 with pandas, numpy, matplotlib and cloudpickle, nothing of this
# repository.
# The bridge injects its Python runtime (image/runtime/) at container start, so the image
# only has to provide `python3` on PATH, an unprivileged user and the /tmp and /workspace
# mount points. The result is a docker-archive (.tar.gz) that `mcp-code-bridge image load`
# (or `podman load -i`) accepts; its `imageName` and `imageTag` attributes give the reference it
# loads as, the tag derived from the image's content.
#
#   pkgs.callPackage ./image { }
#   (pkgs.callPackage ./image { }).override { extraPythonPackages = ps: [ ps.scipy ]; }
#   (pkgs.callPackage ./image { }).override { profile = "data"; }
{
  lib,
  dockerTools,
  runCommand,
  python314,
  # "default" (pandas, numpy, matplotlib, cloudpickle) or "data" (also scipy, scikit-learn and
  # pyarrow), the profiles of image/build-debian.sh; the image's label io.mcp-code-bridge.profile
  # says which.
  profile ? "default",
  # Python packages added on top of the profile's: a function of the package set.
  extraPythonPackages ? (_ps: [ ]),
  # Other store paths to put in the image (their bin/ lands in /bin), e.g. [ coreutils ].
  extraContents ? [ ],
  name ? "mcp-code-bridge-sandbox",
  # null: a hash of everything the image is made of (see contentTag below).
  tag ? null,
  # A fixed date keeps the archive reproducible.
  created ? "1970-01-01T00:00:01Z",
  # true only under the offline evaluation stub of nixpkgs (docs/nix.md; the flake's overlay says
  # which): a Python package the stub lacks is then left out. With nixpkgs a missing one (renamed,
  # removed) is an error naming it, never an image silently without it.
  evaluationStub ? false,
}:

assert lib.assertOneOf "profile" profile [
  "default"
  "data"
];

let
  # The image's Python packages by name: the profile's (image/build-debian.sh has the same two
  # profiles), then extraPythonPackages. matplotlib: the tool description promises that display()
  # of a figure returns an image. cloudpickle: a session's snapshot keeps the functions and
  # classes its cells defined by value (docs/protocol.md, "Snapshots").
  profileNames = [
    "pandas"
    "numpy"
    "matplotlib"
    "cloudpickle"
  ]
  ++ lib.optionals (profile == "data") [
    "scipy"
    "scikit-learn"
    "pyarrow"
  ];
  byName =
    ps: names:
    lib.concatMap (
      n:
      if ps ? ${n} then
        [ ps.${n} ]
      else if evaluationStub then
        [ ]
      else
        throw "mcp-code-bridge sandbox image: ${python314.name}'s package set has no `${n}` (renamed or removed in this nixpkgs?); the ${profile} profile needs it."
    ) names;
  # What the image's Python is made of, as a function of the package set: the runtime tests
  # (nix/runtime-tests.nix) build their Python from it too, plus pytest.
  pythonSelection = ps: byName ps profileNames ++ extraPythonPackages ps;
  python = python314.withPackages pythonSelection;

  # /etc/passwd, /etc/group and nsswitch for uid/gid 65534 (nobody/nogroup), so that
  # getpass.getuser(), pwd.getpwuid() and friends work for the sandbox user.
  etcFiles = runCommand "mcp-code-bridge-sandbox-etc" { } ''
    mkdir -p $out/etc
    cat > $out/etc/passwd <<'EOF'
    root:x:0:0:root:/root:/noshell
    nobody:x:65534:65534:nobody:/tmp:/noshell
    EOF
    cat > $out/etc/group <<'EOF'
    root:x:0:
    nogroup:x:65534:
    EOF
    cat > $out/etc/nsswitch.conf <<'EOF'
    passwd: files
    group: files
    hosts: files dns
    EOF
  '';

  imageArgs = {
    inherit name created;
    contents = [
      python
      etcFiles
    ]
    ++ extraContents;

    # Mount points for the bridge's tmpfs mounts; also usable without them.
    extraCommands = ''
      mkdir -p tmp workspace
      chmod 1777 tmp
    '';
    fakeRootCommands = ''
      chown 65534:65534 workspace
      chmod 0755 workspace
    '';

    config = {
      User = "65534:65534";
      WorkingDir = "/workspace";
      # The environment's own bin/ first: its python3 finds its site-packages from the path it was
      # started by, so `python3` must resolve to the environment rather than to a /bin symlink.
      Cmd = [ "${python}/bin/python3" ];
      Env = [
        "PATH=${python}/bin:/bin"
        "HOME=/tmp"
        "LANG=C.UTF-8"
        "PYTHONDONTWRITEBYTECODE=1"
        "PYTHONUNBUFFERED=1"
        # The value the bridge gives every sandbox container (crates/sandbox/src/container.rs), and
        # image/build-debian.sh's image: one directory, whichever sets it.
        "MPLCONFIGDIR=/tmp/.matplotlib"
        "MPLBACKEND=Agg"
      ];
      Labels = {
        "org.opencontainers.image.title" = "mcp-code-bridge-sandbox";
        "org.opencontainers.image.description" = "Sandbox image of mcp-code-bridge (${profile}): ${python.name}";
        # Read by `mcp-code-bridge doctor` (sandbox::image::PROFILE_LABEL).
        "io.mcp-code-bridge.profile" = profile;
      };
    };
  };

  # The tag: a hash of all of the above. The contents are store paths, whose names already hash
  # their whole build closure, so a different image gets a different tag and a rebuild of the same
  # one keeps it. Computed here rather than taken from dockerTools (which would use its output
  # path's hash) so that config.toml and the `nix run` wrapper do not depend on dockerTools'
  # internals.
  contentTag = builtins.substring 0 32 (
    builtins.hashString "sha256" (builtins.unsafeDiscardStringContext (builtins.toJSON imageArgs))
  );
  # Image references must be lowercase (dockerTools lowercases the name, not a given tag).
  imageTag = lib.toLower (if tag != null then tag else contentTag);

  image = dockerTools.buildLayeredImage (imageArgs // { tag = imageTag; });
in
# The reference the archive loads as. dockerTools' own imageName/imageTag have the same values
# (the name lowercased, the tag as given); they are spelled out here so that the modules and the
# wrapper depend only on this file.
lib.extendDerivation true
  {
    imageName = lib.toLower name;
    inherit imageTag;
    # For the runtime tests and the module tests: the interpreter, what its environment is made
    # of, and the image's config (Env, User, ...).
    pythonInterpreter = python314;
    inherit pythonSelection;
    imageConfig = imageArgs.config;
  }
  image

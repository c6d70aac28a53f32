#!/usr/bin/env bash
# scripts/check-nixos-scripts.sh [--flake DIR] [--self-test]: the NixOS VM tests' scripts checked
# as nixpkgs checks them before any VM boots. nixpkgs' test driver (nixos/lib/testing/driver.nix)
# builds every test's driver by, unless the test sets skipTypeCheck / skipLint:
#   - type-checking the script with mypy (`mypy --no-implicit-optional --pretty
#     --no-color-output`), prepended with the driver's globals (nixos/lib/test-script-prepend.py)
#     and one `<node>: QemuMachine;` line per VM node (`machine` too when there is one node of
#     another name), `<node>: NspawnMachine;` per container, `vlan<N>: VLan` per VLAN;
#   - linting it with pyflakes, the machine names and the driver's symbols as builtins.
# A failure of either fails the build of the test. This script does the same for every VM test of
# the flake's checks (every check made by testers.runNixOSTest), with:
#   - the script as the offline evaluation renders it (`nix eval` through the nix-offline wrapper,
#     with the stand-in for nixpkgs; docs/nix.md), of a clone of this checkout's HEAD (a flake
#     sees only what git tracks) or of the git checkout given with --flake;
#   - tests/nixos/driver_stub/ (of that checkout) as the driver: a typed stand-in of its Python
#     API, the prepend, and the list of driver symbols, written from nixpkgs' driver source (its
#     test_driver/__init__.pyi says which files and revision);
#   - mypy and pyflakes from PyPI at the versions below, in a venv in the cache directory
#     ($MCP_CODE_BRIDGE_CACHE_DIR, default /var/cache/mcp-code-bridge) that it makes when missing;
#     mypy is told the Python version nixpkgs' mypy runs on (it defaults to its interpreter's),
#     and reads no configuration file, as in the build.
# It sets up the nix-offline wrapper itself when it is missing (as .ci/run does), from
# $NIX_OFFLINE_DIR (default ../shared/nix-offline beside the checkout).
#
# Prints one line per test script (and one for the stand-in, checked by mypy --strict) and ends
# with "nixos-scripts: N passed, N failed"; exits non-zero on any failure. With --self-test it then
# plants, in scratch copies of the rendered scripts (the checkout is not touched), a union-attr
# error (a re.search() result used as a match), a name no one defines, a Machine method called with
# a keyword it does not take and one called with an argument of the wrong type, and checks that
# each copy fails with the error planted (one line each, in the same count): so the check is shown
# able to fail. NIXOS_SCRIPTS_KEEP=DIR keeps the files each test was checked as there.
set -euo pipefail

# What nixpkgs builds the driver with at the revision flake.lock pins (nixpkgs-unstable of
# 2026-08-20), as near as can be told without that nixpkgs here: python3 3.13 (nixpkgs' python3
# since 25.05), pyflakes 3.4.0 (its one release between June 2025 and the pin), mypy 2.3.0 (out
# five weeks before the pin; 2.3.1 came five days before it). Move them with flake.lock.
MYPY_VERSION=2.3.0
PYFLAKES_VERSION=3.4.0
NIXPKGS_PYTHON=3.13

die() { printf 'check-nixos-scripts: error: %s\n' "$*" >&2; exit 2; }

flake_src=""
self_test=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --flake) [[ $# -ge 2 ]] || die "--flake needs a directory"; flake_src=$(realpath -- "$2"); shift 2 ;;
        --self-test) self_test=1; shift ;;
        -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
        *) die "unknown argument: $1 (usage: scripts/check-nixos-scripts.sh [--flake DIR] [--self-test])" ;;
    esac
done
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
command -v git >/dev/null || die "git is not installed"
[[ -z "$flake_src" ]] || git -C "$flake_src" rev-parse --git-dir >/dev/null 2>&1 \
    || die "--flake $flake_src: not a git checkout (a flake is evaluated from what git tracks)"
cache_dir="${MCP_CODE_BRIDGE_CACHE_DIR:-/var/cache/mcp-code-bridge}"
system="${NIXOS_SCRIPTS_SYSTEM:-$(uname -m)-linux}"
started=$SECONDS

work=$(mktemp -d /tmp/nixos-scripts.XXXXXX)
cleanup() {
    if [[ -n "${NIXOS_SCRIPTS_KEEP:-}" && -d "$work/tests" ]]; then
        cp -r "$work/tests" "$NIXOS_SCRIPTS_KEEP" && echo "the checked files kept in $NIXOS_SCRIPTS_KEEP" >&2
    fi
    rm -rf -- "$work"
}
trap cleanup EXIT

# ------------------------------------------------------------------------------------ mypy, pyflakes
# A venv per pair of versions, made by a Python >= 3.10 with venv (Debian's python3-venv installed
# when there is none, as scripts/setup-debian.sh does).
venv="$cache_dir/nixos-scripts/venv-mypy-$MYPY_VERSION-pyflakes-$PYFLAKES_VERSION"
have_tools() {
    [[ "$("$venv/bin/python" -m mypy --version 2>/dev/null)" == "mypy $MYPY_VERSION "* ]] \
        && [[ "$("$venv/bin/python" -m pyflakes --version 2>/dev/null)" == "$PYFLAKES_VERSION "* ]]
}
if ! have_tools; then
    python=""
    for cand in python3 /usr/bin/python3; do
        if command -v "$cand" >/dev/null \
            && "$cand" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            python=$(command -v "$cand")
            break
        fi
    done
    if [[ -z "$python" ]]; then
        [[ $(id -u) -eq 0 ]] || die "no Python >= 3.10 with venv: install python3-venv (apt-get install python3 python3-venv)"
        printf 'installing python3-venv\n' >&2
        { apt-get update -qq && apt-get install -y -q --no-install-recommends python3 python3-venv; } >&2 < /dev/null
        python=/usr/bin/python3
    fi
    printf 'PyPI: mypy==%s pyflakes==%s (into %s)\n' "$MYPY_VERSION" "$PYFLAKES_VERSION" "$venv" >&2
    rm -rf -- "$venv"
    mkdir -p -- "$(dirname -- "$venv")"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        "mypy==$MYPY_VERSION" "pyflakes==$PYFLAKES_VERSION" >&2 < /dev/null \
        || die "pip could not install mypy==$MYPY_VERSION pyflakes==$PYFLAKES_VERSION into $venv"
    have_tools || die "$venv does not run mypy $MYPY_VERSION and pyflakes $PYFLAKES_VERSION after installing them"
fi

# ------------------------------------------------------------------------------------ nix-offline
nix_offline_dir="${NIX_OFFLINE_DIR:-$repo/../shared/nix-offline}"
if ! command -v nix-offline >/dev/null; then
    [[ -d "$nix_offline_dir/inputs" ]] || die "nix-offline is not set up and $nix_offline_dir has no inputs (NIX_OFFLINE_DIR)"
    printf 'setting up the nix-offline wrapper (%s)\n' "$nix_offline_dir" >&2
    # As .ci/run does: writable copies of the pinned inputs, with the refs/ that git needs.
    inputs="$work/inputs"
    mkdir -p "$inputs"
    cp -a "$nix_offline_dir/inputs/." "$inputs/"
    chmod -R u+w "$inputs"
    for g in "$inputs"/*.git; do mkdir -p "$g/refs/heads" "$g/refs/tags"; done
    bash "$nix_offline_dir/setup-offline-nix.sh" --home-manager "$inputs/home-manager.git" \
        --nixpkgs-lib "$inputs/nixpkgs.lib.git" > "$work/setup-offline-nix.log" 2>&1 < /dev/null \
        || { tail -n 20 "$work/setup-offline-nix.log" >&2; die "setup-offline-nix.sh failed"; }
    rm -rf -- "$inputs"
fi
stub="${NIX_OFFLINE_STUB:-/var/cache/nix-offline/stub-nixpkgs}"

# A clone of this commit (or of the checkout given with --flake) in the work directory: a flake
# sees what git tracks, and the wrapper's chroot sees /tmp. Named by its URL from `/`, so the
# wrapper binds no directory of this run's into the chroot and no mount outlives the run.
git clone -q --no-hardlinks "${flake_src:-$repo}" "$work/flake"
[[ -f "$work/flake/tests/nixos/driver_stub/test-script-prepend.py" ]] \
    || die "the checkout has no tests/nixos/driver_stub/ (the driver's stand-in): is it committed?"

# The stand-in for nixpkgs, with runNixOSTest telling what driver.nix needs besides the script:
# the test's node and container names, its VLANs and skipTypeCheck / skipLint. A copy (made in
# the chroot, which has it), whose default.nix adds an overlay to the stand-in's own.
(cd / && nix-offline cp -a "$stub/." "$work/nixpkgs/") || die "cannot copy the nixpkgs stand-in $stub"
chmod -R u+w "$work/nixpkgs"
[[ -f "$work/nixpkgs/default.nix" && -f "$work/nixpkgs/nixos/eval-stub.nix" ]] \
    || die "$stub is not the stand-in setup-offline-nix.sh writes (no default.nix, nixos/eval-stub.nix)"
mv "$work/nixpkgs/default.nix" "$work/nixpkgs/stand-in.nix"
cat > "$work/nixpkgs/default.nix" <<'NIX'
# The offline stand-in for nixpkgs (stand-in.nix), with the overlay of driver-info.nix first.
args:
import ./stand-in.nix (args // { overlays = [ (import ./driver-info.nix) ] ++ (args.overlays or [ ]); })
NIX
cat > "$work/nixpkgs/driver-info.nix" <<'NIX'
# testers.runNixOSTest of the stand-in, its result with `nixosTestDriver`: what nixpkgs'
# nixos/lib/testing/driver.nix reads to check the script (nodes and containers by name, the VLANs
# of nixos/lib/testing/network.nix, skipTypeCheck, skipLint), the test evaluated as the stand-in
# evaluates it (its options, the rest free-form; each node by the stand-in's NixOS evaluation).
final: prev:
let
  inherit (prev) lib;
  driverInfo =
    module:
    let
      t = lib.evalModules {
        modules = [
          module
          {
            options = {
              name = lib.mkOption { type = lib.types.str; };
              nodes = lib.mkOption {
                type = lib.types.lazyAttrsOf lib.types.deferredModule;
                default = { };
              };
              testScript = lib.mkOption {
                type = lib.types.either lib.types.str (lib.types.functionTo lib.types.str);
              };
              defaults = lib.mkOption {
                type = lib.types.deferredModule;
                default = { };
              };
            };
            config._module.freeformType = lib.types.lazyAttrsOf lib.types.anything;
          }
        ];
      };
      nodeConfig =
        m:
        (import ./nixos/eval-stub.nix {
          inherit lib;
          inherit (final.stdenv.hostPlatform) system;
          pkgsFor = _: final;
          modules = [
            m
            t.config.defaults
            { networking.primaryIPAddress = "192.168.1.1"; }
          ];
        }).config;
      # nixos/modules/virtualisation/qemu-vm.nix: vlans default to [ 1 ] with no interfaces.
      vlansOf =
        c:
        let
          v = c.virtualisation or { };
          interfaces = v.interfaces or { };
        in
        (v.vlans or (if interfaces == { } then [ 1 ] else [ ]))
        ++ map (i: i.vlan) (lib.filter (i: i ? vlan) (lib.attrValues interfaces));
    in
    {
      nodes = lib.attrNames t.config.nodes;
      containers = lib.attrNames (t.config.containers or { });
      vlans = lib.sort lib.lessThan (
        lib.unique (lib.concatMap (m: vlansOf (nodeConfig m)) (lib.attrValues t.config.nodes))
      );
      skipTypeCheck = t.config.skipTypeCheck or false;
      skipLint = t.config.skipLint or false;
    };
in
{
  testers = prev.testers // {
    runNixOSTest =
      module:
      let
        test = prev.testers.runNixOSTest module;
      in
      test // { nixosTestDriver = driverInfo module // { script = test.testScript; }; };
  };
}
NIX

# Every check that runNixOSTest made, with its script and what driver.nix reads.
cat > "$work/apply.nix" <<'NIX'
checks:
builtins.toJSON (
  builtins.listToAttrs (
    builtins.concatMap (
      n:
      let
        c = checks.${n};
      in
      if builtins.isAttrs c && c ? nixosTestDriver then
        [
          {
            name = n;
            value = c.nixosTestDriver;
          }
        ]
      else
        [ ]
    ) (builtins.attrNames checks)
  )
)
NIX
printf 'evaluating the VM tests of checks.%s (offline)\n' "$system" >&2
if ! (cd / && nix-offline nix eval --raw --no-eval-cache --override-input nixpkgs "path:$work/nixpkgs" \
    "git+file://$work/flake#checks.$system" --apply "$(cat "$work/apply.nix")") \
    > "$work/tests.json" 2> "$work/eval.err"; then
    grep -v '^warning: not writing\|^• Updated\|^    .github\|^  → ' "$work/eval.err" | tail -n 30 >&2
    die "the offline evaluation of checks.$system failed"
fi

# ------------------------------------------------------------------------------------ the checks
cat > "$work/check.py" <<'PY'
"""The checks of scripts/check-nixos-scripts.sh: driver.nix's mypy and pyflakes steps, per test."""
import json
import os
import re
import subprocess
import sys

work, stub_dir, venv, python_version, self_test = sys.argv[1:6]
tests = json.load(open(os.path.join(work, "tests.json")))
prepend = open(os.path.join(stub_dir, "test-script-prepend.py")).read()
driver_symbols = open(os.path.join(stub_dir, "driver-symbols")).read().strip()
# An empty configuration: mypy's defaults, as in the build (which has no configuration file).
config = os.path.join(work, "mypy.ini")
with open(config, "w") as f:
    f.write("[mypy]\n")


def pythonize(name):
    """driver.nix's pythonizeName: [A-z_] first, [A-z0-9_] after (the ASCII range A-z, as written
    there), anything else `_`."""
    head, tail = name[:1], name[1:]
    return (head if re.fullmatch(r"[A-z_]", head) else "_") + "".join(
        c if re.fullmatch(r"[A-z0-9_]", c) else "_" for c in tail
    )


def vm_names(t):
    names = list(t["nodes"])
    # theOnlyMachine: one node, not called `machine`, is also `machine`.
    if len(t["nodes"]) == 1 and "machine" not in t["nodes"]:
        names.append("machine")
    return [pythonize(n) for n in names]


def check(name, t, script):
    """The script of test `name` through driver.nix's two steps: (ok, steps run, [(step, output)])."""
    d = os.path.join(work, "tests", name)
    os.makedirs(d, exist_ok=True)
    problems = []
    vms = vm_names(t)
    containers = [pythonize(n) for n in t["containers"]]
    if not t["skipTypeCheck"]:
        # testScriptWithTypes, line for line as driver.nix writes it (echo adds the newlines).
        hints = [
            " ".join(f"{n}: QemuMachine;" for n in vms),
            " ".join(f"{n}: NspawnMachine;" for n in containers),
            "\n".join(f"vlan{v}: VLan" for v in t["vlans"]),
        ]
        head = prepend + "".join(h + "\n" for h in hints)
        with open(os.path.join(d, "testScriptWithTypes"), "w") as f:
            f.write(head + script)
        offset = head.count("\n")
        env = dict(os.environ, MYPYPATH=stub_dir)
        r = subprocess.run(
            [os.path.join(venv, "bin", "mypy"), "--no-implicit-optional", "--pretty",
             "--no-color-output", "--python-version", python_version, "--config-file", config,
             "--cache-dir", os.path.join(work, "mypy-cache"), "testScriptWithTypes"],
            cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        if r.returncode != 0:
            # Lines of the script itself by their number in the script.
            out = re.sub(
                r"^testScriptWithTypes:(\d+):",
                lambda m: f"testScript:{int(m.group(1)) - offset}:" if int(m.group(1)) > offset else m.group(0),
                r.stdout, flags=re.M,
            )
            problems.append(("mypy", out.rstrip()))
    if not t["skipLint"]:
        with open(os.path.join(d, "test-script"), "w") as f:
            f.write(script)
        env = dict(os.environ, PYFLAKES_BUILTINS=",".join(vms + containers) + "," + driver_symbols)
        r = subprocess.run(
            [os.path.join(venv, "bin", "pyflakes"), "test-script"],
            cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        if r.returncode != 0:
            problems.append(("pyflakes", r.stdout.rstrip()))
    steps = [s for s, skip in (("mypy", t["skipTypeCheck"]), ("pyflakes", t["skipLint"])) if not skip]
    return not problems, steps, problems


passed = failed = 0
results = {}
# The stand-in itself: mypy does not report errors in a stub it only imports.
r = subprocess.run(
    [os.path.join(venv, "bin", "mypy"), "--strict", "--python-version", python_version,
     "--config-file", config, "--cache-dir", os.path.join(work, "mypy-cache"), "-p", "test_driver"],
    cwd=work, env=dict(os.environ, MYPYPATH=stub_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    text=True,
)
if r.returncode == 0:
    passed += 1
    print("PASS  the driver's stand-in (tests/nixos/driver_stub/test_driver): mypy --strict")
else:
    failed += 1
    print("FAIL  the driver's stand-in (tests/nixos/driver_stub/test_driver): mypy --strict")
    for line in r.stdout.rstrip().splitlines():
        print(f"        mypy| {line}")
if not tests:
    print("no VM test among the flake's checks (none made by testers.runNixOSTest)")
    failed += 1
for name in sorted(tests):
    t = tests[name]
    ok, steps, problems = check(name, t, t["script"])
    results[name] = ok
    skipped = [s for s in ("mypy", "pyflakes") if s not in steps]
    what = " and ".join(steps) or "nothing"
    note = f" (skipped by the test: {', '.join(skipped)})" if skipped else ""
    if ok:
        passed += 1
        print(f"PASS  {name}: {what}{note}")
    else:
        failed += 1
        print(f"FAIL  {name}: {', '.join(s for s, _ in problems)}{note}")
        for step, out in problems:
            for line in out.splitlines():
                print(f"        {step}| {line}")

if self_test == "1":
    # Each fault in a copy of a test whose own script passed; the copy must fail, with it.
    base = next((n for n in sorted(tests) if results.get(n) and not tests[n]["skipTypeCheck"]
                 and not tests[n]["skipLint"]), None)
    if base is None:
        print("FAIL  self-test: no test passes both steps to plant faults into")
        failed += 1
    else:
        node = vm_names(tests[base])[0]
        plants = [
            ("a re.search() result used as a match (union-attr)", "mypy",
             'of "Match[str] | None" has no attribute "group" [union-attr]',
             'import re as planted_re\nplanted_kernel = planted_re.search(r"KERNEL=(\\S+)", "").group(1)\n'),
            ("a name no one defines (undefined name)", "pyflakes", "undefined name 'planted_undefined_name'",
             "print(planted_undefined_name)\n"),
            ("a Machine method called with a keyword it does not take (call-arg)", "mypy",
             'Unexpected keyword argument "timout" for "wait_for_unit"',
             f'{node}.wait_for_unit("multi-user.target", timout=60)\n'),
            ("a Machine method called with an argument of the wrong type (arg-type)", "mypy",
             '"wait_for_open_port" of "BaseMachine" has incompatible type "str"',
             f'{node}.wait_for_open_port("8931")\n'),
        ]
        for i, (what, step, expect, code) in enumerate(plants):
            script = tests[base]["script"].rstrip("\n") + "\n" + code
            ok, _, problems = check(f"self-test-{i}", tests[base], script)
            outs = dict(problems)
            # mypy --pretty wraps its messages: the report's words, one space between them.
            said = " ".join(outs.get(step, "").split())
            at = said.find(expect)
            if not ok and at >= 0:
                # The message, from its file:line to its [code] (mypy) or the next message.
                start = max(0, said.rfind("testScript:", 0, at), said.rfind("test-script:", 0, at))
                if step == "pyflakes":
                    end = said.find(" test-script:", at)
                else:  # to the error code: the expected text's own, or the next one
                    code = re.compile(r"\[[a-z-]+\]$" if expect.endswith("]") else r"\[[a-z-]+\]")
                    m = code.search(said[: at + len(expect)]) if expect.endswith("]") else code.search(said, at + len(expect))
                    end = m.end() if m else -1
                passed += 1
                print(f"PASS  self-test: {base} with {what} fails {step}: {said[start:end if end > 0 else None]}")
            else:
                failed += 1
                print(f"FAIL  self-test: {base} with {what} was not failed by {step} with {expect!r}")
                for s, out in problems:
                    for line in out.splitlines():
                        print(f"        {s}| {line}")

print(f"nixos-scripts: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
rc=0
"$venv/bin/python" "$work/check.py" "$work" "$work/flake/tests/nixos/driver_stub" "$venv" \
    "$NIXPKGS_PYTHON" "$self_test" || rc=$?
printf '(%ss)\n' "$((SECONDS - started))" >&2
exit "$rc"

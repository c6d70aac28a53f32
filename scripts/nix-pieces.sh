#!/usr/bin/env bash
# scripts/nix-pieces.sh BRIDGE [--flake DIR] | --preflight: what Nix runs inside the NixOS VM tests and on a
# NixOS or home-manager machine, run here on Debian against BRIDGE (the optimised binary) and real
# podman. Nothing of the flake can be built here (no binary cache, no nixpkgs), so every piece is
# taken from the offline evaluation (`nix eval` through the nix-offline wrapper, with the stand-in
# for nixpkgs; docs/nix.md, "What was checked") and run as written:
#
#   - the VM tests' probes (tests/nixos/, as tests/nixos/sandbox.nix renders them into the VM's
#     /etc): the control in a container on a dual-stack podman network, against the DNS responder
#     and the HTTP listener started as the VM's units start them, the responder being the
#     container's resolver; the sandbox probe through `mcp-code-bridge exec -f` under `container`
#     and `gvisor`, as root and rootless; and on an IPv4-only network, as podman's default network
#     is on NixOS, to show what its IPv6 checks prove there;
#   - the rootful gVisor sandbox's memory and pids cgroups, read on the host;
#   - the MCP client VM test (tests/nixos/mcp-client.nix): its script, run by a stand-in of the
#     test driver's `machine`, with tests/nixos/mcp_client.py (the Python SDK's client), against
#     its machine's config.toml;
#   - the config.toml of each example configuration (nixosConfigurations.example,
#     homeConfigurations.example, each with gVisor, the NixOS one with settings.token_file), built
#     by running the module's own build script (its sha256 line and its check with the bridge),
#     then read by `config` and `doctor`;
#   - the runsc wrapper and the containers.conf runtime registration the modules write, used by
#     podman as written (root: merged into the host's containers.conf as NixOS merges the option;
#     home-manager: the drop-in in the user's configuration directory);
#   - the systemd units: the image preload and `serve` of the NixOS module (with gVisor, also its
#     podman service, socket-activated), the home-manager user service, each run once with its
#     command line and environment (LoadCredential files in $CREDENTIALS_DIRECTORY, `%d`), and
#     `serve` answering run_python over HTTP.
#
# Each unit runs as systemd would start it (pieces.py run-unit): as its User=, Group= and
# SupplementaryGroups= (or DynamicUser=), through setpriv, with NoNewPrivileges=,
# CapabilityBoundingSet=, AmbientCapabilities= and UMask=; its StateDirectory/LogsDirectory owned by
# that user with their modes; its credentials read as root and handed to that user. The users and
# groups are made where this host lacks them as the configuration declares them (users.users,
# users.groups; a DynamicUser as a system user of the unit's name; `podman`, the group of
# podman.socket that nixpkgs' podman module declares) and kept for the next run; a unit naming a
# user the configuration does not declare fails, as systemd fails it. The rest of systemd's
# sandboxing (ProtectSystem, PrivateTmp, the syscall filter, ...) is not tried here.
#
# The "VM" is a network namespace of this script's own: loopback with the VM's addresses, and the
# podman networks this script creates (every packet stays there). Store paths become a local stand-in
# store: a package's bin/<program> is the host's program (BRIDGE for mcp-code-bridge), the image
# archive is the one scripts/setup-debian.sh built, and every file the modules render is written
# from its evaluated text. /var/lib, /run, /etc/mcp-code-bridge and the home directory the
# configurations name are mapped into a work directory. Deviations from the machines Nix builds
# for, each deliberate: no systemd here (the units run as above, sockets are opened by a script of
# this one's), runsc's platform is the one this host runs (a module option), and podman.socket is a
# podman service of this script's.
#
# Prints one line per check and ends with "nix-pieces: N passed, N failed"; exits non-zero on any
# failure. It sets up the nix-offline wrapper itself when it is missing (as .ci/run does), and
# leaves the wrapper's mounts as they are. It evaluates a clone of this checkout's HEAD (a flake
# sees only what git tracks), or of the git checkout given with --flake. It makes a user of its
# own, mcb-nixpieces, for the rootless runs, and keeps it (and that user's podman storage, with the
# image) for the next run. The MCP client test needs the test venv's Python with the SDK
# (MCP_BRIDGE_TEST_SERVERS_BIN of setup.env: scripts/setup-debian.sh --test-deps).
# NIX_PIECES_KEEP_LOGS=DIR keeps each check's full output there.
set -euo pipefail

die() { printf 'nix-pieces: error: %s\n' "$*" >&2; exit 2; }

repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
# The flake is evaluated offline from its pinned inputs (nixpkgs' lib, home-manager): the
# nix-offline wrapper, or the directory to set it up from.
nix_offline_dir="${NIX_OFFLINE_DIR:-$repo/../shared/nix-offline}"
need_nix_offline() {
    command -v nix-offline >/dev/null || [[ -d "$nix_offline_dir/inputs" ]] \
        || die "nix-offline is not set up and $nix_offline_dir has no inputs: the flake is evaluated offline from its pinned inputs; set NIX_OFFLINE_DIR to their nix-offline directory (default: ../shared/nix-offline beside the checkout)"
}
# --preflight: only whether the run could start (scripts/test.sh asks before its suites, so a
# missing piece fails the test command in its first minute, not after the suites).
if [[ "${1:-}" == --preflight ]]; then
    need_nix_offline
    printf 'nix-pieces: preflight ok (nix-offline %s)\n' \
        "$(command -v nix-offline >/dev/null && echo "set up" || echo "from $nix_offline_dir")"
    exit 0
fi
[[ $# -ge 1 ]] || die "usage: scripts/nix-pieces.sh BRIDGE [--flake DIR] | --preflight"
bridge=$(realpath -- "$1"); shift
flake_src=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --flake) [[ $# -ge 2 ]] || die "--flake needs a directory"; flake_src=$(realpath -- "$2"); shift 2 ;;
        *) die "unknown argument: $1" ;;
    esac
done
[[ $(id -u) -eq 0 ]] || die "run as root (podman networks, a network namespace, a test user)"
[[ -x "$bridge" ]] || die "$bridge is not an executable"
for tool in podman ip nsenter setpriv python3 git runsc useradd groupadd; do
    command -v "$tool" >/dev/null || die "$tool is not installed (scripts/setup-debian.sh --test-deps)"
done
# Debian's python3 (the test user and `nobody` run it too): 3.11 or later, for tomllib.
py=/usr/bin/python3
[[ -x $py ]] || py=$(command -v python3)
"$py" -c 'import sys, tomllib' 2>/dev/null || die "python3 >= 3.11 is needed (tomllib)"
cache_dir="${MCP_CODE_BRIDGE_CACHE_DIR:-/var/cache/mcp-code-bridge}"
[[ -f "$cache_dir/setup.env" ]] || die "no $cache_dir/setup.env: run scripts/setup-debian.sh first"
MCP_BRIDGE_IMAGE_ARCHIVE=""
# shellcheck disable=SC1091
. "$cache_dir/setup.env"
[[ -s "$MCP_BRIDGE_IMAGE_ARCHIVE" ]] || die "no image archive (MCP_BRIDGE_IMAGE_ARCHIVE in $cache_dir/setup.env)"
archive=$MCP_BRIDGE_IMAGE_ARCHIVE
system=$(uname -m)-linux
started=$SECONDS

work=$(mktemp -d /tmp/nix-pieces.XXXXXX)
chmod 755 "$work"
id=${work##*.}
id=${id,,}
ns="nixpieces-$id"
net6="nixpieces-$id-dual"
net4="nixpieces-$id-v4"
user=mcb-nixpieces
mkdir -p "$work/logs" "$work/store" "$work/bin"
: > "$work/pids"
# Each bridge run here, as the `pid:starttime` its containers carry as owner (a parked sandbox
# outlives its bridge, to be taken by the next one): the clean-up removes those.
: > "$work/bridges"
chmod 666 "$work/bridges"
printf '#!/bin/sh
echo "$$:$(cut -d" " -f22 /proc/$$/stat)" >> %q
exec %q "$@"
' "$work/bridges" "$bridge" \
    > "$work/bin/mcp-code-bridge"
chmod 755 "$work/bin/mcp-code-bridge"
real_bridge=$bridge
bridge=$work/bin/mcp-code-bridge
tagged=()

# ------------------------------------------------------------------------------------ clean-up
# Only what this script made: its processes (by pid, then any process left whose command line
# names the work directory, such as a bridge's lingering podman service, and the test user's), its
# containers, networks, namespace, image tag and files.
# remove_owned PODMAN...: the containers of the bridges run here, in that podman's storage.
remove_owned() {
    "$@" ps -a --filter label=io.mcp-code-bridge.managed --format json 2>/dev/null | "$py" -c '
import json, sys
ours = set(open(sys.argv[1]).read().split())
for c in json.load(sys.stdin) or []:
    if (c.get("Labels") or {}).get("io.mcp-code-bridge.owner") in ours:
        print(c["Id"])' "$work/bridges" | xargs -r "$@" rm -f >/dev/null 2>&1
}
cleanup() {
    local pid
    set +e
    while read -r pid; do kill -TERM "$pid" 2>/dev/null; done < "$work/pids"
    sleep 1
    while read -r pid; do kill -KILL "$pid" 2>/dev/null; done < "$work/pids"
    for pid in $(grep -lsF -- "$work" /proc/[0-9]*/cmdline | cut -d/ -f3); do
        [[ "$pid" != "$$" ]] && kill -TERM "$pid" 2>/dev/null
    done
    remove_owned podman
    if id -u "$user" >/dev/null 2>&1; then
        remove_owned setpriv --reuid="$user" --regid="$user" --init-groups env -i HOME="$(getent passwd "$user" | cut -d: -f6)" \
            PATH=/usr/bin:/bin XDG_RUNTIME_DIR="/run/user/$(id -u "$user")" podman
        for pid in $(ps -o pid= -u "$user"); do kill -TERM "$pid" 2>/dev/null; done
        rm -rf -- "$(getent passwd "$user" | cut -d: -f6)/.config"
    fi
    podman ps -aq --filter "name=^nixpieces-$id-" | xargs -r podman rm -f >/dev/null 2>&1
    podman network rm -f "$net6" "$net4" >/dev/null 2>&1
    ip netns del "$ns" 2>/dev/null
    for t in ${tagged[@]+"${tagged[@]}"}; do podman rmi "$t" >/dev/null 2>&1; done
    if [[ -n "${NIX_PIECES_KEEP_LOGS:-}" ]]; then
        cp -r "$work/logs" "$NIX_PIECES_KEEP_LOGS" && echo "logs kept in $NIX_PIECES_KEEP_LOGS" >&2
    fi
    rm -rf -- "$work"
}
trap cleanup EXIT

# ------------------------------------------------------------------------------------ checks
pass=0
fail=0
n=0
# check NAME FUNCTION [ARGS...]: runs the function in a subshell with errexit, its output in a log
# shown on failure.
check() {
    local name=$1 rc=0 t0=$SECONDS
    shift
    n=$((n + 1))
    local log="$work/logs/$n.log"
    ( "$@" ) > "$log" 2>&1 < /dev/null &
    local child=$! deadline=$((SECONDS + 600))
    # At most 10 minutes: then the check's processes (its children, by their parent) are ended.
    while kill -0 "$child" 2>/dev/null && [[ $SECONDS -lt $deadline ]]; do sleep 0.2; done
    if kill -0 "$child" 2>/dev/null; then
        echo "(timed out after 600 s)" >> "$log"
        pkill -TERM -P "$child" 2>/dev/null || true
        kill -TERM "$child" 2>/dev/null || true
    fi
    wait "$child" || rc=$?
    if [[ $rc -eq 0 ]]; then
        pass=$((pass + 1))
        printf 'PASS %4ss  %s\n' "$((SECONDS - t0))" "$name"
    else
        fail=$((fail + 1))
        printf 'FAIL %4ss  %s\n' "$((SECONDS - t0))" "$name"
        tail -n 30 "$log" | sed 's/^/        /'
    fi
}
# A process in the background, ended by the clean-up.
background() {
    local log=$1
    shift
    "$@" > "$log" 2>&1 < /dev/null &
    echo $! >> "$work/pids"
}
# serving PID PORT: `listening` on 127.0.0.1:PORT in the VM, or exits 2 when PID has exited.
serving() {
    local deadline=$((SECONDS + 60))
    until listening 127.0.0.1 "$2" >/dev/null 2>&1; do
        kill -0 "$1" 2>/dev/null || { echo "the service exited before it listened"; return 2; }
        [[ $SECONDS -lt $deadline ]] || { echo "the service did not listen within 60 s"; return 1; }
        sleep 0.2
    done
}
# wait_for TIMEOUT COMMAND...: until it succeeds.
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        [[ $SECONDS -lt $deadline ]] || return 1
        sleep 0.2
    done
}
has() { grep -qF -- "$1" "$2" || { echo "expected \"$1\" in $2:"; cat "$2"; return 1; }; }
hasnt() { ! grep -qF -- "$1" "$2" || { echo "did not expect \"$1\" in $2:"; cat "$2"; return 1; }; }

# ------------------------------------------------------------------------------------ helpers
cat > "$work/pieces.py" <<'PY'
"""Helpers of scripts/nix-pieces.sh (one subcommand each)."""
import contextlib
import glob
import grp
import json
import os
import pwd
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request

HOST_PATH = "/usr/local/bin:/usr/bin:/bin"
# A store path's name: Nix's own characters for it.
NAME = r"[a-z0-9]{32}-[A-Za-z0-9+._?=-]+"
STORE_REF = re.compile(r"/nix/store/(" + NAME + r")(/bin/([A-Za-z0-9._+-]+))?")


def toml_key(k):
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON's escapes are TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise SystemExit(f"no TOML for {v!r}")


def toml_dump(d, prefix=()):
    """JSON -> TOML as json2toml (remarshal, what nixpkgs' formats.toml runs) lays it out:
    a table's keys, then its sub-tables."""
    out = []
    for k, v in d.items():
        if not isinstance(v, dict):
            out.append(f"{toml_key(k)} = {toml_value(v)}")
    for k, v in d.items():
        if isinstance(v, dict):
            path = prefix + (k,)
            out.append("")
            out.append("[" + ".".join(toml_key(p) for p in path) + "]")
            out.extend(toml_dump(v, path))
    return out


def write_toml(data, path):
    text = "\n".join(toml_dump(data)).lstrip("\n") + "\n"
    if tomllib.loads(text) != data:
        raise SystemExit(f"TOML rendering of {path} does not read back as its JSON")
    with open(path, "w") as f:
        f.write(text)


def merge(a, b):
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            merge(a[k], v)
        else:
            a[k] = v
    return a


def cmd_toml(src, dst):
    """A JSON file (a settings value, `formats.toml`'s input) as TOML."""
    write_toml(json.load(open(src)), dst)


def cmd_conf(dst, module_json):
    """containers.conf as podman reads it here (its defaults, the system's file and drop-ins, in
    order) with the module's settings merged in, as NixOS merges
    virtualisation.containers.containersConf.settings into /etc/containers/containers.conf."""
    conf = {}
    files = ["/usr/share/containers/containers.conf", "/etc/containers/containers.conf"]
    files += sorted(glob.glob("/etc/containers/containers.conf.d/*.conf"))
    for f in files:
        if os.path.exists(f):
            merge(conf, tomllib.load(open(f, "rb")))
    merge(conf, json.load(open(module_json)))
    write_toml(conf, dst)


def cmd_get(path, key):
    """A value of a JSON file by its dotted key ("a.b.c"; a key with dots in [brackets])."""
    v = json.load(open(path))
    for part in re.findall(r"\[([^\]]*)\]|([^.\[\]]+)", key):
        v = v[part[0] or part[1]]
    print(v if isinstance(v, str) else json.dumps(v))


def cmd_stage(store, bridge, *files):
    """Every /nix/store/<path>/bin/<program> the files name, as the host's program in the local
    store (mcp-code-bridge: the bridge under test); prints those it cannot give."""
    missing = []
    for f in files:
        for m in STORE_REF.finditer(open(f).read()):
            prog = m.group(3)
            if not prog:
                continue
            dst = os.path.join(store, m.group(1), "bin", prog)
            if os.path.lexists(dst):
                continue
            target = bridge if prog == "mcp-code-bridge" else shutil.which(prog, path=HOST_PATH)
            if target is None:
                missing.append(m.group(0))
                continue
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(target, dst)
    for m in missing:
        print(f"no program on this host for {m}")


def cmd_unstaged(store, *files):
    """Store paths left in the files, and paths of the local store they name that it lacks."""
    local = re.compile(re.escape(store.rstrip("/")) + "/(" + NAME + ")")
    bad = set()
    for f in files:
        text = open(f).read()
        bad |= {f"/nix/store/{m.group(1)} (not mapped)" for m in STORE_REF.finditer(text)}
        bad |= {f"{m.group(0)} (missing)" for m in local.finditer(text)
                if not os.path.lexists(os.path.join(store, m.group(1)))}
    for b in sorted(bad):
        print(b)
    sys.exit(1 if bad else 0)


def cmd_localize_str(text):
    print(localize(text))


def localize(text):
    """Paths of the machine Nix builds for -> this script's stand-ins (PIECES_MAP: from\\tto
    lines; the longest prefix first)."""
    pairs = [l.split("\t") for l in os.environ["PIECES_MAP"].splitlines() if l]
    for a, b in sorted(pairs, key=lambda p: -len(p[0])):
        text = text.replace(a, b)
    return text


def cmd_localize(src, dst):
    with open(dst, "w") as f:
        f.write(localize(open(src).read()))


def cmd_write_script(text_json, key, dst):
    """A script the modules render (writeShellScript: its text), with the shebang
    writeShellScript gives it (runtimeShell, bash)."""
    v = json.load(open(text_json))
    for part in key.split("."):
        v = v[part]
    text = localize(v)
    if not text.startswith("#!"):
        text = "#!/bin/bash\n" + text
    with open(dst, "w") as f:
        f.write(text)
    os.chmod(dst, 0o755)


# Users and groups NixOS always has (nixos/modules/config/users-groups.nix: ids.uids/gids).
BASE_USERS = {"root", "nobody"}
BASE_GROUPS = {"root", "nogroup", "wheel", "users"}


def group_exists(name):
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def user_exists(name):
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def run(*argv):
    print("+", " ".join(argv), file=sys.stderr, flush=True)
    subprocess.run(argv, check=True)


def ensure_group(name, declared, standins, why):
    """A group a unit names: here already, or made as the configuration declares it
    (users.groups.<name>; `standins`: the groups that NixOS modules outside this project declare,
    such as nixpkgs' podman module's `podman`)."""
    if group_exists(name):
        return
    if name in declared or name in standins:
        gid = (declared.get(name) or {}).get("gid")
        run("groupadd", "--system", *(["--gid", str(gid)] if gid is not None else []), name)
        return
    raise SystemExit(f"{why}: group {name!r} is declared nowhere in the configuration (users.groups) "
                     "and NixOS has no such group: systemd would fail to start the unit (216/GROUP)")


def ensure_user(name, users, groups, standins, dynamic):
    """The unit's user: here already, or made as the configuration declares it
    (users.users.<name>: isSystemUser, group, home, extraGroups, description), or a DynamicUser
    (a system user with a group of its name, as systemd allocates it)."""
    if user_exists(name):
        return
    if dynamic:
        if not group_exists(name):
            run("groupadd", "--system", name)
        run("useradd", "--system", "--gid", name, "--no-create-home", "--home-dir", "/",
            "--shell", "/usr/sbin/nologin", "--comment", "DynamicUser of a unit (nix-pieces)", name)
        return
    decl = users.get(name)
    if decl is None:
        raise SystemExit(f"User={name}: the configuration declares no such user (users.users.{name}) and "
                         "NixOS has none by default: systemd would fail to start the unit (217/USER)")
    group = decl.get("group") or "nogroup"
    ensure_group(group, groups, standins, f"users.users.{name}.group")
    extra = decl.get("extraGroups") or []
    for g in extra:
        ensure_group(g, groups, standins, f"users.users.{name}.extraGroups")
    if not decl.get("isSystemUser") and not decl.get("isNormalUser"):
        raise SystemExit(f"users.users.{name}: neither isSystemUser nor isNormalUser (NixOS refuses it)")
    args = ["useradd", "--gid", group, "--no-create-home",
            "--home-dir", decl.get("home") or "/var/empty", "--shell", "/usr/sbin/nologin",
            "--comment", decl.get("description") or ""]
    if decl.get("isSystemUser"):
        args.append("--system")
    if decl.get("uid") is not None:
        args += ["--uid", str(decl["uid"])]
    if extra:
        args += ["--groups", ",".join(extra)]
    run(*args, name)


def cmd_accounts(users_json, *args):
    """The users and groups the units and sockets of UNITS_JSON files name (User=, Group=,
    SupplementaryGroups=, DynamicUser=, SocketUser=, SocketGroup=), made as USERS_JSON (the
    configuration's evaluated users.users and users.groups) declares them where this host lacks
    them; prints each with its ids. --standin-group NAME: a group another NixOS module declares."""
    u = json.load(open(users_json))
    users, groups = u.get("users") or {}, u.get("groups") or {}
    standins, files = set(), []
    it = iter(args)
    for a in it:
        if a == "--standin-group":
            standins.add(next(it))
        else:
            files.append(a)
    for f in files:
        for unit_name, unit in json.load(open(f)).items():
            c = unit.get("serviceConfig") or unit.get("socketConfig") or {}
            dynamic = bool(c.get("DynamicUser"))
            user = c.get("User") or c.get("SocketUser") or (unit_name if dynamic else None)
            if user and user not in BASE_USERS:
                ensure_user(user, users, groups, standins, dynamic)
            sup = c.get("SupplementaryGroups") or []
            for g in [c.get("Group"), c.get("SocketGroup")] + (sup.split() if isinstance(sup, str) else sup):
                if g and g not in BASE_GROUPS:
                    ensure_group(g, groups, standins, f"{unit_name}: {g}")
            if user:
                pw = pwd.getpwnam(user)
                names = [grp.getgrgid(g).gr_name for g in os.getgrouplist(user, pw.pw_gid)]
                print(f"{unit_name}: user {user} uid {pw.pw_uid} gid {pw.pw_gid} groups {','.join(names)}"
                      f" home {pw.pw_dir}")


def cmd_process_as(pid, unit_json, key):
    """Whether process PID runs as the unit says, by its /proc/PID/status: Uid, Gid, Groups
    (User=, Group=, the user's own groups and SupplementaryGroups=), Umask (UMask=), NoNewPrivs,
    CapBnd and CapAmb (CapabilityBoundingSet=, AmbientCapabilities=)."""
    unit = json.load(open(unit_json))
    for part in filter(None, key.split(".")):
        unit = unit[part]
    service = unit.get("serviceConfig", unit.get("Service", {}))
    status = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status").read().splitlines() if ":" in l)
    status = {k: v.strip() for k, v in status.items()}
    print("\n".join(f"{k}: {status.get(k)}" for k in
                    ("Name", "Uid", "Gid", "Groups", "Umask", "NoNewPrivs", "CapBnd", "CapAmb")))
    wrong = []
    user = service.get("User") or (key if service.get("DynamicUser") else "root")
    pw = pwd.getpwnam(user)
    gid = grp.getgrnam(service["Group"]).gr_gid if service.get("Group") else pw.pw_gid
    if status["Uid"].split() != [str(pw.pw_uid)] * 4:
        wrong.append(f"Uid {status['Uid']}, not {user}'s {pw.pw_uid}")
    if status["Gid"].split() != [str(gid)] * 4:
        wrong.append(f"Gid {status['Gid']}, not {gid}")
    sup = service.get("SupplementaryGroups") or []
    want = {grp.getgrnam(g).gr_gid for g in (sup.split() if isinstance(sup, str) else sup)}
    if not service.get("DynamicUser"):
        want |= set(os.getgrouplist(user, gid))
    got = {int(g) for g in status["Groups"].split()}
    if got - {gid} != want - {gid}:
        wrong.append(f"Groups {sorted(got)}, not {sorted(want)}")
    if service.get("UMask") is not None and int(status["Umask"], 8) != int(str(service["UMask"]), 8):
        wrong.append(f"Umask {status['Umask']}, not {service['UMask']}")
    if service.get("NoNewPrivileges") and status["NoNewPrivs"] != "1":
        wrong.append("NoNewPrivs is not set")
    bounding = service.get("CapabilityBoundingSet")
    if bounding == "" and int(status["CapBnd"], 16) != 0:
        wrong.append(f"CapBnd {status['CapBnd']}, not empty")
    if not service.get("AmbientCapabilities") and int(status["CapAmb"], 16) != 0:
        wrong.append(f"CapAmb {status['CapAmb']}, not empty")
    for w in wrong:
        print("wrong:", w)
    sys.exit(1 if wrong else 0)


def cmd_host_cgroup(pid, controller, v1, v2):
    """The value of a cgroup file of the cgroup host process PID is in, as the host's kernel has it
    (cgroup v1: the controller's hierarchy; v2: the unified one), as tests/e2e read it."""
    unified = found = None
    for line in open(f"/proc/{pid}/cgroup").read().splitlines():
        _, ctrls, path = line.split(":", 2)
        if not ctrls:
            unified = f"/sys/fs/cgroup{path}/{v2}"
        elif controller in ctrls.split(","):
            found = f"/sys/fs/cgroup/{ctrls}{path}/{v1}"
            break
    path = found or unified
    if path is None or not os.path.exists(path):
        raise SystemExit(f"no {controller} cgroup file for {pid}: {path}")
    print(f"{path} = {open(path).read().strip()}", file=sys.stderr)
    print(open(path).read().strip())


def cmd_size_bytes(size):
    """A size as the bridge's config reads it ("1g", "512m", "768m", a number of bytes)."""
    m = re.fullmatch(r"([0-9]+)([kmg]?)b?", str(size).strip().lower())
    if not m:
        raise SystemExit(f"not a size: {size}")
    print(int(m.group(1)) * 1024 ** " kmg".index(m.group(2) or " "))


class Machine:
    """nixpkgs' test driver's Machine, as far as a VM test's script uses it, on this host: a
    command runs with bash as root, its paths mapped (PIECES_MAP), in ENV."""

    def __init__(self, env, units):
        self.env, self.units = env, units

    def _run(self, cmd):
        local = localize(cmd)
        print(f"$ {local}", flush=True)
        p = subprocess.run(["bash", "-c", local], env=self.env, stdout=subprocess.PIPE, timeout=900)
        return p.returncode, p.stdout.decode()

    def succeed(self, *cmds):
        out = ""
        for c in cmds:
            rc, o = self._run(c)
            out += o
            if rc != 0:
                print(o)
                raise SystemExit(f"command failed (exit {rc}): {c}")
        return out

    def fail(self, *cmds):
        out = ""
        for c in cmds:
            rc, o = self._run(c)
            out += o
            if rc == 0:
                print(o)
                raise SystemExit(f"command succeeded unexpectedly: {c}")
        return out

    def execute(self, cmd):
        return self._run(cmd)

    def wait_for_unit(self, unit, *_):
        # The units this script ran (and the targets a booted machine has reached).
        if unit not in self.units:
            raise SystemExit(f"the test waits for {unit}, which is not run here")
        print(f"(unit {unit}: run here)", flush=True)


def cmd_vm_script(script_file, *opts):
    """A VM test's script (Python, as nixpkgs' test driver runs it) against this host as its one
    machine (`machine`): `succeed`/`fail`/`execute` run commands (Machine), `wait_for_unit` passes
    for the units given with --unit, `subtest` names a step. --env K=V: the commands'
    environment (nothing else of this process's is passed)."""
    env, units = {}, set()
    it = iter(opts)
    for o in it:
        if o == "--env":
            k, v = next(it).split("=", 1)
            env[k] = v
        elif o == "--unit":
            units.add(next(it))
    machine = Machine(env, units)

    @contextlib.contextmanager
    def subtest(name):
        print(f"subtest: {name}", flush=True)
        yield

    code = compile(open(script_file).read(), "testScript", "exec")
    exec(code, {"machine": machine, "subtest": subtest, "__name__": "testScript"})
    print("the test script passed")


def cmd_vm_config(drvs_json, node_json, prefix):
    """The config.toml of a VM test's machine, from the derivations of its evaluation
    (`nix derivation show -r` of the machine): its build script (PREFIX.build.sh), the settings it
    renders (PREFIX.settings.json, the input `mcp-code-bridge-settings.toml`'s JSON value); prints
    that rendering's store path, then the file's."""
    drvs = json.load(open(drvs_json))
    drvs = drvs.get("derivations", drvs)
    source = json.load(open(node_json))["environment"]["etc"]["mcp-code-bridge/config.toml"]["source"]
    base = lambda p: p.rsplit("/", 1)[-1]
    config = [d for d in drvs.values() if base(d["outputs"]["out"]["path"]) == base(source)]
    if len(config) != 1:
        raise SystemExit(f"no derivation of {source} among the machine's")
    config = config[0]
    with open(prefix + ".build.sh", "w") as f:
        f.write(config["env"].get("buildCommand") or config["env"]["cmd"])
    inputs = config.get("inputs", {}).get("drvs") or config.get("inputDrvs") or {}
    generated = [drvs[base(i)] for i in inputs if base(i) in drvs and drvs[base(i)]["name"] == "mcp-code-bridge-settings.toml"]
    if len(generated) != 1:
        raise SystemExit(f"no settings rendering among the inputs of {source}")
    with open(prefix + ".settings.json", "w") as f:
        f.write(generated[0]["env"]["value"])
    print("/nix/store/" + base(generated[0]["outputs"]["out"]["path"]))
    print(source)


def cmd_stage_test(store, tests_dir, client_python, *files):
    """A VM test's own files in the local store: a store path named after a file of TESTS_DIR
    (`./mcp_client.py`) is that file; the bin/python3 of a Python environment
    (python3.withPackages, the test's client) is CLIENT_PYTHON."""
    for f in files:
        for m in re.finditer(r"/nix/store/(" + NAME + r")", open(f).read()):
            name = m.group(1)
            dst = os.path.join(store, name)
            if os.path.lexists(dst):
                continue
            own = os.path.join(tests_dir, name[33:])
            if os.path.isfile(own):
                os.symlink(own, dst)
            elif re.fullmatch(r"python3-[0-9.]+-env", name[33:]):
                os.makedirs(os.path.join(dst, "bin"))
                os.symlink(client_python, os.path.join(dst, "bin", "python3"))


def cap_name(c):
    return c.lower().removeprefix("cap_")


def cmd_run_unit(unit_json, key, *opts):
    """Exec a systemd unit's ExecStart as systemd would: its Environment; `%d` and
    $CREDENTIALS_DIRECTORY the credentials directory, which gets a copy of each LoadCredential
    file (read here as root, as systemd reads it), owned by the unit's user, 0400 in a 0500
    directory; StateDirectory/LogsDirectory made and owned by the unit's user with their modes;
    UMask; and the process run as the unit's User=/Group=/SupplementaryGroups= (with the user's
    own groups, as systemd's initgroups), or DynamicUser=, with NoNewPrivileges=,
    CapabilityBoundingSet= and AmbientCapabilities= (setpriv). The users and groups the unit names
    are made here as the configuration declares them (--users: its evaluated `users`).
    Options: --creds DIR, --path DIR (systemd's PATH of the unit besides the unit's `path`),
    --env K=V (added), --args "A B" (the unit's program with these arguments instead of its
    own: another subcommand in the unit's environment), --users FILE, --standin-group NAME
    (a group another NixOS module declares), --name UNIT (a unit's name, for DynamicUser)."""
    unit = json.load(open(unit_json))
    for part in filter(None, key.split(".")):
        unit = unit[part]
    creds, base_path, extra, instead = None, "/usr/bin:/bin", {}, None
    users_decl, groups_decl, standins, name = {}, {}, set(), key
    it = iter(opts)
    for o in it:
        if o == "--creds":
            creds = next(it)
        elif o == "--path":
            base_path = next(it)
        elif o == "--env":
            k, v = next(it).split("=", 1)
            extra[k] = v
        elif o == "--args":
            instead = shlex.split(next(it))
        elif o == "--users":
            u = json.load(open(next(it)))
            users_decl, groups_decl = u.get("users") or {}, u.get("groups") or {}
        elif o == "--standin-group":
            standins.add(next(it))
        elif o == "--name":
            name = next(it)
        else:
            raise SystemExit(f"run-unit: unknown option {o}")
    service = unit.get("serviceConfig", unit.get("Service", {}))

    # Who runs it. No User= (and no DynamicUser=): whoever runs this (root, or the user of a user
    # manager's unit).
    dynamic = bool(service.get("DynamicUser"))
    user = service.get("User") or (name if dynamic else None)
    uid = gid = None
    groups = []
    if user is not None and user != "root" or service.get("Group"):
        user = user or "root"
        if user not in BASE_USERS:
            ensure_user(user, users_decl, groups_decl, standins, dynamic)
        pw = pwd.getpwnam(user)
        uid = pw.pw_uid
        group = service.get("Group")
        if group:
            if group not in BASE_GROUPS:
                ensure_group(group, groups_decl, standins, f"Group={group}")
            gid = grp.getgrnam(group).gr_gid
        else:
            gid = pw.pw_gid
        sup = service.get("SupplementaryGroups") or []
        sup = sup.split() if isinstance(sup, str) else sup
        for g in sup:
            if g not in BASE_GROUPS:
                ensure_group(g, groups_decl, standins, f"SupplementaryGroups={g}")
        # systemd: the user's groups from the database (initgroups), except for a dynamic user,
        # and SupplementaryGroups= on top.
        groups = [] if dynamic else [g for g in os.getgrouplist(user, gid) if g != gid]
        groups += [grp.getgrnam(g).gr_gid for g in sup]
        groups = list(dict.fromkeys(groups))

    env = {}
    # The unit's `path` packages: their bin/<name> is the host's program of that name.
    paths = []
    for p in unit.get("path", []):
        local = localize(p)
        prog = re.sub(r"^[a-z0-9]{32}-", "", os.path.basename(p))
        prog = re.sub(r"-[0-9][^-]*$", "", prog)
        dst = os.path.join(local, "bin", prog)
        if not os.path.lexists(dst) and shutil.which(prog, path=HOST_PATH):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(shutil.which(prog, path=HOST_PATH), dst)
        paths.append(local + "/bin")
    env["PATH"] = ":".join(paths + [base_path])
    for k, v in unit.get("environment", {}).items():
        env[k] = localize(v)
    for kv in service.get("Environment", []):  # home-manager's units: KEY=VALUE strings
        k, v = kv.split("=", 1)
        env[k] = localize(v)
    # StateDirectory, LogsDirectory: made by systemd before the start, owned by the unit's user,
    # with their modes (0755 unless the unit says).
    for kind, base in (("StateDirectory", "/var/lib/"), ("LogsDirectory", "/var/log/")):
        dirs = service.get(kind, [])
        mode = int(str(service.get(kind + "Mode", "0755")), 8)
        for d in [dirs] if isinstance(dirs, str) else dirs:
            path = localize(base + d)
            os.makedirs(path, exist_ok=True)
            if uid is not None:
                os.chown(path, uid, gid)
            os.chmod(path, mode)
            print(f"{kind}: {path} {oct(mode)} {uid if uid is not None else os.getuid()}:{gid if gid is not None else os.getgid()}",
                  file=sys.stderr)
    loads = service.get("LoadCredential", [])
    if loads:
        os.makedirs(creds, mode=0o700, exist_ok=True)
        for entry in loads:
            cred, src = entry.split(":", 1)
            dst = os.path.join(creds, cred)
            shutil.copyfile(localize(src), dst)
            os.chmod(dst, 0o400)
            if uid is not None:
                os.chown(dst, uid, gid)
        os.chmod(creds, 0o500)
        if uid is not None:
            os.chown(creds, uid, gid)
        env["CREDENTIALS_DIRECTORY"] = creds
    for k, v in list(env.items()):
        if creds:
            env[k] = v.replace("%d", creds)
    env.update(extra)
    # A socket unit's service gets its sockets (systemd's LISTEN_* variables).
    for k in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        if k in os.environ:
            env[k] = os.environ[k]
    start = service["ExecStart"]
    start = start[0] if isinstance(start, list) else start
    argv = shlex.split(localize(start).replace("%d", creds or "%d"))
    if instead is not None:
        argv = argv[:1] + instead
    # setpriv: the identity, then what it can do.
    priv = []
    if uid is not None:
        priv += [f"--reuid={uid}", f"--regid={gid}"]
        priv += [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    if service.get("NoNewPrivileges"):
        priv.append("--no-new-privs")
    bounding = service.get("CapabilityBoundingSet")
    if bounding is not None:
        caps = [bounding] if isinstance(bounding, str) else bounding
        caps = [c for c in " ".join(caps).split() if c]
        if any(c.startswith("~") for c in caps):
            raise SystemExit(f"CapabilityBoundingSet={bounding}: an inverted set is not run here")
        priv.append("--bounding-set=" + ",".join(["-all"] + [f"+{cap_name(c)}" for c in caps]))
    ambient = service.get("AmbientCapabilities") or []
    ambient = ambient.split() if isinstance(ambient, str) else ambient
    if ambient:
        caps = ",".join(f"+{cap_name(c)}" for c in ambient)
        priv += [f"--inh-caps={caps}", f"--ambient-caps={caps}"]
    if priv:
        argv = ["setpriv", *priv, "--", *argv]
    # UMask=, else systemd's default.
    umask = str(service.get("UMask", "0022"))
    os.umask(int(umask, 8))
    print("unit:", " ".join(argv), file=sys.stderr)
    print("umask:", umask, file=sys.stderr)
    print("environment:", " ".join(f"{k}={v}" for k, v in sorted(env.items())), file=sys.stderr, flush=True)
    env_path = env["PATH"] + ":" + HOST_PATH
    os.execvpe(shutil.which(argv[0], path=env_path) or argv[0], argv, env)


def cmd_activate(sock_path, mode, group, dir_mode, *argv):
    """A socket unit: listen on SOCK_PATH (SocketMode, SocketGroup; its directory made with
    DirectoryMode), start the service (LISTEN_FDS=1, fd 3) at the first connection, and again at
    the next one after it exits, as systemd does."""
    if not os.path.isdir(os.path.dirname(sock_path)):
        os.makedirs(os.path.dirname(sock_path))
        os.chmod(os.path.dirname(sock_path), int(dir_mode or "0755", 8))
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sock_path)
    os.chmod(sock_path, int(mode, 8))
    if group:
        shutil.chown(sock_path, group=group)
    s.listen(128)
    child = None

    def stop(*_):
        if child:
            os.kill(child, signal.SIGTERM)
            os.waitpid(child, 0)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    argv = list(argv[1:] if argv and argv[0] == "--" else argv)
    while True:
        select.select([s], [], [])
        child = os.fork()
        if child == 0:
            os.dup2(s.fileno(), 3)
            os.set_inheritable(3, True)
            env = dict(os.environ, LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
            os.execvpe(argv[0], argv, env)
        print(f"started {argv[0]} (pid {child})", flush=True)
        os.waitpid(child, 0)
        print("it exited", flush=True)
        child = None


def rpc(url, body, token=None, session=None):
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    if session:
        headers["mcp-session-id"] = session
        headers["mcp-protocol-version"] = "2025-11-25"
    req = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def messages(text):
    """The JSON-RPC messages of a reply: JSON, or server-sent events."""
    text = text.strip()
    if text.startswith("{"):
        return [json.loads(text)]
    return [json.loads(l[5:]) for l in text.splitlines() if l.startswith("data:") and l[5:].strip()]


def cmd_mcp(url, token, code):
    """run_python over MCP at URL (initialize, initialized, tools/call); prints the result's
    text; an HTTP status other than 200 is printed as `HTTP <status>` and exits 3."""
    token = token or None
    status, headers, body = rpc(url, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "nix-pieces", "version": "1"}}}, token)
    if status != 200:
        print(f"HTTP {status}", body)
        sys.exit(3)
    session = headers.get("mcp-session-id")
    rpc(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, token, session)
    status, _, body = rpc(url, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "run_python", "arguments": {"code": code, "timeout": 120}}}, token, session)
    if status != 200:
        print(f"HTTP {status}", body)
        sys.exit(3)
    for m in messages(body):
        if m.get("id") == 2:
            result = m.get("result", {})
            print("\n".join(c.get("text", "") for c in result.get("content", [])))
            if result.get("isError"):
                print("(isError)")
                sys.exit(4)
            return
    print(body)
    sys.exit(5)


if __name__ == "__main__":
    globals()["cmd_" + sys.argv[1].replace("-", "_")](*sys.argv[2:])
PY
pieces() { "$py" "$work/pieces.py" "$@"; }

# ------------------------------------------------------------------------------------ nix-offline
need_nix_offline
if ! command -v nix-offline >/dev/null; then
    printf 'setting up the nix-offline wrapper (%s)\n' "$nix_offline_dir"
    # As .ci/run does: writable copies of the pinned inputs, with the refs/ that git needs.
    inputs=$(mktemp -d)
    cp -a "$nix_offline_dir/inputs/." "$inputs/"
    chmod -R u+w "$inputs"
    for g in "$inputs"/*.git; do mkdir -p "$g/refs/heads" "$g/refs/tags"; done
    bash "$nix_offline_dir/setup-offline-nix.sh" --home-manager "$inputs/home-manager.git" \
        --nixpkgs-lib "$inputs/nixpkgs.lib.git" > "$work/logs/setup-offline-nix.log" 2>&1 < /dev/null \
        || { tail -n 20 "$work/logs/setup-offline-nix.log"; die "setup-offline-nix.sh failed"; }
    rm -rf "$inputs"
fi
stub="${NIX_OFFLINE_STUB:-/var/cache/nix-offline/stub-nixpkgs}"

# A clone of this commit (or of the checkout given with --flake) in the work directory: a flake
# sees what git tracks, and the wrapper's chroot sees /tmp. It is named by its URL from `/`, so
# the wrapper binds no directory of this run's into the chroot (it binds the parent of the
# checkout it is called from) and no mount outlives the run: the wrapper's mounts are left as
# they are, for whoever else evaluates.
git clone -q --no-hardlinks "${flake_src:-$repo}" "$work/flake"

# runsc's platform: the one this host runs (scripts/setup-debian.sh picked it for its wrapper).
platform=$(grep -so -- '--platform=[a-z]*' /usr/local/lib/mcp-code-bridge/runsc | cut -d= -f2 || true)
if [[ -z "$platform" ]]; then
    for p in systrap kvm ptrace; do
        if [[ "$(timeout 20 runsc --network=none --platform="$p" do /bin/echo ok 2>/dev/null)" == ok ]]; then
            platform=$p
            break
        fi
    done
fi
[[ -n "$platform" ]] || die "gVisor runs on none of its platforms here"

nix_eval() { # nix_eval OUT ATTR APPLY
    (cd / && nix-offline nix eval --raw --no-eval-cache --override-input nixpkgs "path:$stub" \
        "git+file://$work/flake#$2" --apply "$3") > "$1" 2> "$1.err" \
        || { grep -v '^warning: not writing\|^• Updated\|^    .github\|^  → ' "$1.err" | grep -v '^\s*…\|^\s*at \|^\s*[0-9]*|\|^\s*|$' | tail -n 20; return 1; }
}

# What each configuration renders. The gVisor variants add to the examples what a gVisor
# machine sets (gvisor.enable, the choice about rootless limits) and this host's platform.
cat > "$work/apply-nixos.nix" <<'NIX'
c:
let
  variant =
    x:
    let
      cfg = x.config;
      b = cfg.services.mcp-code-bridge;
      ours = n: _: builtins.substring 0 15 n == "mcp-code-bridge";
    in
    {
      failed = map (a: a.message) (builtins.filter (a: !a.assertion) cfg.assertions);
      inherit (b) settings;
      configFile = {
        path = "${b.configFile}";
        script = b.configFile.buildCommand or b.configFile.cmd;
        generated = "${b.configFile.generated}";
      };
      installed = "${cfg.environment.etc."mcp-code-bridge/config.toml".source}";
      services = builtins.intersectAttrs (builtins.mapAttrs ours cfg.systemd.services) cfg.systemd.services;
      sockets = cfg.systemd.sockets or { };
      users = {
        users = cfg.users.users or { };
        groups = cfg.users.groups or { };
      };
      containersConf = cfg.virtualisation.containers.containersConf.settings or { };
      wrapper =
        if b.gvisor.enable then
          {
            path = "${b.gvisor.wrapper}";
            inherit (b.gvisor.wrapper) text;
          }
        else
          null;
    };
  gvisor = c.extendModules {
    modules = [
      {
        services.mcp-code-bridge = {
          gvisor = {
            enable = true;
            platform = "@platform@";
          };
          settings.allow_unenforced_limits = true;
        };
      }
    ];
  };
  # The token file given by hand in settings (token_file) rather than by http.tokenFile.
  settingsToken = c.extendModules {
    modules = [
      {
        services.mcp-code-bridge = {
          http.tokenFile = {
            _type = "override";
            priority = 50;
            content = null;
          };
          settings.token_file = "/run/secrets/mcp-code-bridge-tokens";
        };
      }
    ];
  };
in
builtins.toJSON {
  example = variant c;
  gvisor = variant gvisor;
  settingsToken = variant settingsToken;
}
NIX
cat > "$work/apply-home.nix" <<'NIX'
h:
let
  variant =
    x:
    let
      cfg = x.config;
      b = cfg.programs.mcp-code-bridge;
      start = cfg.systemd.user.services.mcp-code-bridge-http.Service.ExecStart;
      serve = if builtins.isList start then builtins.head start else start;
      dropIn = cfg.xdg.configFile."containers/containers.conf.d/50-mcp-code-bridge-gvisor.conf".source or null;
    in
    {
      failed = map (a: a.message) (builtins.filter (a: !a.assertion) cfg.assertions);
      inherit (b) settings;
      home = cfg.home.homeDirectory;
      configFile = {
        path = "${b.configFile}";
        script = b.configFile.buildCommand or b.configFile.cmd;
        generated = "${b.configFile.generated}";
      };
      installed = "${cfg.xdg.configFile."mcp-code-bridge/config.toml".source}";
      service = cfg.systemd.user.services.mcp-code-bridge-http;
      serve = {
        path = "${serve}";
        inherit (serve) text;
      };
      dropIn =
        if dropIn == null then
          null
        else
          {
            path = "${dropIn}";
            value = builtins.fromJSON (builtins.unsafeDiscardStringContext dropIn.value);
          };
      wrapper =
        if b.gvisor.enable then
          {
            path = "${b.gvisor.wrapper}";
            inherit (b.gvisor.wrapper) text;
          }
        else
          null;
    };
  gvisor = h.extendModules {
    modules = [
      {
        programs.mcp-code-bridge = {
          gvisor = {
            enable = true;
            platform = "@platform@";
          };
          settings.allow_unenforced_limits = true;
        };
      }
    ];
  };
in
builtins.toJSON {
  example = variant h;
  gvisor = variant gvisor;
}
NIX
sed -i "s/@platform@/$platform/" "$work/apply-nixos.nix" "$work/apply-home.nix"

# The variants of each evaluation (apply-nixos.nix, apply-home.nix).
variants_of() { if [[ $1 == nixos.json ]]; then echo example gvisor settingsToken; else echo example gvisor; fi; }
ev_nix() {
    # The VM tests' machine as the offline evaluation gives it: the stand-in for nixpkgs' test
    # driver evaluates each node into a summary of its units and /etc files.
    nix_eval "$work/vm.json" "checks.$system.nixos-sandbox" 't: (builtins.head t.nodes).text'
    nix_eval "$work/vm-gvisor.json" "checks.$system.nixos-sandbox-gvisor" 't: (builtins.head t.nodes).text'
    # The MCP client's test: its script, its machine, and the machine's derivations (the build
    # script and settings of its config.toml are there).
    nix_eval "$work/vm-client.json" "checks.$system.nixos-mcp-client" \
        't: builtins.toJSON { script = t.testScript; node = (builtins.head t.nodes).text; machine = (builtins.head t.nodes).drvPath; }'
    (cd / && nix-offline nix derivation show -r "$(pieces get "$work/vm-client.json" machine)") \
        > "$work/vm-client-drvs.json" 2> "$work/vm-client-drvs.err" || { tail -n 20 "$work/vm-client-drvs.err"; return 1; }
    nix_eval "$work/nixos.json" nixosConfigurations.example "$(cat "$work/apply-nixos.nix")"
    nix_eval "$work/home.json" homeConfigurations.example "$(cat "$work/apply-home.nix")"
    # No assertion fails in the configurations run below.
    local f v
    for f in nixos.json home.json; do
        for v in $(variants_of "$f"); do
            [[ "$(pieces get "$work/$f" "$v.failed")" == "[]" ]] \
                || { echo "$f $v: failed assertions:"; pieces get "$work/$f" "$v.failed"; return 1; }
        done
    done
}
echo "nix-pieces: $real_bridge; the flake at $(git -C "$work/flake" rev-parse --short HEAD)${flake_src:+ of $flake_src}; runsc platform $platform"
check "offline evaluation: the VM tests' machines (nixos-sandbox, -gvisor, nixos-mcp-client), nixosConfigurations.example (also with gVisor, and with settings.token_file), homeConfigurations.example (also with gVisor)" ev_nix
if [[ ! -s "$work/home.json" ]]; then
    echo "nix-pieces: $pass passed, $((fail + 1)) failed (nothing to run without the evaluation)"
    exit 1
fi

# ------------------------------------------------------------------------------------ stand-ins
home_dir=$(pieces get "$work/home.json" example.home)
id -u "$user" >/dev/null 2>&1 || useradd -m -s /bin/sh "$user"
user_home=$(getent passwd "$user" | cut -d: -f6)
user_uid=$(id -u "$user")
mkdir -p "/run/user/$user_uid"
chown "$user:" "/run/user/$user_uid"
chmod 700 "/run/user/$user_uid"
mkdir -p "$work/var/lib" "$work/var/log" "$work/run/secrets" "$work/etc/mcp-code-bridge" "$work/var/empty" \
    "$work/etc/mcp-code-bridge-test" "$work/etc/containers" "$work/root-home"
# The bridge's path must be open to the test user and to `nobody`.
if ! setpriv --reuid="$user" --regid="$user" --clear-groups test -x "$real_bridge"; then
    cp "$real_bridge" "$work/mcp-code-bridge"
    sed -i "s|exec .* \"\$@\"|exec $work/mcp-code-bridge \"\$@\"|" "$bridge"
fi
export PIECES_MAP="/nix/store/	$work/store/
/var/lib/	$work/var/lib/
/var/log/	$work/var/log/
/var/empty	$work/var/empty
/run/	$work/run/
/etc/mcp-code-bridge-test/	$work/etc/mcp-code-bridge-test/
/etc/mcp-code-bridge/	$work/etc/mcp-code-bridge/
$home_dir/	$user_home/
$home_dir	$user_home"
local_of() { pieces localize-str "$(pieces get "$@")"; } # local_of FILE KEY: the value, mapped
# systemd's PATH of a NixOS service besides its `path` (coreutils, findutils, grep, sed): no
# podman there unless the unit asks for it.
mkdir -p "$work/nixos-path"
for f in $(dpkg -L coreutils findutils grep sed 2>/dev/null | grep -E '^/(usr/)?bin/[^/]+$'); do
    ln -sfn "$f" "$work/nixos-path/$(basename "$f")"
done

# The image archive the examples name (the flake's image) is setup-debian.sh's here.
image_ref=$(pieces get "$work/nixos.json" example.settings.image)
stage_all() {
    local out f v
    for f in nixos.json home.json; do
        for v in $(variants_of "$f"); do
            ln -sfn "$archive" "$(local_of "$work/$f" "$v.settings.image_archive")"
        done
    done
    # The MCP client test's own files, and its client's Python with the SDK: the test venv's
    # (mcp-python, scripts/setup-debian.sh --test-deps).
    pieces stage-test "$work/store" "$work/flake/tests/nixos" "${MCP_BRIDGE_TEST_SERVERS_BIN:-/nonexistent}/mcp-python" \
        "$work/vm-client.json"
    out=$(pieces stage "$work/store" "$bridge" "$work/vm.json" "$work/vm-gvisor.json" "$work/nixos.json" "$work/home.json" \
        "$work/vm-client.json")
    [[ -z "$out" ]] || { echo "$out"; return 1; }
    for f in nixos.json home.json; do
        for v in $(variants_of "$f"); do
            # The settings' own rendering (formats.toml: JSON -> TOML), the paths mapped.
            pieces get "$work/$f" "$v.settings" > "$work/$f.$v.settings.json"
            pieces localize "$work/$f.$v.settings.json" "$work/$f.$v.settings.local.json"
            pieces toml "$work/$f.$v.settings.local.json" "$(local_of "$work/$f" "$v.configFile.generated")"
        done
        pieces write-script "$work/$f" gvisor.wrapper.text "$(local_of "$work/$f" gvisor.wrapper.path)"
    done
    for v in example gvisor; do
        pieces write-script "$work/home.json" "$v.serve.text" "$(local_of "$work/home.json" "$v.serve.path")"
    done
    pieces get "$work/home.json" gvisor.dropIn.value > "$work/dropin.json"
    pieces localize "$work/dropin.json" "$work/dropin.local.json"
    pieces toml "$work/dropin.local.json" "$(local_of "$work/home.json" gvisor.dropIn.path)"
    cat "$(local_of "$work/home.json" gvisor.dropIn.path)"
}
check "the local store: a program here for each one the pieces run, each file they render written from its text" stage_all

# ------------------------------------------------------------------------------------ config.toml
# The module's build script of config.toml (its sha256 line, its check with the bridge) run as
# Nix runs it: in an empty directory, $out its store path.
config_of() { local_of "$work/$1" "$2.configFile.path"; }
build_config() { # build_config FILE VARIANT
    local out dir
    out=$(config_of "$1" "$2")
    pieces get "$work/$1" "$2.configFile.script" > "$work/$1.$2.build.sh"
    pieces localize "$work/$1.$2.build.sh" "$work/$1.$2.build.local.sh"
    cat "$work/$1.$2.build.local.sh"
    dir=$(mktemp -d "$work/build.XXXXXX")
    (cd "$dir" && out=$out bash -euo pipefail "$work/$1.$2.build.local.sh")
    cat "$out"
    has "image_sha256 = \"$(sha256sum < "$archive" | cut -d' ' -f1)\"" "$out"
    # The file installed (/etc, ~/.config) is the one built.
    [[ "$(pieces get "$work/$1" "$2.configFile.path")" == "$(pieces get "$work/$1" "$2.installed")" ]]
    pieces unstaged "$work/store" "$out"
}
check "NixOS example: config.toml built by the module's own script (sha256 of the archive, checked by the bridge)" build_config nixos.json example
check "NixOS example with gVisor: config.toml built and checked" build_config nixos.json gvisor
check "NixOS example with settings.token_file: config.toml built and checked" build_config nixos.json settingsToken
check "home-manager example: config.toml built and checked" build_config home.json example
check "home-manager example with gVisor: config.toml built and checked" build_config home.json gvisor

config_reads() {
    local file
    file=$(config_of nixos.json example)
    env -i PATH=/usr/bin:/bin HOME="$work/root-home" MCP_BRIDGE_SYSTEM_CONFIG="$file" "$bridge" config > "$work/config.out"
    cat "$work/config.out"
    has "$file" "$work/config.out"
    grep -E '^memory +=\s+1g\s' "$work/config.out"
    grep -E '^log_level +=\s+debug\s' "$work/config.out"
    grep -E "^image +=\s+$image_ref\s" "$work/config.out"
}
check "NixOS example: \`mcp-code-bridge config\` reads it as /etc/mcp-code-bridge/config.toml" config_reads

# ------------------------------------------------------------------------------------ engine
# The units' users and groups, made where this host lacks them as the configurations declare
# them (users.users, users.groups: the module's `mcp-code-bridge`), a DynamicUser= as a system user
# of the unit's name. `podman` is the group of podman.socket, declared by nixpkgs' podman module
# (users.groups.podman, SocketGroup), which the offline evaluation does not run. They are kept for
# the next run, like the test user.
podman_group=podman
accounts() {
    local f v
    for v in example gvisor settingsToken; do
        pieces get "$work/nixos.json" "$v.services" > "$work/accounts-$v.services.json"
        pieces get "$work/nixos.json" "$v.sockets" > "$work/accounts-$v.sockets.json"
        pieces get "$work/nixos.json" "$v.users" > "$work/users-$v.json"
        pieces accounts "$work/users-$v.json" --standin-group "$podman_group" \
            "$work/accounts-$v.services.json" "$work/accounts-$v.sockets.json"
    done
    pieces get "$work/vm.json" systemd.services > "$work/accounts-vm.json"
    pieces get "$work/vm.json" users > "$work/users-vm.json"
    pieces accounts "$work/users-vm.json" "$work/accounts-vm.json"
}
check "the units' users and groups: as the configurations declare them (users.users, users.groups; DynamicUser)" accounts

# podman.socket of a NixOS machine (podman's own unit, with nixpkgs' SocketGroup): a root podman
# service of this script's, socket-activated at /run/podman/podman.sock, mode 0660, group podman.
background "$work/logs/podman-service.log" "$py" "$work/pieces.py" activate "$work/run/podman/podman.sock" 0660 \
    "$podman_group" 0755 -- podman system service
podman_sock="unix://$work/run/podman/podman.sock"
# /etc/containers/containers.conf of the gVisor variant: the host's, with the module's
# registration of the runtime merged in (CONTAINERS_CONF of this script's podman commands).
containers_conf() {
    pieces get "$work/nixos.json" gvisor.containersConf > "$work/containers-conf.json"
    pieces localize "$work/containers-conf.json" "$work/containers-conf.local.json"
    pieces conf "$work/etc/containers/containers.conf" "$work/containers-conf.local.json"
}
containers_conf
runtime=$(pieces get "$work/nixos.json" gvisor.settings.gvisor_runtime)
runtime_registered() {
    local wrapper
    wrapper=$(local_of "$work/nixos.json" gvisor.wrapper.path)
    cat "$wrapper"
    CONTAINERS_CONF="$work/etc/containers/containers.conf" podman --runtime "$runtime" info \
        --format '{{.Host.OCIRuntime.Name}} {{.Host.OCIRuntime.Path}}' > "$work/runtime.out"
    cat "$work/runtime.out"
    [[ "$(cat "$work/runtime.out")" == "$runtime $wrapper" ]]
    "$wrapper" --version > "$work/runsc-version.out"
    head -n 1 "$work/runsc-version.out"
}
check "NixOS gVisor: containers.conf's runtime $runtime is the module's runsc wrapper, which runs" runtime_registered

# ------------------------------------------------------------------------------------ units
# mcp-code-bridge-image: `image load` into root's storage, as the unit runs it (its engine: the
# stand-in for podman.socket).
podman image exists "$image_ref" || tagged+=("$image_ref")
preload() {
    pieces get "$work/nixos.json" example.services > "$work/units.json"
    pieces run-unit "$work/units.json" mcp-code-bridge-image --path "$work/nixos-path" \
        --env "MCP_BRIDGE_SYSTEM_CONFIG=$(config_of nixos.json example)" --env "CONTAINER_HOST=$podman_sock"
    podman image exists "$image_ref"
}
check "NixOS unit mcp-code-bridge-image: \`image load\` puts $image_ref into root's storage" preload

# ------------------------------------------------------------------------------------ the VM
vm=(nsenter --net="/run/netns/$ns")
vm_etc() { # the VM's /etc/mcp-code-bridge-test, as the test writes it
    local f
    for f in probe.py control.py probe_dns.py; do
        pieces get "$work/$1" "environment.etc.[mcp-code-bridge-test/$f].text" > "$work/etc/mcp-code-bridge-test/$f"
    done
}
vm_etc vm-gvisor.json
cp "$work/etc/mcp-code-bridge-test/probe.py" "$work/probe-gvisor.py"
vm_etc vm.json
cp "$work/etc/mcp-code-bridge-test/probe.py" "$work/probe-container.py"
ipv4=$(sed -n 's/^IPV4 = "\(.*\)"$/\1/p' "$work/etc/mcp-code-bridge-test/control.py")
ipv6=$(sed -n 's/^IPV6 = "\(.*\)"$/\1/p' "$work/etc/mcp-code-bridge-test/control.py")
port=$(sed -n 's/^PORT = int("\(.*\)")$/\1/p' "$work/etc/mcp-code-bridge-test/control.py")

# The VM: its addresses on loopback, and this script's two podman networks (their bridges are
# made in the namespace by podman run there).
ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" addr add "$ipv4/32" dev lo
ip -n "$ns" addr add "$ipv6/128" dev lo nodad
podman network create --ipv6 --disable-dns "$net6" >/dev/null
podman network create --disable-dns "$net4" >/dev/null
pieces get "$work/vm.json" systemd.services > "$work/vm-units.json"
# The VM's units, each as its DynamicUser (a user of the unit's name), the responder with its
# AmbientCapabilities.
background "$work/logs/probe-http.log" "${vm[@]}" \
    "$py" "$work/pieces.py" run-unit "$work/vm-units.json" probe-http --path "$work/nixos-path"
background "$work/logs/probe-dns.log" "${vm[@]}" \
    "$py" "$work/pieces.py" run-unit "$work/vm-units.json" probe-dns --path "$work/nixos-path"
listening() { "${vm[@]}" "$py" -c "import socket; socket.create_connection(('$1', $2), 1)"; }
wait_for 20 listening "$ipv4" "$port" || true

control_ok() { # the VM test's command, on this script's dual-stack network
    "${vm[@]}" timeout 120 podman run --rm --name "nixpieces-$id-control" --network "$net6" --dns "$ipv4" \
        "$image_ref" python3 -c "$(cat "$work/etc/mcp-code-bridge-test/control.py")" | tee "$work/control.out"
    has CONTROL-OK "$work/control.out"
}
check "VM probe, control: from a dual-stack podman network every check reaches the responder and the listener (run as their units)" control_ok

# The sandbox probe in a container on an IPv4-only network, as podman's default network is on
# NixOS (ipv6_enabled = false): it fails, by IPv4, while its IPv6 checks say blocked.
v4_only() {
    local rc=0
    "${vm[@]}" timeout 120 podman run --rm --name "nixpieces-$id-v4" --network "$net4" --dns "$ipv4" "$image_ref" \
        python3 -c "$(cat "$work/probe-container.py")" > "$work/v4.out" 2>&1 || rc=$?
    cat "$work/v4.out"
    [[ $rc -ne 0 ]]
    has "tcp over ipv4 to the VM's listener: NOT blocked" "$work/v4.out"
    has "udp dns query over ipv4 to the VM: NOT blocked" "$work/v4.out"
    has "tcp over ipv6 to the VM's listener: blocked" "$work/v4.out"
    has "udp dns query over ipv6 to the VM: blocked" "$work/v4.out"
    has "reached from the sandbox" "$work/v4.out"
}
check "VM probe, sandbox mode on an IPv4-only network: fails by IPv4 while its IPv6 checks say blocked (docs/nix.md)" v4_only

host_kernel=$(uname -r)
on_kernel() { # on_kernel KERNEL container|gvisor
    [[ -n "$1" ]] || { echo "no kernel named"; return 1; }
    if [[ $2 == gvisor ]]; then [[ "$1" != "$host_kernel" ]]; else [[ "$1" == "$host_kernel" ]]; fi
}
sandbox_probe() { # sandbox_probe OUTPUT container|gvisor
    cat "$1"
    has SANDBOX-PROBE-OK "$1"
    on_kernel "$(sed -n 's/^KERNEL=//p' "$1")" "$2"
}
# Root's shell on the NixOS machine: this variant's /etc files. No socket at /run/podman here, so
# the bridge starts a podman service of its own, as it does where podman.socket is off.
root_env() {
    env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$work/root-home" \
        MCP_BRIDGE_SYSTEM_CONFIG="$(config_of nixos.json "$1")" \
        CONTAINERS_CONF="$work/etc/containers/containers.conf" MCP_BRIDGE_ENGINE_LINGER=0 "${@:2}"
}
probe_root_container() {
    root_env example timeout 300 "$bridge" exec -f "$work/probe-container.py" > "$work/probe.out" 2>&1 || true
    sandbox_probe "$work/probe.out" container
}
check "VM probe, sandbox mode: \`exec -f\` as root, container isolation (the NixOS example's config.toml)" probe_root_container
probe_root_gvisor() {
    root_env gvisor timeout 300 "$bridge" exec -f "$work/probe-gvisor.py" > "$work/probe-g.out" 2>&1 || true
    sandbox_probe "$work/probe-g.out" gvisor
}
check "VM probe, sandbox mode: \`exec -f\` as root under gVisor (the module's runtime and wrapper: the engine's seccomp profile on PID 1)" probe_root_gvisor
doctor_root_gvisor() {
    root_env gvisor timeout 300 "$bridge" doctor > "$work/doctor-g.out" 2>&1 || { cat "$work/doctor-g.out"; return 1; }
    cat "$work/doctor-g.out"
    has "limits enforceable" "$work/doctor-g.out"
    has "isolation: gvisor, through the engine's runtime $runtime" "$work/doctor-g.out"
}
check "NixOS gVisor: \`doctor\` as root passes, the limits enforced" doctor_root_gvisor
# The rootful gVisor sandbox held to the limits by the host's kernel: the memory and pids cgroups
# its container's process is in, read on the host (/proc/<pid>/cgroup, as tests/e2e read them),
# hold what podman was asked for (the configuration's memory). A wrapper that passed
# --ignore-cgroups rootful too would leave the sandbox in its engine's unlimited cgroup; the
# wrapper's flags are not read here.
cgroup_root_gvisor() {
    local before owner id="" pid mem want limits rc=0 deadline
    before=$(wc -l < "$work/bridges")
    root_env gvisor timeout 300 "$bridge" exec 'import time; time.sleep(90)' > "$work/cg.out" 2>&1 &
    local exec_pid=$!
    deadline=$((SECONDS + 120))
    while [[ -z "$id" && $SECONDS -lt $deadline ]]; do
        sleep 0.5
        owner=$(sed -n "$((before + 1))p" "$work/bridges")
        [[ -n "$owner" ]] || continue
        id=$(root_env gvisor podman ps -q --filter "label=io.mcp-code-bridge.owner=$owner" --filter status=running | head -n 1)
    done
    [[ -n "$id" ]] || { echo "no running container of the bridge ($owner)"; kill -TERM "$exec_pid"; cat "$work/cg.out"; return 1; }
    root_env gvisor podman inspect --format '{{.OCIRuntime}} {{.State.Pid}} {{.HostConfig.Memory}} {{.HostConfig.PidsLimit}}' "$id" \
        | tee "$work/cg.inspect"
    read -r _ pid mem limits < "$work/cg.inspect"
    want=$(pieces size-bytes "$(pieces get "$work/nixos.json" gvisor.settings.memory)")
    [[ "$(cut -d' ' -f1 "$work/cg.inspect")" == "$runtime" ]] || { echo "not run by $runtime"; rc=1; }
    [[ "$mem" == "$want" ]] || { echo "podman was asked for memory $mem, not the configuration's $want"; rc=1; }
    [[ "$(pieces host-cgroup "$pid" memory memory.limit_in_bytes memory.max)" == "$want" ]] \
        || { echo "the sandbox's memory cgroup on the host does not hold $want"; rc=1; }
    [[ "$limits" -gt 0 && "$(pieces host-cgroup "$pid" pids pids.max pids.max)" == "$limits" ]] \
        || { echo "the sandbox's pids cgroup on the host does not hold $limits"; rc=1; }
    kill -TERM "$exec_pid" 2>/dev/null
    wait "$exec_pid" 2>/dev/null || true
    return $rc
}
check "NixOS gVisor, rootful: the sandbox's memory and pids cgroups on the host hold the configuration's limits" cgroup_root_gvisor

# ------------------------------------------------------------------------------------ serve
token="alice-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
printf 'alice:%s\n' "$token" > "$work/run/secrets/mcp-code-bridge-tokens"
chmod 600 "$work/run/secrets/mcp-code-bridge-tokens"
listen_of() { # where serve listens: the settings' listen, else the bridge's default
    local l
    l=$(pieces get "$work/$1" "$2.settings" | "$py" -c 'import json, sys; print(json.load(sys.stdin).get("listen", ""))')
    echo "${l:-127.0.0.1:8931}"
}
stop_serve() { # SIGTERM (the units' KillSignal), as `systemctl stop`: serve exits
    local deadline=$((SECONDS + 60))
    kill -TERM "$1" 2>/dev/null || { echo "serve had exited already"; return 1; }
    while kill -0 "$1" 2>/dev/null; do
        [[ $SECONDS -lt $deadline ]] || { echo "serve did not exit within 60 s of SIGTERM"; return 1; }
        sleep 0.2
    done
}
# call_serve OUT URL TOKEN EXPECT: run_python over MCP; EXPECT container|gvisor (42 on that
# kernel) or refused (an error naming the limits). Called in an `||` list, where errexit is off:
# each step returns.
call_serve() {
    local rc=0 kernel
    "${vm[@]}" "$py" "$work/pieces.py" mcp "$2" "$3" "import os; print(6 * 7, 'KERNEL=' + os.uname().release)" \
        > "$1" 2>&1 || rc=$?
    cat "$1"
    if [[ $4 == refused ]]; then
        [[ $rc -eq 4 ]] || return 1
        has "limits" "$1"
        return
    fi
    [[ $rc -eq 0 ]] || return 1
    has "42 KERNEL=" "$1" || return 1
    kernel=$(sed -n 's/.*KERNEL=\([^ ]*\).*/\1/p' "$1" | sed -n 1p)
    on_kernel "$kernel" "$4"
}

# The unit's user cannot read the token file where it lies: root's alone (0600), as a secret is
# on the machine (sops-nix, agenix, a `chmod 600` file). Only the credential systemd hands over
# reaches the service.
secret_unreadable() { # secret_unreadable UNITS_FILE
    local unit_user
    unit_user=$(pieces get "$1" mcp-code-bridge-http.serviceConfig.User)
    id "$unit_user" || { echo "no user $unit_user here (the units' users and groups, above)"; return 1; }
    stat -c '%n: %U:%G %a' "$work/run/secrets/mcp-code-bridge-tokens"
    [[ "$(stat -c '%U %a' "$work/run/secrets/mcp-code-bridge-tokens")" == "root 600" ]]
    if setpriv --reuid="$unit_user" --regid="$(id -g "$unit_user")" --init-groups \
        cat "$work/run/secrets/mcp-code-bridge-tokens" > /dev/null 2>&1; then
        echo "$unit_user can read the token file where it lies: the test would prove nothing"
        return 1
    fi
    echo "$unit_user cannot read it"
}
# mcp-code-bridge-http of the NixOS example: as its user, its token from its credential, on
# 0.0.0.0:8931 in the namespace.
serve_nixos() { # serve_nixos VARIANT container|gvisor
    local v=$1 units="$work/units-$1.json" pid listen url rc=0
    pieces get "$work/nixos.json" "$v.services" > "$units"
    pieces get "$work/nixos.json" "$v.users" > "$work/users-$v.json"
    secret_unreadable "$units"
    pieces get "$units" mcp-code-bridge-http.serviceConfig.LoadCredential
    "${vm[@]}" "$py" "$work/pieces.py" run-unit "$units" mcp-code-bridge-http --creds "$work/credentials/$v" \
        --path "$work/nixos-path" --env "MCP_BRIDGE_SYSTEM_CONFIG=$(config_of nixos.json "$v")" \
        --users "$work/users-$v.json" --standin-group "$podman_group" > "$work/serve-$v.log" 2>&1 &
    pid=$!
    echo "$pid" >> "$work/pids"
    listen=$(listen_of nixos.json "$v")
    url="http://127.0.0.1:${listen##*:}/mcp"
    # On a failure the service is stopped too: the next one listens on the same port.
    serving "$pid" "${listen##*:}" || { cat "$work/serve-$v.log"; stop_serve "$pid"; return 1; }
    pieces process-as "$pid" "$units" mcp-code-bridge-http || { stop_serve "$pid"; return 1; }
    ls -ld "$work/var/lib/mcp-code-bridge-http" "$work/credentials/$v" "$work/credentials/$v"/*
    "${vm[@]}" "$py" "$work/pieces.py" mcp "$url" "" "print(1)" > "$work/serve-$v.noauth" 2>&1 || rc=$?
    cat "$work/serve-$v.noauth"
    [[ $rc -eq 3 ]] || { stop_serve "$pid"; return 1; }
    has "HTTP 401" "$work/serve-$v.noauth"
    call_serve "$work/serve-$v.out" "$url" "$token" "$2" || { cat "$work/serve-$v.log"; stop_serve "$pid"; return 1; }
    stop_serve "$pid"
    grep -v DEBUG "$work/serve-$v.log"
}
doctor_http_unit() {
    pieces get "$work/nixos.json" example.services > "$work/units-doctor.json"
    pieces get "$work/nixos.json" example.users > "$work/users-doctor.json"
    pieces run-unit "$work/units-doctor.json" mcp-code-bridge-http --creds "$work/credentials/doctor" \
        --path "$work/nixos-path" --env "MCP_BRIDGE_SYSTEM_CONFIG=$(config_of nixos.json example)" \
        --users "$work/users-doctor.json" --standin-group "$podman_group" \
        --args doctor > "$work/doctor-http.out" 2>&1 || { cat "$work/doctor-http.out"; return 1; }
    cat "$work/doctor-http.out"
    has "limits enforceable" "$work/doctor-http.out"
    has "container engine: Podman" "$work/doctor-http.out"
    has "(CONTAINER_HOST)" "$work/doctor-http.out"
}
check "NixOS unit mcp-code-bridge-http: \`doctor\` as its user in its environment (its token credential, podman's socket) passes, limits enforced" \
    doctor_http_unit
check "NixOS unit mcp-code-bridge-http: serve as its User=/Group=/SupplementaryGroups=, its token (root's, 0600) from the credential (401 without), run_python on the host's kernel, SIGTERM stops it" \
    serve_nixos example container
check "NixOS unit mcp-code-bridge-http with settings.token_file (root's, 0600) in place of http.tokenFile: handed over as a credential too, serve as its user runs run_python" \
    serve_nixos settingsToken container

# With gVisor: the module's own podman service, socket-activated where the units say, with the
# containers.conf that registers the runtime.
gvisor_podman=mcp-code-bridge-gvisor-podman
pieces get "$work/nixos.json" gvisor.sockets > "$work/sockets.json"
pieces get "$work/nixos.json" gvisor.services > "$work/units-gvisor.json"
gvisor_sock=$(pieces get "$work/sockets.json" "$gvisor_podman.listenStreams" | "$py" -c 'import json, sys; print(json.load(sys.stdin)[0])' || true)
if [[ -n "$gvisor_sock" ]]; then
    # The socket's owner and mode as its unit says (its group is the HTTP service's, made above).
    background "$work/logs/gvisor-podman.log" "$py" "$work/pieces.py" activate \
        "$(pieces localize-str "$gvisor_sock")" "$(pieces get "$work/sockets.json" "$gvisor_podman.socketConfig.SocketMode")" \
        "$(pieces get "$work/sockets.json" "$gvisor_podman.socketConfig.SocketGroup")" \
        "$(pieces get "$work/sockets.json" "$gvisor_podman.socketConfig.DirectoryMode")" -- \
        "$py" "$work/pieces.py" run-unit "$work/units-gvisor.json" "$gvisor_podman" --path "$work/nixos-path" \
        --env "CONTAINERS_CONF=$work/etc/containers/containers.conf"
fi
gvisor_podman_default() {
    local host
    [[ -n "$gvisor_sock" ]] || { echo "no socket unit $gvisor_podman"; return 1; }
    host=$(local_of "$work/units-gvisor.json" mcp-code-bridge-http.environment.CONTAINER_HOST)
    [[ "$host" == "unix://$(pieces localize-str "$gvisor_sock")" ]]
    wait_for 30 timeout 5 podman --url "$host" info
    podman --url "$host" info --format '{{.Host.OCIRuntime.Name}}' | tee "$work/gvisor-default.out"
    [[ "$(cat "$work/gvisor-default.out")" == "$runtime" ]]
    cat "$work/logs/gvisor-podman.log"
}
check "NixOS gVisor unit $gvisor_podman: socket-activated at the HTTP service's CONTAINER_HOST, default runtime $runtime" gvisor_podman_default
check "NixOS gVisor unit mcp-code-bridge-http: serve as its user through that service (its socket's group), run_python on gVisor's kernel" serve_nixos gvisor gvisor

# ------------------------------------------------------------------------------------ MCP client
# checks.nixos-mcp-client: its machine's config.toml built by its own build script, its image
# preload unit run, then its test script run here by a stand-in of the test driver's `machine`
# (commands as root, paths mapped): `mcp-code-bridge servers`, the upstream server's secrets
# written, and tests/nixos/mcp_client.py (the Python SDK's stdio client) against the bridge.
mcp_client_vm() {
    local cfg generated rc=0
    [[ -x "${MCP_BRIDGE_TEST_SERVERS_BIN:-}/mcp-python" ]] \
        || { echo "no MCP_BRIDGE_TEST_SERVERS_BIN/mcp-python in $cache_dir/setup.env (scripts/setup-debian.sh --test-deps)"; return 1; }
    pieces get "$work/vm-client.json" node > "$work/vm-client-node.json"
    pieces get "$work/vm-client.json" script > "$work/vm-client-script.py"
    pieces vm-config "$work/vm-client-drvs.json" "$work/vm-client-node.json" "$work/vm-client" > "$work/vm-client.paths"
    generated=$(pieces localize-str "$(sed -n 1p "$work/vm-client.paths")")
    cfg=$(pieces localize-str "$(sed -n 2p "$work/vm-client.paths")")
    ln -sfn "$archive" "$(pieces localize-str "$(pieces get "$work/vm-client.settings.json" image_archive)")"
    pieces localize "$work/vm-client.settings.json" "$work/vm-client.settings.local.json"
    pieces toml "$work/vm-client.settings.local.json" "$generated"
    pieces stage "$work/store" "$bridge" "$work/vm-client.build.sh"
    pieces localize "$work/vm-client.build.sh" "$work/vm-client.build.local.sh"
    pieces unstaged "$work/store" "$work/vm-client.build.local.sh"
    (cd "$(mktemp -d "$work/build.XXXXXX")" && out=$cfg bash -euo pipefail "$work/vm-client.build.local.sh")
    cat "$cfg"
    pieces get "$work/vm-client-node.json" systemd.services > "$work/vm-client-units.json"
    pieces run-unit "$work/vm-client-units.json" mcp-code-bridge-image --path "$work/nixos-path" \
        --env "MCP_BRIDGE_SYSTEM_CONFIG=$cfg" --env "CONTAINER_HOST=$podman_sock"
    pieces vm-script "$work/vm-client-script.py" --unit multi-user.target --unit mcp-code-bridge-image.service \
        --env "PATH=$work/bin:$MCP_BRIDGE_TEST_SERVERS_BIN:/usr/local/bin:/usr/bin:/bin" --env "HOME=$work/root-home" \
        --env "MCP_BRIDGE_SYSTEM_CONFIG=$cfg" --env MCP_BRIDGE_ENGINE_LINGER=0 || rc=$?
    rm -f "$work/run/secrets/time.env" "$work/run/secrets/time-token"
    return $rc
}
check "VM test nixos-mcp-client: its machine's config.toml and preload unit, its script with tests/nixos/mcp_client.py (the Python SDK's client) against the bridge" \
    mcp_client_vm

# ------------------------------------------------------------------------------------ home-manager
# The user's files as home-manager lays them out ($XDG_CONFIG_HOME: config.toml, the drop-in);
# the user's own rootless podman.
# No /etc/mcp-code-bridge/config.toml: home-manager writes none (this host's, if any, is not read).
as_user=("${vm[@]}" setpriv --reuid="$user" --regid="$user" --init-groups env -i HOME="$user_home"
    PATH=/usr/local/bin:/usr/bin:/bin XDG_RUNTIME_DIR="/run/user/$user_uid" PIECES_MAP="$PIECES_MAP"
    MCP_BRIDGE_SYSTEM_CONFIG=none)
home_files() { # home_files VARIANT
    rm -rf "$user_home/.config"
    install -d -o "$user" -g "$user" "$user_home/.config" "$user_home/.config/mcp-code-bridge"
    install -o "$user" -g "$user" -m 644 "$(config_of home.json "$1")" "$user_home/.config/mcp-code-bridge/config.toml"
    if [[ "$1" == gvisor ]]; then
        install -d -o "$user" -g "$user" "$user_home/.config/containers" "$user_home/.config/containers/containers.conf.d"
        install -o "$user" -g "$user" -m 644 "$(local_of "$work/home.json" gvisor.dropIn.path)" \
            "$user_home/.config/containers/containers.conf.d/50-mcp-code-bridge-gvisor.conf"
    fi
}
home_config() {
    home_files example
    "${as_user[@]}" "$bridge" config > "$work/home-config.out"
    cat "$work/home-config.out"
    has "$user_home/.config/mcp-code-bridge/config.toml" "$work/home-config.out"
    grep -E '^memory +=\s+768m\s' "$work/home-config.out"
}
check "home-manager example: \`config\` as the user reads \$XDG_CONFIG_HOME/mcp-code-bridge/config.toml" home_config

serve_home() { # serve_home VARIANT container|gvisor|refused
    local v=$1 pid listen
    home_files "$v"
    pieces get "$work/home.json" "$v.service" > "$work/home-unit-$v.json"
    "${as_user[@]}" "$py" "$work/pieces.py" run-unit "$work/home-unit-$v.json" "" \
        --path /usr/local/bin:/usr/bin:/bin --env "XDG_RUNTIME_DIR=/run/user/$user_uid" \
        --env "HOME=$user_home" --env MCP_BRIDGE_SYSTEM_CONFIG=none > "$work/home-serve-$v.log" 2>&1 &
    pid=$!
    echo "$pid" >> "$work/pids"
    listen=$(listen_of home.json "$v")
    serving "$pid" "${listen##*:}" || { cat "$work/home-serve-$v.log"; stop_serve "$pid"; return 1; }
    call_serve "$work/home-serve-$v.out" "http://127.0.0.1:${listen##*:}/mcp" "" "$2" \
        || { cat "$work/home-serve-$v.log"; stop_serve "$pid"; return 1; }
    stop_serve "$pid"
}
if [[ "$("${as_user[@]}" podman info --format '{{.Host.CgroupsVersion}}' 2>/dev/null)" == v2 ]]; then
    check "home-manager unit mcp-code-bridge-http: the user service's script serves run_python, rootless" serve_home example container
else
    check "home-manager unit mcp-code-bridge-http: the user service's script serves; run_python refused naming the limits (rootless on cgroup v1 here)" \
        serve_home example refused
fi
# The VM test's rootless user (sandbox.nix, `container` isolation): a normal user whose bridge reads
# the system's config.toml (the NixOS example's), the probe through `exec -f` in rootless podman.
# On cgroup v2 (the VM's) the limits hold; on cgroup v1 rootless podman cannot apply them and the
# bridge refuses, naming them, until the user's own config.toml allows it, as the bridge answers
# there: then the probe runs.
probe_rootless_container() {
    local sys_config
    sys_config=$(config_of nixos.json example)
    rm -rf "$user_home/.config"
    install -d -o "$user" -g "$user" "$user_home/.config" "$user_home/.config/mcp-code-bridge"
    if [[ "$("${as_user[@]}" podman info --format '{{.Host.CgroupsVersion}}' 2>/dev/null)" != v2 ]]; then
        if "${as_user[@]}" MCP_BRIDGE_SYSTEM_CONFIG="$sys_config" MCP_BRIDGE_ENGINE_LINGER=0 timeout 300 "$bridge" \
            exec 'print(1)' > "$work/rootless-refused.out" 2>&1; then
            cat "$work/rootless-refused.out"
            echo "rootless on cgroup v1 ran with its limits dropped"
            return 1
        fi
        cat "$work/rootless-refused.out"
        has "cannot enforce these sandbox limits" "$work/rootless-refused.out"
        has "memory (1g)" "$work/rootless-refused.out"
        echo 'allow_unenforced_limits = true' > "$user_home/.config/mcp-code-bridge/config.toml"
        chown "$user:$user" "$user_home/.config/mcp-code-bridge/config.toml"
    fi
    "${as_user[@]}" MCP_BRIDGE_SYSTEM_CONFIG="$sys_config" MCP_BRIDGE_ENGINE_LINGER=0 "$bridge" config \
        | grep -E '^(isolation|memory|image|allow_unenforced_limits) '
    "${as_user[@]}" MCP_BRIDGE_SYSTEM_CONFIG="$sys_config" MCP_BRIDGE_ENGINE_LINGER=0 timeout 300 "$bridge" \
        exec -f "$work/probe-container.py" > "$work/rootless-probe.out" 2>&1 || true
    sandbox_probe "$work/rootless-probe.out" container
    "${as_user[@]}" podman image exists "$image_ref"
    if "${as_user[@]}" MCP_BRIDGE_SYSTEM_CONFIG="$sys_config" MCP_BRIDGE_ENGINE_LINGER=0 timeout 300 "$bridge" \
        exec 'raise RuntimeError("boom")' > "$work/rootless-raise.out" 2>&1; then
        cat "$work/rootless-raise.out"
        echo "a raising snippet did not make exec fail"
        return 1
    fi
    rm -rf "$user_home/.config"
}
check "VM probe, sandbox mode, rootless: \`exec -f\` as a normal user, container isolation (the NixOS example's config.toml; cgroup v1: refused naming the limits until the user allows it)" \
    probe_rootless_container
home_gvisor_probe() {
    home_files gvisor
    "${as_user[@]}" MCP_BRIDGE_ENGINE_LINGER=0 "$bridge" doctor > "$work/home-doctor.out" 2>&1 \
        || { cat "$work/home-doctor.out"; return 1; }
    cat "$work/home-doctor.out"
    has "limits NOT enforced (allowed by allow_unenforced_limits)" "$work/home-doctor.out"
    has "gVisor applies no cgroup limits to a rootless container" "$work/home-doctor.out"
    "${as_user[@]}" MCP_BRIDGE_ENGINE_LINGER=0 timeout 300 "$bridge" exec -f "$work/probe-gvisor.py" \
        > "$work/home-probe.out" 2>&1 || true
    sandbox_probe "$work/home-probe.out" gvisor
}
check "home-manager gVisor, rootless: the drop-in's runtime and its wrapper (--ignore-cgroups); doctor names the limits not applied; the VM probe passes" \
    home_gvisor_probe
check "home-manager gVisor unit mcp-code-bridge-http: serve runs run_python on gVisor's kernel, rootless" serve_home gvisor gvisor

echo "nix-pieces: $pass passed, $fail failed"
printf '(%ss)\n' "$((SECONDS - started))" >&2
[[ $fail -eq 0 ]]

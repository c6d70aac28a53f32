#!/usr/bin/env bash
# One-time setup of a Debian 12 (or later) host for mcp-code-bridge, as root (run as another user,
# it runs itself again with sudo):
#   - installs podman, runc, catatonit, mmdebstrap (apt),
#   - installs uv (pinned, from PyPI, into a venv in the cache directory; linked as /usr/local/bin/uv
#     when no uv is on PATH): the resolver the bridge runs on the host for packages on demand,
#   - configures podman for this kind of host (runc as the OCI runtime, because crun refuses cgroup v1
#     hybrid hosts; default ulimits at or below the host's, because podman cannot raise them here),
#   - gives rootful podman subordinate ids (`containers` in /etc/subuid and /etc/subgid, and with
#     --rootless-user a rootless user's) for a host uid of each sandbox's own (--userns=auto),
#   - builds the sandbox image archive with image/build-debian.sh into a cache directory (rebuilt only
#     when that script or the package list changes); an older archive is deleted unless
#     /etc/mcp-code-bridge/config.toml still names it,
#   - with --configure, points the bridge at the archive in /etc/mcp-code-bridge/config.toml (`image`,
#     `image_archive`, `image_sha256`; only those keys of a file it wrote, replaced atomically),
#   - with --isolation gvisor, installs gVisor (runsc), picks the platform that works on this host
#     (systrap, then kvm, then ptrace) and registers it with podman as the runtime `runsc`; with
#     --configure it also writes `isolation = "gvisor"` (--isolation container writes it back),
#   - with --docker, installs Docker (Debian's docker.io) for `runtime = "docker"`: on a systemd host
#     its daemon is enabled; elsewhere it is not started (start it with `dockerd --iptables=false
#     --bridge=none &`: the sandbox needs no Docker network, so the host's firewall stays as it was),
#   - with --test-deps, also builds the data profile's image (tests/e2e/data_image.rs) and installs the
#     real MCP servers the integration tests talk to (npm and PyPI)
#     and the Python `mcp` SDK, and checks that each one answers initialize + tools/list, and
#     downloads a few real wheels for CPython 3.14 manylinux x86_64 into <cache>/wheels (the local
#     index of the package tests, tests/fixtures/pyindex.py; MCP_BRIDGE_TEST_WHEELHOUSE), and
#     Docker as --docker does (scripts/test.sh runs suites against a Docker daemon it starts).
# It ends by printing (and writing to <cache>/setup.env) the variables to use, e.g.
#   MCP_BRIDGE_IMAGE=... MCP_BRIDGE_IMAGE_ARCHIVE=... MCP_BRIDGE_IMAGE_SHA256=...
# Safe to run again, with or without the other options: every step is idempotent, and no run
# deletes the archive a configured bridge uses.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd -- "$here/.." && pwd)
args=("$@")

cache_dir="${MCP_CODE_BRIDGE_CACHE_DIR:-/var/cache/mcp-code-bridge}"
test_deps=0
docker=0
configure=0
isolation=""
build_image=1
extras=()
build_args=()
rootless_users=()

# Versions of the test servers (bump deliberately).
NPM_PACKAGES=(
    "@modelcontextprotocol/server-everything@2026.8.31"
    "@modelcontextprotocol/server-filesystem@2026.8.31"
    "oidc-provider@9.13.3"  # a real OpenID provider for tests/e2e/oauth.rs (tests/fixtures/oidc)
    "jose@6.2.18"           # its key generation, imported by the fixture itself
    "@modelcontextprotocol/sdk@1.32.2"  # the TypeScript SDK client of tests/e2e/http.rs
    "@modelcontextprotocol/client@2.4.0"  # the TypeScript client 2.x (2026-07-28 in auto mode)
)
# Tools that need Node >= 22 (Debian 12 has 20), installed beside the npm registry's own build of
# Node 22 and run by wrappers that put it first on PATH: the official conformance suite
# (tests/e2e/conformance.rs) and the MCP Inspector's CLI (tests/e2e/http.rs).
NODE22_PACKAGES=(
    "node@22.23.3"
    "@modelcontextprotocol/conformance@0.2.0-alpha.12"  # 2026-07-28 scenarios (prerelease)
    "@modelcontextprotocol/inspector@2.12.0"
)
# uv, the resolver of packages on demand (always installed; bump deliberately).
UV_VERSION="0.13.9"
# Real wheels for the package tests (tests/fixtures/pyindex.py serves them as a local index): each
# pinned with its sha256 on PyPI, for CPython 3.14 on manylinux x86_64 (what the sandbox runs).
TEST_WHEELS=(
    # a small pure-Python package with no dependencies
    "tabulate==0.10.0 tabulate-0.10.0-py3-none-any.whl f0b0622e567335c8fabaaa659f1b33bcb6ddfe2e496071b743aa113f8774f2d3"
    # a pure-Python package with a pure-Python dependency (text-unidecode)
    "python-slugify==9.2.0 python_slugify-9.2.0-py3-none-any.whl 7298dcfc65e9ccdf834b3c398f163af0d09a9a8fc1ee6a7b2dffd8d38bfb756e"
    "text-unidecode==1.3 text_unidecode-1.3-py2.py3-none-any.whl 1311f10e8b895935241623731c2ba64f4c455287888b18189350b67134a822e8"
    # a C extension with cp314 manylinux wheels
    "msgpack==1.2.4 msgpack-1.2.4-cp314-cp314-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl 5d65b791ce4283e02b6267742ad540899155e1b32887b9cbdda47f38f5a076b5"
)
PIP_PACKAGES=(
    "mcp-server-time==2026.10.19"
    "mcp-server-git==2026.10.19"
    "mcp==2.3.0"
    "pytest==8.4.2"
    "pandas==2.3.3"
    "matplotlib==3.10.7"
    "nbformat==5.11.1"  # tests/e2e/notebook.rs validates export_notebook()'s file with it
    "cloudpickle==3.1.1"  # image/tests/test_snapshots.py: the runtime's snapshots as the image makes them
    # tests/fixtures/otlp_receiver.py: the OTLP receiver of tests/e2e/traces.rs
    "opentelemetry-proto==1.45.2"
    "protobuf==7.36.2"
)

step() { printf '\n==> [setup-debian] %s (at %d s)\n' "$*" "$SECONDS" >&2; }
log() { printf '    %s\n' "$*" >&2; }
die() { printf '[setup-debian] error: %s\n' "$*" >&2; exit 1; }

usage() {
    cat <<'EOF'
Usage: scripts/setup-debian.sh [options]     (as root; as another user it runs itself with sudo)

  --configure        point the bridge at the image archive in /etc/mcp-code-bridge/config.toml
                     (so `mcp-code-bridge` works with no other setting); in a file this script
                     wrote, only the image keys are replaced
  --isolation NAME   container (the host's kernel; the default) or gvisor (installs gVisor's
                     runsc and registers it with podman; with --configure, every sandbox runs
                     under it)
  --docker           also install Docker (docker.io) for runtime = "docker"; where systemd is
                     not PID 1 its daemon is left stopped: `dockerd --iptables=false
                     --bridge=none &` starts one that leaves the host's firewall alone
  --test-deps        also install the MCP servers and the Python mcp SDK used by the tests,
                     gVisor and Docker (the tests run suites under both isolation levels and
                     against both engines)
  --cache-dir DIR    where the image archive and test servers go
                     (default: $MCP_CODE_BRIDGE_CACHE_DIR or /var/cache/mcp-code-bridge)
  --profile NAME     the image's profile: default, or data (adds scipy, scikit-learn, pyarrow)
  --extra PKG        extra Debian package for the image (repeatable), e.g. python3-statsmodels
                     (python3, numpy, pandas and matplotlib are always in it)
  --mirror URL       Debian mirror for the image (default: the one apt on this host uses)
  --no-image         do not build the image archive (setup.env keeps the image lines it had)
  --rootless-user U  give user U (who runs rootless podman) subordinate ids enough for a host uid
                     of each sandbox's own (repeatable; rootful podman's are always given)
  -h, --help         this help
EOF
}

need_arg() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --test-deps) test_deps=1; docker=1; shift ;;
        --docker) docker=1; shift ;;
        --configure) configure=1; shift ;;
        --isolation) need_arg "$@"; isolation="$2"; shift 2
            [[ "$isolation" == container || "$isolation" == gvisor ]] \
                || die "--isolation takes container or gvisor, not '$isolation'" ;;
        --cache-dir) need_arg "$@"; cache_dir="$2"; shift 2 ;;
        --extra) need_arg "$@"; extras+=("$2"); build_args+=(--extra "$2"); shift 2 ;;
        --profile) need_arg "$@"; build_args+=(--profile "$2"); shift 2 ;;
        --mirror) need_arg "$@"; build_args+=(--mirror "$2"); shift 2 ;;
        --no-image) build_image=0; shift ;;
        --rootless-user) need_arg "$@"; id -u "$2" >/dev/null 2>&1 || die "--rootless-user: no user $2"
            rootless_users+=("$2"); shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

if [[ $(id -u) -ne 0 ]]; then
    # It installs packages and configures podman for root. sudo resets the environment, so the
    # cache directory (perhaps from MCP_CODE_BRIDGE_CACHE_DIR) goes along as an argument, and a
    # moved system configuration file as the variable.
    command -v sudo >/dev/null \
        || die "run as root: it installs packages and configures podman (and sudo is not installed)"
    keep_env=()
    if [[ -v MCP_BRIDGE_SYSTEM_CONFIG ]]; then
        keep_env+=("MCP_BRIDGE_SYSTEM_CONFIG=$MCP_BRIDGE_SYSTEM_CONFIG")
    fi
    printf '[setup-debian] not root: running it again with sudo\n' >&2
    exec sudo -- env ${keep_env[@]+"${keep_env[@]}"} bash "$here/setup-debian.sh" \
        ${args[@]+"${args[@]}"} --cache-dir "$cache_dir"
fi
command -v apt-get >/dev/null || die "apt-get not found: this script is for Debian hosts"
export DEBIAN_FRONTEND=noninteractive
mkdir -p -- "$cache_dir"
cache_dir=$(cd -- "$cache_dir" && pwd)

# apt, waiting for another apt/dpkg run to release its locks.
apt_run() {
    local try
    for try in 1 2 3 4 5 6 7 8 9 10; do
        if apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=3 "$@"; then
            return 0
        fi
        log "apt-get $1 failed (try $try); retrying in 15s"
        sleep 15
    done
    die "apt-get $* kept failing"
}

# --- packages ----------------------------------------------------------------------------------
step "apt-get update"
apt_run update -q >&2

packages=(podman runc catatonit uidmap mmdebstrap debian-archive-keyring ca-certificates curl gzip tar)
# The test command's own tools: scripts/nix-pieces.sh makes a network namespace (iproute2), clones
# the flake (git) and reads TOML with Debian's python3 (3.11, tomllib); util-linux's setpriv and
# nsenter are in every Debian.
if [[ $test_deps -eq 1 ]]; then packages+=(iproute2 git python3); fi
step "installing ${packages[*]}"
apt_run install -y -q --no-install-recommends "${packages[@]}" >&2
log "$(podman --version); $(runc --version | head -n1)"

# A Python >= 3.10 with venv, in `python`: the one on PATH if it fits, else Debian's (installed).
python=""
find_python() {
    [[ -z "$python" ]] || return 0
    local cand
    for cand in python3 /usr/bin/python3; do
        if command -v "$cand" >/dev/null \
            && "$cand" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            python=$(command -v "$cand"); return 0
        fi
    done
    step "installing python3-venv"
    apt_run install -y -q --no-install-recommends python3 python3-venv >&2
    python=/usr/bin/python3
}
# A venv at DIR made by find_python's interpreter (made again if the one it was made from is gone).
make_venv() {
    if [[ -x "$1/bin/python" ]] && ! "$1/bin/python" -c 'import sys' 2>/dev/null; then
        rm -rf -- "$1"
    fi
    [[ -x "$1/bin/python" ]] || { find_python; "$python" -m venv "$1"; }
}

# --- uv ----------------------------------------------------------------------------------------
# The bridge resolves packages on demand on the host with uv (`uv pip compile`). Pinned, from PyPI,
# in a venv of its own; /usr/local/bin/uv points at it unless another uv is already on PATH.
uv_venv="$cache_dir/uv/venv"
uv_bin="$uv_venv/bin/uv"
if [[ "$("$uv_bin" --version 2>/dev/null)" == "uv $UV_VERSION"* ]]; then
    step "uv $UV_VERSION: already in $uv_venv"
else
    step "PyPI: uv==$UV_VERSION (into $uv_venv)"
    make_venv "$uv_venv"
    "$uv_venv/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION" >&2
    [[ "$("$uv_bin" --version 2>/dev/null)" == "uv $UV_VERSION"* ]] \
        || die "uv $UV_VERSION does not run from $uv_bin"
fi
if ! command -v uv >/dev/null; then
    log "linking /usr/local/bin/uv -> $uv_bin"
    mkdir -p /usr/local/bin
    ln -sfn -- "$uv_bin" /usr/local/bin/uv
fi
uv_found=$(command -v uv) || die "uv is not on PATH (PATH=$PATH; it is at $uv_bin)"
log "uv on PATH: $uv_found ($("$uv_found" --version 2>&1))"

# --- podman configuration ----------------------------------------------------------------------
# A drop-in, so that an existing /etc/containers/containers.conf is left as it is (drop-ins win).
conf_dir=/etc/containers/containers.conf.d
conf="$conf_dir/50-mcp-code-bridge.conf"
hard_nofile=$(ulimit -Hn); hard_nproc=$(ulimit -Hu)
nofile=1024; [[ "$hard_nofile" == unlimited || "$hard_nofile" -ge 1024 ]] || nofile=$hard_nofile
nproc=1000; [[ "$hard_nproc" == unlimited || "$hard_nproc" -ge 1000 ]] || nproc=$hard_nproc
step "writing $conf (runtime runc, ulimits nofile=$nofile nproc=$nproc)"
mkdir -p "$conf_dir"
new_conf=$(cat <<EOF
# Written by mcp-code-bridge's scripts/setup-debian.sh.
# crun refuses cgroup v1 hybrid hosts ("cgroups in hybrid mode not supported"): use runc.
# Podman cannot raise rlimits above the host's here (no CAP_SYS_RESOURCE), and its default
# nofile (1048576) makes every container fail to start: keep the defaults at or below the host's.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
EOF
)
if [[ ! -f "$conf" ]] || [[ "$(cat "$conf")" != "$new_conf" ]]; then
    printf '%s\n' "$new_conf" > "$conf"
else
    log "unchanged"
fi

step "checking podman"
runtime=$(podman info --format '{{.Host.OCIRuntime.Name}}') || die "podman info failed"
[[ "$runtime" == runc ]] || die "podman's OCI runtime is '$runtime', expected runc (see $conf)"
log "$(podman info --format 'runtime {{.Host.OCIRuntime.Name}}, cgroup {{.Host.CgroupsVersion}} ({{.Host.CgroupManager}}), rootless {{.Host.Security.Rootless}}, API socket {{.Host.RemoteSocket.Path}}')"
if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
    step "enabling podman.socket (the Docker-compatible API on the default socket)"
    systemctl enable --now podman.socket >&2 || log "could not enable podman.socket; the bridge starts 'podman system service' itself"
fi

# --- subordinate ids: a host uid of each sandbox's own ------------------------------------------
# Rootful podman gives each --userns=auto container a range of its own of the ids that
# /etc/subuid and /etc/subgid list for the name `containers`; the bridge asks for it when they
# hold enough, and then each sandbox runs as a host uid no other sandbox has, so the kernel's
# per-uid limits (RLIMIT_NPROC) and file ownership are per sandbox (`mcp-code-bridge doctor`:
# host identity). A line already there is left as it is; a range is added only where the name
# has too few ids, and overlaps no other line. --rootless-user NAME does the same for a user who
# runs rootless podman (its podman is told with `podman system migrate`).
step "subordinate ids for podman's --userns=auto (containers${rootless_users[*]:+, ${rootless_users[*]}})"
for who in containers ${rootless_users[@]+"${rootless_users[@]}"}; do
    for f in /etc/subuid /etc/subgid; do
        bash "$here/subids.sh" give "$f" "$who"
    done
done
for who in ${rootless_users[@]+"${rootless_users[@]}"}; do
    runuser -u "$who" -- sh -c 'cd ~ && podman system migrate' >&2 \
        || log "podman system migrate as $who failed: its podman sees the new ids once its pause process is gone"
done

# --- Docker --------------------------------------------------------------------------------------
# Debian's docker.io (dockerd, containerd, the runc podman uses too, tini as docker-init). Where
# systemd runs, its postinst enables and starts docker.service, as a user expects; elsewhere it
# would start dockerd through its init script with Docker's default network, which rewrites the
# host's iptables (FORWARD policy DROP) for a bridge the sandbox never uses. There the install
# starts nothing (policy-rc.d) and the daemon is started when wanted (scripts/test.sh does, with
# --iptables=false --bridge=none, and stops it after).
if [[ $docker -eq 1 ]]; then
    if command -v dockerd >/dev/null; then
        step "Docker: $(dockerd --version) already installed"
    else
        step "installing docker.io"
        if [[ -d /run/systemd/system ]]; then
            apt_run install -y -q --no-install-recommends docker.io >&2
        else
            # Debian's container images ship a policy-rc.d of their own (`exit 101`, for `docker
            # build`); another host may have one that allows some services. Either way ours
            # stands in for the install only, and whatever was there comes back exactly (content,
            # mode, owner), also when the install fails.
            policy=/usr/sbin/policy-rc.d
            policy_saved=""
            if [[ -e "$policy" || -L "$policy" ]]; then
                policy_saved=$(mktemp -d /usr/sbin/.policy-rc.d.mcp-code-bridge.XXXXXX)
                mv -- "$policy" "$policy_saved/policy-rc.d"
                log "$policy exists: set aside while docker.io installs, then put back"
            fi
            restore_policy() {
                rm -f -- "$policy"
                if [[ -n "$policy_saved" ]]; then
                    mv -- "$policy_saved/policy-rc.d" "$policy" && rmdir -- "$policy_saved"
                fi
            }
            trap restore_policy EXIT
            printf '#!/bin/sh\n# scripts/setup-debian.sh: installing docker.io starts no daemon\nexit 101\n' \
                > "$policy"
            chmod 0755 "$policy"
            apt_run install -y -q --no-install-recommends docker.io >&2
            restore_policy
            trap - EXIT
        fi
        log "$(dockerd --version)"
    fi
fi

# --- gVisor --------------------------------------------------------------------------------------
# runsc is an OCI runtime podman runs as it runs runc. Two of its global flags are not podman's to
# give: --network=none (runsc refuses a container with networking in the root network namespace,
# which the sandbox's "no network" is) and the platform (how it intercepts system calls: systrap
# and kvm are fast, ptrace works everywhere; kvm hangs where nested virtualisation is off). A
# wrapper passes both, and is what podman knows as the runtime `runsc` (the bridge's default
# gvisor_runtime).
gvisor_wrapper=/usr/local/lib/mcp-code-bridge/runsc
gvisor_conf="$conf_dir/51-mcp-code-bridge-gvisor.conf"
if [[ "$isolation" == gvisor || $test_deps -eq 1 ]]; then
    step "installing gVisor (runsc)"
    apt_run install -y -q --no-install-recommends runsc >&2
    runsc=$(command -v runsc) || die "runsc is not on PATH after installing it"
    log "$("$runsc" --version | head -n1)"
    platform=""
    for p in systrap kvm ptrace; do
        # A platform this runsc does not know fails at once; one that hangs is given 20 s.
        if out=$(timeout 20 "$runsc" --network=none --platform="$p" do /bin/echo ok 2>/dev/null) \
            && [[ "$out" == ok ]]; then
            platform=$p
            break
        fi
        log "platform $p: does not run here"
    done
    [[ -n "$platform" ]] || die "gVisor runs on none of its platforms here (systrap, kvm, ptrace): see 'runsc --platform=ptrace --network=none do /bin/true'"
    log "platform $platform runs here"
    mkdir -p "$(dirname "$gvisor_wrapper")"
    new_wrapper="#!/bin/sh
# Written by mcp-code-bridge's scripts/setup-debian.sh: gVisor as podman's runtime \"runsc\",
# with no network of its own and the platform that runs on this host ($platform). Not
# --oci-seccomp: this runsc answers the profile's refusals with EPERM, select(2) included.
exec $runsc --network=none --platform=$platform \"\$@\""
    if [[ ! -f "$gvisor_wrapper" ]] || [[ "$(cat "$gvisor_wrapper")" != "$new_wrapper" ]]; then
        printf '%s\n' "$new_wrapper" > "$gvisor_wrapper.tmp"
        chmod 755 "$gvisor_wrapper.tmp"
        mv -f "$gvisor_wrapper.tmp" "$gvisor_wrapper"
    fi
    step "writing $gvisor_conf (the runtime runsc: $gvisor_wrapper)"
    new_gconf="# Written by mcp-code-bridge's scripts/setup-debian.sh: gVisor, for bridges with
# isolation = \"gvisor\". podman's default runtime stays runc.
[engine.runtimes]
runsc = [\"$gvisor_wrapper\"]"
    if [[ ! -f "$gvisor_conf" ]] || [[ "$(cat "$gvisor_conf")" != "$new_gconf" ]]; then
        printf '%s\n' "$new_gconf" > "$gvisor_conf"
    else
        log "unchanged"
    fi
fi

env_lines=()

# --- the sandbox image archive -----------------------------------------------------------------
# The bridge's system configuration file; MCP_BRIDGE_SYSTEM_CONFIG moves it, for this script as for
# the bridge (`none` turns it off for the bridge; here it leaves nothing to configure).
system_etc=/etc/mcp-code-bridge/config.toml
etc="${MCP_BRIDGE_SYSTEM_CONFIG-$system_etc}"
case "${etc,,}" in
    ""|none) etc="" ;;
esac
marker="# Written by mcp-code-bridge's scripts/setup-debian.sh --configure."

# The value of a top-level string key in a TOML file (before any [table]), or nothing.
toml_string() {
    [[ -f "$2" ]] || return 0
    awk -v key="$1" '
        /^[[:space:]]*\[/ { exit }
        {
            line = $0
            if (match(line, "^[[:space:]]*" key "[[:space:]]*=[[:space:]]*")) {
                v = substr(line, RLENGTH + 1)
                q = substr(v, 1, 1)
                if (q == "\"" || q == "\047") {
                    v = substr(v, 2); i = index(v, q)
                    if (i > 0) { print substr(v, 1, i - 1); exit }
                }
            }
        }' "$2"
}

build_script="$repo/image/build-debian.sh"
# Build (or reuse) an image archive in DIR with build-debian.sh's ARGS; sets `archive` and `sha`.
# The archive's name is keyed by the script and the arguments, so any change rebuilds it.
build_archive() {
    local dir=$1 key start
    shift
    [[ -x "$build_script" ]] || die "$build_script not found or not executable"
    key=$( { sha256sum < "$build_script"; printf '%s\n' "$@"; } | sha256sum | cut -c1-16)
    archive="$dir/mcp-code-bridge-sandbox-$key.tar"
    mkdir -p "$dir"
    if [[ -f "$archive" && -f "$archive.sha256" ]] \
        && [[ "$(sha256sum < "$archive" | cut -d' ' -f1)" == "$(cat "$archive.sha256")" ]]; then
        step "reusing the image archive $archive (build-debian.sh and options unchanged)"
    else
        step "building the image archive (image/build-debian.sh${*:+ $*})"
        start=$(date +%s)
        rm -f -- "$archive" "$archive.sha256"
        "$build_script" --output "$archive" "$@" >&2
        sha256sum < "$archive" | cut -d' ' -f1 > "$archive.sha256"
        log "built in $(( $(date +%s) - start ))s"
    fi
    [[ -s "$archive" ]] || die "no image archive at $archive"
    sha=$(cat "$archive.sha256")
}

if [[ $build_image -eq 1 ]]; then
    image_dir="$cache_dir/image"
    build_archive "$image_dir" ${build_args[@]+"${build_args[@]}"}
    # The image's name in the engine: tagged with the archive's digest, so that a bridge configured
    # with this archive never runs an image another archive loaded under the same name.
    image="mcp-code-bridge-sandbox:${sha:0:16}"
    log "$(du -h "$archive" | cut -f1) $archive sha256 $sha"
    env_lines+=("MCP_BRIDGE_IMAGE=$image" "MCP_BRIDGE_IMAGE_ARCHIVE=$archive" "MCP_BRIDGE_IMAGE_SHA256=$sha")
fi

# --- the bridge's system configuration ---------------------------------------------------------
# Replace the three image keys of a config file this script wrote, keeping everything else (top
# level keys before any [table] are the image keys' neighbours; the new ones go right after the
# header comments), in one rename.
write_config() {
    local tmp
    mkdir -p "$(dirname -- "$etc")"
    tmp=$(mktemp "$etc.XXXXXX")
    { if [[ -f "$etc" ]]; then cat -- "$etc"; else printf '%s\n' "$marker"; fi; } | awk \
        -v marker="$marker" -v image="$image" -v archive="$archive" -v sha="$sha" \
        -v isolation="$isolation" '
        function keys() {
            print "# The three image keys below are rewritten by each run of it; edit the rest"
            print "# freely, or remove the line above to keep this script away from this file."
            printf "image = \"%s\"\nimage_archive = \"%s\"\nimage_sha256 = \"%s\"\n", image, archive, sha
            if (isolation != "") printf "isolation = \"%s\"\n", isolation
            done = 1
        }
        /^[[:space:]]*\[/ { table = 1 }
        !table && /^[[:space:]]*(image|image_archive|image_sha256)[[:space:]]*=/ { next }
        !table && isolation != "" && /^[[:space:]]*isolation[[:space:]]*=/ { next }
        /^# (Edit freely; remove the line above|The three image keys below|freely, or remove the line above)/ { next }
        header && !done && !/^#/ { keys() }
        { print }
        $0 == marker { header = 1 }
        END { if (!done) keys() }
    ' > "$tmp"
    chmod 644 -- "$tmp"
    mv -f -- "$tmp" "$etc"
}

if [[ $build_image -eq 1 ]]; then
    ours=0
    if [[ -n "$etc" && -f "$etc" ]] && grep -qxF "$marker" "$etc"; then ours=1; fi
    if [[ $configure -eq 1 && -z "$etc" ]]; then
        die "--configure, but MCP_BRIDGE_SYSTEM_CONFIG=none: there is no system configuration file to write"
    elif [[ $configure -eq 1 && -f "$etc" && $ours -eq 0 ]]; then
        log "$etc exists and was not written by this script: left alone. Add to it:"
        log "  image = \"$image\""
        log "  image_archive = \"$archive\""
        log "  image_sha256 = \"$sha\""
        if [[ -n "$isolation" ]]; then log "  isolation = \"$isolation\""; fi
    elif [[ $configure -eq 1 ]]; then
        step "writing $etc (image, image archive and its sha256${isolation:+, isolation $isolation})"
        write_config
        log "image = \"$image\"; image_archive = \"$archive\""
    elif [[ $ours -eq 1 && "$(toml_string image_archive "$etc")" == "$archive" ]] \
        && [[ "$(toml_string image_sha256 "$etc")" != "$sha" || "$(toml_string image "$etc")" != "$image" ]]; then
        # The configured archive was rebuilt in place: its digest (and image name) follow.
        step "updating $etc: its archive was rebuilt (new sha256 $sha)"
        write_config
    fi
fi

# Drop archives built by other versions of the script or with other options, except one that a
# system configuration still names (a bridge set up with --configure keeps working).
if [[ $build_image -eq 1 ]]; then
    for old in "$image_dir"/mcp-code-bridge-sandbox-*.tar; do
        [[ -e "$old" && "$old" != "$archive" ]] || continue
        keep=""
        for file in "$etc" "$system_etc"; do
            named=$(toml_string image_archive "$file")
            if [[ -n "$named" && "$(realpath -m -- "$named")" == "$(realpath -m -- "$old")" ]]; then
                keep=$file
                break
            fi
        done
        if [[ -n "$keep" ]]; then
            log "keeping $old: $keep names it (run with --configure to move the bridge to the new archive)"
            continue
        fi
        log "deleting $old (an older build)"
        rm -f -- "$old" "$old.sha256"
    done
fi

# --- the data profile's image for the tests (tests/e2e/data_image.rs) --------------------------------
# In a directory of its own: each build keeps only its own archive there, so neither the default
# image's build nor this one deletes the other's.
if [[ $test_deps -eq 1 && $build_image -eq 1 ]]; then
    main_archive=${archive:-}
    main_sha=${sha:-}
    build_archive "$cache_dir/image-data" --profile data
    for old in "$cache_dir/image-data"/mcp-code-bridge-sandbox-*.tar; do
        [[ -e "$old" && "$old" != "$archive" ]] || continue
        log "deleting $old (an older build of the data image)"
        rm -f -- "$old" "$old.sha256"
    done
    env_lines+=("MCP_BRIDGE_TEST_DATA_IMAGE_ARCHIVE=$archive")
    archive=$main_archive
    sha=$main_sha
fi

# --- MCP servers for the tests -----------------------------------------------------------------
if [[ $test_deps -eq 1 ]]; then
    servers="$cache_dir/test-servers"
    bin="$servers/bin"
    mkdir -p "$servers/npm" "$bin"

    if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
        step "installing nodejs and npm"
        apt_run install -y -q --no-install-recommends nodejs npm >&2
    fi
    step "npm: ${NPM_PACKAGES[*]} (node $(node --version))"
    npm install --prefix "$servers/npm" --no-audit --no-fund --no-update-notifier --loglevel=error \
        "${NPM_PACKAGES[@]}" >&2

    venv="$servers/venv"
    find_python
    step "PyPI: ${PIP_PACKAGES[*]} (venv from $("$python" --version 2>&1))"
    make_venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${PIP_PACKAGES[@]}" >&2

    step "npm (Node 22): ${NODE22_PACKAGES[*]}"
    mkdir -p "$servers/node22"
    npm install --prefix "$servers/node22" --no-audit --no-fund --no-update-notifier --loglevel=error \
        "${NODE22_PACKAGES[@]}" >&2
    node22_bin="$servers/node22/node_modules/.bin"
    "$node22_bin/node" --version >/dev/null || die "the npm registry's Node 22 does not run here"
    for exe in conformance mcp-inspector; do
        rm -f -- "$bin/$exe"
        printf '#!/bin/sh\nPATH=%q:"$PATH" exec %q "$@"\n' "$node22_bin" "$node22_bin/$exe" > "$bin/$exe"
        chmod +x "$bin/$exe"
    done

    for exe in mcp-server-everything mcp-server-filesystem; do
        ln -sfn "$servers/npm/node_modules/.bin/$exe" "$bin/$exe"
    done
    for exe in mcp-server-time mcp-server-git; do
        ln -sfn "$venv/bin/$exe" "$bin/$exe"
    done
    # Python with the mcp SDK (a test client). A wrapper, not a symlink: a symlinked venv python
    # outside the venv's bin/ does not find the venv's site-packages.
    rm -f -- "$bin/mcp-python"
    printf '#!/bin/sh\nexec %q "$@"\n' "$venv/bin/python" > "$bin/mcp-python"
    chmod +x "$bin/mcp-python"

    step "checking the test servers answer initialize + tools/list"
    "$bin/mcp-server-time" --help >/dev/null
    scratch=$(mktemp -d)
    "$bin/mcp-python" - "$bin" "$scratch" <<'EOF' >&2
import json, os, select, subprocess, sys, time
bin_dir, scratch = sys.argv[1], sys.argv[2]
servers = [["mcp-server-everything"], ["mcp-server-filesystem", scratch], ["mcp-server-time"],
           ["mcp-server-git"]]
for argv in servers:
    p = subprocess.Popen([os.path.join(bin_dir, argv[0])] + argv[1:], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    def send(m):
        p.stdin.write((json.dumps(m) + "\n").encode()); p.stdin.flush()
    def recv(want, deadline=time.time() + 60):
        while time.time() < deadline:
            if not select.select([p.stdout], [], [], deadline - time.time())[0]:
                break
            line = p.stdout.readline()
            if not line:
                break
            msg = json.loads(line)
            if msg.get("id") == want:
                return msg["result"]
        sys.exit(f"{argv[0]}: no answer to request {want}")
    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "setup-debian", "version": "0"}}})
        info = recv(1)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        tools = recv(2)["tools"]
        print(f"    {argv[0]}: {info['serverInfo']['name']} {info['serverInfo'].get('version', '')}, "
              f"{len(tools)} tools")
    finally:
        p.kill(); p.wait()
import mcp  # the SDK the tests use as a client
print(f"    python mcp SDK importable ({sys.version.split()[0]})")
EOF
    rm -rf -- "$scratch"
    env_lines+=("MCP_BRIDGE_TEST_SERVERS_BIN=$bin")
fi

# --- real wheels for the package tests ----------------------------------------------------------
# For CPython 3.14 on manylinux x86_64, whatever this host runs: tests/fixtures/pyindex.py serves
# them as a local index, and the bridge's `find_links` reads the directory itself. Each file is
# checked against its pinned sha256, and one already there with that digest is not fetched again.
if [[ $test_deps -eq 1 ]]; then
    wheels="$cache_dir/wheels"
    mkdir -p "$wheels"
    step "wheels for the package tests (cp314 manylinux x86_64) in $wheels"
    for entry in "${TEST_WHEELS[@]}"; do
        read -r spec file digest <<< "$entry"
        if [[ -f "$wheels/$file" && "$(sha256sum < "$wheels/$file" | cut -d' ' -f1)" == "$digest" ]]; then
            log "$file: present"
            continue
        fi
        rm -f -- "$wheels/$file"
        scratch=$(mktemp -d "$wheels/.download.XXXXXX")
        # uv has no `uv pip download` up to this pin; use it if a later one has it.
        if ! { "$uv_bin" pip download --help >/dev/null 2>&1 \
                && "$uv_bin" pip download --quiet --no-deps --only-binary :all: --python-version 3.14 \
                    --python-platform x86_64-manylinux_2_28 -d "$scratch" "$spec" >&2; }; then
            "$uv_venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
                --only-binary :all: --python-version 3.14 --platform manylinux_2_28_x86_64 \
                --implementation cp -d "$scratch" "$spec" >&2 \
                || { rm -rf -- "$scratch"; die "could not download $spec"; }
        fi
        [[ -f "$scratch/$file" ]] \
            || { ls -- "$scratch" >&2; rm -rf -- "$scratch"; die "$spec: expected $file"; }
        got=$(sha256sum < "$scratch/$file" | cut -d' ' -f1)
        [[ "$got" == "$digest" ]] \
            || { rm -rf -- "$scratch"; die "$file: sha256 $got, expected $digest"; }
        mv -f -- "$scratch/$file" "$wheels/$file"
        rm -rf -- "$scratch"
        log "$file: downloaded"
    done
    # Wheels of earlier pins would be served too: the directory holds these and nothing else.
    for old in "$wheels"/*.whl; do
        [[ -e "$old" ]] || continue
        keep=0
        for entry in "${TEST_WHEELS[@]}"; do
            read -r _ file _ <<< "$entry"
            if [[ "$(basename -- "$old")" == "$file" ]]; then keep=1; break; fi
        done
        if [[ $keep -eq 0 ]]; then
            log "deleting $old (not pinned)"
            rm -f -- "$old"
        fi
    done
    env_lines+=("MCP_BRIDGE_TEST_WHEELHOUSE=$wheels")
fi

# --- summary -----------------------------------------------------------------------------------
env_file="$cache_dir/setup.env"
# With --no-image, the image lines of the last run that built the images stay.
tmp_env=$(mktemp "$env_file.XXXXXX")
if [[ $build_image -eq 0 && -f "$env_file" ]]; then
    grep -E '^(MCP_BRIDGE_IMAGE|MCP_BRIDGE_IMAGE_ARCHIVE|MCP_BRIDGE_IMAGE_SHA256|MCP_BRIDGE_TEST_DATA_IMAGE_ARCHIVE)=' \
        -- "$env_file" > "$tmp_env" || true
fi
for line in ${env_lines[@]+"${env_lines[@]}"}; do
    printf '%s=%q\n' "${line%%=*}" "${line#*=}" >> "$tmp_env"
done
chmod 644 -- "$tmp_env"
mv -f -- "$tmp_env" "$env_file"
step "done; these settings (shell syntax) are also in $env_file"
cat "$env_file"
printf '# uv (packages on demand): %s, %s\n' "$uv_found" "$("$uv_found" --version 2>&1)"

#!/usr/bin/env bash
# scripts/check-setup.sh --configure|--test-deps [--cache-dir DIR]: is everything the README's
# commands need on this machine, as scripts/setup-debian.sh left it? One line per missing piece, then
# "check-setup: N passed, N failed"; exits non-zero when anything is missing.
#   --configure   the first command (`setup-debian.sh --configure && cargo run --release`): the
#                 container engine and what the bridge runs (podman, runc, catatonit, uv), and
#                 /etc/mcp-code-bridge/config.toml naming an image archive that matches its sha256;
#   --test-deps   the second command (`scripts/test.sh`): all that, but the configuration file, and
#                 the test servers, SDKs and Node builds, the wheelhouse, gVisor, Docker and the
#                 tools of the Nix pieces (scripts/nix-pieces.sh).
# scripts/test.sh runs it before any test; scripts/fresh-machine.sh runs it in a fresh Debian root
# file system after the set-up, which is how CI proves that the set-up installs all of it. The Rust
# toolchain is the user's (README), so it is not checked here.
set -euo pipefail

mode=""
cache_dir="${MCP_CODE_BRIDGE_CACHE_DIR:-/var/cache/mcp-code-bridge}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --configure|--test-deps) mode=${1#--}; shift ;;
        --cache-dir) [[ $# -ge 2 ]] || { echo "check-setup: --cache-dir needs a value" >&2; exit 2; }
            cache_dir=$2; shift 2 ;;
        *) echo "usage: scripts/check-setup.sh --configure|--test-deps [--cache-dir DIR]" >&2; exit 2 ;;
    esac
done
[[ -n "$mode" ]] || { echo "usage: scripts/check-setup.sh --configure|--test-deps [--cache-dir DIR]" >&2; exit 2; }

passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); printf 'check-setup: missing: %s\n' "$*" >&2; }
# check WHAT COMMAND...: COMMAND succeeds, quietly.
check() { local what=$1; shift; if "$@" >/dev/null 2>&1; then ok; else bad "$what"; fi; }
have() { check "$1 on PATH${2:+ ($2)}" command -v "$1"; }

# What the bridge itself runs, for either command.
have podman "apt-get install podman"
check "podman answers (podman info)" podman info
have runc "apt-get install runc"
check "podman's OCI runtime is runc (/etc/containers/containers.conf.d/50-mcp-code-bridge.conf)" \
    test "$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>/dev/null)" = runc
check "catatonit (podman --init): apt-get install catatonit" \
    test -x /usr/libexec/podman/catatonit -o -x /usr/bin/catatonit
for f in /etc/subuid /etc/subgid; do
    check "subordinate ids of containers in $f, for a host uid of each sandbox's own (scripts/setup-debian.sh gives them)" \
        bash "$(dirname -- "${BASH_SOURCE[0]}")/subids.sh" check "$f" containers
done
have mmdebstrap "image/build-debian.sh builds the image with it"
have uv "scripts/setup-debian.sh links /usr/local/bin/uv"
check "uv runs" uv --version

env_file="$cache_dir/setup.env"
check "$env_file (written by scripts/setup-debian.sh)" test -s "$env_file"
MCP_BRIDGE_IMAGE_ARCHIVE="" MCP_BRIDGE_IMAGE_SHA256="" MCP_BRIDGE_TEST_SERVERS_BIN=""
MCP_BRIDGE_TEST_DATA_IMAGE_ARCHIVE="" MCP_BRIDGE_TEST_WHEELHOUSE=""
# shellcheck disable=SC1090
[[ ! -s "$env_file" ]] || . "$env_file"
check "the image archive (MCP_BRIDGE_IMAGE_ARCHIVE in $env_file)" test -s "$MCP_BRIDGE_IMAGE_ARCHIVE"

if [[ $mode == configure ]]; then
    etc=/etc/mcp-code-bridge/config.toml
    check "$etc" test -s "$etc"
    archive=$(awk -F'"' '/^image_archive[[:space:]]*=/ { print $2; exit }' "$etc" 2>/dev/null || true)
    sha=$(awk -F'"' '/^image_sha256[[:space:]]*=/ { print $2; exit }' "$etc" 2>/dev/null || true)
    check "the archive $etc names (image_archive = \"$archive\")" test -s "$archive"
    check "that archive's sha256 is $etc's image_sha256" \
        test "$(sha256sum < "$archive" 2>/dev/null | cut -d' ' -f1)" = "$sha"
fi

if [[ $mode == test-deps ]]; then
    bin=$MCP_BRIDGE_TEST_SERVERS_BIN
    check "the test servers (MCP_BRIDGE_TEST_SERVERS_BIN in $env_file)" test -d "$bin"
    for exe in mcp-server-everything mcp-server-filesystem mcp-server-time mcp-server-git \
               mcp-python conformance mcp-inspector; do
        check "test server $exe in $bin" test -x "$bin/$exe"
    done
    check "the Python SDK, pytest and the fixtures' packages in mcp-python" "$bin/mcp-python" -c \
        'import mcp, pytest, pandas, matplotlib, nbformat, cloudpickle, opentelemetry.proto, google.protobuf'
    check "Node 22 for the conformance suite and the Inspector (conformance --help)" \
        timeout 60 "$bin/conformance" --help
    check "node and npm (the npm servers and the TypeScript SDK)" command -v node npm
    check "the data profile's image (MCP_BRIDGE_TEST_DATA_IMAGE_ARCHIVE)" \
        test -s "$MCP_BRIDGE_TEST_DATA_IMAGE_ARCHIVE"
    check "wheels in the wheelhouse (MCP_BRIDGE_TEST_WHEELHOUSE)" \
        compgen -G "$MCP_BRIDGE_TEST_WHEELHOUSE/*.whl"
    have runsc "gVisor: apt-get install runsc"
    check "the runsc wrapper podman runs (/usr/local/lib/mcp-code-bridge/runsc)" \
        test -x /usr/local/lib/mcp-code-bridge/runsc
    check "podman knows the runtime runsc (51-mcp-code-bridge-gvisor.conf)" \
        test -s /etc/containers/containers.conf.d/51-mcp-code-bridge-gvisor.conf
    have dockerd "apt-get install docker.io"
    have docker "apt-get install docker.io"
    # scripts/nix-pieces.sh: a network namespace, a test user, the flake's clone, tomllib.
    for tool in ip nsenter setpriv git useradd; do have "$tool"; done
    check "python3 >= 3.11 (tomllib) at /usr/bin/python3" /usr/bin/python3 -c 'import tomllib'
fi

printf 'check-setup (%s): %d passed, %d failed\n' "$mode" "$passed" "$failed" >&2
[[ $failed -eq 0 ]]

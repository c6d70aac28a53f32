#!/usr/bin/env bash
# The test command: `scripts/test.sh` as root (or `sudo scripts/test.sh`; run as another user, it
# runs itself again with sudo) from a checkout on a Debian 12 (or later) host.
# Installs podman/runc/mmdebstrap and the test MCP servers (scripts/setup-debian.sh --test-deps),
# builds (or reuses) the sandbox image archive, then runs the runtime's pytest suite and the Rust
# test suite against real podman and real MCP servers. Nothing is skipped: a missing podman, image
# or server is a failure. It builds the same archive as `scripts/setup-debian.sh --configure`, never
# touches /etc/mcp-code-bridge/config.toml, and the tests do not read it (MCP_BRIDGE_SYSTEM_CONFIG),
# so a bridge set up before keeps working. CI (.ci/run) runs exactly this.
set -euo pipefail

# Each step says when it started (seconds into the run), so a slow run shows where its time went.
step() { printf '\n==> [test] %s (at %d s)\n' "$*" "$SECONDS" >&2; }
die() { printf '[test] error: %s\n' "$*" >&2; exit 1; }

cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
repo=$(pwd)
start=$(date +%s)

if [[ $(id -u) -ne 0 ]]; then
    # The set-up installs packages, and the tests use rootful podman and create a test user.
    command -v sudo >/dev/null || die "run as root (and sudo is not installed)"
    printf '[test] not root: running it again with sudo\n' >&2
    exec sudo -- bash "$repo/scripts/test.sh" "$@"
fi

export DEBIAN_FRONTEND=noninteractive
export CI="${CI:-true}"
# Outside the repository, reused across runs on the same machine.
cache_dir="${MCP_CODE_BRIDGE_CACHE_DIR:-/var/cache/mcp-code-bridge}"
if [[ -d "${HOME:-/root}/.cargo/bin" ]]; then export PATH="${HOME:-/root}/.cargo/bin:$PATH"; fi

step "host: $(. /etc/os-release && echo "$PRETTY_NAME"), $(uname -r), $(nproc) cpus, user $(id -un)"

step "setup: scripts/setup-debian.sh --test-deps"
bash scripts/setup-debian.sh --test-deps --cache-dir "$cache_dir" < /dev/null
# Read (not export) what setup wrote: the tests get only the MCP_BRIDGE_TEST_* variables, so that
# config tests see no stray MCP_BRIDGE_* settings.
MCP_BRIDGE_IMAGE_ARCHIVE="" MCP_BRIDGE_TEST_SERVERS_BIN="" MCP_BRIDGE_TEST_DATA_IMAGE_ARCHIVE=""
MCP_BRIDGE_TEST_WHEELHOUSE=""
# shellcheck disable=SC1091
. "$cache_dir/setup.env"

step "checking what the tests need (scripts/check-setup.sh --test-deps)"
bash scripts/check-setup.sh --test-deps --cache-dir "$cache_dir" < /dev/null \
    || die "the set-up left something out (above); scripts/setup-debian.sh --test-deps installs it"
command -v cargo >/dev/null \
    || die "cargo not found for $(id -un): install Rust for this user (https://rustup.rs)"
# The last step, the Nix pieces, evaluates the flake offline: whether it can is known now.
bash scripts/nix-pieces.sh --preflight < /dev/null \
    || die "the Nix pieces (the last step) could not run (above)"
[[ -f Cargo.toml ]] || die "no Cargo.toml in $repo"

export MCP_BRIDGE_TEST_IMAGE_ARCHIVE="$MCP_BRIDGE_IMAGE_ARCHIVE"
export MCP_BRIDGE_TEST_SERVERS_BIN MCP_BRIDGE_TEST_DATA_IMAGE_ARCHIVE MCP_BRIDGE_TEST_WHEELHOUSE
unset MCP_BRIDGE_IMAGE MCP_BRIDGE_IMAGE_ARCHIVE MCP_BRIDGE_IMAGE_SHA256
export PATH="$MCP_BRIDGE_TEST_SERVERS_BIN:$PATH"
printf '    MCP_BRIDGE_TEST_IMAGE_ARCHIVE=%s\n    MCP_BRIDGE_TEST_SERVERS_BIN=%s\n    MCP_BRIDGE_TEST_WHEELHOUSE=%s\n    setup took %ss\n' \
    "$MCP_BRIDGE_TEST_IMAGE_ARCHIVE" "$MCP_BRIDGE_TEST_SERVERS_BIN" "$MCP_BRIDGE_TEST_WHEELHOUSE" \
    "$(( $(date +%s) - start ))" >&2

step "pytest image/tests (the sandbox runtime, frame by frame)"
"$MCP_BRIDGE_TEST_SERVERS_BIN/mcp-python" -m pytest -q -p no:cacheprovider image/tests < /dev/null

# The unit tests in the dev profile (unoptimised, incremental): they need no speed, and building
# the crate's tests a second time optimised cost 6 minutes of the CI run. The integration tests
# (e2e against the optimised binary, the shape guards) in the release profile, the build of
# README's first command: its ~400 dependencies and our crates are reused and only the test
# binaries are built, so they test the binary users get. (In the incremental `dev-release`
# profile they were a second optimised build of everything: 14 min 5 s of the 34 min this command
# ran on a fresh 2-core machine after the first command, BENCHMARKS.md "The build".) While
# changing code, `--profile dev-release` rebuilds a change in seconds (Cargo.toml).
step "cargo test --locked --no-fail-fast --workspace --lib --bins (the unit tests of every crate, dev profile)"
cargo --version >&2
# A failure here is reported at the end, after the integration tests have run too.
unit_status=0
cargo test --locked --no-fail-fast --workspace --lib --bins -- --test-threads=2 < /dev/null || unit_status=$?

step "cargo test --release --locked --no-fail-fast --test '*' -- --test-threads=2 (all but the rootless tests)"
# The conformance suite runs on its own below, where its summary is printed.
# The rootless tests (every test whose name says rootless) run on their own below.
cargo test --release --locked --no-fail-fast --test '*' -- --test-threads=2 \
    --skip official_conformance_suite --skip rootless < /dev/null

# Rootless podman here stores images and containers with vfs (full copies): removing a container
# takes seconds of disk work, which the rest of the suite running beside it made outlast the
# bridge's shutdown. One at a time (common::rootless::TURN), with nothing else running.
step "the rootless tests, alone"
cargo test --release --locked --no-fail-fast --test e2e -- --test-threads=2 rootless < /dev/null

# Suites a second time with every sandbox under gVisor (isolation = "gvisor", the runtime runsc
# that setup registered, ptrace platform): the suites where the sandbox's kernel answers. 72 tests,
# 207 s on the 2-core machine (the pass of 99 that also ran the bridge's own logic: 288 s):
# - security:: all of it: the network's walls, the filesystem, privilege and the attacks on the
#   channel. Every wall is a different kernel's answer under gVisor; where gVisor answers
#   differently the test asserts gVisor's answer (SECURITY.md, Kernel isolation).
# - sandbox:: the limits (read on the host: gVisor shows no cgroup files), pids (nproc under
#   gVisor), memory, timeouts and interrupts (signals through gVisor's kernel).
# - hostile:: the channel is a host file under gVisor (short writes, other fd names).
# - files:: files out come back through the channel under gVisor, not through the engine.
# - packages::an_allowed_install_works_and_changes_nothing_else: the install directory is a
#   bind mount served by gVisor's gofer (read-only, C extensions load), not the host's kernel;
#   packages::the_package_mount_names_nothing_of_the_host: what gVisor shows of its source.
# - snapshots::a_session_closed_idle_ and snapshots::a_fork_diverges_: a session's state
#   streamed out of and into gVisor's kernel over the channel (no parking under gVisor: the
#   snapshot is how its sessions outlive their sandbox).
# - faults::resources_ (fork and memory bombs, a full tmpfs, a CPU spin measured on the host,
#   output floods) and faults_lifecycle::lifecycle_ (SIGTERM, SIGKILL and its orphans, the idle
#   reaper, a restarted podman service run with --runtime runsc): gVisor's kernel dies or is
#   killed differently; where it answers differently the test asserts gVisor's answer.
# - tenancy:: one identity's sessions at their task limits and another's new session: under gVisor
#   every sandbox's kernel runs as the host's nobody, so the bound is gVisor's and the pids cgroup.
# - inputs::declared_inputs_are_copied_in_and_nothing_else_of_the_host: the inputs are unpacked by
#   a process run in the sandbox (an exec), which gVisor's kernel runs.
# Not here, because the sandbox's kernel plays no part in what they assert: policy:: and proxy::
# (the bridge's rules and relay; their calls cross the same channel hostile:: and security::
# attack under gVisor), pool:: (the bridge's pool accounting and timing), faults::upstream_/
# client_ (the bridge's side of the channel), faults_lifecycle::own_service_ (podman's service,
# not the sandbox; its linger is not used under gVisor, whose service runs runsc by default and
# goes with its bridge), the hundred sessions (the bridge's accounting; 100 gVisor starts would
# cost minutes), isolation:: (above: it asks for gVisor itself).
gvisor_suites=(security:: sandbox:: hostile:: files::
    packages::an_allowed_install_works_and_changes_nothing_else
    packages::the_package_mount_names_nothing_of_the_host
    snapshots::a_session_closed_idle_ snapshots::a_fork_diverges_
    faults::resources_ faults_lifecycle::lifecycle_ tenancy::
    inputs::declared_inputs_are_copied_in_and_nothing_else_of_the_host)
step "under gVisor: ${gvisor_suites[*]} (MCP_BRIDGE_TEST_ISOLATION=gvisor)"
gvisor_start=$(date +%s)
MCP_BRIDGE_TEST_ISOLATION=gvisor cargo test --release --locked --no-fail-fast --test e2e -- \
    --test-threads=2 "${gvisor_suites[@]}" --skip lifecycle_a_hundred_sessions < /dev/null
printf '    the gVisor pass took %ss\n' "$(( $(date +%s) - gvisor_start ))" >&2

step "the official MCP conformance suite against serve, at 2025-11-25 and 2026-07-28 (tests/e2e/conformance.rs)"
# One revision after the other, so each summary prints whole.
cargo test --release --locked --test e2e -- conformance:: --nocapture --test-threads=1 < /dev/null

# --- against Docker ------------------------------------------------------------------------------
# The sandbox, security and proxy suites a second time with every bridge on a real Docker daemon
# (runtime = "docker", MCP_BRIDGE_TEST_ENGINE=docker): the hardened container, its limits and walls,
# the proxied calls as Docker's API and runc make them, the tenants' task limits and the inputs
# unpacked by an exec. Where no daemon answers, one is started
# here for this pass only (no Docker network, so the host's firewall is untouched) and stopped
# after: where no podman socket listens, a Docker socket is what `runtime = "auto"` takes, and the
# passes above are podman's.
docker_suites=(sandbox:: security:: proxy:: tenancy::
    inputs::declared_inputs_are_copied_in_and_nothing_else_of_the_host)
step "against Docker: ${docker_suites[*]} (MCP_BRIDGE_TEST_ENGINE=docker)"
command -v dockerd >/dev/null || die "dockerd is not installed (scripts/setup-debian.sh --docker)"
dockerd_pid=""
stop_dockerd() {
    [[ -n "$dockerd_pid" ]] || return 0
    kill "$dockerd_pid" 2>/dev/null || true
    wait "$dockerd_pid" 2>/dev/null || true
    dockerd_pid=""
}
if ! timeout 20 docker info >/dev/null 2>&1; then
    dockerd --iptables=false --bridge=none >"$cache_dir/dockerd.log" 2>&1 < /dev/null &
    dockerd_pid=$!
    trap stop_dockerd EXIT
    for _ in $(seq 1 60); do
        timeout 10 docker info >/dev/null 2>&1 && break
        kill -0 "$dockerd_pid" 2>/dev/null || die "dockerd exited: $(tail -n 20 "$cache_dir/dockerd.log")"
        sleep 1
    done
    timeout 10 docker info >/dev/null 2>&1 || die "dockerd did not answer in 60s: $(tail -n 20 "$cache_dir/dockerd.log")"
fi
printf '    %s\n' "$(docker version --format 'Docker {{.Server.Version}} (API {{.Server.APIVersion}})')" >&2
docker_start=$(date +%s)
MCP_BRIDGE_TEST_ENGINE=docker cargo test --release --locked --no-fail-fast --test e2e -- \
    --test-threads=2 "${docker_suites[@]}" < /dev/null
printf '    the Docker pass took %ss\n' "$(( $(date +%s) - docker_start ))" >&2
stop_dockerd
trap - EXIT

# --- the Nix pieces -------------------------------------------------------------------------------
# What the NixOS VM tests and the modules run (the probes, the units, config.toml, the runsc
# wrapper), taken from the offline evaluation and run against the release binary and real
# podman, each unit as its own user (docs/nix.md, VM tests); about 3 minutes.
bridge="${CARGO_TARGET_DIR:-target}/release/mcp-code-bridge"
step "the Nix pieces on Debian: scripts/nix-pieces.sh $bridge"
bash scripts/nix-pieces.sh "$bridge" < /dev/null
# ----------------------------------------------------------------------------------------------------

[[ $unit_status -eq 0 ]] || die "the unit tests failed (the dev-profile cargo test above)"
step "all done in $(( $(date +%s) - start ))s"

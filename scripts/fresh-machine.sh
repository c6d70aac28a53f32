#!/usr/bin/env bash
# scripts/fresh-machine.sh [--cache-dir DIR] [--keep]: the README's set-up on a fresh Debian 12 root
# file system, as root. What a machine set up by hand has and a new one lacks (a package installed
# once, a file another tool left) stays invisible to a test run on the same machine; here nothing
# was there before.
#
# The root file system is Debian 12 (`mmdebstrap --variant=minbase`, as image/build-debian.sh makes
# the image) with the `/usr/sbin/policy-rc.d` that Debian's container images ship (`exit 101`):
# what a user who starts from such an image, or a CI runner, has. In it, in a mount and PID
# namespace of its own whose root it is (pivot_root, so that podman and runc inside work as on a
# host), from a copy of this checkout's tracked files:
#   1. scripts/setup-debian.sh --configure   (the README's first command, before `cargo run`),
#      then scripts/check-setup.sh --configure: podman answers, the configured archive matches;
#   2. scripts/setup-debian.sh --test-deps   (what scripts/test.sh runs first),
#      then scripts/check-setup.sh --test-deps: every tool, server and SDK the tests use;
#   3. both again, in the same order: the README says they work in either order and again.
# The Rust toolchain is the user's (README) and is not installed here.
#
# Cached between runs, in DIR/fresh-machine (DIR: --cache-dir, $MCP_CODE_BRIDGE_CACHE_DIR or
# /var/cache/mcp-code-bridge): the base root file system (rebuilt when its recipe changes or after
# 14 days) and what was downloaded (apt's .deb files, npm's and pip's caches), never a result:
# every package is installed, every image built and every venv made anew each run.
# Prints each step's output to its log (DIR/fresh-machine/last.log) and a summary; ends with
# "fresh-machine: N passed, N failed" and exits non-zero on any failure.
set -euo pipefail

die() { printf 'fresh-machine: error: %s\n' "$*" >&2; exit 2; }

# --- inside the fresh root (run by the outer part below, never by hand) --------------------------
if [[ "${1:-}" == --inside ]]; then
    cd /src
    passed=0 failed=0
    run() { # NAME COMMAND...: one step, timed
        local name=$1 start=$SECONDS; shift
        printf '\n=== fresh-machine: %s\n' "$name"
        if "$@" < /dev/null; then
            passed=$((passed + 1))
            printf '=== fresh-machine: ok %s (%ds)\n' "$name" $((SECONDS - start))
        else
            failed=$((failed + 1))
            printf '=== fresh-machine: FAILED %s (%ds)\n' "$name" $((SECONDS - start))
            return 1
        fi
    }
    # What the machine had before (Debian's container images' policy-rc.d) must be there after.
    cp -a /usr/sbin/policy-rc.d /run/policy-rc.d.before
    for round in 1 2; do
        run "round $round: scripts/setup-debian.sh --configure" bash scripts/setup-debian.sh --configure \
            && run "round $round: scripts/check-setup.sh --configure" bash scripts/check-setup.sh --configure \
            && run "round $round: scripts/setup-debian.sh --test-deps" bash scripts/setup-debian.sh --test-deps \
            && run "round $round: scripts/check-setup.sh --test-deps" bash scripts/check-setup.sh --test-deps \
            || break
    done
    run "/usr/sbin/policy-rc.d as it was before the set-up (content and mode)" \
        bash -c 'cmp /run/policy-rc.d.before /usr/sbin/policy-rc.d \
            && [[ $(stat -c %a%U /run/policy-rc.d.before) == $(stat -c %a%U /usr/sbin/policy-rc.d) ]]' \
        || true
    printf '=== fresh-machine: inside: %d passed, %d failed\n' "$passed" "$failed"
    [[ $failed -eq 0 && $passed -eq 9 ]]
    exit
fi

# --- outside -------------------------------------------------------------------------------------
cache_dir="${MCP_CODE_BRIDGE_CACHE_DIR:-/var/cache/mcp-code-bridge}"
keep=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cache-dir) [[ $# -ge 2 ]] || die "--cache-dir needs a value"; cache_dir=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) die "usage: scripts/fresh-machine.sh [--cache-dir DIR] [--keep]" ;;
    esac
done
[[ $(id -u) -eq 0 ]] || die "run as root (it makes a root file system and namespaces)"
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
started=$SECONDS
for tool in mmdebstrap unshare pivot_root tar git; do
    command -v "$tool" >/dev/null || {
        [[ $tool == mmdebstrap ]] || die "$tool is not installed"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            --no-install-recommends mmdebstrap debian-archive-keyring >&2 < /dev/null
    }
done
dir="$cache_dir/fresh-machine"
mkdir -p "$dir/apt/partial" "$dir/npm" "$dir/pip"
log="$dir/last.log"
: > "$log"

# The Debian mirror this host's apt uses (as image/build-debian.sh finds it), for bookworm, its
# updates and its security archive: the sources a Debian 12 machine comes with.
mirror=$(apt-get indextargets --format '$(ORIGIN)|$(LABEL)|$(REPO_URI)' 2>/dev/null \
    | awk -F'|' '$1 == "Debian" && $2 == "Debian" { print $3; exit }')
mirror=${mirror%/}
[[ -n "$mirror" ]] || mirror=http://deb.debian.org/debian
security=${mirror%/debian}/debian-security
sources=("deb $mirror bookworm main" "deb $mirror bookworm-updates main"
         "deb $security bookworm-security main")
policy='#!/bin/sh
# As in Debian'"'"'s container images: "apt-get install" starts no service.
exit 101'
recipe=$(printf '%s\n' "minbase" "${sources[@]}" "recipe 1")
key=$(printf '%s' "$recipe" | sha256sum | cut -c1-16)
base="$dir/bookworm-minbase-$key.tar"
if [[ -f "$base" ]] && [[ -n "$(find "$base" -mtime -14)" ]]; then
    printf 'fresh-machine: the base root file system: %s (cached)\n' "$base" >&2
else
    printf 'fresh-machine: making the base root file system (mmdebstrap --variant=minbase bookworm)\n' >&2
    rm -f -- "$dir"/bookworm-minbase-*.tar
    # shellcheck disable=SC2016 # expanded by mmdebstrap's hook shell
    mmdebstrap --variant=minbase --format=tar \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
        bookworm "$base.partial" "${sources[@]}" >> "$log" 2>&1 \
        || { tail -n 30 "$log" >&2; die "mmdebstrap failed (log: $log)"; }
    mv -f -- "$base.partial" "$base"
fi
# Downloads older than 60 days are not what a current set-up fetches.
find "$dir/apt" "$dir/npm" "$dir/pip" -type f -mtime +60 -delete 2>/dev/null || true

root=$(mktemp -d /var/tmp/mcp-code-bridge-fresh.XXXXXX)
cleanup() {
    if [[ $keep -eq 1 ]]; then
        printf 'fresh-machine: kept the root file system %s\n' "$root" >&2
    else
        # The mounts were in the namespace, gone with it: what is left are plain directories.
        rm -rf --one-file-system -- "$root"
    fi
}
trap cleanup EXIT
tar -xf "$base" -C "$root"
# mmdebstrap removes the policy-rc.d it used while installing, after every hook: the image's is
# written here.
printf '%s\n' "$policy" > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
mkdir -p "$root/src"
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
    # The files of the checkout as they are in the work tree (tracked, and new ones not ignored).
    git -C "$repo" ls-files -z --cached --others --exclude-standard \
        | tar -C "$repo" --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$root/src" -xf -
else
    tar -C "$repo" --exclude=./target -cf - . | tar -C "$root/src" -xf -
fi
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# How this host reaches the package registries carries over, as it would to a new machine on the
# same network: the CA certificates it added (a TLS-inspecting proxy's, say; Debian's
# ca-certificates, which the set-up installs, takes them in), its pip and npm configuration, and
# the standard variables naming a CA bundle or a proxy (below).
if compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp -aL /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
for f in /etc/pip.conf /etc/npmrc "${HOME:-/root}/.npmrc" "${HOME:-/root}/.config/pip/pip.conf"; do
    [[ -f "$f" ]] || continue
    dest="$root${f/#${HOME:-/root}//root}"
    mkdir -p "$(dirname -- "$dest")"
    cp -L -- "$f" "$dest"
done
pass_env=()
for v in SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE CURL_CA_BUNDLE PIP_CERT NODE_EXTRA_CA_CERTS \
         GIT_SSL_CAINFO http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY \
         PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_DEFAULT_TIMEOUT npm_config_registry; do
    if [[ -n "${!v:-}" ]]; then pass_env+=("$v=${!v}"); fi
done

# The namespace: its own mounts (private: nothing reaches the host's) and PIDs (whatever the
# set-up leaves running ends with it), the root file system made a mount point and pivoted into.
# The host's devices, but a /dev/shm of its own: podman keeps its table of container locks there
# (libpod_lock), and the podman inside, with a database of its own, would take its locks from
# the host podman's table and leave there any its containers still held when the namespace ends.
inner='set -euo pipefail
root=$1 dir=$2
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=755 tmpfs "$root/run"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mkdir -p "$root/var/cache/apt/archives" "$root/root/.npm" "$root/root/.cache/pip"
mount --bind "$dir/apt" "$root/var/cache/apt/archives"
mount --bind "$dir/npm" "$root/root/.npm"
mount --bind "$dir/pip" "$root/root/.cache/pip"
cd "$root"
mkdir -p .oldroot
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot
shift 2
exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    TERM=dumb LANG=C.UTF-8 CI=true "$@" bash /src/scripts/fresh-machine.sh --inside'
status=0
unshare --mount --pid --fork --propagation private -- bash -c "$inner" inner "$root" "$dir" \
    ${pass_env[@]+"${pass_env[@]}"} >> "$log" 2>&1 < /dev/null || status=$?

grep -E '^=== fresh-machine: ' "$log" | sed 's/^=== //' >&2 || true
if [[ $status -ne 0 ]]; then
    printf '\nfresh-machine: the last 60 lines of %s:\n' "$log" >&2
    tail -n 60 "$log" >&2
fi
passed=$(grep -c '^=== fresh-machine: ok ' "$log" || true)
failed=$(grep -c '^=== fresh-machine: FAILED ' "$log" || true)
[[ $status -eq 0 || $failed -gt 0 ]] || failed=1
printf 'fresh-machine: %d s in all\n' $((SECONDS - started)) >&2
printf 'fresh-machine: %d passed, %d failed\n' "$passed" "$failed"
[[ $status -eq 0 ]]

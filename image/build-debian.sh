#!/usr/bin/env bash
# Build the mcp-code-bridge sandbox image from Debian packages (for hosts without Nix) and write it
# as a docker-archive tarball that `mcp-code-bridge image load`, `podman load` or `docker load` read.
#
# The image: Debian sid's python3 (3.14) + numpy + pandas + matplotlib + cloudpickle (+ --extra
# packages), user 65534:65534, workdir /workspace, CMD ["python3"]. The Python runtime of the bridge
# is not in the image: the bridge injects it at session start, so any image with python3 works.
#
# Needs: mmdebstrap, podman (rootful or rootless). The script never touches the podman image store
# you use: it imports, saves and smoke-tests the image in a throwaway store that it deletes.
#
# Usage: image/build-debian.sh [--profile default|data] [--output PATH] [--tag NAME:TAG]
#                              [--extra PKG]... [--mirror URL] [--suite SUITE] [--keep-rootfs PATH]
#
# Profiles: `default` (python3, numpy, pandas, matplotlib, cloudpickle) and `data`, which adds
# scipy, scikit-learn and pyarrow (Parquet). cloudpickle: a session's snapshot keeps the functions
# and classes its cells defined by value (docs/protocol.md, "Snapshots"). The image carries its
# profile as the label io.mcp-code-bridge.profile, which `mcp-code-bridge doctor` shows.
set -euo pipefail

output=""
tag=""
profile="default"
suite="sid"
mirror=""
keep_rootfs=""
extras=()

log() { printf '[build-debian] %s\n' "$*" >&2; }
die() { printf '[build-debian] error: %s\n' "$*" >&2; exit 1; }

usage() {
    cat <<'EOF'
Usage: build-debian.sh [options]

Builds the mcp-code-bridge sandbox image from Debian packages with mmdebstrap and writes it as a
docker-archive tarball (a plain tar whose layer is gzip-compressed).

Options:
  --profile NAME  default (python3, numpy, pandas, matplotlib, cloudpickle) or data (also
                  scipy, scikit-learn and pyarrow)
  --output PATH   where to write the archive (default: ./mcp-code-bridge-sandbox[-data].tar)
  --tag NAME:TAG  the image's name in the archive (default: mcp-code-bridge-sandbox[-data]:latest)
  --extra PKG     an extra Debian package to install (repeatable), e.g. python3-scipy
                  (python3, numpy, pandas, matplotlib and cloudpickle are always installed)
  --mirror URL    the Debian mirror (default: the Debian mirror apt on this host is configured with)
  --suite SUITE   the Debian suite (default: sid, whose python3 is 3.14)
  --keep-rootfs PATH  also keep the root filesystem tarball at PATH
  -h, --help      this help
EOF
}

need_arg() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --output) need_arg "$@"; output="$2"; shift 2 ;;
        --output=*) output="${1#*=}"; shift ;;
        --profile) need_arg "$@"; profile="$2"; shift 2 ;;
        --profile=*) profile="${1#*=}"; shift ;;
        --tag) need_arg "$@"; tag="$2"; shift 2 ;;
        --tag=*) tag="${1#*=}"; shift ;;
        --extra) need_arg "$@"; extras+=("$2"); shift 2 ;;
        --extra=*) extras+=("${1#*=}"); shift ;;
        --mirror) need_arg "$@"; mirror="$2"; shift 2 ;;
        --mirror=*) mirror="${1#*=}"; shift ;;
        --suite) need_arg "$@"; suite="$2"; shift 2 ;;
        --suite=*) suite="${1#*=}"; shift ;;
        --keep-rootfs) need_arg "$@"; keep_rootfs="$2"; shift 2 ;;
        --keep-rootfs=*) keep_rootfs="${1#*=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

# The profiles, each defined here once: the packages a profile adds to the defaults, and the
# imports its smoke test makes.
case "$profile" in
    default) profile_packages=(); profile_suffix="" ;;
    data) profile_packages=(python3-scipy python3-sklearn python3-pyarrow); profile_suffix="-data" ;;
    *) die "unknown profile: $profile (default or data)" ;;
esac
[[ -n "$output" ]] || output="mcp-code-bridge-sandbox$profile_suffix.tar"
[[ -n "$tag" ]] || tag="mcp-code-bridge-sandbox$profile_suffix:latest"

for pkg in ${extras[@]+"${extras[@]}"}; do
    [[ "$pkg" =~ ^[a-z0-9][a-z0-9.+-]+$ ]] || die "not a Debian package name: $pkg"
done
[[ "$tag" =~ ^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$ ]] || die "bad image tag: $tag"
[[ "$tag" == *:* ]] || tag="$tag:latest"

command -v mmdebstrap >/dev/null || die "mmdebstrap not found (apt-get install mmdebstrap)"
command -v podman >/dev/null || die "podman not found (apt-get install podman)"

# The Debian mirror apt on this host uses: the archive whose Release file says Origin/Label Debian.
detect_mirror() {
    local uri=""
    if command -v apt-get >/dev/null; then
        # shellcheck disable=SC2016 # apt's format variables, not the shell's
        uri=$(apt-get indextargets --format '$(ORIGIN)|$(LABEL)|$(REPO_URI)' 2>/dev/null \
            | awk -F'|' '$1 == "Debian" && $2 == "Debian" { print $3; exit }')
        if [[ -z "$uri" ]]; then
            # No package lists yet (apt-get update never ran): read the sources themselves.
            uri=$( { cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
                        | awk '/^URIs:/ { for (i = 2; i <= NF; i++) print $i }'
                     cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
                        | awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; break } }'
                   } | grep -E '/debian/?$' | head -n1 || true)
        fi
    fi
    printf '%s' "${uri%/}"
}
if [[ -z "$mirror" ]]; then
    mirror=$(detect_mirror)
    [[ -n "$mirror" ]] || die "could not find a Debian mirror in this host's apt configuration; pass --mirror URL"
fi

aptopts=(--aptopt='Acquire::Check-Valid-Until "false"' --aptopt='Acquire::Languages "none"'
         --aptopt='APT::Install-Recommends "false"')
# Forward the host's apt proxy, if it has one.
if command -v apt-config >/dev/null; then
    for key in Acquire::http::Proxy Acquire::https::Proxy; do
        val=$(apt-config dump "$key" 2>/dev/null | awk -v k="$key" '$1 == k { v = $2; gsub(/[";]/, "", v); print v; exit }')
        [[ -n "$val" ]] && aptopts+=(--aptopt="$key \"$val\"")
    done
fi

# The default packages: what the tool description promises (display() of a matplotlib figure), and
# cloudpickle, with which a session's snapshot keeps the functions and classes its cells defined.
defaults=(python3 python3-numpy python3-pandas python3-matplotlib python3-cloudpickle
          ${profile_packages[@]+"${profile_packages[@]}"})
include=$(IFS=,; printf '%s' "${defaults[*]}")
for pkg in ${extras[@]+"${extras[@]}"}; do
    [[ ",$include," == *",$pkg,"* ]] || include+=",$pkg"
done

output_dir=$(dirname -- "$output")
mkdir -p -- "$output_dir"
output=$(cd -- "$output_dir" && pwd)/$(basename -- "$output")

work=$(mktemp -d "${TMPDIR:-/var/tmp}/mcp-code-bridge-image.XXXXXX")
store="$work/store"
P=(podman --root "$store/root" --runroot "$store/run" --storage-driver vfs)
cleanup() {
    local rc=$?
    if [[ -d "$store" ]]; then
        timeout 120 "${P[@]}" rm -af -t 0 >/dev/null 2>&1 || true
        timeout 120 "${P[@]}" rmi -af >/dev/null 2>&1 || true
        if [[ $(id -u) -ne 0 ]]; then
            podman unshare rm -rf -- "$store" 2>/dev/null || true
        fi
    fi
    rm -rf -- "$work" 2>/dev/null || true
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$(date +%s)
log "suite $suite from $mirror; packages: $include"

# Slimming: dpkg never unpacks docs (but copyright), man/info pages and translations; the customize
# hook drops apt's lists and caches, logs, the test suites of numpy, pandas and matplotlib, and
# prepares /workspace. It also drops what the image cannot use: extension modules and standard
# library directories of Python versions other than the image's python3 (sid builds packages for
# every supported version), and what matplotlib's dependencies bring along but matplotlib never
# loads: sympy and mpmath and lxml (optional extras of fontTools), the Unicode Character Database
# text files, Tcl/Tk (there is no display), and the AV1 codecs of Pillow's AVIF plugin. The smoke
# test below draws PNG, SVG and PDF figures to show that plotting survives it.
# Byte-compiled .pyc files stay: the root filesystem is read-only at run time.
# shellcheck disable=SC2016 # expanded by mmdebstrap's hook shell
slim_hook='set -e; root="$1"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
       "$root"/var/log/apt "$root"/var/log/dpkg.log "$root"/var/log/alternatives.log \
       "$root"/var/log/bootstrap.log
site="$root/usr/lib/python3/dist-packages"
for d in numpy pandas matplotlib mpl_toolkits scipy sklearn pyarrow; do
    [ -d "$site/$d" ] || continue
    find "$site/$d" -depth -type d -name tests -exec rm -rf {} +
done
py=$(readlink "$root/usr/bin/python3"); py=${py##*/}
tag="cpython-$(printf %s "${py#python}" | tr -d .)"
find "$site" -name "*.cpython-3*" ! -name "*.$tag[-.]*" -delete
for d in "$root"/usr/lib/python3.*; do [ "${d##*/}" = "$py" ] || rm -rf "$d"; done
rm -rf "$site"/sympy "$site"/sympy-* "$site"/mpmath "$site"/mpmath-* "$site"/lxml "$site"/lxml-* \
       "$root"/usr/bin/isympy "$root"/usr/share/unicode "$root"/usr/share/tcltk
rm -f "$site"/PIL/_avif.* "$site"/PIL/_imagingtk.* "$root"/usr/lib/"$py"/lib-dynload/_tkinter.*
for lib in libaom libSvtAv1Enc librav1e libgav1 libdav1d libyuv libabsl_ libavif libtk8 libtcl8 \
           libxslt libexslt; do
    # Arrow (the data profile) links abseil itself: keep what any library left still needs.
    for f in "$root"/usr/lib/*/"$lib"*.so*; do
        [ -e "$f" ] || continue
        if [ "$lib" = libabsl_ ] && ls "$root"/usr/lib/*/libarrow*.so* >/dev/null 2>&1; then continue; fi
        rm -f "$f"
    done
done
mkdir -p "$root/workspace" "$root/tmp"
chmod 1777 "$root/workspace" "$root/tmp"'

rootfs="$work/rootfs.tar"
mmdebstrap --variant=apt --format=tar \
    --include="$include" \
    "${aptopts[@]}" \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --customize-hook="$slim_hook" \
    "$suite" "$rootfs" "$mirror" >&2
log "root filesystem: $(du -h "$rootfs" | cut -f1) ($(( $(date +%s) - start ))s)"
[[ -z "$keep_rootfs" ]] || cp -- "$rootfs" "$keep_rootfs"

tmp_out="$output.partial"
mkdir -p "$store"
log "importing into a throwaway podman store as $tag"
"${P[@]}" import --quiet \
    --change 'USER 65534:65534' \
    --change 'WORKDIR /workspace' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV HOME=/tmp' \
    --change 'ENV PYTHONUNBUFFERED=1' \
    --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
    --change 'ENV MPLBACKEND=Agg' \
    --change 'ENV MPLCONFIGDIR=/tmp/.matplotlib' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'LABEL org.opencontainers.image.title=mcp-code-bridge-sandbox' \
    --change "LABEL org.opencontainers.image.description=mcp-code-bridge sandbox ($profile): Debian $suite $(IFS=' '; printf '%s' "${defaults[*]}")" \
    --change "LABEL io.mcp-code-bridge.profile=$profile" \
    --change 'CMD ["python3"]' \
    "$rootfs" "$tag" >/dev/null
rm -f -- "$rootfs"

log "writing docker-archive $output"
# `podman save` writes the layer uncompressed. Re-pack the archive with the layer gzip-compressed:
# podman (4.3 too) and docker load such archives (same image ID), while a gzip-compressed *outer*
# archive is refused by podman 4.3's load.
"${P[@]}" save --format docker-archive -o "$work/saved.tar" "$tag"
mkdir "$work/archive"
tar -C "$work/archive" -xf "$work/saved.tar"
rm -f -- "$work/saved.tar"
(
    cd "$work/archive"
    layers=$(sed -n 's/.*"Layers":\[\([^]]*\)\].*/\1/p' manifest.json | tr -d '"' | tr ',' ' ')
    [[ -n "$layers" ]] || die "no layers in the saved manifest.json"
    for layer in $layers; do
        gzip -n -6 -- "$layer"
        sed -i "s|\"$layer\"|\"$layer.gz\"|g" manifest.json
    done
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$tmp_out" -- *
)
rm -rf -- "$work/archive"

# Smoke test: load the archive into an empty store and run it with the bridge's hardening flags.
"${P[@]}" rmi -af >/dev/null
"${P[@]}" load --quiet -i "$tmp_out" >/dev/null
loaded=$("${P[@]}" images --format '{{.Repository}}:{{.Tag}}' | head -n1)
log "archive loads as $loaded; checking it runs"
# Detached and read back from its log, every podman call with a deadline: once (in CI) a
# `podman run --rm` here never returned after the container had printed all of this and exited
# (the store still showed it running), and the set-up waited until CI's own limit.
smoke="mcp-code-bridge-smoke-$$"
timeout 120 "${P[@]}" run -d --name "$smoke" --network none --read-only --cap-drop ALL \
    --security-opt no-new-privileges --user 65534:65534 \
    --tmpfs /tmp:rw,noexec,nosuid,nodev,size=64m --tmpfs /workspace:rw,noexec,nosuid,nodev,size=64m \
    "$tag" python3 -c '
import io, sys, os, numpy, pandas, matplotlib, cloudpickle
assert os.getcwd() == "/workspace", os.getcwd()
assert (os.getuid(), os.getgid()) == (65534, 65534)
import matplotlib.pyplot as plt, PIL.Image
fig, ax = plt.subplots(figsize=(2, 2), dpi=50)
ax.plot([1, 3, 2])
ax.set_title("smoke \u00e9\u03bb")
for fmt, magic in (("png", b"\x89PNG"), ("svg", b"<?xml"), ("pdf", b"%PDF")):
    out = io.BytesIO()
    fig.savefig(out, format=fmt)
    assert out.getvalue().startswith(magic), "matplotlib drew no " + fmt
PIL.Image.init()
out = io.BytesIO()
fig.savefig(out, format="png")
assert PIL.Image.open(out).size == (100, 100)
print("python", sys.version.split()[0])
print("numpy", numpy.__version__)
print("pandas", pandas.__version__)
print("matplotlib", matplotlib.__version__, "(" + matplotlib.get_backend() + ")")
# A function by value and a numpy buffer out of band, as a snapshot pickles them.
buffers = []
data = cloudpickle.dumps([lambda x: x + 1, numpy.arange(4)], protocol=5, buffer_callback=buffers.append)
f, a = cloudpickle.loads(data, buffers=buffers)
assert f(1) == 2 and a.sum() == 6 and len(buffers) == 1
print("cloudpickle", cloudpickle.__version__)
if sys.argv[1] == "data":
    import numpy as np, scipy, scipy.optimize, sklearn, sklearn.linear_model, pyarrow, pyarrow.parquet
    r = scipy.optimize.minimize_scalar(lambda x: (x - 2) ** 2)
    assert abs(r.x - 2) < 1e-6, r.x
    X = np.arange(20, dtype=float).reshape(-1, 1)
    model = sklearn.linear_model.LinearRegression().fit(X, 3 * X.ravel() + 1)
    assert abs(model.coef_[0] - 3) < 1e-9, model.coef_
    df = pandas.DataFrame({"region": ["n", "s"], "amount": [1.5, 2.5]})
    df.to_parquet("/tmp/smoke.parquet")
    assert pandas.read_parquet("/tmp/smoke.parquet").equals(df)
    print("scipy", scipy.__version__)
    print("scikit-learn", sklearn.__version__)
    print("pyarrow", pyarrow.__version__)
print("smoke: ok")
' "$profile" >/dev/null || die "the image did not start (podman run -d $tag)"
smoke_log() { timeout 60 "${P[@]}" logs "$smoke" 2>&1 || true; }
deadline=$(( SECONDS + 600 ))
while :; do
    versions=$(smoke_log)
    grep -qx 'smoke: ok' <<<"$versions" && break
    state=$(timeout 60 "${P[@]}" inspect --format '{{.State.Status}}' "$smoke" 2>/dev/null || echo unknown)
    if [[ "$state" == exited || "$state" == stopped ]]; then
        versions=$(smoke_log)
        grep -qx 'smoke: ok' <<<"$versions" && break
        die "the image's smoke test failed: $versions"
    fi
    (( SECONDS < deadline )) \
        || die "the image's smoke test did not finish in 600 s (podman says $state): $versions"
    sleep 1
done
timeout 60 "${P[@]}" rm -f -t 0 "$smoke" >/dev/null 2>&1 || true
versions=$(grep -vx 'smoke: ok' <<<"$versions")
mv -f -- "$tmp_out" "$output"

size=$(stat -c %s "$output")
sha=$(sha256sum "$output" | cut -d' ' -f1)
log "done in $(( $(date +%s) - start ))s"
printf 'image   %s (profile %s)\n' "$tag" "$profile"
printf '%s\n' "$versions"
[[ ${#extras[@]} -eq 0 ]] || printf 'extra   %s\n' "${extras[*]}"
printf 'archive %s\n' "$output"
printf 'size    %s bytes (%s MiB)\n' "$size" "$(( size / 1048576 ))"
printf 'sha256  %s\n' "$sha"

#!/usr/bin/env bash
# Keeps a Cargo build directory that survives between runs from growing without end: cargo never
# removes what an earlier build of a changed crate left. Usage: scripts/prune-target.sh DIR...
#
# What grows is this project's own output, rebuilt whenever its sources change: the test, bench
# and fuzz executables (hundreds of MB each), the rlibs of the workspace crates, and the
# incremental state of each. Of each of these, by name, only the newest is kept (of incremental
# state, the four newest), which is what the next build starts from. The dependencies' artifacts
# are left alone: several builds of one crate (other features, host and target) live side by side
# and are all in use.
set -euo pipefail

newest_per_stem() { # DIR KEEP FIND-ARGS...: of what FIND-ARGS select, keeps the KEEP newest per stem
  local dir=$1 keep=$2; shift 2
  local -A seen=()
  find "$dir" -mindepth 1 -maxdepth 1 "$@" -printf '%T@ %f\n' 2>/dev/null \
    | sort -rn \
    | while read -r _ name; do
        # <stem>-<hash>[.<ext>] (16 hex digits; 13 base-36 ones in incremental): the key is the stem
        # with the extension.
        [[ $name =~ ^(.+)-([0-9a-f]{16}|[0-9a-z]{13})(\..*)?$ ]] || continue
        key="${BASH_REMATCH[1]}${BASH_REMATCH[3]}"
        seen[$key]=$((${seen[$key]:-0} + 1))
        if ((seen[$key] > keep)); then rm -rf -- "${dir:?}/$name"; fi
      done
}

for target in "$@"; do
  [[ -d $target ]] || continue
  before=$(du -sm "$target" | cut -f1)
  while IFS= read -r -d '' deps; do
    # Executables (test, bench and fuzz binaries) and the workspace crates' own artifacts.
    newest_per_stem "$deps" 1 -type f -perm -u+x ! -name '*.so' ! -name '*.rlib'
    newest_per_stem "$deps" 1 -type f \( -name '*mcp_code_bridge*' -o -name 'libbridge_*' -o -name 'bridge_*' \)
  done < <(find "$target" -type d -name deps -print0)
  while IFS= read -r -d '' incremental; do
    # A library, its unit tests and a binary of one crate share a name here: a few are kept.
    newest_per_stem "$incremental" 4 -type d
  done < <(find "$target" -type d -name incremental -print0)
  after=$(du -sm "$target" | cut -f1)
  printf 'prune-target: %s: %d MB -> %d MB\n' "$target" "$before" "$after" >&2
done

#!/usr/bin/env bash
# scripts/subids.sh give|check FILE NAME [COUNT [BASE]]: the subordinate ids (subuid(5), subgid(5))
# of NAME in FILE, for podman's --userns=auto, which gives each sandbox a range of its own
# (`mcp-code-bridge doctor`: host identity). A sandbox runs as 65534:65534, so its range is
# 65535 ids. By default, for rootful podman's name `containers`, 2147483648 ids from 2147483647
# (podman's own example: room for 32768 sandboxes), and for a user who runs rootless podman
# 4194304 ids from 100000 up (64 sandboxes; the bridge wants its max_sessions + pool_size + 1).
#   check  exits 0 when NAME's lines in FILE hold at least COUNT ids together;
#   give   when they hold fewer, appends one line `NAME:START:COUNT`, START the lowest id from
#          BASE up (default 100000) where COUNT ids overlap no line of FILE; every other line is
#          left as it is, and a FILE that already holds enough is not touched. Says what it did.
# scripts/setup-debian.sh gives them (rootful podman: the name `containers`), and
# scripts/check-setup.sh checks them.
set -euo pipefail

die() { printf 'subids: %s\n' "$*" >&2; exit 2; }
[[ $# -ge 3 ]] || die "usage: scripts/subids.sh give|check FILE NAME [COUNT [BASE]]"
mode=$1 file=$2 name=$3
if [[ "$name" == containers ]]; then count=2147483648 base=2147483647; else count=4194304 base=100000; fi
count=${4:-$count} base=${5:-$base}
[[ "$count" =~ ^[0-9]+$ && "$base" =~ ^[0-9]+$ ]] || die "COUNT and BASE are numbers"
[[ "$name" =~ ^[A-Za-z0-9_.][A-Za-z0-9_.-]*$ ]] || die "not a user name: $name"

# The ids NAME's lines hold together.
held() {
    [[ -f "$file" ]] || { echo 0; return; }
    awk -F: -v n="$name" '$1 == n && $3 ~ /^[0-9]+$/ { s += $3 } END { printf "%.0f\n", s }' "$file"
}

case "$mode" in
    check) [[ $(held) -ge $count ]] ;;
    give)
        have=$(held)
        if [[ $have -ge $count ]]; then
            printf '    %s: %s has %s ids already: unchanged\n' "$file" "$name" "$have" >&2
            exit 0
        fi
        start=$( { [[ -f "$file" ]] && cat -- "$file"; true; } | awk -F: -v base="$base" -v count="$count" '
            $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ { n++; s[n] = $2 + 0; e[n] = $2 + $3 }
            END {
                # The ranges in order of their start, then the first gap of COUNT ids from BASE.
                for (i = 2; i <= n; i++) for (j = i; j > 1 && s[j-1] > s[j]; j--) {
                    t = s[j]; s[j] = s[j-1]; s[j-1] = t; t = e[j]; e[j] = e[j-1]; e[j-1] = t
                }
                c = base
                for (i = 1; i <= n; i++) {
                    if (c + count <= s[i]) break
                    if (e[i] > c) c = e[i]
                }
                printf "%.0f\n", c
            }')
        # uid 4294967295 is (uid_t) -1: no id reaches it.
        [[ $((start + count)) -le 4294967295 ]] \
            || die "$file: no room for $count ids of $name from $base up"
        printf '%s:%s:%s\n' "$name" "$start" "$count" >> "$file"
        printf '    %s: %s gets ids %s to %s\n' "$file" "$name" "$start" "$((start + count - 1))" >&2
        ;;
    *) die "give or check, not $mode" ;;
esac

#!/usr/bin/env bash
# The lints every crate takes (Cargo.toml's [workspace.lints], clippy.toml), warnings as errors:
#   scripts/lint.sh              clippy over the workspace, every target
#   scripts/lint.sh --self-test  the same, then a copy of the workspace with planted violations
#                                must fail, each by its lint's name: a print in the sandbox crate
#                                (stdout is the MCP channel of `run`), an unsafe block without its
#                                SAFETY comment, a `pub` item no other crate can reach, a public
#                                item without documentation.
# CI (.ci/run) runs it with --self-test before the README's commands.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
die() { printf '[lint] error: %s\n' "$*" >&2; exit 1; }

self_test=0
case "${1:-}" in
    --self-test) self_test=1 ;;
    "") ;;
    *) die "unknown argument '$1' (scripts/lint.sh [--self-test])" ;;
esac

command -v cargo >/dev/null || die "cargo not found: install Rust (https://rustup.rs)"
cargo clippy --version >/dev/null 2>&1 || die "clippy not found: rustup component add clippy"
printf '[lint] cargo clippy --locked --workspace --all-targets -- -D warnings\n' >&2
cargo clippy --locked --workspace --all-targets -- -D warnings < /dev/null
printf '[lint] ok: no lint fires\n' >&2
[[ $self_test -eq 1 ]] || exit 0

# The copy builds into the same target directory: the dependencies are checked once, only the
# workspace's crates are checked again (their paths differ).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
copy=$(mktemp -d /tmp/lint-self-test.XXXXXX)
trap 'rm -rf -- "$copy"' EXIT
git ls-files -z -c -o --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$copy"
cat >> "$copy/crates/sandbox/src/lib.rs" <<'EOF'

pub fn planted_undocumented() {}

mod planted {
    pub fn planted_unreachable() {}
    pub(crate) fn planted_print() {
        println!("planted");
    }
    pub(crate) fn planted_unsafe() -> i32 {
        unsafe { libc::getpid() }
    }
}
EOF
printf '[lint] self-test: planted violations in a copy (%s) must fail\n' "$copy" >&2
status=0
out=$(cd "$copy" && cargo clippy --locked -p mcp-code-bridge-sandbox --lib -- -D warnings 2>&1 < /dev/null) || status=$?
[[ $status -ne 0 ]] || die "self-test: clippy passed planted violations"
failed=0
for lint in clippy::print_stdout clippy::undocumented_unsafe_blocks unreachable_pub missing_docs; do
    if grep -q -- "$lint" <<<"$out"; then
        printf '[lint] self-test: %s fails as it should\n' "$lint" >&2
    else
        printf '[lint] self-test: %s did not fire on its planted violation\n' "$lint" >&2
        failed=1
    fi
done
[[ $failed -eq 0 ]] || { printf '%s\n' "$out" >&2; die "self-test failed (above)"; }
printf '[lint] self-test: 4 planted violations, 4 failures\n' >&2

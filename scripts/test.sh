#!/usr/bin/env bash
# The README's test command: every test silo has, against the real agent, a
# real Docker engine and real SQLite. Under CI=true a missing engine or tool
# fails the run instead of skipping what needs it.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*" >&2; }

# What the tests use beyond the build's own needs: tmux (the real terminal the
# Ctrl-C and PTY tests type into) and dash (the POSIX sh the session tests
# compare with bash). setup.sh only checks when they are there already.
scripts/setup.sh tmux dash

log "Rust workspace"
cargo test --workspace "$@"

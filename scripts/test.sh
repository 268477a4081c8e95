#!/usr/bin/env bash
# The README's test command: every test silo has, against the real agent, a
# real Docker engine, a real Podman engine, real SQLite, and a fleet's real
# PostgreSQL and S3 server (Garage), then the providers' own SDKs against
# the mock E2B and Daytona; then the CLI suites once more with every
# sandbox's state and snapshots on the fleet's services. Under CI=true a
# missing engine or tool fails the run instead of skipping what needs it.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*" >&2; }
in_ci() { [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; }

# What the tests use beyond the build's own needs: tmux (the real terminal the
# Ctrl-C and PTY tests type into), dash (the POSIX sh the session tests
# compare with bash), bash-static (the bash of the SDK journeys' sandbox
# image: E2B runs every command as `bash -l -c`) and python3-venv (the SDK
# journeys' virtual environment), podman (the Podman backend's engine,
# whose API socket setup.sh starts) and kubectl (the real client the
# Kubernetes tests and journeys run against the mock API server). setup.sh
# only checks when they are there already.
scripts/setup.sh tmux dash bash-static python3-venv podman kubectl

# Whether python3 can make virtual environments: 0 if so; else 1 (skip,
# with a note) or 2 (fail, under CI=true).
have_venv() {
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 && return 0
  if in_ci; then
    echo "CI=true but python3 with venv and ensurepip is missing (apt-get install python3-venv)" >&2
    return 2
  fi
  echo "skipping $1: python3 with venv is missing (CI=true makes this fail)" >&2
  return 1
}

# The providers' official Python SDKs, pinned in tests/sdk/requirements.txt,
# run their journeys against the mock binaries in a virtual environment of
# their own (made again when the pins change). Without python3's venv this
# is a failure under CI=true and a skip with a note elsewhere.
sdk_journeys() {
  local requirements=tests/sdk/requirements.txt
  local venv=${SILO_SDK_VENV:-tests/sdk/.venv}
  have_venv "the SDK journeys" || return $(($? - 1))
  local want have
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  have=$(cat "$venv/.requirements.sha256" 2>/dev/null || true)
  if [ ! -x "$venv/bin/python" ] || [ "$want" != "$have" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    echo "$want" >"$venv/.requirements.sha256"
  fi
  cargo build --quiet -p silo-mocks --bins -p silo-cli
  SILO_TARGET_DIR=${CARGO_TARGET_DIR:-target} \
    "$venv/bin/python" -m pytest -q -s -rs -p no:cacheprovider tests/sdk
}

# The Python package (python/): its wheel built with maturin in a build
# environment, installed into a new virtual environment, and its pytest
# suite run against the installed wheel (never the source tree), with the
# real agent, Docker engine and SQLite.
python_package() {
  local requirements=python/tests/requirements.txt
  local build venv target wheels
  build=$(realpath -m "${SILO_PY_BUILD_VENV:-python/.venv-build}")
  venv=$(realpath -m "${SILO_PY_TEST_VENV:-python/.venv-test}")
  target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
  wheels=$target/wheels
  have_venv "the Python package" || return $(($? - 1))
  if [ ! -x "$build/bin/maturin" ]; then
    python3 -m venv "$build"
    "$build/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
  fi
  rm -rf "$wheels" "$venv"
  (cd python && "$build/bin/maturin" build --quiet -o "$wheels")
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "$(grep '^pytest==' "$requirements")" "$(grep '^mypy==' "$requirements")" "$wheels"/silo_sandbox-*.whl
  (cd python/tests && SILO_TARGET_DIR=$target "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider .)
}

log "ARCHITECTURE.md's code map names only what exists"
scripts/check-architecture.sh

log "providers' SDKs against the mocks"
sdk_journeys

log "the Python package against its installed wheel"
python_package

log "a fleet's services: PostgreSQL and Garage on loopback"
# scripts/fleet.sh installs them on first use (Garage from crates.io) and
# prints where the tests find them; the tests make a schema and a bucket
# prefix each.
if scripts/fleet.sh up >/dev/null; then
  eval "$(scripts/fleet.sh test-env)"
elif in_ci; then
  echo "CI=true but scripts/fleet.sh could not start PostgreSQL and Garage" >&2
  exit 1
else
  echo "the fleet tests are skipped: scripts/fleet.sh up failed (CI=true makes this fail)" >&2
fi

log "Rust workspace"
cargo test --workspace "$@"

log "the CLI suites once more, on the fleet's shared state and store"
# Each CLI a test makes keeps its state in a schema of its own and its
# snapshots under a prefix of its own (tests/src/lib.rs). The rewind
# property tests (exact::) run once, above: they check the snapshot
# engine, which is the same on either state, and take minutes a run.
if [ -n "${SILO_TEST_POSTGRES_URL:-}" ]; then
  SILO_TEST_STATE_URL=$SILO_TEST_POSTGRES_URL SILO_TEST_STORE_URL=$SILO_TEST_S3_URL \
    cargo test -p silo-cli --test docker --test local "$@" -- --skip exact::
fi

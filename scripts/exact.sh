#!/usr/bin/env bash
# A long run of the property that a rewind and a fork give back exactly
# what the snapshot saw (tests/docker/exact.rs), on Docker, Podman and the
# E2B and Daytona mocks, with large budgets and one seed for all, so a
# failure can be repeated.
#
#   scripts/exact.sh [SEED [BACKEND...]]
#
# BACKEND is docker, podman, e2b or daytona (default: all four, one after
# another).
# SILO_EXACT_REWINDS, SILO_EXACT_FORKS, SILO_EXACT_KINDS,
# SILO_EXACT_SHRINK_SECS and SILO_EXACT_NANOS pass through; the budgets
# default to 2000 rewinds and 200 forks. The seed defaults to one from the
# clock, printed first.
set -euo pipefail
cd "$(dirname "$0")/.."

seed=${1:-${SILO_EXACT_SEED:-$(date +%s%N)}}
shift || true
backends=("$@")
[ ${#backends[@]} -gt 0 ] || backends=(docker podman e2b daytona kubernetes)
export SILO_EXACT_SEED=$seed
export SILO_EXACT_REWINDS=${SILO_EXACT_REWINDS:-2000}
export SILO_EXACT_FORKS=${SILO_EXACT_FORKS:-200}
export SILO_EXACT_SHRINK_SECS=${SILO_EXACT_SHRINK_SECS:-1800}

echo "exact: SILO_EXACT_SEED=$seed, $SILO_EXACT_REWINDS rewinds, $SILO_EXACT_FORKS forks on ${backends[*]}" >&2
for backend in "${backends[@]}"; do
  case $backend in
    docker | podman | e2b | daytona | kubernetes) ;;
    *) echo "exact: no backend $backend (docker, podman, e2b, daytona, kubernetes)" >&2; exit 2 ;;
  esac
  # One run at a time: each backend's has the machine to itself.
  cargo test -p silo-cli --test docker \
    "exact::every_rewind_and_fork_gives_back_exactly_what_its_snapshot_saw_on_$backend" \
    -- --exact --nocapture --test-threads 1
done

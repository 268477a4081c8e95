#!/usr/bin/env bash
# The benchmarks: what they need beyond the build's own, then silo-bench in
# a release build with the arguments given (scenario names, --quick, --json).
# debootstrap makes the Debian image the snapshot scenarios run on (once;
# about a minute). Safe to run repeatedly; as for setup.sh, without root it
# changes nothing and prints the commands to run.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh debootstrap
cargo build --release -p silo-cli -p silo-bench
exec cargo run --release -q -p silo-bench -- "$@"

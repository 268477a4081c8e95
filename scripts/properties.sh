#!/usr/bin/env bash
# Long runs of the property tests that live beside the code (proptest):
# an exec's output replayed by per-stream offsets gives each stream exactly
# its rest. The suite runs 256 cases each; this runs PROPTEST_CASES
# (default 100000). A failure prints its shrunk input.
#
#   scripts/properties.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PROPTEST_CASES=${PROPTEST_CASES:-100000}
echo "properties: $PROPTEST_CASES cases each" >&2
cargo test -p silo-agent --lib -- exec::ring::tests::stream_offsets --nocapture

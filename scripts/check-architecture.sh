#!/usr/bin/env bash
# Keeps ARCHITECTURE.md's code map true: every folder it names as a heading
# (`### `protocol/``), every folder it names inside the agent's and the
# controller's sections, and every backend exists; and every backend the
# controller registers is named in the map. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

doc=ARCHITECTURE.md
failed=0
missing() { echo "ARCHITECTURE.md names $1, which does not exist" >&2; failed=1; }

# The code map: from its heading to the next second-level heading.
map=$(awk '/^## Code map/{on=1; next} /^## /{on=0} on' "$doc")
[ -n "$map" ] || { echo "ARCHITECTURE.md has no '## Code map'" >&2; exit 1; }

# Top-level folders: the backticked paths of each third-level heading.
while IFS= read -r folder; do
  [ -d "$folder" ] || missing "the folder $folder"
done < <(grep '^### ' <<<"$map" | grep -o '`[a-z._-]*/`' | tr -d '`')

# Folders inside a crate's section resolve under that crate's sources.
section() { awk -v h="$1" 'index($0, "### `" h "`")==1{on=1; next} /^### /{on=0} on' <<<"$map"; }
check_in() {
  local crate=$1; shift
  while IFS= read -r name; do
    local found=0
    for base in "$@"; do
      [ -e "$base/${name%/}" ] || [ -e "$base/${name%/}.rs" ] && found=1
    done
    [ "$found" = 1 ] || missing "$crate's $name"
  done < <(section "$crate" | grep -o '`[a-z_]*/`' | tr -d '`' | sort -u)
}
check_in agent/ agent/src
check_in controller/ controller/src controller/src/backend controller/src/silo

# Backends: each one registered in the controller has its folder and is
# named in the map, as `name/`.
# The registry is the list of `backends!` in the spec module, one line per
# backend: `Variant = "name", Machines => field: Type, Error;`, the field
# being the backend's folder.
registry=controller/src/spec.rs
backends=$(awk '/^macro_rules! backends \{/{on=1; next} on && /^\}/{on=0} on' "$registry" |
  grep -oE '=> *[a-z0-9_]+:' | tr -d '=>: ')
[ -n "$backends" ] || { echo "no backends registered in $registry" >&2; exit 1; }
for backend in $backends; do
  [ -d "controller/src/backend/$backend" ] || missing "the backend folder $backend/ (registered)"
  grep -q "\`$backend/\`" <<<"$(section controller/)" ||
    { echo "ARCHITECTURE.md's code map does not name the backend $backend/" >&2; failed=1; }
done

# The agent's layers: every `crate::MODULE` a module of agent/src names
# (comments aside) stands in its own layer or one below, as the map's
# "**Layers**" paragraph lists them, bottom first, layers apart by `→`.
layers=$(awk '/^\*\*Layers\*\* of the agent/{on=1} on{print} on && /^$/{exit}' "$doc" |
  sed -n '/bottom first/,$p' | sed 's/^.*it)://' | tr '\n' ' ' | sed 's/\. The floor.*//')
[ -n "$layers" ] || { echo "ARCHITECTURE.md has no agent layers paragraph" >&2; exit 1; }
declare -A rank
level=0
for token in $layers; do
  case $token in
    →) level=$((level + 1)) ;;
    \`*\`) rank[${token//\`/}]=$level ;;
  esac
done
for file in $(find agent/src -name '*.rs' ! -name tests.rs ! -path '*/tests/*' ! -name main.rs ! -name lib.rs); do
  module=${file#agent/src/}
  module=${module%%/*}
  module=${module%.rs}
  [ -n "${rank[$module]+x}" ] || { echo "agent module $module is in no layer of ARCHITECTURE.md" >&2; failed=1; continue; }
  for used in $(grep -v '^\s*//' "$file" | grep -o 'crate::[a-z_]*' | sed 's/crate:://' | sort -u); do
    [ "$used" = "$module" ] && continue
    [ -n "${rank[$used]+x}" ] || { echo "$file uses crate::$used, which is in no layer" >&2; failed=1; continue; }
    if [ "${rank[$used]}" -gt "${rank[$module]}" ]; then
      echo "$file ($module) imports $used, a layer above it" >&2
      failed=1
    fi
  done
done

exit "$failed"

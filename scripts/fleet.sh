#!/usr/bin/env bash
# A fleet's shared services on this machine, for tests, benchmarks and
# trying a fleet out: PostgreSQL (Debian's) for the state and Garage (an
# S3-compatible object store, from crates.io) for the snapshot store, both
# listening on loopback only.
#
#   scripts/fleet.sh up     installs what is missing (first use), starts both,
#                           creates the database and the bucket, and prints
#                           the `export` lines a fleet's hosts (and the
#                           tests) use
#   scripts/fleet.sh env    prints those lines again
#   scripts/fleet.sh test-env
#                           prints what the tests use instead: the servers'
#                           addresses for tests to make schemas and
#                           prefixes of their own (SILO_TEST_POSTGRES_URL,
#                           SILO_TEST_S3_URL) and the AWS_* variables
#   scripts/fleet.sh down   stops both (their data stays for the next `up`)
#   scripts/fleet.sh pg-stop / pg-start
#                           stops or starts PostgreSQL alone (the tests that
#                           restart it under a running silo)
#   scripts/fleet.sh s3-stop / s3-start
#                           the same for the object store
#
# Everything lives under $SILO_FLEET_DIR (default: a silo-fleet directory in
# the temporary directory). Safe to run repeatedly. docs/fleet.md says how to
# point a fleet at a PostgreSQL and an S3 service of your own instead.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${SILO_FLEET_DIR:-${TMPDIR:-/tmp}/silo-fleet}
PG_PORT=${SILO_FLEET_PG_PORT:-55432}
S3_PORT=${SILO_FLEET_S3_PORT:-53900}
RPC_PORT=$((S3_PORT + 1))
ADMIN_PORT=$((S3_PORT + 3))
GARAGE_VERSION=2.5.0
BUCKET=silo
REGION=garage

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'fleet.sh: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- PostgreSQL

pg_bin() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$bin" ] || die "no PostgreSQL server binaries under /usr/lib/postgresql"
  printf '%s\n' "$bin"
}

# The server refuses to run as root: it runs as Debian's `postgres` user.
as_postgres() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

pg_install() {
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed; as root: apt-get install postgresql"
    log "installing PostgreSQL (Debian's postgresql)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql postgresql-client
  fi
}

pg_init() {
  local data="$DIR/postgres"
  [ -f "$data/PG_VERSION" ] && return 0
  log "creating a PostgreSQL cluster in $data"
  mkdir -p "$data" "$DIR/postgres-run"
  local owner
  owner=$([ "$(id -u)" = 0 ] && echo postgres || id -un)
  chown "$owner" "$data" "$DIR/postgres-run"
  chmod 700 "$data"
  printf '%s\n' "$PG_PASSWORD" >"$DIR/pg-password"
  chown "$owner" "$DIR/pg-password"
  as_postgres "$(pg_bin)/initdb" -D "$data" -U postgres --auth=scram-sha-256 \
    --pwfile="$DIR/pg-password" -E UTF8 >"$DIR/postgres-init.log"
}

pg_running() {
  as_postgres "$(pg_bin)/pg_ctl" -D "$DIR/postgres" status >/dev/null 2>&1
}

pg_start() {
  pg_running && return 0
  as_postgres "$(pg_bin)/pg_ctl" -D "$DIR/postgres" -w -t 60 -l "$DIR/postgres-run/postgres.log" \
    -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $DIR/postgres-run -c max_connections=300 -c fsync=on" \
    start >/dev/null || die "PostgreSQL did not start; see $DIR/postgres-run/postgres.log"
}

pg_stop() {
  pg_running || return 0
  as_postgres "$(pg_bin)/pg_ctl" -D "$DIR/postgres" -m fast -w stop >/dev/null
}

pg_database() {
  PGPASSWORD=$PG_PASSWORD psql -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres \
    -v ON_ERROR_STOP=1 >/dev/null <<SQL
SELECT 'CREATE ROLE silo LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'silo')\gexec
ALTER ROLE silo PASSWORD '$PG_PASSWORD';
SELECT 'CREATE DATABASE silo OWNER silo' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'silo')\gexec
SQL
}

# -------------------------------------------------------------------- Garage

garage_bin() {
  if type -P garage >/dev/null 2>&1; then
    type -P garage
  else
    printf '%s\n' "${CARGO_HOME:-$HOME/.cargo}/bin/garage"
  fi
}

garage_install() {
  local bin
  bin=$(garage_bin)
  if [ -x "$bin" ] && [[ "$("$bin" --version 2>/dev/null)" == *"$GARAGE_VERSION"* ]]; then
    return 0
  fi
  log "building Garage $GARAGE_VERSION from crates.io (first use only; several minutes)"
  # Its metadata on SQLite; no metrics exporter, no K2V API: a smaller
  # build. SILO_FLEET_GARAGE_DEBUG=1 builds it unoptimised, in about half
  # the time (CI's choice: its blobs are small).
  local profile=()
  [ "${SILO_FLEET_GARAGE_DEBUG:-}" = 1 ] && profile=(--debug)
  cargo install --quiet --locked "${profile[@]}" "garage@$GARAGE_VERSION" \
    --no-default-features --features bundled-libs,sqlite
}

garage_run() { "$(garage_bin)" -c "$DIR/garage.toml" "$@"; }

garage_config() {
  [ -f "$DIR/garage.toml" ] && return 0
  mkdir -p "$DIR/garage/meta" "$DIR/garage/data"
  cat >"$DIR/garage.toml" <<TOML
metadata_dir = "$DIR/garage/meta"
data_dir = "$DIR/garage/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$RPC_PORT"
rpc_public_addr = "127.0.0.1:$RPC_PORT"
rpc_secret = "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"

[s3_api]
s3_region = "$REGION"
api_bind_addr = "127.0.0.1:$S3_PORT"
root_domain = ".s3.localhost"

[admin]
api_bind_addr = "127.0.0.1:$ADMIN_PORT"
admin_token = "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
TOML
}

s3_running() { [ -f "$DIR/garage.pid" ] && kill -0 "$(cat "$DIR/garage.pid")" 2>/dev/null; }

s3_start() {
  s3_running && return 0
  nohup "$(garage_bin)" -c "$DIR/garage.toml" server >>"$DIR/garage.log" 2>&1 &
  echo $! >"$DIR/garage.pid"
  for _ in $(seq 1 100); do
    garage_run status >/dev/null 2>&1 && return 0
    s3_running || break
    sleep 0.1
  done
  die "Garage did not start; see $DIR/garage.log"
}

s3_stop() {
  s3_running || return 0
  kill "$(cat "$DIR/garage.pid")"
  for _ in $(seq 1 100); do
    s3_running || { rm -f "$DIR/garage.pid"; return 0; }
    sleep 0.1
  done
  kill -9 "$(cat "$DIR/garage.pid")" 2>/dev/null || true
  rm -f "$DIR/garage.pid"
}

# A one-node layout, the bucket, and a key of ours allowed on it (imported,
# so its id and secret are known without parsing Garage's output).
s3_bucket() {
  local layout
  layout=$(garage_run layout show 2>/dev/null || true)
  if [[ "$layout" != *"Current cluster layout version: "[1-9]* ]]; then
    local node
    node=$(garage_run node id -q 2>/dev/null | cut -d@ -f1)
    garage_run layout assign -z local -c 10G "$node" >/dev/null
    garage_run layout apply --version 1 >/dev/null
  fi
  garage_run bucket info "$BUCKET" >/dev/null 2>&1 || garage_run bucket create "$BUCKET" >/dev/null
  garage_run key info "$S3_KEY_ID" >/dev/null 2>&1 ||
    garage_run key import --yes -n silo "$S3_KEY_ID" "$S3_SECRET" >/dev/null
  garage_run bucket allow --read --write --owner "$BUCKET" --key "$S3_KEY_ID" >/dev/null
}

# --------------------------------------------------------------------- state

# Credentials are made once and kept beside the data they open.
secrets() {
  mkdir -p "$DIR"
  if [ ! -f "$DIR/secrets" ]; then
    {
      printf 'PG_PASSWORD=%s\n' "$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
      printf 'S3_KEY_ID=GK%s\n' "$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
      printf 'S3_SECRET=%s\n' "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    } >"$DIR/secrets"
    chmod 600 "$DIR/secrets"
  fi
  # shellcheck disable=SC1091
  . "$DIR/secrets"
}

print_aws() {
  cat <<ENV
export AWS_ENDPOINT_URL=http://127.0.0.1:$S3_PORT
export AWS_ACCESS_KEY_ID=$S3_KEY_ID
export AWS_SECRET_ACCESS_KEY=$S3_SECRET
export AWS_REGION=$REGION
ENV
}

print_env() {
  cat <<ENV
export SILO_STATE_URL=postgres://silo:$PG_PASSWORD@127.0.0.1:$PG_PORT/silo
export SILO_STORE_URL=s3://$BUCKET/fleet
ENV
  print_aws
}

print_test_env() {
  cat <<ENV
export SILO_TEST_POSTGRES_URL=postgres://silo:$PG_PASSWORD@127.0.0.1:$PG_PORT/silo
export SILO_TEST_S3_URL=s3://$BUCKET/test
ENV
  print_aws
}

secrets
case "${1:-}" in
  up)
    pg_install
    pg_init
    pg_start
    pg_database
    garage_install
    garage_config
    s3_start
    s3_bucket
    log "PostgreSQL on 127.0.0.1:$PG_PORT, Garage's S3 API on 127.0.0.1:$S3_PORT ($DIR)"
    print_env
    ;;
  env) print_env ;;
  test-env) print_test_env ;;
  down)
    s3_stop
    pg_stop
    ;;
  pg-stop) pg_stop ;;
  pg-start) pg_start ;;
  s3-stop) s3_stop ;;
  s3-start) s3_start ;;
  *) die "usage: scripts/fleet.sh up|env|test-env|down|pg-stop|pg-start|s3-stop|s3-start" ;;
esac

#!/usr/bin/env bash
# Installs what building and running silo needs on a Debian machine: the musl
# target (the agent is a static musl binary), musl-tools (the C compiler that
# crates with C parts use for musl), busybox-static (the registry-free base
# image of the demo and the tests) and a running Docker engine. Extra Debian
# packages may be named as arguments (.ci/run adds what the tests use); when
# podman is installed, its Docker-compatible API socket is started too (the
# Podman backend's engine), where silo looks for it.
#
# The README's demo command and .ci/run both start here. Where it cannot
# install (not root, no apt-get, no rustup), it changes nothing and stops
# with the exact commands to run. Safe to run repeatedly.
set -euo pipefail
# The toolchain that rust-toolchain.toml pins is the one that needs the target.
cd "$(dirname "$0")/.."

MUSL_TARGET=x86_64-unknown-linux-musl
packages=(musl-tools busybox-static "$@")
todo=()

log() { printf '== %s\n' "$*" >&2; }

can_install() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

missing_packages() {
  local pkg
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || printf '%s\n' "$pkg"
  done
}

apt_install() {
  local missing
  mapfile -t missing < <(missing_packages "$@")
  [ "${#missing[@]}" -gt 0 ] || return 0
  if can_install; then
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    todo+=("sudo apt-get install -y ${missing[*]}")
  fi
}

engine_answers() { docker info >/dev/null 2>&1; }

start_engine() {
  engine_answers && return 0
  if ! can_install; then
    todo+=("sudo apt-get install -y docker.io && sudo systemctl start docker  # or start dockerd by hand")
    return 0
  fi
  apt_install docker.io fuse-overlayfs iptables
  if ! pgrep -x dockerd >/dev/null; then
    log "starting dockerd (log: /tmp/silo-dockerd.log)"
    if command -v systemctl >/dev/null 2>&1 && systemctl start docker 2>/dev/null; then
      :
    else
      (dockerd >/tmp/silo-dockerd.log 2>&1 &)
    fi
  fi
  for _ in $(seq 1 60); do
    engine_answers && return 0
    sleep 1
  done
  cat /tmp/silo-dockerd.log >&2 2>/dev/null || true
  echo "setup: the Docker engine did not start" >&2
  exit 1
}

# Where silo looks for Podman's API socket (see backend/podman): the
# variable, else root's or the user's default.
podman_socket() {
  if [ -n "${SILO_PODMAN_SOCKET:-}" ]; then
    printf '%s\n' "${SILO_PODMAN_SOCKET#unix://}"
  elif [ "$(id -u)" = 0 ] || [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    printf '%s\n' /run/podman/podman.sock
  else
    printf '%s\n' "$XDG_RUNTIME_DIR/podman/podman.sock"
  fi
}

# Podman has no daemon: `podman system service` serves its API on a socket,
# started here in the background (no timeout) unless one answers already.
start_podman() {
  command -v podman >/dev/null 2>&1 || return 0
  local socket answers
  socket=$(podman_socket)
  answers() { podman --remote --url "unix://$socket" version >/dev/null 2>&1; }
  answers && return 0
  log "starting podman's API socket at $socket (log: /tmp/silo-podman.log)"
  mkdir -p "$(dirname "$socket")"
  rm -f "$socket"
  (podman system service --time=0 "unix://$socket" >/tmp/silo-podman.log 2>&1 &)
  for _ in $(seq 1 30); do
    answers && return 0
    sleep 1
  done
  cat /tmp/silo-podman.log >&2 2>/dev/null || true
  echo "setup: podman's API socket did not answer at $socket" >&2
  exit 1
}

if command -v rustup >/dev/null 2>&1; then
  if ! rustup target list --installed | grep -qx "$MUSL_TARGET"; then
    log "adding the Rust target $MUSL_TARGET"
    rustup target add "$MUSL_TARGET"
  fi
else
  todo+=("rustup target add $MUSL_TARGET  # needs rustup: https://rustup.rs")
fi
apt_install "${packages[@]}"
start_engine
start_podman

if [ "${#todo[@]}" -gt 0 ]; then
  {
    echo "setup: silo needs these steps first (this script cannot do them: it needs root and apt-get):"
    printf '  %s\n' "${todo[@]}"
    echo "then run this command again."
  } >&2
  exit 1
fi
log "ready: musl target, musl-tools, busybox-static and a Docker engine"
if command -v podman >/dev/null 2>&1; then
  log "and podman's API socket at $(podman_socket)"
fi

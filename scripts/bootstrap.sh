#!/usr/bin/env bash
# Shared set-up for scripts/preflight and scripts/test: creates .venv and
# installs the pinned requirements, only when they changed since the last run.
# Sourced, not executed.  Usage: bootstrap_venv requirements.txt [apt packages...]
set -euo pipefail

PREFLIGHT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFLIGHT_VENV="${PREFLIGHT_VENV:-$PREFLIGHT_ROOT/.venv}"
PREFLIGHT_PYTHON="${PREFLIGHT_PYTHON:-python3}"

bootstrap_apt() {
  # Install missing Debian packages when running as root; otherwise only warn.
  local missing=()
  local pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: missing packages ${missing[*]}; run as root or install them with apt-get" >&2
    return 0
  fi
  echo "bootstrap: apt-get install ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

bootstrap_venv() {
  local req="$PREFLIGHT_ROOT/$1"
  local stamp="$PREFLIGHT_VENV/.stamp-$(basename "$req")"
  local want
  want="$(cat "$req" "$PREFLIGHT_ROOT/requirements.txt" | sha256sum | cut -d' ' -f1)"
  if [ ! -x "$PREFLIGHT_VENV/bin/python" ]; then
    echo "bootstrap: creating $PREFLIGHT_VENV" >&2
    if ! "$PREFLIGHT_PYTHON" -m venv "$PREFLIGHT_VENV"; then
      # Debian's system Python ships venv separately.
      rm -rf "$PREFLIGHT_VENV"
      bootstrap_apt python3-venv
      "$PREFLIGHT_PYTHON" -m venv "$PREFLIGHT_VENV"
    fi
  fi
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "bootstrap: installing $1 into $PREFLIGHT_VENV (first run takes a few minutes)" >&2
    # pip's notes about absent local index directories are noise; errors still show.
    "$PREFLIGHT_VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$req" 2>&1 \
      | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "bootstrap: pip install failed" >&2; return 1; }
    echo "$want" >"$stamp"
  fi
  # The project's own two packages (pyproject.toml: preflight_node, the node layer, and cluster_preflight,
  # the controller), editable, so plugins, the CLI and scripts import them from this checkout.
  local project_stamp="$PREFLIGHT_VENV/.stamp-project"
  local project_want
  project_want="$( (cat "$PREFLIGHT_ROOT/pyproject.toml"; echo "$PREFLIGHT_ROOT") | sha256sum | cut -d' ' -f1)"
  if [ "$(cat "$project_stamp" 2>/dev/null)" != "$project_want" ]; then
    echo "bootstrap: installing the project's packages into $PREFLIGHT_VENV (editable)" >&2
    "$PREFLIGHT_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
      -e "$PREFLIGHT_ROOT" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "bootstrap: installing the project failed" >&2; return 1; }
    echo "$project_want" >"$project_stamp"
  fi
  export PATH="$PREFLIGHT_VENV/bin:$PATH"
  export VIRTUAL_ENV="$PREFLIGHT_VENV"
}

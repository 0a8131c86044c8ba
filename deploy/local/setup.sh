#!/usr/bin/env bash
# Installs what Ragline needs on this machine, idempotently: Debian packages, the .venv with the
# project and its dev extra, the OpenSearch artifacts and S3Proxy. A second run does only what changed.
set -euo pipefail
HERE=$(dirname "${BASH_SOURCE[0]}")
source "$HERE/lib.sh"

# tesseract and poppler: OCR of PDF pages without a text layer; git: `git` sources (and their
# tests' git daemon and smart HTTP servers).
APT_PACKAGES=(redis-server tesseract-ocr tesseract-ocr-eng poppler-utils git)
# What the scripts call, from Debian where this machine lacks it: Maven fetches OpenSearch and
# S3Proxy from Maven Central, a JRE 17 runs them, and the project needs Python 3.11 with venv.
command -v mvn >/dev/null || APT_PACKAGES+=(maven)
command -v curl >/dev/null || APT_PACKAGES+=(curl)
# OpenSearch and S3Proxy each take their own JAVA_HOME, else this JRE (S3Proxy: else `java`).
if [ ! -x /usr/lib/jvm/java-17-openjdk-amd64/bin/java ] && { [ -z "${RAGLINE_OPENSEARCH_JAVA_HOME:-}" ] \
  || { [ -z "${RAGLINE_S3_JAVA_HOME:-}" ] && ! command -v java >/dev/null; }; }; then
  APT_PACKAGES+=(openjdk-17-jre-headless)
fi
# A Python 3.11 with venv, only to make the venv where there is none.
python_fits() { "$1" -c 'import ensurepip, sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; }
PYTHON=${PYTHON:-}
if [ ! -x "$VENV/bin/python" ]; then
  if [ -n "$PYTHON" ] && ! python_fits "$PYTHON"; then
    say "setup: PYTHON=$PYTHON is not a Python 3.11 with venv; looking for one"
    PYTHON=
  fi
  for candidate in python3.11 python3; do
    [ -n "$PYTHON" ] || ! python_fits "$candidate" || PYTHON=$candidate
  done
  if [ -z "$PYTHON" ]; then
    PYTHON=/usr/bin/python3.11
    APT_PACKAGES+=(python3.11 python3.11-venv)
  fi
fi

install_apt() {
  local missing=() pkg
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "setup: apt-get install ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  if [[ " ${missing[*]} " == *" python3.11 "* ]] && ! apt-cache show python3.11 >/dev/null 2>&1; then
    die "Ragline needs Python 3.11 with venv, and this system's apt has none (Ubuntu 24.04 and Debian 13 \
ship other versions): install one (pyenv, uv, a distribution package) and run again with PYTHON=/path/to/python3.11"
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install_venv() {
  local stamp=$VENV/.ragline-installed want
  want=$(cat "$REPO_ROOT/pyproject.toml" $(ls "$REPO_ROOT"/constraints.txt 2>/dev/null) | sha256sum | cut -d' ' -f1)
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  say "setup: installing Python packages into $VENV"
  # The packages take about 8 GiB installed, 4 of them torch's CUDA wheels (PyPI's only Linux
  # torch), and pip keeps each download until its command ends, plus a copy in its cache. Without
  # the cache, and with torch in a step of its own, a machine with little disk left gets through.
  local pip=("$VENV/bin/python" -m pip install -q --no-cache-dir)
  "${pip[@]}" --upgrade pip
  local constraints=()
  [ -f "$REPO_ROOT/constraints.txt" ] && constraints=(-c "$REPO_ROOT/constraints.txt")
  "${pip[@]}" "${constraints[@]}" torch
  "${pip[@]}" "${constraints[@]}" -e "$REPO_ROOT[dev]"
  # unstructured imports unstructured_inference even for the fast PDF strategy, but its own
  # dependencies (timm, torchvision, accelerate) serve only hi_res, which Ragline never uses.
  "${pip[@]}" "${constraints[@]}" --no-deps unstructured-inference
  echo "$want" >"$stamp"
}

install_apt
install_venv
bash "$HERE/opensearch.sh" install
bash "$HERE/s3.sh" install

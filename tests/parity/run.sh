#!/usr/bin/env bash
# The parity suite (tests/parity/README.md): trainerd's jobs against plain PyTorch loops, through
# the Python client installed in its environment (python/venv.sh, as python/run_tests.sh).
#
#   tests/parity/run.sh [PYTHON] [PYTEST ARGS...]
#
# PYTHON (or $TRAINERD_PYTHON): the torch environment's interpreter. The daemon under test is
# $TRAINERD_BIN (default build/release/server/trainerd).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$(dirname "$here")")"
python="${TRAINERD_PYTHON:-}"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  python="$1"
  shift
fi
venv_python="$("$repo/python/venv.sh" ${python:+"$python"})"
export TRAINERD_BIN="${TRAINERD_BIN:-$repo/build/release/server/trainerd}"
export TRAINERD_PYCLIENT_INSTALLED=1
cd "$here"
exec "$(dirname "$venv_python")/pytest" -p no:cacheprovider "$here" "$@"

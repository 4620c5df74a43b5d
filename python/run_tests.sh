#!/usr/bin/env bash
# Tests of the Python client (python/): installs the package into a virtual environment of its
# own (python/venv.sh), then runs `mypy --strict` on it and its pytest suite against the real
# daemon.
#
#   python/run_tests.sh [PYTHON] [PYTEST ARGS...]
#
# PYTHON (or $TRAINERD_PYTHON): the interpreter the environment is made from, normally the torch
# environment's ($TRAINERD_TORCH_VENV/bin/python from build/deps.env); its packages (torch,
# numpy) stay visible in the new environment, which is made once at $TRAINERD_PYCLIENT_VENV
# (default ${XDG_CACHE_HOME:-~/.cache}/trainerd/pyclient-venv). The package is reinstalled only
# when its sources (or the .proto files) changed since the last run, with its extras (torch,
# safetensors, pandas, progress, test, notebook: the example notebook's test runs a Jupyter
# kernel, optuna, tensorboard and mlflow: the exports' tests read back what they wrote).
#
# The daemon under test is $TRAINERD_BIN (default build/release/server/trainerd), trainctl
# $TRAINCTL_BIN (default: the same build's client/trainctl).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

python="${TRAINERD_PYTHON:-}"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  python="$1"
  shift
fi
venv_python="$("$here/venv.sh" ${python:+"$python"})"
venv="$(dirname "$(dirname "$venv_python")")"

# Both check the installed package (with its generated modules), not python/trainerd: mypy from a
# folder outside the source tree, pytest through its script (which, unlike `python -m pytest`,
# does not put the current folder on sys.path; conftest.py checks it).
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "run_tests.sh: mypy --strict" >&2
(cd "$work" && "$venv/bin/python" -m mypy --strict --config-file "$here/pyproject.toml" \
  --cache-dir "$venv/.mypy_cache" -p trainerd)
echo "run_tests.sh: pytest" >&2
export TRAINERD_BIN="${TRAINERD_BIN:-$repo/build/release/server/trainerd}"
export TRAINERD_PYCLIENT_INSTALLED=1
cd "$here"
exec "$venv/bin/pytest" -p no:cacheprovider tests "$@"

#!/usr/bin/env bash
# The Python client's virtual environment: made once, with ./python[torch,safetensors,pandas,
# progress,test,notebook,optuna,tensorboard,mlflow] installed into it and reinstalled whenever the
# package's sources (or the .proto files) changed. Prints the environment's python on stdout;
# what it does goes to stderr. Shared by python/run_tests.sh and bench/run.sh (`make test`,
# `make bench`).
#
#   python/venv.sh [PYTHON]
#
# PYTHON (or $TRAINERD_PYTHON): the interpreter the environment is made from, normally the torch
# environment's ($TRAINERD_TORCH_VENV/bin/python from build/deps.env); its packages (torch,
# numpy) stay visible in the new environment, which is made once at $TRAINERD_PYCLIENT_VENV
# (default ${XDG_CACHE_HOME:-~/.cache}/trainerd/pyclient-venv).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

python="${1:-${TRAINERD_PYTHON:-}}"
if [ -z "$python" ] && [ -f "$repo/build/deps.env" ]; then
  torch_venv="$(sed -n 's/^TRAINERD_TORCH_VENV=//p' "$repo/build/deps.env")"
  [ -n "$torch_venv" ] && [ -x "$torch_venv/bin/python" ] && python="$torch_venv/bin/python"
fi
python="${python:-python3}"

venv="${TRAINERD_PYCLIENT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/trainerd/pyclient-venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "venv.sh: creating $venv from $python" >&2
  "$python" -m venv --system-site-packages "$venv"
fi
# --system-site-packages shows the base interpreter's packages, not those of a virtual
# environment $python may be (the torch one): a .pth file adds its site-packages after ours.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
source_site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ "$source_site" != "$site" ]; then
  echo "$source_site" >"$site/trainerd-source-python.pth"
fi

# What the installed package was built from: its sources and the .proto files.
extras="torch,safetensors,pandas,progress,test,notebook,optuna,tensorboard,mlflow"
stamp_file="$venv/.trainerd-pyclient-stamp"
stamp="$(cd "$repo" && {
  find python/setup.py python/pyproject.toml python/README.md python/trainerd proto/trainerd \
    -type f \( -name '*.py' -o -name '*.proto' -o -name '*.toml' -o -name '*.md' -o -name py.typed \) \
    ! -name '*_pb2.py' ! -name '*_pb2_grpc.py' -print0 | sort -z | xargs -0 sha256sum
  "$venv/bin/python" --version
  echo "$extras"
} | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp" ] ||
  ! "$venv/bin/python" -c 'import trainerd, pytest, mypy, nbclient, optuna, tensorboard, mlflow' 2>/dev/null; then
  echo "venv.sh: installing ./python[$extras] into $venv" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade \
    "$here[$extras]" >&2
  echo "$stamp" >"$stamp_file"
fi
echo "$venv/bin/python"

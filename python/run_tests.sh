#!/usr/bin/env bash
# Tests of the Python client (python/): installs the package into a virtual environment of its
# own, then runs `mypy --strict` on it and its pytest suite against the real daemon.
#
#   python/run_tests.sh [PYTHON] [PYTEST ARGS...]
#
# PYTHON (or $TRAINERD_PYTHON): the interpreter the environment is made from, normally the torch
# environment's ($TRAINERD_TORCH_VENV/bin/python from build/deps.env); its packages (torch,
# numpy) stay visible in the new environment, which is made once at $TRAINERD_PYCLIENT_VENV
# (default ${XDG_CACHE_HOME:-~/.cache}/trainerd/pyclient-venv). The package is reinstalled only
# when its sources (or the .proto files) changed since the last run.
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
if [ -z "$python" ] && [ -f "$repo/build/deps.env" ]; then
  torch_venv="$(sed -n 's/^TRAINERD_TORCH_VENV=//p' "$repo/build/deps.env")"
  [ -n "$torch_venv" ] && [ -x "$torch_venv/bin/python" ] && python="$torch_venv/bin/python"
fi
python="${python:-python3}"

venv="${TRAINERD_PYCLIENT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/trainerd/pyclient-venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "run_tests.sh: creating $venv from $python" >&2
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
stamp_file="$venv/.trainerd-pyclient-stamp"
stamp="$(cd "$repo" && {
  find python/setup.py python/pyproject.toml python/README.md python/trainerd proto/trainerd \
    -type f \( -name '*.py' -o -name '*.proto' -o -name '*.toml' -o -name '*.md' -o -name py.typed \) \
    ! -name '*_pb2.py' ! -name '*_pb2_grpc.py' -print0 | sort -z | xargs -0 sha256sum
  "$venv/bin/python" --version
} | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp" ] ||
  ! "$venv/bin/python" -c 'import trainerd, pytest, mypy, nbclient' 2>/dev/null; then
  echo "run_tests.sh: installing ./python[torch,pandas,progress,test,notebook] into $venv" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade \
    "$here[torch,pandas,progress,test,notebook]" >&2
  echo "$stamp" >"$stamp_file"
fi

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

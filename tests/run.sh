#!/usr/bin/env bash
# Run the test suite from a fresh clone: make a virtual environment if none is
# active, install the project with its test extras, then run pytest.
# Extra arguments go to pytest (e.g. tests/run.sh -k sender -x).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# A C compiler and Python's headers (the C extensions), Java (Spark), systemd's tools (the unit's tests).
deploy/install-system-packages.sh --tests

if [[ -z "${VIRTUAL_ENV:-}" ]]; then
    if [[ ! -x .venv/bin/python ]]; then
        python3 -m venv .venv
    fi
    # shellcheck disable=SC1091
    source .venv/bin/activate
fi

python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e ".[dev,quickstart]"

exec python -m pytest "$@"

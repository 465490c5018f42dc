#!/usr/bin/env bash
# The quickstart from a fresh clone: make a virtual environment if none is active,
# install kafka-sidecar with its embedded broker, and run `kafka-sidecar quickstart`
# (broker, daemon and four producing processes on this machine, all on loopback).
# Extra arguments go to the quickstart (e.g. deploy/quickstart.sh --processes 8).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

deploy/install-system-packages.sh  # a C compiler and Python's headers (the C extension), Java (Spark)

if [[ -z "${VIRTUAL_ENV:-}" ]]; then
    if [[ ! -x .venv/bin/python ]]; then
        python3 -m venv .venv
    fi
    # shellcheck disable=SC1091
    source .venv/bin/activate
fi

python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e ".[quickstart]"

exec kafka-sidecar --log-level WARNING quickstart "$@"

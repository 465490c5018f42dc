#!/usr/bin/env bash
# The quickstart from a fresh clone: make a virtual environment if none is active,
# install kafka-sidecar with its embedded broker, and run `kafka-sidecar quickstart`
# (broker, daemon and four producing processes on this machine, all on loopback,
# then the example Spark pipeline through the same daemon).
# Extra arguments go to the quickstart (e.g. deploy/quickstart.sh --processes 8).
#
# apt, venv, pip and setuptools write their output to a log, shown only if a step fails: pip
# warns even with --quiet (an ignored index location, say) and setuptools prints banners while
# it builds the C extensions.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

install_log="$(mktemp -t kafka-sidecar-install.XXXXXX)"
trap 'rm -f "$install_log"' EXIT

# Run a step with its output going to the log; on failure, show the log and stop.
quietly() {
    if ! "$@" >>"$install_log" 2>&1; then
        echo "deploy/quickstart.sh: this step failed: $*" >&2
        cat "$install_log" >&2
        exit 1
    fi
}

quietly deploy/install-system-packages.sh  # a C compiler and Python's headers (the C extension), Java (Spark)

if [[ -z "${VIRTUAL_ENV:-}" ]]; then
    if [[ ! -x .venv/bin/python ]]; then
        quietly python3 -m venv .venv
    fi
    # shellcheck disable=SC1091
    source .venv/bin/activate
fi

echo "installing kafka-sidecar and the quickstart's dependencies into ${VIRTUAL_ENV#"$root"/}" \
     "(a few minutes the first time: pyspark is built from its source) ..."
quietly python -m pip install --quiet --upgrade pip
quietly python -m pip install --quiet -e ".[quickstart]"

rm -f "$install_log"  # exec leaves the EXIT trap behind
exec kafka-sidecar --log-level WARNING quickstart "$@"

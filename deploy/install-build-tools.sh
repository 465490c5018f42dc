#!/usr/bin/env bash
# The client's fast path (client_stub/_fastpath.c) is a C extension: installing
# kafka-sidecar from source needs a C compiler and Python's headers. Installs gcc
# and python3-dev with apt-get when either is missing (the quickstart and the test
# command call this before pip).
set -euo pipefail

has_headers() {
    python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
}

if command -v cc >/dev/null 2>&1 && has_headers; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "kafka-sidecar: install a C compiler and Python's headers (python3-dev) first" >&2
    exit 1
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then
    sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq gcc python3-dev >/dev/null

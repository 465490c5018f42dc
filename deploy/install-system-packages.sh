#!/usr/bin/env bash
# What kafka-sidecar needs from the system, installed with apt-get when missing (the quickstart
# and the test command call this before pip; the test command with --tests):
# - a C compiler and Python's headers: the per-record work (client_stub/_fastpath.c,
#   service/_fastpath.c) is in C extensions built at install time (without them the install goes on
#   with the pure-Python twins, about ten times slower per record); gcc, with its AddressSanitizer
#   and UndefinedBehaviorSanitizer runtimes, for the test that runs them under the sanitizers
#   (tests/integration/test_sanitizers.py);
# - Java 17: Spark runs on a JVM (the quickstart's pipeline and the Spark tests);
# - with --tests, systemd's tools (systemd-analyze, systemd-sysusers, systemd-tmpfiles): the tests check
#   the unit and the sysusers.d and tmpfiles.d entries under systemd/ with them
#   (tests/integration/test_systemd_units.py); a container has systemd's libraries but not its tools.
set -euo pipefail

has_headers() {
    python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
}

has_sanitizers() {
    # gcc prints the bare name back for a file it does not have.
    [[ $(gcc -print-file-name=libasan.so) == /* && $(gcc -print-file-name=libubsan.so) == /* ]]
}

missing=()
if ! command -v gcc >/dev/null 2>&1 || ! has_headers; then
    missing+=(gcc python3-dev)  # gcc's libgcc-N-dev brings the sanitizers' runtimes
elif ! has_sanitizers; then
    missing+=("libgcc-$(gcc -dumpversion | cut -d. -f1)-dev")  # libasan.so and libubsan.so, on Debian and Ubuntu
fi
java_major() {
    # `java -version` says e.g. 'openjdk version "17.0.15" 2025-04-15' (or "1.8.0_..." for Java 8).
    java -version 2>&1 | sed -n 's/.* version "\(1\.\)\{0,1\}\([0-9]*\).*/\2/p' | head -n 1
}
if ! command -v java >/dev/null 2>&1 || [[ $(java_major) -lt 17 ]]; then
    missing+=(openjdk-17-jre-headless)  # Spark 4 runs on Java 17 or 21
fi
if [[ ${1:-} == --tests ]] && ! command -v systemd-analyze >/dev/null 2>&1; then
    missing+=(systemd)
fi
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "kafka-sidecar: install these first (or your system's equivalents): ${missing[*]}" >&2
    exit 1
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then
    sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null

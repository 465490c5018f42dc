#!/usr/bin/env bash
# Spark runs on a JVM: the Spark pipeline of the quickstart and the Spark tests need Java 17 (or 21).
# Installs Debian's openjdk-17-jre-headless with apt-get when no java is on PATH.
set -euo pipefail

if command -v java >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "kafka-sidecar: Spark needs Java 17 or 21; install a JRE first" >&2
    exit 1
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then
    sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openjdk-17-jre-headless >/dev/null

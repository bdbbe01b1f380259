#!/bin/sh
# Installs the command-line tools some targets use, from Debian's packages, when missing:
#   scripts/install-tools.sh curl wrk prometheus-parser
# curl (the HTTP tests' client), wrk (the http benchmark's load generator), prometheus-parser
# (the Prometheus text parser of python3-prometheus-client, for /metrics in the tests). Uses sudo
# only when not root; does nothing when every tool asked for is there.
set -eu
missing=""
for tool in "$@"; do
    case "$tool" in
        curl) command -v curl >/dev/null 2>&1 || missing="$missing curl" ;;
        wrk) command -v wrk >/dev/null 2>&1 || missing="$missing wrk" ;;
        prometheus-parser)
            /usr/bin/python3 -c "import prometheus_client.parser" >/dev/null 2>&1 || missing="$missing python3-prometheus-client" ;;
        *) echo "install-tools: unknown tool '$tool' (curl, wrk, prometheus-parser)" >&2; exit 2 ;;
    esac
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "Please install:$missing" >&2
    exit 1
fi
echo "Installing$missing…" >&2
$SUDO apt-get update -qq
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null

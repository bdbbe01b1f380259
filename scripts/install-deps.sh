#!/bin/sh
# Installs what Mainspring needs from Debian's packages (libevent-dev, pkg-config) when
# pkg-config cannot find libevent. Uses sudo only when not root.
set -eu
if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libevent; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "Mainspring needs libevent 2.1 and pkg-config; install them with your package manager." >&2
    exit 1
fi
echo "Installing libevent-dev and pkg-config…" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libevent-dev pkg-config >/dev/null
pkg-config --exists libevent

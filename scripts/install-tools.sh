#!/bin/sh
# Installs the tools some tests run, from Debian's packages, when they are missing:
# systemd-socket-activate and systemd-analyze (package systemd; installing it starts nothing),
# and testssl.sh (package testssl.sh, whose program is `testssl`) for the TLS scan test.
# Never fails the build: without the tools, the tests that need them are skipped with a message.
# Uses sudo only when not root.
set -u
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
updated=""

# best_effort PACKAGE WHAT TOOL…: installs PACKAGE when one of the TOOLs is missing.
best_effort() {
    package="$1"
    what="$2"
    shift 2
    missing=""
    for tool in "$@"; do
        command -v "$tool" >/dev/null 2>&1 || missing="${missing:+$missing and }$tool"
    done
    [ -z "$missing" ] && return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "note: missing $missing (package $package); the tests that need $what will be skipped." >&2
        return 0
    fi
    echo "Installing $package (for $what in the tests)…" >&2
    if [ -z "$updated" ]; then
        $SUDO apt-get update -qq || true
        updated=yes
    fi
    if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$package" >/dev/null; then
        echo "note: could not install $package; the tests that need $what will be skipped." >&2
    fi
}

best_effort systemd "systemd-socket-activate and systemd-analyze" systemd-socket-activate systemd-analyze
# Debian names the program `testssl`; upstream's is `testssl.sh`.
if ! command -v testssl.sh >/dev/null 2>&1; then
    best_effort testssl.sh "testssl.sh" testssl
fi
exit 0

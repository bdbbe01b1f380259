#!/bin/sh
# Installs the tools some tests run, from Debian's packages, when they are missing:
# systemd-socket-activate and systemd-analyze (package systemd; installing it starts nothing).
# Never fails the build: without the tools, the tests that need them are skipped with a message.
# Uses sudo only when not root.
set -u
missing=""
for tool in systemd-socket-activate systemd-analyze; do
    command -v "$tool" >/dev/null 2>&1 || missing="${missing:+$missing and }$tool"
done
[ -z "$missing" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "note: missing $missing (package systemd); the tests that need them will be skipped." >&2
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
echo "Installing systemd (for systemd-socket-activate and systemd-analyze in the tests)…" >&2
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends systemd >/dev/null; }; then
    echo "note: could not install systemd; the tests that need its tools will be skipped." >&2
fi
exit 0

#!/bin/sh
# Installs what Mainspring needs from Debian's packages. Always: libevent-dev and pkg-config,
# when pkg-config cannot find libevent, zlib1g-dev when it cannot find zlib (WebSocket compression),
# libnghttp2-dev when it cannot find nghttp2 (HTTP/2), and libssl-dev when it cannot find OpenSSL
# (MainspringTLS). Then any extra packages a make target names as
# arguments (`install-deps.sh valgrind`), each only when it is missing: a package counts as
# present when dpkg has it installed or a program of that name is on the PATH.
# Uses sudo only when not root.
set -eu

missing=""
if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libevent; }; then
    missing="libevent-dev pkg-config"
fi
# MainspringHTTP's WebSocket compression (permessage-deflate): zlib.
if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists zlib; }; then
    missing="$missing zlib1g-dev"
fi
# MainspringHTTP's HTTP/2: nghttp2.
if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libnghttp2; }; then
    missing="$missing libnghttp2-dev"
fi
# MainspringTLS: OpenSSL 3 and libevent's OpenSSL layer (libevent_openssl comes with libevent-dev).
if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libevent_openssl openssl; }; then
    missing="$missing libssl-dev"
fi
for package in "$@"; do
    if command -v "$package" >/dev/null 2>&1; then continue; fi
    if command -v dpkg-query >/dev/null 2>&1 \
        && dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        continue
    fi
    missing="$missing $package"
done
[ -n "$missing" ] || exit 0

if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "Mainspring needs:$missing (libevent 2.1 with pkg-config, plus what the target asked for);" \
        "install them with your package manager." >&2
    exit 1
fi
echo "Installing $(echo $missing) …" >&2
$SUDO apt-get update -qq
# shellcheck disable=SC2086 # one word per package
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
pkg-config --exists libevent libevent_openssl openssl libnghttp2
for package in "$@"; do
    command -v "$package" >/dev/null 2>&1 || dpkg-query -W "$package" >/dev/null 2>&1 || {
        echo "install-deps: $package is still missing" >&2
        exit 1
    }
done

#!/bin/sh
# Make sure the native gRPC frontend can be built: it needs libnghttp2's headers (Debian: libnghttp2-dev).
# Installs them when they are missing and this machine allows it (root, apt-get); otherwise says that
# the build will skip the native frontend and fastoip will serve gRPC with grpcio.
set -u
have_headers() {
    [ -f /usr/include/nghttp2/nghttp2.h ] && return 0
    command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libnghttp2 && return 0
    return 1
}
if have_headers; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "fastoip: installing libnghttp2-dev for the native gRPC frontend"
    if apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libnghttp2-dev; then
        exit 0
    fi
    echo "fastoip: apt-get could not install libnghttp2-dev"
fi
echo "fastoip: libnghttp2 headers not found: the native gRPC frontend will not be built (grpcio serves gRPC);" \
     "install libnghttp2-dev and run make build to get it"
exit 0

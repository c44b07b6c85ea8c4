#!/usr/bin/env bash
# Runs the Go binding's tests against a build: installs it into a staging prefix so that cgo
# finds libswiftkv the way a user's program does (#cgo pkg-config: swiftkv), then `go test`
# with Debian's Go, offline (no module proxy).
# Usage: run_tests.sh BUILD_DIR WORK_DIR CMAKE GO
set -euo pipefail
build=$1 work=$2 cmake=$3 go=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work/stage"
"$cmake" --install "$build" --prefix "$work/stage" >/dev/null
pc=$(find "$work/stage" -name swiftkv.pc -print -quit)
libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir swiftkv)
cd "$here"
export PKG_CONFIG_PATH=$(dirname "$pc") CGO_LDFLAGS="-Wl,-rpath,$libdir"
export GOCACHE=$work/gocache GOPATH=$work/gopath GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local
"$go" vet ./...
"$go" test -count=1 ./...

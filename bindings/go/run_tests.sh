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

# A program in a module of its own, outside this tree, as a user writes one: it imports
# swiftkv.dev/bindings/swiftkv through a go.work file that names this module (no replace
# directive, nothing fetched). docs/bindings.md gives the same steps.
consumer=$work/consumer
rm -rf "$consumer"
mkdir -p "$consumer/app"
cat >"$consumer/app/go.mod" <<'MOD'
module example.com/app

go 1.19
MOD
cat >"$consumer/app/main.go" <<'SRC'
package main

import (
	"fmt"

	"swiftkv.dev/bindings/swiftkv"
)

func main() {
	ctx, err := swiftkv.NewContext(swiftkv.DefaultConfig())
	if err != nil {
		panic(err)
	}
	defer ctx.Close()
	fmt.Println("consumer: context open")
}
SRC
(cd "$consumer" && GOFLAGS= "$go" work init ./app "$here" && cd app && GOFLAGS= "$go" run . ) |
  grep -qx "consumer: context open"

#!/bin/sh
# Builds the corpus's Go programs (gomutex, httpserver, httpload) into the directory $1, with the
# host's Go toolchain and no modules (they use the standard library only). Called by the tests
# (tests/src/corpus.rs) and by xtask for the kernel matrix's guests, which cannot build them.
set -eu
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$(dirname "$0")"
GO111MODULE=off GOFLAGS= exec go build -o "$out/" ./gomutex ./httpserver ./httpload

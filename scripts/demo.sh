#!/usr/bin/env bash
# The main job on a local default: starts RabbitMQ nodes and amqp-mirror in
# front of them, prints how to connect, and runs until Ctrl-C (or SIGTERM).
# Flags go to `amqp-mirror demo`: see `./scripts/demo.sh --help`.
#
# The binary is built and exec'd rather than run with `go run`: go run does not
# pass SIGINT/SIGTERM on to the program it runs, so stopping this script by its
# pid would orphan the demo and its brokers. After exec, this script's pid is
# the demo's, and the demo stops every broker it started before it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
mkdir -p bin
# Built under a temporary name and renamed: a rename never meets a running copy
# of the binary ("text file busy"), so two demos can start at once.
go build -o "bin/.amqp-mirror.$$" .
mv -f "bin/.amqp-mirror.$$" bin/amqp-mirror
exec ./bin/amqp-mirror demo "$@"

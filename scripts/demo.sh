#!/usr/bin/env bash
# The main job on a local default: starts RabbitMQ nodes and amqp-mirror in
# front of them, prints how to connect, and runs until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
exec go run . demo "$@"

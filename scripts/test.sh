#!/usr/bin/env bash
# The whole test suite: unit, fuzz-corpus replay and integration tests against
# real RabbitMQ nodes, with the race detector. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
exec go test -race -count=1 -timeout 40m ./...

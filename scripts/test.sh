#!/usr/bin/env bash
# The whole test suite: unit, fuzz-corpus replay and integration tests against
# real RabbitMQ nodes, with the race detector. Installs what it needs first.
#
# The integration package is most of the time, and most of its time is waiting
# (broker boots, failover grace periods, failure detection), so its tests run as
# several test binaries at once, one per part of integrationParts in
# integration/split_test.go, each with its own three brokers, after the other
# packages, which run first and alone. Each integration run's output is printed
# whole when it ends, headed by its name; the script exits non-zero if anything
# failed, after all have ended.
#
# AMQP_MIRROR_TEST_LONG=1 (make test-long) runs the long tier: the same tests with the
# repeated faults and large backlogs at full size (bySize in integration/tier_test.go).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh

# Must equal len(integrationParts); a binary given another count refuses to run.
integration_parts=3
timeout=40m
[ "${AMQP_MIRROR_TEST_LONG:-}" != 1 ] || timeout=90m

work=$(mktemp -d "${TMPDIR:-/tmp}/amqp-mirror-test.XXXXXX")
declare -A names=() logs=() started=()
stop() {
	trap - INT TERM
	# The test binaries stop their brokers on SIGTERM before they exit.
	[ ${#names[@]} -eq 0 ] || kill -TERM "${!names[@]}" 2>/dev/null || true
	wait || true
	rm -rf "$work"
	exit 130
}
trap stop INT TERM
trap 'rm -rf "$work"' EXIT

# launch NAME COMMAND...: runs the command in the background, its output to a
# file of its own.
launch() {
	local name=$1
	shift
	local log="$work/${#logs[@]}.log"
	"$@" >"$log" 2>&1 &
	names[$!]=$name
	logs[$!]=$log
	started[$!]=$SECONDS
	echo "=== started: $name"
}

failed=()
# The other packages first, alone: several of them start brokers of their own
# and time failure detection, which three integration binaries' nine brokers
# beside them on two cores made fail (a watcher judging live brokers down).
mapfile -t packages < <(go list ./... | grep -v '/integration$')
name="go test (all packages but ./integration/)"
echo "=== $name"
if go test -race -count=1 -timeout "$timeout" "${packages[@]}"; then
	echo "=== ok: $name (${SECONDS}s)"
else
	echo "=== FAIL: $name (${SECONDS}s)"
	failed+=("$name")
fi
# One build of the integration test binary for all parts; go test runs a test
# binary in its package's directory, and so do we.
echo "building the integration test binary"
if go test -race -c -o "$work/integration.test" ./integration/; then
	for part in $(seq "$integration_parts"); do
		launch "integration part $part/$integration_parts" env AMQP_MIRROR_INTEGRATION_PART="$part/$integration_parts" \
			sh -c 'cd integration && exec "$0" -test.count=1 -test.timeout="$1"' "$work/integration.test" "$timeout"
	done
else
	failed+=("building the integration test binary")
fi

while [ ${#names[@]} -gt 0 ]; do
	status=0
	wait -n -p pid "${!names[@]}" || status=$?
	name=${names[$pid]}
	elapsed=$((SECONDS - ${started[$pid]}))
	unset "names[$pid]"
	if [ "$status" -eq 0 ]; then
		echo "=== ok: $name (${elapsed}s)"
	else
		echo "=== FAIL: $name (exit $status, ${elapsed}s)"
		failed+=("$name")
	fi
	cat "${logs[$pid]}"
done

if [ ${#failed[@]} -gt 0 ]; then
	echo "=== FAILED:"
	printf '    %s\n' "${failed[@]}"
	exit 1
fi
echo "=== all passed in ${SECONDS}s"

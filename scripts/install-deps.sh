#!/usr/bin/env bash
# Installs the system packages the tests need, on Debian or Ubuntu. Idempotent: packages
# already installed are left alone, and apt-get runs only when something is missing.
#
#   rabbitmq-server  the brokers the demo and the tests start (internal/localbroker)
#   amqp-specs       the AMQP 0-9-1 spec XML the codec generator reads
#   python3-pika     the second client of the transparency tests
#   amqp-tools       amqp-publish/amqp-consume, a third client
#   make             .ci/run calls make test
#   chromium         the headless browser that renders the admin status page in its test
#
# The package's postinst starts its own broker (as user rabbitmq, on port 5672); the tests
# start their own nodes, so that one is kept from starting, or stopped. Test nodes run as
# the invoking user and are never touched. epmd is shared by all Erlang nodes and left alone.
set -euo pipefail

packages=(rabbitmq-server amqp-specs python3-pika amqp-tools make chromium)

say() { echo "install-deps: $*"; }

missing=()
for package in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$package")
	fi
done

if ((${#missing[@]} == 0)); then
	say "already installed: ${packages[*]}"
elif [[ $(id -u) != 0 ]]; then
	say "missing: ${missing[*]}; as root, run:" >&2
	echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
	exit 1
else
	# A policy-rc.d that answers 101 tells invoke-rc.d not to start services, so the
	# package's broker does not start at all. Ours is removed again on exit; an existing
	# one (Docker images have it) is left as it is.
	policy=/usr/sbin/policy-rc.d
	if [[ ! -e $policy ]]; then
		say "creating $policy so that the package does not start its broker"
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		trap 'rm -f "$policy"; say "removed $policy"' EXIT
	fi
	say "apt-get update"
	apt-get update
	say "apt-get install -y --no-install-recommends ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

# package_brokers prints the pids of beam.smp processes owned by the rabbitmq user: brokers
# the package started. Test nodes run as the invoking user. Reads /proc, as a minimal image
# may lack procps.
package_brokers() {
	local uid directory
	uid=$(id -u rabbitmq 2>/dev/null) || return 0
	for directory in /proc/[0-9]*; do
		if [[ $(cat "$directory/comm" 2>/dev/null) == beam.smp && $(stat -c %u "$directory" 2>/dev/null) == "$uid" ]]; then
			echo "${directory#/proc/}"
		fi
	done
}

brokers=$(package_brokers)
if [[ -n $brokers ]]; then
	if [[ $(id -u) != 0 ]]; then
		say "warning: the package's RabbitMQ broker is running (pids $brokers); tests do not need it" >&2
	else
		for pid in $brokers; do
			say "stopping the package's RabbitMQ broker (beam.smp pid $pid, user rabbitmq)"
			kill -TERM "$pid" 2>/dev/null || true
		done
		for _ in $(seq 1 300); do
			[[ -z $(package_brokers) ]] && break
			sleep 0.1
		done
		for pid in $(package_brokers); do
			say "broker pid $pid ignored SIGTERM for 30s; killing it"
			kill -KILL "$pid" 2>/dev/null || true
		done
	fi
fi

server=/usr/lib/rabbitmq/bin/rabbitmq-server
if [[ ! -x $server ]]; then
	say "$server is missing although rabbitmq-server is installed" >&2
	exit 1
fi
say "ready"

# The README's two commands are ./scripts/demo.sh and ./scripts/test.sh;
# these targets are the same entry points for people who type make.
GO ?= go
FUZZTIME ?= 60s

.PHONY: build test test-long chaos chaos-sidecar demo bench bench-proxy fuzz generate vet

build:
	$(GO) build -o amqp-mirror .

test:
	./scripts/test.sh

# The same suite with its repeated faults and large backlogs at full size: ten kills in a
# row instead of three, a sync of 100 000 messages instead of 20 000.
test-long:
	AMQP_MIRROR_TEST_LONG=1 ./scripts/test.sh

# The fault campaign's long tier: 105 faults of every kind, mixed, under a workload
# whose every message is checked (docs/testing.md); the table lands in CAMPAIGN_REPORT.
CAMPAIGN_REPORT ?= campaign-report.txt
chaos:
	./scripts/install-deps.sh
	AMQP_MIRROR_TEST_LONG=1 AMQP_MIRROR_CAMPAIGN_REPORT=$(abspath $(CAMPAIGN_REPORT)) \
		$(GO) test -race -count=1 -v -timeout 120m -run '^TestCampaign$$' ./integration/

# The sidecar cluster's long tier: 100 faults, partitions mixed with kills, freezes and
# wipes of proxies, nodes and brokers (docs/testing.md); the table lands in
# SIDECAR_CAMPAIGN_REPORT.
SIDECAR_CAMPAIGN_REPORT ?= campaign-sidecar-report.txt
chaos-sidecar:
	./scripts/install-deps.sh
	AMQP_MIRROR_TEST_LONG=1 AMQP_MIRROR_CAMPAIGN_REPORT=$(abspath $(SIDECAR_CAMPAIGN_REPORT)) \
		$(GO) test -race -count=1 -v -timeout 120m -run '^TestCampaignPartitions$$' ./integration/

demo:
	./scripts/demo.sh

# The benchmark report (under ten minutes on two cores): the proxy in front of one broker,
# amqp-mirror against RabbitMQ's classic mirroring and quorum queues, and a master kill on
# each, printed as tables and written to REPORTDIR/report.md and REPORTDIR/failover.svg;
# then the codec, socket and bookkeeping micro-benchmarks. BENCHFLAGS adds flags.
REPORTDIR ?= bench-results/report
BENCHFLAGS ?=
bench:
	$(GO) run ./integration/bench -scenario=report -report-dir=$(REPORTDIR) $(BENCHFLAGS)
	$(GO) test -run '^$$' -bench . -benchmem ./frames/ ./proxy/

# The proxy in front of one broker in detail: directly, through a plain TCP forwarder and
# through the proxy, alternately on the same broker; idle memory; backpressure.
bench-proxy:
	$(GO) run ./integration/bench $(BENCHFLAGS)

# Every fuzz target for FUZZTIME each (go test -fuzz takes one target at a time).
fuzz:
	for target in FuzzReadFrame FuzzDecodeMethod FuzzDecodeTable FuzzContentHeader; do \
		$(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) ./frames/ || exit 1; \
	done
	$(GO) test -run '^$$' -fuzz '^FuzzTap$$' -fuzztime $(FUZZTIME) ./mirror/controllink/
	$(GO) test -run '^$$' -fuzz '^FuzzProxyClientBytes$$' -fuzztime $(FUZZTIME) ./integration/

generate:
	$(GO) generate ./...

vet:
	$(GO) vet ./...
	test -z "$$(gofmt -l .)"

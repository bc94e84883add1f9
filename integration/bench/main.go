// Command bench measures what amqp-mirror's proxy costs a client: throughput and latency
// of the same load run directly against a RabbitMQ node, through a plain TCP forwarder
// (socat) and through the proxy, on the same broker in one run, plus how much memory the
// proxy holds per idle connection and when a consumer stops reading.
//
//	go run ./integration/bench                    # everything, about seven minutes
//	go run ./integration/bench -scenario=full -rounds=3 -proxy-cpuprofile=/tmp/proxy.pprof
//	go tool pprof -top /tmp/proxy.full.1.pprof
//	go run ./integration/bench -targets=direct,proxy,baseline -baseline-cmd='/tmp/old-bench -role=proxy -backend={backend}'
//	go run ./integration/bench -scenario=mirrored -rounds=3
//	go run ./integration/bench -scenario=mirrored -rounds=3 -mirrored-targets=direct,amqp-mirror,amqp-mirror-baseline -amqp-mirror-baseline-bin=/tmp/old-amqp-mirror -amqp-mirror-perf=/tmp/m.data
//	go run ./integration/bench -scenario=failover -failover-kills=5
//	go run ./integration/bench -scenario=report -report-dir=bench-results/report
//
// The last form compares two builds of the proxy in one run: build the bench of the older
// commit to /tmp/old-bench and let it be the baseline target.
//
// Processes. The broker is one node started with internal/localbroker (or an existing
// broker given by -amqp-url). The proxy runs in a separate process, as in a deployment:
// the bench binary re-executes itself with the hidden flag -role=proxy, which runs
// proxy.New and Serve and prints its listen address on stdout; the proxy ends when its
// stdin closes (the bench is done, or died) or on SIGTERM. -proxy-cmd runs another proxy
// command instead. A fresh proxy process serves each measured run, so every run starts
// from the same state and a CPU profile covers exactly one run. The socat target runs
// `socat TCP-LISTEN:port,fork TCP:broker`, which forks one process per connection; its
// CPU and system calls are counted over the process and its children.
//
// Scenarios (-scenario, comma separated):
//
//   - full: P publishers with pipelined publisher confirms (at most -confirm-window
//     unconfirmed messages each) and C consumers with manual acks (prefetch -prefetch, one
//     basic.ack per message as RabbitMQ PerfTest does unless -multi-ack), persistent
//     messages of -size bytes. Queue i (durable, one per publisher/consumer pair, as
//     PerfTest's -x/-y with one queue each) carries publisher i's messages to consumer i;
//     with unequal counts, publisher and consumer i use queue i mod max(P, C).
//     Each connection carries one channel, so the proxy serves one client connection per
//     publisher and per consumer. The clients are amqp091-go, which writes every publish
//     and every ack with a system call of its own: the most a forwarder has to wake for.
//   - full-raw: full's load with the bench's raw client (rawload.go), which writes what it
//     has and flushes when its reader runs dry, so many publishes and acks share a system
//     call: the least a forwarder has to wake for.
//   - light: one publisher that waits for each confirm before the next message, paced at
//     -light-rate messages per second, and one consumer: the latency the proxy adds when
//     nothing queues. A confirm slower than the pace delays the next message rather than
//     causing a catch-up burst, so the rate achieved shows in published/s.
//   - rss: backpressure. -rss-messages messages of -rss-size bytes are put in a transient
//     queue directly at the broker; then a raw AMQP client consumes them through the proxy
//     with no-ack and stops reading its socket. The proxy process's VmRSS is sampled every
//     100 ms while the client stalls and while it finally drains the queue.
//   - idle: -idle-conns idle amqp091-go connections (rising counts, default 1 000 then
//     3 000) are opened through a fresh proxy process; at each count the resident sets of
//     the proxy and the broker give their memory per connection. Then all close, and the
//     proxy's resident set is read 1, 5, 10 and -idle-linger seconds later. Run for the
//     proxy and baseline targets; socat's process per connection would say nothing.
//   - mirrored: full's load (amqp091-go) on a mirrored queue, four rows in one table with
//     ratios to the first: direct, one plain RabbitMQ node; amqp-mirror, `amqp-mirror
//     serve --config` (a separate process, built with go build into a temporary directory
//     unless -amqp-mirror-bin names one) in front of three plain nodes, its config's
//     policy ha-mode all with ha-sync-mode automatic; native-ha, RabbitMQ's own classic
//     mirroring on a three-node RabbitMQ cluster of the same version (the same policy set
//     with rabbitmqctl set_policy), clients on its first node; quorum, quorum queues on
//     that cluster. The scenario starts these six nodes itself (-amqp-url does not apply)
//     and runs -mirrored-targets in rounds like the other loads. Before each load it
//     counts the copies of the run's queues on the brokers themselves (passive declares
//     on each plain node; rabbitmqctl list_queues synchronised_slave_pids or online on the
//     cluster) and waits up to 15 s for all three; a row with fewer says so in its copies
//     column. Then the rate of queue.declare, directly and through amqp-mirror, for
//     -declare-duration each: an RPC client's server-named exclusive auto-delete queue,
//     declared and deleted per call, and a declare of a named durable queue that exists.
//     Row amqp-mirror-baseline (not in the default) runs the -amqp-mirror-baseline-bin
//     build like amqp-mirror, alternating with it on the same nodes: on a shared machine
//     a change is only comparable with its predecessor in one run. -amqp-mirror-perf
//     records each amqp-mirror server with perf record -g (serve has no pprof endpoint;
//     perf also shows the kernel's share, system calls and scheduling).
//     About a minute to start and 20 s per run: three to four minutes with -rounds=1
//     (direct, amqp-mirror, native-ha, quorum, direct), six to seven with -rounds=3, so it
//     is not in the default list.
//   - failover (failover.go; not in the default list): the mirrored scenario's nodes, and
//     on each of -failover-targets (amqp-mirror: clients on the proxy, without reconnect
//     logic; native-ha: clients on a cluster node other than the master's, reconnecting to
//     another node and consuming again, sending again what was not confirmed) one
//     publisher waiting for each confirm and one consumer with manual acks on a mirrored
//     queue, while the queue master's node is killed with SIGKILL -failover-kills times,
//     each time restarted and waited for until it is a synchronised mirror again. One table:
//     messages confirmed and never delivered, duplicates, publishes neither confirmed nor
//     nacked, and the time from each kill to the first delivery of a message published
//     after it. About four minutes with the default five kills.
//   - connections (connections.go; not in the default list): amqp-mirror serve in front
//     of three plain nodes, -conns-queues mirrored queues; -conns-idle idle amqp091-go
//     connections, then -conns-active working ones (half publish -conns-rate msg/s in all
//     with confirms, half consume with manual acks). At each step the proxy's resident
//     set, open files and CPU and the brokers' resident sets and CPU over a -duration
//     window, and the confirm latency: what a connection costs a mirroring proxy.
//   - backlog (backlog.go; not in the default list): what a long queue costs amqp-mirror.
//     The scale scenario's setup (three plain nodes, amqp-mirror serve with ha-mode all
//     and automatic sync) with one durable queue, filled through the proxy with
//     -backlog-messages persistent messages of -backlog-size bytes by -publishers
//     publishers (confirm window -confirm-window), no consumer: publish rate, the proxy's
//     RSS before and with the backlog held (bytes per queued message) and its CPU per
//     published message. Then a slave's node is wiped and started again empty: the time
//     from its return until amqp-mirror ctl lists it synchronised, and the proxy's RSS
//     meanwhile. Last a kill -9 of the master's node: the time until ctl names another
//     master and until a consumer started after the kill (prefetch -prefetch, an ack per
//     message) gets its first message; that consumer drains the backlog, and the table
//     counts the confirmed messages that never arrived. About 9 minutes on two cores
//     with the default 1 000 000 messages, 3 with -backlog-messages=100000.
//   - sync (sync.go; not in the default list): on each of -sync-targets (amqp-mirror,
//     native-ha), a mirrored queue with ha-sync-mode manual gets a backlog of
//     -sync-messages while a slave's node is stopped; the node comes back with an
//     unsynchronised slave, the queue's own clients start (one publisher at -sync-rate
//     waiting for each confirm, one consumer with manual acks at the same pace), and the
//     queue is synchronised: amqp-mirror ctl sync_queue, or RabbitMQ's blocking sync. One
//     table: the sync's time and rate, and the clients' confirm latencies, longest confirm
//     and longest wait between two deliveries before and during the sync, and messages
//     confirmed and never delivered. About three minutes at the defaults.
//   - report (reportrun.go; not in the default list): the benchmark report, in under ten
//     minutes on two cores. On the mirrored scenario's nodes: full's load on the first plain
//     node directly and through the proxy, alternately (direct, proxy, direct, proxy,
//     direct); the mirrored loads in rounds likewise; then one timeline each on
//     amqp-mirror, classic mirroring and a quorum queue (timeline.go): the failover
//     scenario's clients while the node holding the master (the leader) is killed once,
//     counted in buckets of 100 ms. -rounds, -warmup and -duration default to 3, 2 s and
//     8 s here.
//     Beside the usual tables it writes into -report-dir report.md (the machine, the date,
//     the headline ratios, the command) and failover.svg (chart.go: delivered msg/s and
//     confirm latency p99 through the kill, one line per target). report.md also
//     includes the fault campaigns' last tables (-campaign-reports), which make chaos
//     and make chaos-sidecar write: a campaign takes far longer than the report.
//
// Runs alternate, each round running every target of -targets once and a last direct run
// ending the scenario (direct, socat, proxy, direct for -rounds=1), and the summary takes each target's median, so that drift of the broker
// over time (its disk, its memory) shows in the per-run rows and does not bias the ratio.
//
// Beside throughput and latency, each run reports the CPU the broker, the proxy and the
// bench used during the measured time, and "other": what the rest of the machine used.
// On a shared machine other tenants take cores from the broker; runs with much "other"
// are not comparable, and -rounds=3 with its medians is the remedy. Proxy runs also
// report the proxy's read and write system calls per message (/proc/PID/io).
//
// Latencies are exact percentiles of every sample in the measured window: publish→confirm
// is from just before basic.publish to the arrival of its basic.ack at the client;
// publish→delivery uses a monotonic timestamp in the first 8 body bytes (publisher and
// consumer share this process's clock).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	harness "github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// config is every flag, parsed.
type config struct {
	scenarios []string
	rounds    int
	amqpURL   string
	proxyCmd  string
	jsonPath  string
	verbose   bool
	// targets are where the load goes, in the order each round runs them: direct,
	// socat, proxy, baseline.
	targets     []string
	baselineCmd string

	publishers    int
	consumers     int
	confirmWindow int
	prefetch      int
	multiAck      int
	size          int
	warmup        time.Duration
	duration      time.Duration

	lightRate     float64
	lightWarmup   time.Duration
	lightDuration time.Duration

	rssMessages int
	rssSize     int
	rssStall    time.Duration

	idleCounts []int
	idleLinger time.Duration

	// mirroredTargets are the mirrored scenario's rows, in the order of each round.
	mirroredTargets []string
	mirrorBin       string
	// mirrorBaselineBin is the amqp-mirror-baseline row's binary; mirrorPerf, when
	// set, asks for a perf profile of each amqp-mirror run.
	mirrorBaselineBin string
	mirrorPerf        string
	// mirroredRate paces the mirrored scenario's publishers (messages per second, all
	// together); 0 publishes as fast as confirms allow.
	mirroredRate    float64
	declareDuration time.Duration
	// classicQueueVersion, when not 0, is every mirrored node's
	// classic_queue.default_version: 2 stores classic queues (and their copies) in
	// RabbitMQ's second storage format.
	classicQueueVersion int
	// scaleQueues and scaleRate are the scale scenario's queues and publishes per
	// second over all of them.
	scaleQueues int
	scaleRate   float64
	// connsIdle, connsActive, connsQueues and connsRate size the connections scenario.
	connsIdle, connsActive, connsQueues int
	connsRate                           float64
	// backlogMessages and backlogSize are the backlog scenario's queued messages and
	// their body size in bytes.
	backlogMessages int
	backlogSize     int
	// syncTargets, syncMessages and syncRate are the sync scenario's rows, backlog and
	// clients' pace.
	syncTargets  []string
	syncMessages int
	syncRate     float64

	// failoverTargets are the failover scenario's rows; failoverKills the kills per row.
	failoverTargets []string
	failoverKills   int

	// reportDir is where the report scenario writes report.md and failover.svg;
	// campaignReports are the fault campaigns' tables it includes.
	reportDir       string
	campaignReports []string

	proxyCPUProfile string
	proxyLogLevel   string
	proxyGOMAXPROCS int

	// The proxy role's own flags, hidden from -h.
	role       string
	backend    string
	listen     string
	cpuProfile string
	pprofAddr  string
}

// hiddenFlags are the proxy role's flags: the bench passes them to its own child.
var hiddenFlags = map[string]bool{"role": true, "backend": true, "listen": true, "cpuprofile": true, "pprof": true}

func parseFlags(args []string) (config, error) {
	var cfg config
	var scenarios, targets, idleCounts, mirrored, failover, campaigns, syncTargets string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&scenarios, "scenario", "full,full-raw,light,idle,rss", "comma-separated `list` of scenarios to run: full, full-raw, light, idle, rss, mirrored (not in the default: it starts six nodes and takes three to four minutes with -rounds=1), failover (not in the default: kills brokers; see failover.go), scale (not in the default: -scale-queues mirrored queues, then a kill of the node mastering the most; see scale.go), connections (not in the default: -conns-idle idle and -conns-active working connections through a mirroring proxy; see connections.go), backlog (not in the default: -backlog-messages queued on one mirrored queue, a slave synchronised from empty, a kill of the master; see backlog.go), sync (not in the default: a slave synchronised under its queue's clients, amqp-mirror and native; see sync.go), report (not in the default: pass-through, mirrored and a master kill per target, written to -report-dir; see reportrun.go)")
	fs.IntVar(&cfg.rounds, "rounds", 1, "rounds per load scenario; each round runs every target once, and a last direct run ends the scenario")
	fs.StringVar(&targets, "targets", "direct,socat,proxy", "comma-separated `list` of where full, full-raw and light load goes, in the order of each round: direct (the broker), socat (a plain TCP forwarder), proxy (amqp-mirror), baseline (-baseline-cmd)")
	fs.StringVar(&cfg.baselineCmd, "baseline-cmd", "", "a second proxy `command`, for target baseline (e.g. an older build): same contract as -proxy-cmd")
	fs.StringVar(&cfg.amqpURL, "amqp-url", "", "`URL` of a running broker to use instead of starting a RabbitMQ node, e.g. amqp://guest:guest@127.0.0.1:5672/")
	fs.StringVar(&cfg.proxyCmd, "proxy-cmd", "", "run this `command` as the proxy instead of the bench's own proxy role; {backend} is replaced by the broker's host:port and the command must print its listen host:port as its first stdout line, and exit when its stdin closes")
	fs.StringVar(&cfg.jsonPath, "json", "", "also write the results as JSON to `file`")
	fs.BoolVar(&cfg.verbose, "v", false, "log the harness's progress (starting and stopping RabbitMQ) on stderr")

	fs.IntVar(&cfg.publishers, "publishers", 2, "full: publishers, each on its own connection")
	fs.IntVar(&cfg.consumers, "consumers", 2, "full: consumers, each on its own connection")
	fs.IntVar(&cfg.confirmWindow, "confirm-window", 256, "full: unconfirmed messages each publisher may have outstanding")
	fs.IntVar(&cfg.prefetch, "prefetch", 256, "full: consumer prefetch (basic.qos)")
	fs.IntVar(&cfg.multiAck, "multi-ack", 0, "full: ack with multiple=true every `N` messages; 0 acks each message")
	fs.IntVar(&cfg.size, "size", 1024, "message body size in bytes, full and light (at least 8: the timestamp)")
	fs.DurationVar(&cfg.warmup, "warmup", 3*time.Second, "full: load before measuring starts")
	fs.DurationVar(&cfg.duration, "duration", 15*time.Second, "full: measured time per run")

	fs.Float64Var(&cfg.lightRate, "light-rate", 500, "light: the publisher's pace in messages per second, at most: it also waits for each confirm")
	fs.DurationVar(&cfg.lightWarmup, "light-warmup", 2*time.Second, "light: load before measuring starts")
	fs.DurationVar(&cfg.lightDuration, "light-duration", 10*time.Second, "light: measured time per run")

	fs.IntVar(&cfg.rssMessages, "rss-messages", 1024, "rss: messages queued for the stalled consumer")
	fs.IntVar(&cfg.rssSize, "rss-size", 1<<20, "rss: message body size in bytes")
	fs.DurationVar(&cfg.rssStall, "rss-stall", 5*time.Second, "rss: how long the consumer does not read")

	fs.StringVar(&idleCounts, "idle-conns", "1000,3000", "idle: comma-separated rising `counts` of idle amqp091-go connections to hold open through the proxy")
	fs.DurationVar(&cfg.idleLinger, "idle-linger", 30*time.Second, "idle: how long to watch the proxy's RSS after the connections closed")

	fs.StringVar(&mirrored, "mirrored-targets", strings.Join(mirroredTargets, ","), "mirrored: comma-separated `list` of rows, in the order of each round: direct (one plain node), amqp-mirror (amqp-mirror serve in front of three plain nodes, ha-mode all), native-ha (RabbitMQ's classic mirroring, ha-mode all, on a three-node cluster), quorum (quorum queues on that cluster), amqp-mirror-baseline (not in the default: -amqp-mirror-baseline-bin's build, like amqp-mirror)")
	fs.StringVar(&cfg.mirrorBin, "amqp-mirror-bin", "", "mirrored: the amqp-mirror `binary` to run; default: go build of this module into a temporary directory")
	fs.StringVar(&cfg.mirrorBaselineBin, "amqp-mirror-baseline-bin", "", "mirrored: the amqp-mirror `binary` of row amqp-mirror-baseline (add it to -mirrored-targets), e.g. an older commit's build, measured on the same nodes in the same rounds")
	fs.IntVar(&cfg.scaleQueues, "scale-queues", 1000, "scale: how many mirrored `queues` to declare")
	fs.Float64Var(&cfg.scaleRate, "scale-rate", 1000, "scale: persistent messages per second, published to the queues in turn")
	fs.IntVar(&cfg.connsIdle, "conns-idle", 10000, "connections: idle client `connections` to hold open")
	fs.IntVar(&cfg.connsActive, "conns-active", 1000, "connections: working client `connections`, half publishing and half consuming")
	fs.IntVar(&cfg.connsQueues, "conns-queues", 100, "connections: mirrored `queues` the working connections share")
	fs.Float64Var(&cfg.connsRate, "conns-rate", 1000, "connections: persistent messages per second the publishers send in all")
	fs.IntVar(&cfg.backlogMessages, "backlog-messages", 1000000, "backlog: persistent `messages` to queue on the mirrored queue before the sync and the kill")
	fs.IntVar(&cfg.backlogSize, "backlog-size", 256, "backlog: message body size in `bytes` (at least 8: the message's number)")
	fs.StringVar(&syncTargets, "sync-targets", targetMirror+","+targetNativeHA, "sync: comma-separated `list` of rows: amqp-mirror (serve in front of three plain nodes), native-ha (RabbitMQ's classic mirroring on a three-node cluster)")
	fs.IntVar(&cfg.syncMessages, "sync-messages", 100000, "sync: the backlog's `messages` (-size bytes, persistent), which the sync copies")
	fs.Float64Var(&cfg.syncRate, "sync-rate", 500, "sync: the queue's clients' pace in messages per second, publishing and consuming")
	fs.IntVar(&cfg.classicQueueVersion, "classic-queue-version", 0, "mirrored: set classic_queue.default_version to `n` (1 or 2) in every node's rabbitmq.conf, plain and clustered; 0 leaves the broker's default (1 on 3.10)")
	fs.StringVar(&cfg.mirrorPerf, "amqp-mirror-perf", "", "mirrored: record each amqp-mirror run's server with `perf record -g` into `file` with the row and server number inserted (/tmp/m.data gives /tmp/m.amqp-mirror.2.data); read with perf report")
	fs.Float64Var(&cfg.mirroredRate, "mirrored-rate", 0, "mirrored: publish at most `N` messages per second, all publishers together (0: as fast as confirms allow). At a rate every row sustains, the CPU per message compares rows doing the same work, which a shared machine's throughput does not")
	fs.DurationVar(&cfg.declareDuration, "declare-duration", 5*time.Second, "mirrored: how long each queue.declare rate is measured")

	fs.StringVar(&failover, "failover-targets", targetMirror+","+targetNativeHA, "failover: comma-separated `list` of rows: amqp-mirror (serve in front of three plain nodes, clients without reconnect logic), native-ha (RabbitMQ's classic mirroring on a three-node cluster, clients that reconnect)")
	fs.IntVar(&cfg.failoverKills, "failover-kills", 5, "failover: kill -9 of the queue master's node per target")
	fs.StringVar(&cfg.reportDir, "report-dir", "bench-results/report", "report: the `directory` to write report.md and failover.svg into, created if missing")
	fs.StringVar(&campaigns, "campaign-reports", "campaign-report.txt,campaign-sidecar-report.txt", "report: comma-separated `files` of fault-campaign tables to include, each with its date, when it exists (what make chaos and make chaos-sidecar write)")

	fs.StringVar(&cfg.proxyCPUProfile, "proxy-cpuprofile", "", "write a CPU profile of the proxy process of each full and light run, named after `file` with the scenario and run inserted: /tmp/p.pprof gives /tmp/p.full.1.pprof...")
	fs.StringVar(&cfg.proxyLogLevel, "proxy-log-level", "warn", "proxy process log level: debug, info, warn or error")
	fs.IntVar(&cfg.proxyGOMAXPROCS, "proxy-gomaxprocs", 0, "run the proxy process with GOMAXPROCS=`N`; 0 leaves Go's default (the number of cores)")

	fs.StringVar(&cfg.role, "role", "", "internal: proxy runs the proxy process")
	fs.StringVar(&cfg.backend, "backend", "", "internal: the proxy's broker host:port")
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:0", "internal: the proxy's listen address")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "internal: the proxy's CPU profile file")
	fs.StringVar(&cfg.pprofAddr, "pprof", "", "internal: serve net/http/pprof on this address in the proxy process")

	fs.Usage = func() { usage(fs) }
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.scenarios = splitList(scenarios)
	cfg.campaignReports = splitList(campaigns)
	if cfg.has("report") {
		// The report's loads are shorter than full's, to fit its three parts in ten
		// minutes on two cores, and run three times, for medians; flags given on the
		// command line still apply.
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		if !given["rounds"] {
			cfg.rounds = reportRounds
		}
		if !given["warmup"] {
			cfg.warmup = reportWarmup
		}
		if !given["duration"] {
			cfg.duration = reportDuration
		}
	}
	cfg.targets = splitList(targets)
	cfg.mirroredTargets = splitList(mirrored)
	cfg.failoverTargets = splitList(failover)
	cfg.syncTargets = splitList(syncTargets)
	var errs []error
	for _, c := range splitList(idleCounts) {
		n, err := strconv.Atoi(c)
		if err != nil || n <= 0 || len(cfg.idleCounts) > 0 && n <= cfg.idleCounts[len(cfg.idleCounts)-1] {
			errs = append(errs, fmt.Errorf("-idle-conns: %q is not a positive count above the previous one", c))
			continue
		}
		cfg.idleCounts = append(cfg.idleCounts, n)
	}
	return cfg, errors.Join(append(errs, cfg.validate())...)
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

func (cfg config) validate() error {
	if cfg.role != "" {
		if cfg.role != "proxy" {
			return fmt.Errorf("-role %q: the only role is proxy", cfg.role)
		}
		if cfg.backend == "" {
			return errors.New("-role=proxy needs -backend")
		}
		return nil
	}
	var errs []error
	for _, s := range cfg.scenarios {
		if !slices.Contains([]string{"full", "full-raw", "light", "idle", "rss", "mirrored", "failover", "scale", "connections", "backlog", "sync", "report"}, s) {
			errs = append(errs, fmt.Errorf("-scenario: unknown scenario %q, want full, full-raw, light, idle, rss, mirrored, failover, scale, connections, backlog, sync or report", s))
		}
	}
	if len(cfg.scenarios) == 0 {
		errs = append(errs, errors.New("-scenario: no scenario given"))
	}
	for _, t := range cfg.targets {
		if !slices.Contains([]string{"direct", "socat", "proxy", "baseline"}, t) {
			errs = append(errs, fmt.Errorf("-targets: unknown target %q, want direct, socat, proxy or baseline", t))
		}
	}
	if !slices.Contains(cfg.targets, "direct") {
		errs = append(errs, errors.New("-targets: direct is needed, every ratio is against it"))
	}
	for _, t := range cfg.mirroredTargets {
		if !slices.Contains(mirroredRows, t) {
			errs = append(errs, fmt.Errorf("-mirrored-targets: unknown target %q, want %s", t, strings.Join(mirroredRows, ", ")))
		}
	}
	if slices.Contains(cfg.mirroredTargets, targetMirrorBaseline) != (cfg.mirrorBaselineBin != "") {
		errs = append(errs, errors.New("-mirrored-targets amqp-mirror-baseline and -amqp-mirror-baseline-bin go together"))
	}
	if !slices.Contains(cfg.mirroredTargets, targetDirect) {
		errs = append(errs, errors.New("-mirrored-targets: direct is needed, every ratio is against it"))
	}
	for _, t := range cfg.failoverTargets {
		if t != targetMirror && t != targetNativeHA {
			errs = append(errs, fmt.Errorf("-failover-targets: unknown target %q, want %s or %s", t, targetMirror, targetNativeHA))
		}
	}
	for _, t := range cfg.syncTargets {
		if t != targetMirror && t != targetNativeHA {
			errs = append(errs, fmt.Errorf("-sync-targets: unknown target %q, want %s or %s", t, targetMirror, targetNativeHA))
		}
	}
	if cfg.syncMessages <= 0 || cfg.syncRate <= 0 {
		errs = append(errs, fmt.Errorf("-sync-messages and -sync-rate must be positive, got %d and %g", cfg.syncMessages, cfg.syncRate))
	}
	if cfg.failoverKills <= 0 {
		errs = append(errs, fmt.Errorf("-failover-kills must be positive, got %d", cfg.failoverKills))
	}
	if cfg.mirroredRate < 0 {
		errs = append(errs, fmt.Errorf("-mirrored-rate must not be negative, got %v", cfg.mirroredRate))
	}
	if cfg.declareDuration <= 0 {
		errs = append(errs, fmt.Errorf("-declare-duration must be positive, got %v", cfg.declareDuration))
	}
	if slices.Contains(cfg.targets, "baseline") && cfg.baselineCmd == "" {
		errs = append(errs, errors.New("-targets: baseline needs -baseline-cmd"))
	}
	positive := map[string]int{
		"-rounds": cfg.rounds, "-publishers": cfg.publishers, "-consumers": cfg.consumers,
		"-confirm-window": cfg.confirmWindow, "-rss-messages": cfg.rssMessages, "-rss-size": cfg.rssSize,
	}
	for name, v := range positive {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %d", name, v))
		}
	}
	if cfg.prefetch < 0 || cfg.prefetch > 65535 {
		errs = append(errs, fmt.Errorf("-prefetch must be within 0..65535, got %d", cfg.prefetch))
	}
	if cfg.scaleQueues < 1 || cfg.scaleRate <= 0 {
		errs = append(errs, fmt.Errorf("-scale-queues and -scale-rate must be positive, got %d and %g", cfg.scaleQueues, cfg.scaleRate))
	}
	if cfg.connsIdle < 0 || cfg.connsActive < 2 || cfg.connsQueues < 1 || cfg.connsRate <= 0 {
		errs = append(errs, fmt.Errorf("-conns-idle must not be negative, -conns-active at least 2, -conns-queues and -conns-rate positive, got %d, %d, %d and %g",
			cfg.connsIdle, cfg.connsActive, cfg.connsQueues, cfg.connsRate))
	}
	if cfg.backlogMessages < 1 || cfg.backlogSize < backlogIDSize {
		errs = append(errs, fmt.Errorf("-backlog-messages must be positive and -backlog-size at least %d, got %d and %d", backlogIDSize, cfg.backlogMessages, cfg.backlogSize))
	}
	if cfg.classicQueueVersion < 0 || cfg.classicQueueVersion > 2 {
		errs = append(errs, fmt.Errorf("-classic-queue-version must be 0, 1 or 2, got %d", cfg.classicQueueVersion))
	}
	if cfg.multiAck < 0 {
		errs = append(errs, fmt.Errorf("-multi-ack must not be negative, got %d", cfg.multiAck))
	}
	if cfg.size < timestampSize {
		errs = append(errs, fmt.Errorf("-size must be at least %d, got %d", timestampSize, cfg.size))
	}
	if cfg.warmup < 0 || cfg.lightWarmup < 0 || cfg.duration <= 0 || cfg.lightDuration <= 0 || cfg.rssStall < 0 {
		errs = append(errs, errors.New("-duration and -light-duration must be positive, warm-ups and -rss-stall not negative"))
	}
	if cfg.proxyGOMAXPROCS < 0 {
		errs = append(errs, fmt.Errorf("-proxy-gomaxprocs must not be negative, got %d", cfg.proxyGOMAXPROCS))
	}
	if cfg.lightRate <= 0 {
		errs = append(errs, fmt.Errorf("-light-rate must be positive, got %v", cfg.lightRate))
	}
	if _, err := parseLevel(cfg.proxyLogLevel); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (cfg config) has(scenario string) bool {
	for _, s := range cfg.scenarios {
		if s == scenario {
			return true
		}
	}
	return false
}

// usage prints flag.PrintDefaults' format without the proxy role's flags.
func usage(fs *flag.FlagSet) {
	out := fs.Output()
	fmt.Fprintf(out, "Usage: go run ./integration/bench [flags]\n\n"+
		"Runs the same AMQP load directly against RabbitMQ and through amqp-mirror's proxy\n"+
		"(a separate process) and prints throughput, latency and the proxy's memory under\n"+
		"backpressure. See the package documentation for what each scenario does.\n\nFlags:\n")
	fs.VisitAll(func(f *flag.Flag) {
		if hiddenFlags[f.Name] {
			return
		}
		name, text := flag.UnquoteUsage(f)
		line := "  -" + f.Name
		if name != "" {
			line += " " + name
		}
		text = strings.ReplaceAll(text, "\n", "\n    \t")
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" {
			text += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(out, "%s\n    \t%s\n", line, text)
	})
}

func parseLevel(s string) (slog.Level, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("-proxy-log-level %q: want debug, info, warn or error", s)
	}
	return level, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if cfg.role == "proxy" {
		if err := runProxyRole(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "bench proxy:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// broker is the RabbitMQ the bench measures.
type broker struct {
	url  string // amqp URL of the broker itself
	addr string // host:port, what the proxy dials
	pid  int    // the Erlang VM's pid when the bench started it, else 0
}

// proxyURL is brokerURL with the proxy's address: same user, password and vhost.
func proxyURL(brokerURL, proxyAddr string) string {
	u, err := url.Parse(brokerURL)
	if err != nil { // checked in run
		return brokerURL
	}
	u.Host = proxyAddr
	return u.String()
}

func run(ctx context.Context, cfg config) error {
	began := time.Now()
	logger := slog.New(slog.DiscardHandler)
	if cfg.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	b := broker{url: cfg.amqpURL}
	// The mirrored, failover, scale, connections, backlog, sync and report scenarios start
	// their own nodes: a run of them alone needs no other broker.
	onlyMirrored := !slices.ContainsFunc(cfg.scenarios, func(s string) bool {
		return s != "mirrored" && s != "failover" && s != "scale" && s != "connections" && s != "backlog" && s != "sync" && s != "report"
	})
	if b.url == "" && !onlyMirrored {
		progress("starting a RabbitMQ node")
		cluster, err := harness.Start(ctx, harness.Options{Nodes: 1, Logger: logger})
		if err != nil {
			return fmt.Errorf("start RabbitMQ: %w", err)
		}
		defer func() {
			if err := cluster.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "bench: stopping RabbitMQ:", err)
			}
		}()
		node := cluster.Nodes()[0]
		b.url, b.pid = node.URL(), node.PID()
		progress("RabbitMQ %s on port %d (pid %d) in %s", node.ErlangName, node.Port, b.pid, time.Since(began).Round(100*time.Millisecond))
	}
	if !onlyMirrored {
		u, err := url.Parse(b.url)
		if err != nil || u.Host == "" || u.Scheme != "amqp" {
			return fmt.Errorf("-amqp-url %q: want amqp://user:password@host:port/vhost (the bench's proxy does not dial amqps)", b.url)
		}
		b.addr = u.Host
		if u.Port() == "" {
			b.addr = net.JoinHostPort(u.Hostname(), "5672")
		}
	}

	var report report
	report.Config = describeConfig(cfg)
	if cfg.has("full") {
		spec := loadSpec{
			scenario: "full", publishers: cfg.publishers, consumers: cfg.consumers,
			window: cfg.confirmWindow, prefetch: cfg.prefetch, multiAck: cfg.multiAck,
			size: cfg.size, persistent: true, warmup: cfg.warmup, duration: cfg.duration,
		}
		runs, err := runAlternating(ctx, cfg, b, spec)
		report.Runs = append(report.Runs, runs...)
		if err != nil {
			return errors.Join(err, report.print(os.Stdout, cfg))
		}
	}
	if cfg.has("full-raw") {
		spec := loadSpec{
			scenario: "full-raw", raw: true, publishers: cfg.publishers, consumers: cfg.consumers,
			window: cfg.confirmWindow, prefetch: cfg.prefetch, multiAck: cfg.multiAck,
			size: cfg.size, persistent: true, warmup: cfg.warmup, duration: cfg.duration,
		}
		runs, err := runAlternating(ctx, cfg, b, spec)
		report.Runs = append(report.Runs, runs...)
		if err != nil {
			return errors.Join(err, report.print(os.Stdout, cfg))
		}
	}
	if cfg.has("light") {
		spec := loadSpec{
			scenario: "light", publishers: 1, consumers: 1, window: 1, rate: cfg.lightRate,
			prefetch: cfg.prefetch, size: cfg.size, persistent: true,
			warmup: cfg.lightWarmup, duration: cfg.lightDuration,
		}
		runs, err := runAlternating(ctx, cfg, b, spec)
		report.Runs = append(report.Runs, runs...)
		if err != nil {
			return errors.Join(err, report.print(os.Stdout, cfg))
		}
	}
	if cfg.has("idle") {
		// socat forks a process per connection: thousands of them say nothing
		// about a proxy's memory.
		for _, target := range cfg.targets {
			if target != "proxy" && target != "baseline" {
				continue
			}
			idle, err := runIdle(ctx, cfg, b, target)
			if err != nil {
				return errors.Join(fmt.Errorf("idle via %s: %w", target, err), report.print(os.Stdout, cfg))
			}
			report.Idle = append(report.Idle, idle)
		}
	}
	if cfg.has("rss") {
		rss, err := runBackpressure(ctx, cfg, b)
		if err != nil {
			return errors.Join(fmt.Errorf("rss: %w", err), report.print(os.Stdout, cfg))
		}
		report.Backpressure = &rss
	}
	if cfg.has("mirrored") {
		runs, declares, err := runMirrored(ctx, cfg, logger)
		report.Mirrored, report.Declares = runs, declares
		if err != nil {
			return errors.Join(fmt.Errorf("mirrored: %w", err), report.print(os.Stdout, cfg))
		}
	}
	if cfg.has("failover") {
		results, err := runFailover(ctx, cfg, logger)
		report.Failover = results
		if err != nil {
			return errors.Join(err, report.print(os.Stdout, cfg))
		}
	}
	if cfg.has("scale") {
		result, err := runScale(ctx, cfg, logger)
		report.Scale = &result
		if err != nil {
			return errors.Join(fmt.Errorf("scale: %w", err), report.print(os.Stdout, cfg))
		}
	}
	if cfg.has("connections") {
		result, err := runConnections(ctx, cfg, logger)
		report.Connections = &result
		if err != nil {
			return errors.Join(fmt.Errorf("connections: %w", err), report.print(os.Stdout, cfg))
		}
	}
	if cfg.has("backlog") {
		result, err := runBacklog(ctx, cfg, logger)
		report.Backlog = &result
		if err != nil {
			return errors.Join(fmt.Errorf("backlog: %w", err), report.print(os.Stdout, cfg))
		}
	}
	if cfg.has("sync") {
		results, err := runSync(ctx, cfg, logger)
		report.Sync = results
		if err != nil {
			return errors.Join(fmt.Errorf("sync: %w", err), report.print(os.Stdout, cfg))
		}
	}
	if cfg.has("report") {
		r, err := runReport(ctx, cfg, logger)
		report.Runs = append(report.Runs, r.PassThrough...)
		report.Mirrored = append(report.Mirrored, r.Mirrored...)
		report.Timelines = r.Timelines
		if err != nil {
			return errors.Join(fmt.Errorf("report: %w", err), report.print(os.Stdout, cfg))
		}
		if err := writeReportFiles(cfg.reportDir, r); err != nil {
			return errors.Join(fmt.Errorf("report: %w", err), report.print(os.Stdout, cfg))
		}
		progress("wrote %s and %s", filepath.Join(cfg.reportDir, "report.md"), filepath.Join(cfg.reportDir, "failover.svg"))
	}
	report.Elapsed = time.Since(began).Round(time.Second).String()
	if err := report.print(os.Stdout, cfg); err != nil {
		return err
	}
	if cfg.jsonPath != "" {
		if err := report.writeJSON(cfg.jsonPath); err != nil {
			return err
		}
		progress("wrote %s", cfg.jsonPath)
	}
	return nil
}

// runAlternating runs spec on every target in cfg.targets' order, cfg.rounds times, and
// ends with one more direct run: direct, socat, proxy, direct... Each run through a
// forwarder has its own forwarder process, so every run starts from the same state.
func runAlternating(ctx context.Context, cfg config, b broker, spec loadSpec) ([]runResult, error) {
	var results []runResult
	plan := make([]string, 0, cfg.rounds*len(cfg.targets)+1)
	for range cfg.rounds {
		plan = append(plan, cfg.targets...)
	}
	plan = append(plan, "direct")
	runsOf := map[string]int{}
	for i, target := range plan {
		runsOf[target]++
		number := runsOf[target]
		progress("%s load, run %d of %d: %s", spec.scenario, i+1, len(plan), target)
		var result runResult
		var err error
		if target == "direct" {
			result, err = runSpec(ctx, spec, b.url, watched{brokers: []int{b.pid}})
		} else {
			result, err = runLoadThroughForwarder(ctx, cfg, b, spec, target, profileName(cfg.proxyCPUProfile, spec.scenario, number))
		}
		result.Target, result.Run = target, number
		if err != nil {
			return results, fmt.Errorf("%s load, %s run %d: %w", spec.scenario, target, number, err)
		}
		results = append(results, result)
		progress("  %s", result.oneLine())
	}
	return results, nil
}

// profileName is base with the scenario and run number before its extension, or "" when
// no profile is wanted.
func profileName(base, scenario string, run int) string {
	if base == "" {
		return ""
	}
	ext := filepath.Ext(base)
	return fmt.Sprintf("%s.%s.%d%s", strings.TrimSuffix(base, ext), scenario, run, ext)
}

// runLoadThroughForwarder starts target's forwarder (socat, the proxy, the baseline
// proxy), runs spec through it and stops it. The forwarder's CPU and system calls are
// counted with its children: socat forks one per connection.
func runLoadThroughForwarder(ctx context.Context, cfg config, b broker, spec loadSpec, target, profile string) (runResult, error) {
	var p *proxyProcess
	var err error
	switch target {
	case "socat":
		p, err = startSocat(ctx, b.addr)
		profile = ""
	case "baseline":
		p, err = startProxyCommand(ctx, cfg, cfg.baselineCmd, b.addr)
		profile = ""
	default:
		p, err = startProxy(ctx, cfg, b.addr, profile)
	}
	if err != nil {
		return runResult{}, err
	}
	result, err := runSpec(ctx, spec, proxyURL(b.url, p.addr), watched{brokers: []int{b.pid}, proxy: p.pid()})
	if stopErr := p.stop(); err == nil {
		err = stopErr
	}
	if err == nil && profile != "" {
		progress("  proxy CPU profile in %s", profile)
	}
	return result, err
}

// progress reports what the bench is doing on stderr, so that stdout is the report.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

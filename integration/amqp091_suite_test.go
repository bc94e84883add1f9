package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// TestAmqp091SuiteThroughProxy runs the integration tests of amqp091-go, the client library
// our go.mod pins, three times against rabbit1: once directly; once through a proxy running in
// this process (so under this binary's -race) with rabbit1 as its only backend; and once
// through a proxy with rabbit1 as home and rabbit2 and rabbit3 as the other backends, the real
// mirror engine and a policy that mirrors every queue on all three (ha-mode all, automatic
// sync), so every queue the suite declares has a master and two slaves, and every publish
// and ack crosses three links. Every test that passes directly must pass through both
// proxies. A test that fails directly must be listed in amqp091FailsDirectly with the reason,
// and a listed test must indeed fail directly, so the list stays honest.
//
// The suite is compiled once, without -race, from the module cache with `go test -c -tags
// integration`; its only test-only dependency, go.uber.org/goleak, is already in our go.mod.
// It runs the tests the integration tag adds, plus any other test that reads AMQP_URL;
// the library's unit tests never touch a broker and would only add ~18s per run. The direct
// run is made once and is what both proxied runs are compared with.
//
// It is not parallel: the suite has 200ms delivery deadlines, and on a two-core machine the
// rest of the package running beside it would make those flaky, in any run. Running alone
// also lets the suite's memory-alarm test raise rabbit1's alarm for a few seconds without
// disturbing anyone; rabbit1 is the mirrored proxy's home too, where that test's queue is
// placed.
//
// Two tests take most of the time: TestChannelCounterShouldNotPanicIssue136 (~25s directly,
// 35-65s through the -race proxy on a loaded two-core machine) opens and closes 80,000
// channels from 8 goroutines, wrapping channel ids past channel_max dozens of times, which is
// the proxy's channel-table reuse under concurrency; the mirrored run leaves it out
// (amqp091NotMirrored says why). TestConnectionRecoverySkipAndContinueNoInfiniteLoop (~16s)
// waits three recovery periods to prove a loop does not recur. Measured on the shared
// two-core machine (load average 14-37): the direct run 60-155s, the proxied run 80-190s, the
// mirrored run 42s without TestChannelCounterShouldNotPanicIssue136 (99-154s with it).
func TestAmqp091SuiteThroughProxy(t *testing.T) {
	direct := node(t, "rabbit1")
	suite := buildAmqp091Suite(t)
	suite.rabbitmqctl = rabbitmqctlFor(t, direct)
	t.Logf("amqp091-go %s: %d tests selected, %d not run", suite.version, len(suite.tests), len(amqp091NotRun))

	directRun := suite.run(t, "direct", direct.URL(), nil)
	if len(directRun.results) == 0 {
		t.Fatalf("the direct run reported no test at all; it ended with:\n%s", directRun.ending())
	}
	suite.runFailedAgain(t, "direct", direct.URL(), &directRun, func(name string) bool {
		_, listed := amqp091FailsDirectly[name]
		return !listed
	})
	suite.checkLists(t, directRun)
	// The suite opens hundreds of connections; only warnings are worth reading here.
	warnings := func(t *testing.T) *slog.Logger {
		return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}

	var proxiedRun amqp091Run
	t.Run("proxied", func(t *testing.T) {
		url, server := startProxy(t, direct, func(options *proxy.Options) { options.Logger = warnings(t) })
		proxiedRun = suite.run(t, "proxied", url, nil)
		suite.runFailedAgain(t, "proxied", url, &proxiedRun, directRun.passed)
		compareAmqp091Runs(t, directRun, proxiedRun, server, nil)
	})
	t.Run("mirrored", func(t *testing.T) {
		for _, name := range sortedKeys(amqp091NotMirrored) {
			if !slices.Contains(suite.tests, name) {
				t.Errorf("%s is in amqp091NotMirrored but not among the selected tests of amqp091-go %s; take it off the list", name, suite.version)
			} else if status := proxiedRun.results[name]; status != "PASS" {
				t.Errorf("%s is left to the proxied run (amqp091NotMirrored), which got %s, want PASS", name, orMissing(status))
			}
		}
		for _, name := range sortedKeys(amqp091NotMirrored) {
			t.Logf("%s is left to the proxied run: %s", name, amqp091NotMirrored[name])
		}
		p := startMirroredProxyWith(t, direct, mirroredOptions{logger: warnings(t)})
		run := suite.run(t, "mirrored", p.url, amqp091NotMirrored)
		suite.runFailedAgain(t, "mirrored", p.url, &run, func(name string) bool {
			_, out := amqp091NotMirrored[name]
			return !out && directRun.passed(name)
		})
		compareAmqp091Runs(t, directRun, run, p.srv, amqp091NotMirrored)
	})
}

// checkLists fails the test where amqp091FailsDirectly or amqp091NotRun no longer say the
// truth about the direct run or about the suite's tests.
func (s amqp091Suite) checkLists(t *testing.T, directRun amqp091Run) {
	t.Helper()
	for _, name := range directRun.names() {
		if directRun.results[name] != "FAIL" {
			continue
		}
		if _, listed := amqp091FailsDirectly[topLevel(name)]; !listed {
			t.Errorf("%s fails directly and is not in amqp091FailsDirectly; find out why and list it with the reason:\n%s",
				name, directRun.excerpt(name))
		}
	}
	for _, name := range sortedKeys(amqp091FailsDirectly) {
		if status, ran := directRun.results[name]; !ran {
			t.Errorf("%s is in amqp091FailsDirectly but did not run directly: is it still in amqp091-go %s?", name, s.version)
		} else if status != "FAIL" {
			t.Errorf("%s directly: got %s, want FAIL as amqp091FailsDirectly says; take it off the list", name, status)
		}
	}
	for _, name := range sortedKeys(amqp091NotRun) {
		if !slices.Contains(s.declared, name) {
			t.Errorf("%s is in amqp091NotRun but amqp091-go %s has no such test; take it off the list", name, s.version)
		}
	}
}

// compareAmqp091Runs fails the test for every test that passed directly and not through the
// proxy (but for those the run left out, with the reason), and checks that every connection
// the suite opened through the proxy ended there.
func compareAmqp091Runs(t *testing.T, directRun, proxiedRun amqp091Run, server *proxy.Server, leftOut map[string]string) {
	t.Helper()
	regressed := false
	for _, name := range directRun.names() {
		directStatus, proxiedStatus := directRun.results[name], proxiedRun.results[name]
		if _, out := leftOut[topLevel(name)]; out {
			continue
		}
		switch {
		case directStatus == "FAIL":
			t.Logf("%s fails directly, as listed (%s); through the proxy: %s", name, amqp091FailsDirectly[topLevel(name)], orMissing(proxiedStatus))
		case directStatus == "PASS" && proxiedStatus != "PASS":
			regressed = true
			t.Errorf("%s through the proxy: got %s, want PASS as directly\n--- directly:\n%s\n--- through the proxy:\n%s",
				name, orMissing(proxiedStatus), directRun.excerpt(name), proxiedRun.excerpt(name))
		case directStatus == "SKIP":
			t.Logf("%s skips directly; through the proxy: %s", name, orMissing(proxiedStatus))
		}
	}
	if directRun.err == nil && proxiedRun.err != nil && !regressed {
		// Every test passed and the binary still failed: goleak found client goroutines
		// left behind, say.
		t.Errorf("the suite through the proxy: got %v, want exit 0 as directly; it ended with:\n%s",
			proxiedRun.err, proxiedRun.ending())
	}
	// The suite's process is gone, so every connection it opened through the proxy must end
	// in the proxy too; the reasons tell how they ended.
	testutil.Eventually(t, 10*time.Second, func() error {
		if open := server.Stats().ConnectionsOpen.Load(); open != 0 {
			return fmt.Errorf("%d client connections still open in the proxy after the suite exited", open)
		}
		return nil
	})
	if opened := server.Stats().ConnectionsOpened.Load(); opened == 0 {
		t.Errorf("connections through the proxy: got none, want the suite's")
	} else {
		t.Logf("the proxy served %d connections, closed: %s", opened, closeReasons(server.Stats()))
	}
	for _, name := range directRun.names() {
		directly, proxied := directRun.took[name], proxiedRun.took[name]
		if proxied-directly > time.Second && proxied > 2*directly && !strings.Contains(name, "/") {
			t.Logf("%s took %v directly and %v through the proxy", name, directly, proxied)
		}
	}
}

// amqp091FailsDirectly lists, with the reason, the selected tests that fail against a harness
// node without any proxy in between. Through the proxy they are run and reported, not judged.
var amqp091FailsDirectly = map[string]string{}

// needsManagementAPI is why the recovery tests are not run. Each drops its own connection with
// DELETE http://localhost:15672/api/connections/<name>, an address fixed in the suite's
// internal/utils: harness nodes run without plugins, on random ports. Against a harness node
// each would retry for 10s before failing, in both runs; 17 of them would add almost six
// minutes to the package for nothing.
const needsManagementAPI = "needs the management HTTP API on localhost:15672"

// amqp091NotRun lists, with the reason, the tests that cannot pass against a harness node and
// are therefore left out of both runs.
var amqp091NotRun = map[string]string{
	"TestConnectionRecoveryAutoDeleteExchangeCascade":                  needsManagementAPI,
	"TestConnectionRecoveryAutoDeleteTopologyForgotten":                needsManagementAPI,
	"TestConnectionRecoveryCancelInterrupt":                            needsManagementAPI,
	"TestConnectionRecoveryChannelIDReservation":                       needsManagementAPI,
	"TestConnectionRecoveryConsume":                                    needsManagementAPI,
	"TestConnectionRecoveryConsumerNotForgottenAfterFailedResubscribe": needsManagementAPI,
	"TestConnectionRecoveryCustomSASLPlainAuth":                        needsManagementAPI,
	"TestConnectionRecoveryDeletedQueueSkip":                           needsManagementAPI,
	"TestConnectionRecoveryExclusiveQueue":                             needsManagementAPI,
	"TestConnectionRecoveryExhaustionDoesNotPanic":                     needsManagementAPI,
	"TestConnectionRecoveryLifeCycleNotifyStateChange":                 needsManagementAPI,
	"TestConnectionRecoveryMultiChannelTopology":                       needsManagementAPI,
	"TestConnectionRecoveryPublish":                                    needsManagementAPI,
	"TestConnectionRecoverySkipAndContinue":                            needsManagementAPI,
	"TestConnectionRecoveryTopologyAllEnabled":                         needsManagementAPI,
	"TestConnectionRecoveryTopologyDisabled":                           needsManagementAPI,
	"TestConnectionRecoveryTopologyOnlyTransient":                      needsManagementAPI,
}

// amqp091NotMirrored lists, with the reason, the selected tests that the mirrored run leaves
// to the proxied run. Each must pass there.
var amqp091NotMirrored = map[string]string{
	"TestChannelCounterShouldNotPanicIssue136": "it opens and closes channels and does nothing else; with mirroring a " +
		"channel opens on the other backends only when a method needs it there, so this would run the proxied run's code " +
		"on the home link alone, for 35-65 of the mirrored run's ~100 seconds",
}

// amqp091RunTimeout bounds one run of the suite. It takes about a minute on a quiet machine,
// but 3.5 minutes directly when CI's other test binaries load the two cores (its
// TestChannelCounterShouldNotPanicIssue136 alone took 176 s there).
const amqp091RunTimeout = 8 * time.Minute

// amqp091Suite is the compiled test binary of amqp091-go and what to run of it.
type amqp091Suite struct {
	version string
	dir     string // the module's source, the binary's working directory as under go test
	binary  string
	// rabbitmqctl is a script that runs rabbitmqctl against the node both runs reach.
	rabbitmqctl string
	declared    []string // every test and example function, integration-tagged or not
	tests       []string // the selected ones: what the runs pass to -test.run
}

// goPackage is the part of `go list -json` output used here.
type goPackage struct {
	Dir          string
	TestGoFiles  []string
	XTestGoFiles []string
	Module       struct{ Version string }
}

func (p goPackage) testFiles() []string { return slices.Concat(p.TestGoFiles, p.XTestGoFiles) }

func buildAmqp091Suite(t *testing.T) amqp091Suite {
	t.Helper()
	const path = "github.com/rabbitmq/amqp091-go"
	tagged := listPackage(t, "-tags", "integration", path)
	untagged := listPackage(t, path)

	suite := amqp091Suite{version: tagged.Module.Version, dir: tagged.Dir, binary: filepath.Join(t.TempDir(), "amqp091.test")}
	fileSet := token.NewFileSet()
	for _, name := range tagged.testFiles() {
		file, err := parser.ParseFile(fileSet, filepath.Join(tagged.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		integrationOnly := !slices.Contains(untagged.testFiles(), name)
		for _, declaration := range file.Decls {
			function, ok := declaration.(*ast.FuncDecl)
			if !ok || function.Recv != nil || !isTestName(function.Name.Name) {
				continue
			}
			suite.declared = append(suite.declared, function.Name.Name)
			_, notRun := amqp091NotRun[function.Name.Name]
			if (integrationOnly || readsAMQPURL(function)) && !notRun {
				suite.tests = append(suite.tests, function.Name.Name)
			}
		}
	}
	if len(suite.tests) == 0 {
		t.Fatalf("no integration test found in %s %s", path, suite.version)
	}

	ctx := testContext(t, 3*time.Minute)
	build := exec.CommandContext(ctx, "go", "test", "-c", "-tags", "integration", "-o", suite.binary, path)
	began := time.Now()
	if output, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", build, err, output)
	}
	t.Logf("built the amqp091-go %s suite in %v", suite.version, time.Since(began).Round(time.Millisecond))
	return suite
}

// rabbitmqctlFor writes a script that runs rabbitmqctl against the node, for the suite's
// RABBITMQ_RABBITMQCTL_PATH: the suite calls it with the command only, and rabbitmqctl alone
// would reach the default node, not ours. The suite's memory-alarm test restores the
// watermark in its cleanup; if the suite dies before that cleanup runs, the alarm would
// block every later publisher on the shared node, so it is restored here too, to 0.4,
// RabbitMQ's default, which the harness does not change.
func rabbitmqctlFor(t *testing.T, n *localbroker.Node) string {
	t.Helper()
	// /usr/sbin/rabbitmqctl would switch to the rabbitmq user and its cookie; the harness
	// nodes use ours.
	const rabbitmqctl = "/usr/lib/rabbitmq/bin/rabbitmqctl"
	script := filepath.Join(t.TempDir(), "rabbitmqctl")
	content := fmt.Sprintf("#!/bin/sh\nexec %s -n '%s' \"$@\"\n", rabbitmqctl, n.ErlangName)
	writeExecutable(t, script, content)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if output, err := exec.CommandContext(ctx, script, "set_vm_memory_high_watermark", "0.4").CombinedOutput(); err != nil {
			t.Errorf("restoring %s's memory watermark: %v\n%s", n.Name, err, output)
		}
	})
	return script
}

func listPackage(t *testing.T, arguments ...string) goPackage {
	t.Helper()
	command := exec.CommandContext(testContext(t, time.Minute), "go", append([]string{"list", "-json"}, arguments...)...)
	output, err := command.Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("%w\n%s", err, exit.Stderr)
		}
		t.Fatalf("%s: %v", command, err)
	}
	var listed goPackage
	if err := json.Unmarshal(output, &listed); err != nil {
		t.Fatalf("%s: %v", command, err)
	}
	return listed
}

// isTestName reports whether go test would run a function of this name (TestMain aside).
func isTestName(name string) bool {
	return name != "TestMain" && (strings.HasPrefix(name, "Test") || strings.HasPrefix(name, "Example"))
}

// readsAMQPURL reports whether the function mentions the "AMQP_URL" variable itself, as the
// library's reconnect example does from a file without the integration tag.
func readsAMQPURL(function *ast.FuncDecl) bool {
	found := false
	ast.Inspect(function, func(n ast.Node) bool {
		if literal, ok := n.(*ast.BasicLit); ok && literal.Value == `"AMQP_URL"` {
			found = true
		}
		return !found
	})
	return found
}

// amqp091Run is what one run of the suite printed, and each test's outcome.
type amqp091Run struct {
	output   string
	lines    []string
	results  map[string]string        // test or subtest name → PASS, FAIL or SKIP
	took     map[string]time.Duration // test or subtest name → its reported duration
	err      error                    // the binary's exit status
	duration time.Duration
	// again holds, for each test that failed and passed when run again
	// alone, what the first run printed about it.
	again map[string]string
}

var resultLine = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+) \(([0-9.]+s)\)`)

// run runs the selected tests but those in leftOut against url and keeps what they print in
// <label>.log under the test's artifact directory (kept with go test -artifacts).
func (s amqp091Suite) run(t *testing.T, label, url string, leftOut map[string]string) amqp091Run {
	t.Helper()
	tests := slices.DeleteFunc(slices.Clone(s.tests), func(name string) bool {
		_, out := leftOut[name]
		return out
	})
	return s.runTests(t, label, url, tests, amqp091RunTimeout)
}

// runTests runs tests against url, at most timeout, and keeps what they print in <label>.log.
func (s amqp091Suite) runTests(t *testing.T, label, url string, tests []string, timeout time.Duration) amqp091Run {
	t.Helper()
	ctx := testContext(t, timeout+30*time.Second)
	command := exec.CommandContext(ctx, s.binary,
		"-test.v", "-test.count=1", "-test.timeout="+timeout.String(),
		"-test.run=^("+strings.Join(tests, "|")+")$")
	command.Dir = s.dir
	command.Env = append(slices.DeleteFunc(os.Environ(), func(v string) bool {
		return strings.HasPrefix(v, "AMQP_URL=") || strings.HasPrefix(v, "RABBITMQ_RABBITMQCTL_PATH=")
	}), "AMQP_URL="+url, "RABBITMQ_RABBITMQCTL_PATH="+s.rabbitmqctl)
	began := time.Now()
	output, err := command.CombinedOutput()
	run := amqp091Run{output: string(output), err: err, duration: time.Since(began), results: map[string]string{}, took: map[string]time.Duration{}}
	run.lines = strings.Split(run.output, "\n")
	for _, line := range run.lines {
		if match := resultLine.FindStringSubmatch(line); match != nil {
			run.results[match[2]] = match[1]
			run.took[match[2]], _ = time.ParseDuration(match[3])
		}
	}
	logFile := filepath.Join(t.ArtifactDir(), label+".log")
	if err := os.WriteFile(logFile, output, 0o644); err != nil {
		t.Errorf("keeping the %s run's output: %v", label, err)
	}
	t.Logf("%s run against %s: %s; output in %s (kept with go test -artifacts)", label, url, run.summary(), logFile)
	return run
}

// amqp091RerunTimeout bounds the run of the tests that failed, again: most take a second or
// two, TestChannelCounterShouldNotPanicIssue136 up to three minutes on a loaded machine, and
// one that hangs again must not hold the package for another amqp091RunTimeout.
const amqp091RerunTimeout = 4 * time.Minute

// runFailedAgain runs the top-level tests of run that did not pass (failed, or never reported
// because the run ended first) and that retry selects, again, alone, against the same url,
// and takes their new results; those that fail once more get amqp091Reruns tries in all.
// Several of the suite's tests wait for a delivery or a notification only 200 ms
// (TestCorruptedMessageIssue7, TestQuickPublishConsumeBigBody, TestIntegrationCancel),
// which a process starved of CPU misses, with or without a proxy, on two cores shared with
// three brokers and the other packages' tests. A test that fails in every try fails the
// comparison as before; one that passes is logged with its first failure.
func (s amqp091Suite) runFailedAgain(t *testing.T, label, url string, run *amqp091Run, retry func(name string) bool) {
	t.Helper()
	var failed []string
	for _, name := range s.tests {
		if run.results[name] != "PASS" && run.results[name] != "SKIP" && retry(name) {
			failed = append(failed, name)
		}
	}
	if len(failed) == 0 {
		return
	}
	run.again = map[string]string{}
	remaining := failed
	var again amqp091Run
	for try := 1; try <= amqp091Reruns && len(remaining) > 0; try++ {
		again = s.runTests(t, fmt.Sprintf("%s-again-%d", label, try), url, remaining, amqp091RerunTimeout)
		var still []string
		for _, name := range remaining {
			if again.results[name] == "PASS" {
				run.again[name] = run.excerpt(name)
			} else {
				still = append(still, name)
			}
			for result, status := range again.results {
				if result == name || strings.HasPrefix(result, name+"/") {
					run.results[result] = status
				}
			}
		}
		remaining = still
	}
	// The first run's exit status told of the failures; a leak goleak found in it still counts.
	if len(run.again) == len(failed) && !strings.Contains(run.output, "goleak: ") {
		run.err = again.err
	}
	for _, name := range sortedKeys(run.again) {
		t.Logf("%s failed in the %s run and passed when run again alone; the first time:\n%s", name, label, run.again[name])
	}
}

// amqp091Reruns is how many times runFailedAgain runs a test that keeps failing.
const amqp091Reruns = 3

// passed reports whether the test passed in the run.
func (r amqp091Run) passed(name string) bool { return r.results[name] == "PASS" }

func (r amqp091Run) summary() string {
	counts := map[string]int{}
	for _, status := range r.results {
		counts[status]++
	}
	exit := "exit 0"
	if r.err != nil {
		exit = r.err.Error()
	}
	return fmt.Sprintf("%d passed, %d failed, %d skipped (%s, %v)",
		counts["PASS"], counts["FAIL"], counts["SKIP"], exit, r.duration.Round(time.Second))
}

func (r amqp091Run) names() []string { return sortedKeys(r.results) }

// excerpt is what the run printed about one test: from its last "=== RUN", "=== CONT" or
// "=== NAME" line to its result line and the indented lines that follow it.
func (r amqp091Run) excerpt(name string) string {
	start, end := -1, -1
	for i, line := range r.lines {
		fields := strings.Fields(line)
		if len(fields) >= 3 && fields[0] == "===" && fields[2] == name {
			start = i
		}
		if match := resultLine.FindStringSubmatch(line); match != nil && match[2] == name {
			end = i
			if start < 0 {
				start = i
			}
			break
		}
	}
	if start < 0 {
		return "    (no output: the run ended before this test reported)"
	}
	if end < 0 {
		return strings.Join(r.lines[start:min(start+40, len(r.lines))], "\n")
	}
	indent := len(r.lines[end]) - len(strings.TrimLeft(r.lines[end], " "))
	for end+1 < len(r.lines) && strings.HasPrefix(r.lines[end+1], strings.Repeat(" ", indent+4)) {
		end++
	}
	if end-start > 60 {
		return strings.Join(slices.Concat(r.lines[start:start+20], []string{"    ..."}, r.lines[end-40:end+1]), "\n")
	}
	return strings.Join(r.lines[start:end+1], "\n")
}

// ending is how the run ended: from its first panic (a test timeout, say, whose goroutine
// dump would bury the names of the tests still running), or else its last lines.
func (r amqp091Run) ending() string {
	for i, line := range r.lines {
		if strings.HasPrefix(line, "panic: ") {
			return strings.Join(r.lines[i:min(i+30, len(r.lines))], "\n")
		}
	}
	return strings.Join(r.lines[max(0, len(r.lines)-40):], "\n")
}

// topLevel is the name of the top-level test a subtest belongs to.
func topLevel(name string) string {
	top, _, _ := strings.Cut(name, "/")
	return top
}

func orMissing(status string) string {
	if status == "" {
		return "no result (the run ended first)"
	}
	return status
}

// closeReasons lists the non-zero counts of ClosedByReason, as "client_closed=120 ...".
func closeReasons(stats *proxy.Stats) string {
	var counts []string
	for reason := range stats.ClosedByReason {
		if count := stats.ClosedByReason[reason].Load(); count > 0 {
			counts = append(counts, fmt.Sprintf("%s=%d", proxy.CloseReason(reason), count))
		}
	}
	return strings.Join(counts, " ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	return keys
}

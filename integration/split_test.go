package integration

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// partVariable, when set to "i/n", makes the test binary run only part i of n of the
// package's tests (integrationParts). scripts/test.sh starts one binary per part at once,
// each with its own three brokers (node names, ports and data directories are per process,
// see package localbroker; the network namespaces of the partition and compose tests are
// named after the process id too), so that the package's mostly idle waits (broker boots,
// failover grace periods, serf's failure detection) overlap instead of adding up.
const partVariable = "AMQP_MIRROR_INTEGRATION_PART"

// integrationParts lists every test, fuzz and example function of the package in exactly
// one part; TestIntegrationPartsCoverEveryTest fails when one is missing, listed twice or
// no longer exists, so that a new test cannot be left out of the CI run. The parts are
// balanced by the durations of a -test.v run of the default tier (docs/testing.md): each
// part's long acceptance tests (kills, syncs, amqp091-go's suite) set its length.
var integrationParts = [][]string{
	{ // the sidecar cluster: node kills (~100 s), the walkthrough, the partition; the CLI
		// sidecar_kill_test.go, sidecar_test.go, partition_test.go, partial_partition_test.go
		"TestSidecarNodeKilledRepeatedly",
		"TestSidecarWalkthrough", "TestSidecarRuntimePoliciesInTheLog", "TestSidecarDeletedWhileNodeDown", "TestSidecarFrozenNodeJudgedBySerf",
		"TestSidecarPartition", "TestSidecarPartialPartitionKeepsTheMaster",
		// chaos_test.go (~50 s)
		"TestChaosTwoBrokersKilled",
		// cli_*_test.go, ctl_*_test.go, compose*_test.go, demo_script_test.go
		"TestCLIServeConfigErrors", "TestCLIServeReadsYAMLWhateverTheFileName", "TestCLIListenOverrides", "TestCLIServesTheShippedExample",
		"TestCLICtlManagesPolicies", "TestCLICtlOptionsAfterTheCommand",
		"TestCLIReloadAppliesPolicyChanges", "TestCLIReloadRefusesWhatItCannotApply",
		"TestCLIServeLogsConnectionsWithoutPasswords", "TestCLIShutdownSignals", "TestCLIHelp", "TestCLIBackendDown", "TestCLIServesAMQPS", "TestCLIMetrics",
		"TestCtlDrain", "TestCtlDrainMidPublish", "TestCtlViewsOfAProxy",
		"TestCtlQueuesWithoutMirroring", "TestCtlQueuesMirrored", "TestCtlQueuesListsUnmirroredQueues",
		"TestComposeTopologyOnNetworkNamespaces",
		"TestComposeBrokersAreSingleOfficialNodes", "TestComposeProxiesAreBuiltFromTheDockerfile", "TestComposeMountsExist",
		"TestComposeConfigsAreValid", "TestComposePorts", "TestDockerfile", "TestDockerignoreKeepsTheBuildInputs", "TestComposeConfigCommand",
		"TestDemoScriptStopsItsBrokers", "TestDemoScriptRefusesBadAddresses",
		// mirror_routing_test.go
		"TestExchangeRoutingAlternateExchangeCopiesStayEqual", "TestExchangeRoutingReachesEveryKindOfDestination",
		// mirror_deadletter_test.go, mirror_clients_test.go
		"TestMirrorDeadLetteringAcrossMasters",
		"TestMirrorDeadLetteringAfterTTLWhileDelivered", "TestMirrorTransactionalRequeueKeepsSlaves",
		// proxy_errors_test.go
		"TestProxyErrorsBackendGoesAway", "TestProxyErrorsClientVanishes", "TestProxyErrorsHeartbeats", "TestProxyErrorsRefusedLogin",
		// mirror_vhost_test.go
		"TestMirrorInOtherVHosts",
		// mirror_channel_test.go
		"TestMirrorRecoverThenSettleEverything", "TestMirrorNackRequeueThenGet",
		// campaign_test.go
		"TestCampaign",
	},
	{ // failover: the chaos tests (~150 s, master and slave kills), syncs
		// chaos_test.go, proxy_failover_test.go, proxy_failover_maxlen_test.go, proxy_home_test.go
		"TestChaosMasterKilledRepeatedly", "TestChaosSlaveKilled",
		"TestChaosMasterFrozen", "TestChaosCancelOnFailover", "TestChaosWhenSyncedNoPromotion", "TestChaosGetWhileMasterFrozen", "TestChaosQosWhileHomeFrozen",
		"TestFailoverMasterKilled", "TestFailoverMasterStoppedCleanly", "TestFailoverAfterDropHead", "TestHomeIsABackendThatIsUp",
		// views_test.go
		"TestStatusPageInABrowser",
		// metrics_test.go
		"TestMetricsOfMirroredTraffic", "TestMetricsOfAFailover",
		// mirror_sync_test.go, mirror_adopt_autodelete_test.go, proxy_own_confirms_test.go
		"TestMirrorSlaveSynchronisation", "TestMirrorSyncUnderLoad", "TestMirrorAdoption",
		"TestSyncKeepsAnAdoptedAutoDeleteQueue",
		"TestOwnConfirmsNameASlaveThatMissedPublishes", "TestOwnConfirmsAndTheClientsModes", "TestASlaveThatMissedPublishesSynchronisesAgain",
		// proxy_backend_heartbeat_test.go, proxy_backend_tls_test.go
		"TestProxyNoticesAFrozenBackend",
		"TestProxyDialsTLSBackends",
		// sidecar_tls_test.go
		"TestSidecarRaftPortNeedsAMembersCertificate",
		// proxy_transparency_test.go, harness_test.go
		"TestTransparency", "TestNodeLifecycle",
		// campaign_partition_test.go
		"TestCampaignPartitions",
	},
	{ // the proxy and mirrored queues: amqp091-go's suite three times (~300 s), transparency,
		// errors, the harness
		"TestAmqp091SuiteThroughProxy",
		// sidecar_keys_test.go, admin_tls_test.go, proxy_backend_mtls_test.go, mirror_maxlength_test.go
		"TestSidecarGossipNeedsTheKey", "TestSidecarGossipKeyRotation",
		"TestAdminTLS", "TestBackendTLSClientCertificate", "TestBackendTLSRefusesALooseKey",
		"TestMirrorMaxLengthRejectPublish", "TestMirrorMaxLengthDropHead", "TestMirrorMaxLengthBytesDropHead",
		// proxy_*_test.go
		"TestPikaTransparency", "TestTransparencyAmqpTools",
		"TestProxyWireAnswersLikeTheBroker",
		"TestProxyErrorsWrongProtocolHeader", "TestProxyErrorsHandshakeTimeout", "TestProxyErrorsMalformedFrame",
		"TestProxyErrorsOversizedFrame", "TestProxyErrorsPublishToMissingExchange",
		"TestProxyErrorsUnknownDeliveryTag", "TestProxyLeaksNeitherGoroutinesNorSockets", "TestProxyErrorsShutdown",
		"TestProxyPublishConsumeAck", "TestProxyCleanCloseReportsNoError", "TestProxyKeepsPublishesWholeOnFailingChannels",
		"TestProxyClosesChannelsBetweenDeliveries",
		"TestProxyMirroredChannelErrorInsidePublish", "TestProxyMirroredChannelErrorOnEveryBackendOnce",
		"TestProxyMirroredClientCloseCrossesChannelErrors",
		"TestFanoutDeclarePublishConsume", "TestFanoutChannelErrorFromEveryBackend", "TestFanoutBindingNotRecordedClosesTheChannel",
		"TestUnmirroredQueuesMessagesCarryTheIdentity",
		"TestRepeatedIdentityArrivesRedelivered", "TestRedeliveryRemembersBrokerFlaggedDeliveries",
		"TestProxyPause",
		"TestProxyServesAMQPS",
		"FuzzProxyClientBytes",
		// campaign_sidecar_test.go
		"TestCampaignSidecar",
		// mirror_test.go, mirror_clients_test.go, client_test.go, harness_test.go, split_test.go
		"TestMirrorAllPublishConsumeTrim", "TestMirrorPolicyPlacement", "TestMirrorRestartKeepsQueues",
		"TestMirrorMultipleAckAcrossMasters", "TestMirrorPropertiesUnchanged", "TestMirrorPriorityQueue", "TestMirrorDeadLettering",
		// mirror_replyto_test.go
		"TestMirrorDirectReplyTo", "TestMirrorDirectReplyToPika",
		// sidecar_routing_test.go, sidecar_sync_test.go, sidecar_maxlength_test.go
		"TestSidecarBindingRoutesThroughEveryProxyAtOnce", "TestSidecarSyncCopiesWhatClientsHold", "TestSidecarMaxLengthDropHead",
		// sidecar_redelivered_test.go
		"TestSidecarRedeliveredAcrossProxies",
		"TestAmqp091PublishConfirmConsumeAck", "TestPikaPublishesAmqp091Consumes",
		"TestStartOptionErrors", "TestNodesDieWithTheHarnessProcess",
		"TestIntegrationPartsCoverEveryTest", "TestPartPattern",
	},
}

// partPattern returns the -test.run pattern that selects part "i/n" of integrationParts,
// where n must be len(integrationParts), so that a script running another number of parts
// than the list has fails instead of leaving tests out.
func partPattern(part string) (string, error) {
	index, count, found := strings.Cut(part, "/")
	i, errIndex := strconv.Atoi(index)
	n, errCount := strconv.Atoi(count)
	if !found || errIndex != nil || errCount != nil {
		return "", fmt.Errorf("%s=%q: want i/n, e.g. 1/%d", partVariable, part, len(integrationParts))
	}
	if n != len(integrationParts) {
		return "", fmt.Errorf("%s=%q: the tests are split in %d parts, not %d (integrationParts in integration/split_test.go)",
			partVariable, part, len(integrationParts), n)
	}
	if i < 1 || i > n {
		return "", fmt.Errorf("%s=%q: part %d does not exist; the parts are 1 to %d", partVariable, part, i, n)
	}
	names := make([]string, len(integrationParts[i-1]))
	for j, name := range integrationParts[i-1] {
		names[j] = regexp.QuoteMeta(name)
	}
	return "^(" + strings.Join(names, "|") + ")$", nil
}

// TestIntegrationPartsCoverEveryTest checks that integrationParts names every test function
// of the package's files once, and nothing else.
func TestIntegrationPartsCoverEveryTest(t *testing.T) {
	declared := packageTestFunctions(t)
	listed := map[string][]int{}
	for i, part := range integrationParts {
		if len(part) == 0 {
			t.Errorf("part %d of integrationParts is empty", i+1)
		}
		for _, name := range part {
			listed[name] = append(listed[name], i+1)
		}
	}
	for _, name := range declared {
		switch parts := listed[name]; len(parts) {
		case 0:
			t.Errorf("%s is in no part of integrationParts (integration/split_test.go); add it to the shortest part, or CI never runs it", name)
		case 1:
		default:
			t.Errorf("%s: listed in parts %v of integrationParts, want exactly one", name, parts)
		}
	}
	for _, name := range sortedKeys(listed) {
		if !slices.Contains(declared, name) {
			t.Errorf("%s is listed in part %v of integrationParts but is no test function of the package; take it off", name, listed[name])
		}
	}
}

func TestPartPattern(t *testing.T) {
	count := len(integrationParts)
	cases := []struct {
		name    string
		part    string
		wantErr string // empty: the pattern must select exactly that part
	}{
		{name: "first part", part: fmt.Sprintf("1/%d", count)},
		{name: "last part", part: fmt.Sprintf("%d/%d", count, count)},
		{name: "part zero", part: fmt.Sprintf("0/%d", count), wantErr: "part 0 does not exist"},
		{name: "part past the last", part: fmt.Sprintf("%d/%d", count+1, count), wantErr: fmt.Sprintf("part %d does not exist", count+1)},
		{name: "other number of parts", part: fmt.Sprintf("1/%d", count+1), wantErr: fmt.Sprintf("split in %d parts, not %d", count, count+1)},
		{name: "no slash", part: "1", wantErr: "want i/n"},
		{name: "not numbers", part: "a/b", wantErr: "want i/n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pattern, err := partPattern(c.part)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("partPattern(%q): got pattern %q, error %v; want an error containing %q", c.part, pattern, err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("partPattern(%q): %v", c.part, err)
			}
			index, _ := strconv.Atoi(strings.Split(c.part, "/")[0])
			selector := regexp.MustCompile(pattern)
			for i, part := range integrationParts {
				for _, name := range part {
					// A prefix of a name of another part must not select that one too.
					for _, candidate := range []string{name, name + "X"} {
						got := selector.MatchString(candidate)
						want := i+1 == index && candidate == name
						if got != want {
							t.Errorf("pattern %q of part %s matches %s: got %v, want %v", pattern, c.part, candidate, got, want)
						}
					}
				}
			}
		})
	}
}

// packageTestFunctions returns the names of the functions go test runs by name (tests, fuzz
// targets, examples) declared in the package's test files, the current directory.
func packageTestFunctions(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("the package's test files: %v (found %d)", err, len(files))
	}
	var names []string
	fileSet := token.NewFileSet()
	for _, file := range files {
		syntax, err := parser.ParseFile(fileSet, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if syntax.Name.Name != "integration" {
			continue // an external test package would be a binary of its own
		}
		for _, declaration := range syntax.Decls {
			function, ok := declaration.(*ast.FuncDecl)
			if !ok || function.Recv != nil || function.Name.Name == "TestMain" {
				continue
			}
			name := function.Name.Name
			if runsByName(name, "Test") || runsByName(name, "Fuzz") || runsByName(name, "Example") {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	return names
}

// runsByName reports whether name is one go test runs for prefix: the prefix alone, or
// followed by something other than a lower-case letter (cmd/go's rule).
func runsByName(name, prefix string) bool {
	rest, found := strings.CutPrefix(name, prefix)
	if !found {
		return false
	}
	first, _ := utf8.DecodeRuneInString(rest)
	return rest == "" || !unicode.IsLower(first)
}

package integration

// Transparency for clients other than amqp091-go: python3-pika and the amqp-tools of
// librabbitmq. Each session runs directly and through the proxy, as in
// proxy_transparency_test.go, and what the client printed is the journal.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"
)

func TestPikaTransparency(t *testing.T) {
	if _, err := os.Stat(systemPython); err != nil {
		t.Fatalf("%s not found: apt-get install -y python3-pika", systemPython)
	}
	runTransparently(t, []transparencyCase{{name: "pika session", run: observePikaSession}})
}

// observePikaSession runs testdata/pika/session.py and journals its JSON, one line per leaf.
func observePikaSession(t *testing.T, url string, j *journal) {
	var stdout, stderr bytes.Buffer
	session := exec.CommandContext(testContext(t, time.Minute), systemPython, "testdata/pika/session.py", url, queueName(t))
	session.Stdout, session.Stderr = &stdout, &stderr
	if err := session.Run(); err != nil {
		t.Fatalf("pika session: %v\n%s(python3-pika missing? apt-get install -y python3-pika)", err, stderr.Bytes())
	}
	var seen map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &seen); err != nil {
		t.Fatalf("pika session printed no JSON: %v\n%s", err, stdout.Bytes())
	}
	for _, line := range flattenJSON("", seen) {
		j.add("%s", line)
	}

	unroutable := map[string]any{"exception": "UnroutableError", "reply_code": 312.0, "reply_text": "NO_ROUTE", "body": "lost"}
	channelError := map[string]any{"exception": "ChannelClosedByBroker", "reply_code": 404.0,
		"reply_text": "NOT_FOUND - no queue 'amqp-mirror-missing-queue' in vhost '/'"}
	deliveries, _ := seen["deliveries"].([]any)
	gets, _ := seen["gets"].([]any)
	verify(t, []check{
		{"publishes", seen["publishes"], []any{"confirmed", "confirmed", "confirmed", unroutable}},
		{"deliveries", len(deliveries), 3},
		{"messages after a commit of 2 and a rollback of 1", seen["after_transactions"], 2.0},
		{"third basic_get", gets[len(gets)-1], "get-empty"},
		{"passive declare of a missing queue", seen["passive_declare_of_missing_queue"], channelError},
		{"connection open after the channel error", seen["connection_open_after_channel_error"], true},
	})
	if refusal := fmt.Sprint(seen["wrong_password"]); !strings.Contains(refusal, "AuthenticationError") || !strings.Contains(refusal, "403") {
		t.Errorf("wrong password: got %s, want an authentication error with 403", refusal)
	}
}

// flattenJSON lists a decoded JSON value as "path = value" lines, object keys sorted.
func flattenJSON(path string, value any) []string {
	switch v := value.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var lines []string
		for _, k := range keys {
			lines = append(lines, flattenJSON(strings.TrimPrefix(path+"."+k, "."), v[k])...)
		}
		return lines
	case []any:
		lines := []string{fmt.Sprintf("%s = %d elements", path, len(v))}
		for i, element := range v {
			lines = append(lines, flattenJSON(fmt.Sprintf("%s[%d]", path, i), element)...)
		}
		return lines
	default:
		encoded, _ := json.Marshal(v)
		return []string{fmt.Sprintf("%s = %s", path, encoded)}
	}
}

func TestTransparencyAmqpTools(t *testing.T) {
	runTransparently(t, []transparencyCase{{name: "amqp-tools session", run: observeAmqpTools}})
}

// observeAmqpTools drives librabbitmq's command line tools. amqp-consume lets the broker
// choose the consumer tag, a path amqp091-go and pika never take.
func observeAmqpTools(t *testing.T, url string, j *journal) {
	// librabbitmq reads the path after the host as the vhost, so ".../" would mean "".
	base := strings.TrimSuffix(url, "/")
	wrongPassword := strings.Replace(base, "guest:guest@", "guest:wrong@", 1)
	queue := queueName(t)
	ctx := testContext(t, time.Minute)
	run := func(args ...string) {
		var stdout, stderr bytes.Buffer
		command := exec.CommandContext(ctx, args[0], args[1:]...)
		command.Stdout, command.Stderr = &stdout, &stderr
		exitCode := 0
		if err := command.Run(); err != nil {
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("%s: %v", args[0], err)
			}
			exitCode = exit.ExitCode()
		}
		anonymous := strings.NewReplacer(base, "URL", wrongPassword, "WRONG_PASSWORD_URL", queue, "QUEUE")
		j.add("%s: exit %d, stdout %q, stderr %q", anonymous.Replace(strings.Join(args, " ")),
			exitCode, anonymous.Replace(stdout.String()), anonymous.Replace(stderr.String()))
	}
	run("amqp-declare-queue", "--url", base, "-q", queue)
	t.Cleanup(func() { exec.Command("amqp-delete-queue", "--url", base, "-q", queue).Run() })
	run("amqp-publish", "--url", base, "-r", queue, "-b", "hello from amqp-tools")
	run("amqp-publish", "--url", base, "-r", queue, "-p", "-C", "text/plain", "-E", "identity",
		"-H", "source: amqp-tools", "-t", "replies", "-b", "second")
	run("amqp-get", "--url", base, "-q", queue)
	run("amqp-consume", "--url", base, "-q", queue, "-c", "1", "cat")
	run("amqp-get", "--url", base, "-q", queue)
	run("amqp-get", "--url", base+"/no-such-vhost", "-q", queue)
	run("amqp-get", "--url", wrongPassword, "-q", queue)
	run("amqp-delete-queue", "--url", base, "-q", queue)
}

package integration

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMetricsOfMirroredTraffic: through a proxy in front of the three
// nodes, a queue mirrored on all of them counts as mirrored once its
// slaves are synchronised; publishes with confirms are counted and each
// lands in the publish-to-confirm histogram; deliveries and acks are
// counted, and with per-queue metrics on, the queue has series of its own.
func TestMetricsOfMirroredTraffic(t *testing.T) {
	queue := queueName(t)
	p := startMirrorProxy(t, "metrics: {per_queue: true}\n"+
		mirrorPolicyYAML("ha-metrics", exactly(queue), map[string]any{"ha-mode": "all", "ha-sync-mode": "automatic"}))
	conn := dialURL(t, p.url("guest", "guest"))
	declareMirrored(t, p, conn, queue, true, nil)
	t.Cleanup(func() { deleteThroughProxy(t, p, queue) })
	awaitCondition(t, time.Minute, func() error {
		return metricsAtLeast(p, map[string]float64{
			`amqp_mirror_queues{state="mirrored"}`:                                          1,
			fmt.Sprintf(`amqp_mirror_queue_slaves_synchronised{queue=%q,vhost="/"}`, queue): 2,
		})
	})
	before := scrapeMetrics(t, p)

	const count = 200
	publishConfirmed(t, conn, queue, count, persistent)
	consumeAcked(t, conn, queue, count)
	awaitCondition(t, 10*time.Second, func() error {
		return metricsMovedBy(p, before, map[string]float64{
			"amqp_mirror_publishes_total":                           count,
			"amqp_mirror_publish_confirm_seconds_count":             count,
			`amqp_mirror_publish_confirm_seconds_bucket{le="+Inf"}`: count,
			"amqp_mirror_deliveries_total":                          count,
			"amqp_mirror_acks_total":                                count,
		})
	})
	body := scrapeMetrics(t, p)
	if sum, ok := metricValue(body, "amqp_mirror_publish_confirm_seconds_sum"); !ok || sum <= 0 {
		t.Errorf("amqp_mirror_publish_confirm_seconds_sum = %v (present %v), want the confirms' time, above 0", sum, ok)
	}
	if pending, _ := metricValue(body, "amqp_mirror_confirms_pending"); pending != 0 {
		t.Errorf("amqp_mirror_confirms_pending = %v once every publish is confirmed, want 0", pending)
	}
}

// TestMetricsOfAFailover: killing the broker of a mirrored queue's master
// counts one promotion caused by a failure, observes its duration, and
// leaves the queue mirrored on the two brokers left.
func TestMetricsOfAFailover(t *testing.T) {
	queue := queueName(t)
	p := startMirrorProxy(t, mirrorPolicyYAML("ha-metrics", exactly(queue), map[string]any{"ha-mode": "all", "ha-sync-mode": "automatic"}))
	conn := dialURL(t, p.url("guest", "guest"))
	declareMirrored(t, p, conn, queue, true, nil)
	t.Cleanup(func() { deleteThroughProxy(t, p, queue) })
	publishConfirmed(t, conn, queue, 50, persistent)
	master := awaitSynchronised(t, p, queue, 2, time.Minute).Master
	before := scrapeMetrics(t, p)

	killed := node(t, master)
	if err := killed.Kill(); err != nil {
		t.Fatal(err)
	}
	defer restartNode(t, killed)
	awaitCondition(t, time.Minute, func() error {
		return metricsMovedBy(p, before, map[string]float64{
			`amqp_mirror_promotions_total{cause="failure"}`: 1,
			"amqp_mirror_promotion_duration_seconds_count":  1,
		})
	})
	body := scrapeMetrics(t, p)
	if up, _ := metricValue(body, fmt.Sprintf(`amqp_mirror_backend_up{backend=%q}`, master)); up != 0 {
		t.Errorf("amqp_mirror_backend_up of the killed %s = %v, want 0", master, up)
	}
	if n, _ := metricValue(body, "amqp_mirror_promotions_unsynchronised_total"); n != 0 {
		t.Errorf("amqp_mirror_promotions_unsynchronised_total = %v, want 0: the slaves were synchronised", n)
	}
	if mirrored, _ := metricValue(body, `amqp_mirror_queues{state="mirrored"}`); mirrored < 1 {
		t.Errorf(`amqp_mirror_queues{state="mirrored"} = %v after the promotion, want the queue mirrored on the two left`, mirrored)
	}
}

// metricValue is the value of series (name{labels} as the text format
// writes it, labels in its order) in a /metrics body.
func metricValue(body, series string) (float64, bool) {
	for line := range strings.Lines(body) {
		rest, ok := strings.CutPrefix(line, series+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		return v, err == nil
	}
	return 0, false
}

// metricsAtLeast reports which of the series in want are below their
// value in p's /metrics now.
func metricsAtLeast(p *cliProxy, want map[string]float64) error {
	body, err := getMetrics(p)
	if err != nil {
		return err
	}
	var short []string
	for series, min := range want {
		if v, ok := metricValue(body, series); !ok || v < min {
			short = append(short, fmt.Sprintf("%s = %v (present %v), want at least %v", series, v, ok, min))
		}
	}
	if len(short) > 0 {
		return fmt.Errorf("/metrics: %s", strings.Join(short, "; "))
	}
	return nil
}

// metricsMovedBy reports which of the series in want have not grown by at
// least their value since before (a /metrics body).
func metricsMovedBy(p *cliProxy, before string, want map[string]float64) error {
	absolute := make(map[string]float64, len(want))
	for series, by := range want {
		v, _ := metricValue(before, series)
		absolute[series] = v + by
	}
	return metricsAtLeast(p, absolute)
}

// getMetrics is scrapeMetrics for polling: an error instead of a failure.
func getMetrics(p *cliProxy) (string, error) {
	resp, err := http.Get("http://" + p.adminAddr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return string(body), err
}

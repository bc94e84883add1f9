package integration

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// BenchmarkMirroredPublishConsume is the cost of one message through a
// queue with ha-mode all on the three nodes, amqp-mirror's proxy and engine
// in this process, against the same queue on one node directly, in the
// same run: one publisher with confirms (window 256) and one consumer with
// manual acks (prefetch 256), 1 KiB persistent messages. Run it with
// -cpuprofile to see where the proxy's and the engine's time goes:
//
//	go test -run '^$' -bench Mirrored -benchtime 20000x -cpuprofile /tmp/m.pprof ./integration/
func BenchmarkMirroredPublishConsume(b *testing.B) {
	home := cluster.Nodes()[0]
	targets := []struct {
		name string
		url  func(b *testing.B) string
	}{
		{"direct", func(*testing.B) string { return home.URL() }},
		{"mirrored", func(b *testing.B) string {
			url, _ := startMirroredProxy(b, home, slog.LevelWarn)
			return url
		}},
	}
	for _, target := range targets {
		b.Run(target.name, func(b *testing.B) {
			url := target.url(b)
			conn, err := amqp.Dial(url)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			queue := fmt.Sprintf("bench-mirrored-%s-%d", target.name, time.Now().UnixNano())
			setup, err := conn.Channel()
			if err != nil {
				b.Fatal(err)
			}
			if _, err := setup.QueueDeclare(queue, true, false, false, false, nil); err != nil {
				b.Fatal(err)
			}
			defer setup.QueueDelete(queue, false, false, false)
			time.Sleep(500 * time.Millisecond) // let the policy's slaves join

			body := make([]byte, 1024)
			consumed := make(chan struct{})
			cch, err := conn.Channel()
			if err != nil {
				b.Fatal(err)
			}
			cch.Qos(256, 0, false)
			deliveries, err := cch.Consume(queue, "", false, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			b.ResetTimer()
			go func() {
				defer close(consumed)
				for i := 0; i < b.N; i++ {
					d, ok := <-deliveries
					if !ok {
						return
					}
					d.Ack(false)
				}
			}()
			pch, err := conn.Channel()
			if err != nil {
				b.Fatal(err)
			}
			pch.Confirm(false)
			confirms := pch.NotifyPublish(make(chan amqp.Confirmation, 512))
			outstanding := 0
			for i := 0; i < b.N; i++ {
				if outstanding == 256 {
					<-confirms
					outstanding--
				}
				if err := pch.PublishWithContext(context.Background(), "", queue, false, false,
					amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body}); err != nil {
					b.Fatal(err)
				}
				outstanding++
			}
			for ; outstanding > 0; outstanding-- {
				<-confirms
			}
			<-consumed
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
		})
	}
}

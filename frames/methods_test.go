package frames

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// allMethodNames is every method the RabbitMQ-extended spec defines; the
// generator must produce each exactly once.
var allMethodNames = []string{
	"connection.start", "connection.start-ok", "connection.secure", "connection.secure-ok",
	"connection.tune", "connection.tune-ok", "connection.open", "connection.open-ok",
	"connection.close", "connection.close-ok", "connection.blocked", "connection.unblocked",
	"connection.update-secret", "connection.update-secret-ok",
	"channel.open", "channel.open-ok", "channel.flow", "channel.flow-ok", "channel.close", "channel.close-ok",
	"exchange.declare", "exchange.declare-ok", "exchange.delete", "exchange.delete-ok",
	"exchange.bind", "exchange.bind-ok", "exchange.unbind", "exchange.unbind-ok",
	"queue.declare", "queue.declare-ok", "queue.bind", "queue.bind-ok", "queue.purge", "queue.purge-ok",
	"queue.delete", "queue.delete-ok", "queue.unbind", "queue.unbind-ok",
	"basic.qos", "basic.qos-ok", "basic.consume", "basic.consume-ok", "basic.cancel", "basic.cancel-ok",
	"basic.publish", "basic.return", "basic.deliver", "basic.get", "basic.get-ok", "basic.get-empty",
	"basic.ack", "basic.reject", "basic.recover-async", "basic.recover", "basic.recover-ok", "basic.nack",
	"tx.select", "tx.select-ok", "tx.commit", "tx.commit-ok", "tx.rollback", "tx.rollback-ok",
	"confirm.select", "confirm.select-ok",
}

func TestEveryMethodRoundTrips(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range sampleMethods() {
		t.Run(m.Name(), func(t *testing.T) {
			seen[m.Name()] = true
			classID, methodID := m.ID()
			if got := MethodName(classID, methodID); got != m.Name() {
				t.Errorf("MethodName(%d, %d) = %q, want %q", classID, methodID, got, m.Name())
			}
			payload := m.Append(nil)
			got, err := DecodeMethod(payload)
			if err != nil {
				t.Fatalf("DecodeMethod(%x): %v", payload, err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Errorf("decoded %+v, want %+v", got, m)
			}
			if again := got.Append(nil); !bytes.Equal(again, payload) {
				t.Errorf("re-encoded %x, want %x", again, payload)
			}
			if err := m.(validator).Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			// Every truncation must fail cleanly, and so must a trailing byte.
			for n := 4; n < len(payload); n++ {
				fresh, _ := NewMethod(classID, methodID)
				if err := fresh.Decode(payload[4:n]); !errors.Is(err, ErrMalformed) {
					t.Fatalf("Decode of %d/%d argument bytes: error %v, want ErrMalformed", n-4, len(payload)-4, err)
				}
			}
			fresh, _ := NewMethod(classID, methodID)
			if err := fresh.Decode(append(payload[4:len(payload):len(payload)], 0)); !errors.Is(err, ErrMalformed) {
				t.Errorf("Decode with a trailing byte: error %v, want ErrMalformed", err)
			}
		})
	}
	for _, name := range allMethodNames {
		if !seen[name] {
			t.Errorf("no generated type for %s", name)
		}
	}
	if len(seen) != len(allMethodNames) {
		t.Errorf("generated %d method types, want %d", len(seen), len(allMethodNames))
	}
}

// TestUndefinedBitsAreIgnored: RabbitMQ applies a basic.ack whose flag octet
// sets a bit the spec does not define, so the codec must decode it too.
func TestUndefinedBitsAreIgnored(t *testing.T) {
	payload := []byte{0, 60, 0, 80, 0, 0, 0, 0, 0, 0, 0, 7, 0x03}
	m, err := DecodeMethod(payload)
	if err != nil {
		t.Fatalf("DecodeMethod: %v", err)
	}
	got, ok := m.(*BasicAck)
	if !ok || got.DeliveryTag != 7 || !got.Multiple {
		t.Errorf("got %+v, want basic.ack tag 7 multiple", m)
	}
}

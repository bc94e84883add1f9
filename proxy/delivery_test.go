package proxy

import (
	"bytes"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestIdentityRoundTrip: the identity the proxy adds at publish comes off
// again at delivery, leaving the content header byte for byte as published,
// with and without a headers table, and also when a broker moved the field.
func TestIdentityRoundTrip(t *testing.T) {
	id := mirror.MessageID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	tests := []struct {
		name  string
		props frames.Properties
	}{
		{"no properties", frames.Properties{}},
		{"no headers", frames.Properties{Flags: frames.FlagContentType | frames.FlagDeliveryMode | frames.FlagMessageID,
			ContentType: "text/plain", DeliveryMode: 2, MessageID: "m-1"}},
		{"empty headers", frames.Properties{Flags: frames.FlagHeaders, Headers: frames.Table{}}},
		{"headers", frames.Properties{Flags: frames.FlagContentType | frames.FlagContentEncoding | frames.FlagHeaders | frames.FlagPriority,
			ContentType: "a", ContentEncoding: "gzip", Headers: frames.Table{{Key: "k", Value: "v"}, {Key: "n", Value: int32(7)}}, Priority: 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := frames.ContentHeader{ClassID: 60, BodySize: 42, Properties: tt.props}
			published, err := h.Append(nil)
			if err != nil {
				t.Fatal(err)
			}
			withID, err := addIdentity(nil, published, id)
			if err != nil {
				t.Fatalf("addIdentity: %v", err)
			}
			var decoded frames.ContentHeader
			if err := decoded.Decode(withID); err != nil {
				t.Fatalf("header with identity does not decode: %v", err)
			}
			v, ok := decoded.Properties.Headers.Get(mirror.IdentityHeader)
			if !ok {
				t.Fatalf("identity header missing: %+v", decoded.Properties.Headers)
			}
			if got, ok := mirror.ParseMessageID(v.(string)); !ok || got != id {
				t.Fatalf("identity: got %v %v, want %v", got, ok, id)
			}
			stripped, got, ok, err := stripIdentity(nil, withID)
			if err != nil || !ok || got != id {
				t.Fatalf("stripIdentity: got %v ok=%v err=%v, want %v", got, ok, err, id)
			}
			if !bytes.Equal(stripped, published) {
				t.Errorf("stripped header differs from the published one:\n got %x\nwant %x", stripped, published)
			}

			// A broker that re-encodes the table may put the field first.
			moved := decoded
			moved.Properties.Headers = append(frames.Table{{Key: mirror.IdentityHeader, Value: v}}, decoded.Properties.Headers[:len(decoded.Properties.Headers)-1]...)
			movedPayload, err := moved.Append(nil)
			if err != nil {
				t.Fatal(err)
			}
			stripped, got, ok, err = stripIdentity(nil, movedPayload)
			if err != nil || !ok || got != id {
				t.Fatalf("stripIdentity of a moved field: got %v ok=%v err=%v", got, ok, err)
			}
			if !bytes.Equal(stripped, published) {
				t.Errorf("stripped (moved) differs:\n got %x\nwant %x", stripped, published)
			}
		})
	}
}

func TestStripIdentityWithoutOne(t *testing.T) {
	h := frames.ContentHeader{ClassID: 60, BodySize: 1, Properties: frames.Properties{Flags: frames.FlagHeaders, Headers: frames.Table{{Key: "a", Value: "b"}}}}
	payload, _ := h.Append(nil)
	got, _, ok, err := stripIdentity(nil, payload)
	if err != nil || ok || !bytes.Equal(got, payload) {
		t.Errorf("got %x ok=%v err=%v, want the payload unchanged", got, ok, err)
	}
}

func TestCapability(t *testing.T) {
	props := frames.Table{{Key: "product", Value: "x"}, {Key: "capabilities", Value: frames.Table{
		{Key: "consumer_cancel_notify", Value: true}, {Key: "basic.nack", Value: false}}}}
	tests := []struct {
		props frames.Table
		name  string
		want  bool
	}{
		{props, "consumer_cancel_notify", true},
		{props, "basic.nack", false},
		{props, "missing", false},
		{frames.Table{{Key: "capabilities", Value: "not a table"}}, "consumer_cancel_notify", false},
		{nil, "consumer_cancel_notify", false},
	}
	for _, tt := range tests {
		if got := capability(tt.props, tt.name); got != tt.want {
			t.Errorf("capability(%v, %q): got %v, want %v", tt.props, tt.name, got, tt.want)
		}
	}
}

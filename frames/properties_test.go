package frames

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

func allProperties() ContentHeader {
	return ContentHeader{
		ClassID:  60,
		BodySize: 1024,
		Properties: Properties{
			Flags:           0xFFFC,
			ContentType:     "application/json",
			ContentEncoding: "gzip",
			Headers:         Table{{Key: "x-id", Value: "abc"}, {Key: "n", Value: int32(7)}},
			DeliveryMode:    2,
			Priority:        9,
			CorrelationID:   "corr",
			ReplyTo:         "amq.rabbitmq.reply-to",
			Expiration:      "60000",
			MessageID:       "msg",
			Timestamp:       1700000000,
			Type:            "kind",
			UserID:          "guest",
			AppID:           "app",
			ClusterID:       "cluster",
		},
	}
}

func TestContentHeaderRoundTrip(t *testing.T) {
	emptyPresent := ContentHeader{ClassID: 60, Properties: Properties{Flags: FlagContentType | FlagMessageID | FlagHeaders, Headers: Table{}}}
	tests := []struct {
		name      string
		header    ContentHeader
		wantFlags uint16
		wantSize  int
	}{
		{name: "all 14 properties", header: allProperties(), wantFlags: 0xFFFC},
		{name: "none", header: ContentHeader{ClassID: 60, BodySize: 5}, wantFlags: 0, wantSize: 14},
		// Present but empty strings take a length octet each, absent ones nothing.
		{name: "present but empty", header: emptyPresent, wantFlags: 0xA080, wantSize: 14 + 1 + 4 + 1},
		{name: "only timestamp", header: ContentHeader{ClassID: 60, Properties: Properties{Flags: FlagTimestamp, Timestamp: 1}}, wantFlags: 0x0040, wantSize: 22},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload, err := tt.header.Append(nil)
			if err != nil {
				t.Fatalf("Append: %v", err)
			}
			if got := binary.BigEndian.Uint16(payload[12:]); got != tt.wantFlags {
				t.Errorf("flag word 0x%04x, want 0x%04x", got, tt.wantFlags)
			}
			if tt.wantSize != 0 && len(payload) != tt.wantSize {
				t.Errorf("payload is %d bytes, want %d", len(payload), tt.wantSize)
			}
			var got ContentHeader
			if err := got.Decode(payload); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, tt.header) {
				t.Errorf("decoded %+v\nwant %+v", got, tt.header)
			}
			size, err := HeaderBodySize(payload)
			if err != nil || size != tt.header.BodySize {
				t.Errorf("HeaderBodySize = %d, %v; want %d", size, err, tt.header.BodySize)
			}
			// Decoding a header without properties into the same value
			// clears what the previous one had.
			if err := got.Decode((&ContentHeader{ClassID: 60}).mustAppend(t)); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, ContentHeader{ClassID: 60}) {
				t.Errorf("reused decode kept old properties: %+v", got)
			}
		})
	}
}

func (h *ContentHeader) mustAppend(t *testing.T) []byte {
	t.Helper()
	b, err := h.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestContentHeaderErrors(t *testing.T) {
	good := allProperties()
	payload := good.mustAppend(t)
	withFlags := func(flags uint16) []byte {
		b := bytes.Clone(payload)
		binary.BigEndian.PutUint16(b[12:], flags)
		return b
	}
	wrongClass := bytes.Clone(payload)
	binary.BigEndian.PutUint16(wrongClass, 50)
	tests := []struct {
		name    string
		payload []byte
	}{
		{name: "too short", payload: payload[:13]},
		{name: "continuation flag", payload: withFlags(0xFFFD)},
		{name: "undefined bit 1", payload: withFlags(0x0002)},
		{name: "truncated property", payload: payload[:len(payload)-1]},
		{name: "left over bytes", payload: append(bytes.Clone(payload), 0)},
		{name: "not class basic", payload: wrongClass},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h ContentHeader
			if err := h.Decode(tt.payload); !errors.Is(err, ErrMalformed) {
				t.Errorf("Decode error %v, want ErrMalformed", err)
			}
		})
	}
	t.Run("append refuses long shortstr", func(t *testing.T) {
		h := allProperties()
		h.Properties.ReplyTo = string(make([]byte, 256))
		if got, err := h.Append([]byte("keep")); !errors.Is(err, ErrUnencodable) || string(got) != "keep" {
			t.Errorf("Append = %q, %v; want buf unchanged and ErrUnencodable", got, err)
		}
	})
}

func TestHeadersFieldAndReplaceHeaders(t *testing.T) {
	withHeaders := allProperties()
	noHeaders := allProperties()
	noHeaders.Properties.Flags &^= FlagHeaders
	noHeaders.Properties.Headers = nil
	newHeaders := Table{{Key: "x-mirror-id", Value: "42"}}

	tests := []struct {
		name        string
		header      ContentHeader
		replacement Table
	}{
		{name: "replace", header: withHeaders, replacement: newHeaders},
		{name: "add", header: noHeaders, replacement: newHeaders},
		{name: "remove", header: withHeaders, replacement: nil},
		{name: "empty", header: withHeaders, replacement: Table{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload := tt.header.mustAppend(t)
			start, end, present, err := HeadersField(payload)
			if err != nil {
				t.Fatalf("HeadersField: %v", err)
			}
			if present != tt.header.Properties.Has(FlagHeaders) {
				t.Errorf("present = %v", present)
			}
			if present {
				table, n, err := DecodeTable(payload[start:end])
				if err != nil || n != end-start || !reflect.DeepEqual(table, tt.header.Properties.Headers) {
					t.Errorf("bytes %d..%d decode to %v (%d bytes, %v)", start, end, table, n, err)
				}
			}
			got, err := ReplaceHeaders([]byte("dst"), payload, tt.replacement)
			if err != nil {
				t.Fatalf("ReplaceHeaders: %v", err)
			}
			got = got[3:]
			// Expected: the same header with only Headers (and its flag) changed.
			want := tt.header
			want.Properties.Headers = tt.replacement
			if tt.replacement != nil {
				want.Properties.Flags |= FlagHeaders
			} else {
				want.Properties.Flags &^= FlagHeaders
			}
			if wantBytes := want.mustAppend(t); !bytes.Equal(got, wantBytes) {
				t.Errorf("ReplaceHeaders gave\n%x\nwant\n%x", got, wantBytes)
			}
			// Every byte outside the headers table (and the flag word) is untouched.
			newStart, newEnd, _, err := HeadersField(got)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:12], payload[:12]) || !bytes.Equal(got[14:newStart], payload[14:start]) || !bytes.Equal(got[newEnd:], payload[end:]) {
				t.Errorf("bytes outside the headers table changed")
			}
		})
	}
}

func TestHasExpiration(t *testing.T) {
	encode := func(p Properties) []byte {
		t.Helper()
		h := ContentHeader{ClassID: 60, BodySize: 3, Properties: p}
		b, err := h.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name    string
		payload []byte
		want    bool
	}{
		{name: "every property", payload: encode(allProperties().Properties), want: true},
		{name: "expiration alone", payload: encode(Properties{Flags: FlagExpiration, Expiration: "100"}), want: true},
		{name: "no properties", payload: encode(Properties{}), want: false},
		{name: "others but expiration", payload: encode(Properties{Flags: FlagDeliveryMode | FlagPriority, DeliveryMode: 2, Priority: 1}), want: false},
		{name: "too short", payload: []byte{0, 60, 0, 0}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := HasExpiration(tt.payload); got != tt.want {
				t.Errorf("HasExpiration = %v, want %v", got, tt.want)
			}
		})
	}
}

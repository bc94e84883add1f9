package mirror

import (
	"encoding/base64"
	"encoding/binary"
	"strings"
	"testing"
)

// replyToName encodes a direct reply-to name for a pid on node, as a broker
// writes it: with NEW_PID_EXT or PID_EXT, and the node atom with atomTag.
func replyToName(node string, newPid bool, atomTag byte) string {
	b := []byte{termVersion, tagPid}
	if newPid {
		b[1] = tagNewPid
	}
	b = append(b, atomTag)
	if atomTag == tagSmallAtom || atomTag == tagSmallAtomUTF8 {
		b = append(b, byte(len(node)))
	} else {
		b = binary.BigEndian.AppendUint16(b, uint16(len(node)))
	}
	b = append(b, node...)
	b = binary.BigEndian.AppendUint32(b, 0x1c7) // ID
	b = binary.BigEndian.AppendUint32(b, 0)     // Serial
	if newPid {
		b = binary.BigEndian.AppendUint32(b, 0x63f1e2a4) // Creation
	} else {
		b = append(b, 3)
	}
	return ReplyToPrefix + base64.StdEncoding.EncodeToString(b) + ".g2dkAA1yYWJiaXRAbG9jYWxob3N0AAAD"
}

func TestReplyToNode(t *testing.T) {
	long := strings.Repeat("n", 300)
	tests := []struct {
		name     string
		replyTo  string
		wantNode string
		wantOK   bool
	}{
		// What RabbitMQ 3.10 writes: NEW_PID_EXT, a synthetic node in an
		// ATOM_UTF8_EXT.
		{"captured from RabbitMQ 3.10.8", ReplyToPrefix + "g1h2AA5yZXBseUAzNjc4OTg3NgAAAwMAAAAAaxFJlw==.Nvza0syvUaB9yDe1Ad3Q5g==", "reply@36789876", true},
		{"3.10 format", replyToName("reply@42875719", true, tagAtomUTF8), "reply@42875719", true},
		{"PID_EXT, ATOM_EXT", replyToName("rabbit@localhost", false, tagAtom), "rabbit@localhost", true},
		{"SMALL_ATOM_EXT", replyToName("rabbit@host", true, tagSmallAtom), "rabbit@host", true},
		{"SMALL_ATOM_UTF8_EXT", replyToName("rabbit@host", false, tagSmallAtomUTF8), "rabbit@host", true},
		{"a node name longer than 255", replyToName(long, true, tagAtomUTF8), long, true},
		{"unpadded base64", ReplyToPrefix + "g1h2AAVhQGIuYwAAAAEAAAAAAAAAAQ.key", "a@b.c", true},
		{"the pseudo-queue itself", ReplyToQueue, "", false},
		{"another queue", "orders", "", false},
		{"no key", ReplyToPrefix + "g1h2AAVhQGIuYwAAAAEAAAAAAAAAAQ==", "", false},
		{"empty key", ReplyToPrefix + "g1h2AAVhQGIuYwAAAAEAAAAAAAAAAQ==.", "", false},
		{"two dots", ReplyToPrefix + "g1h2AAVhQGIuYwAAAAEAAAAAAAAAAQ==.a.b", "", false},
		{"not base64", ReplyToPrefix + "!!!.key", "", false},
		{"not a term", ReplyToPrefix + base64.StdEncoding.EncodeToString([]byte("hello")) + ".key", "", false},
		{"a reference, not a pid", ReplyToPrefix + base64.StdEncoding.EncodeToString([]byte{131, 90, 0, 1, 118, 0, 1, 'a'}) + ".key", "", false},
		{"truncated", ReplyToPrefix + base64.StdEncoding.EncodeToString([]byte{131, 88, 118, 0, 5, 'a', '@', 'b'}) + ".key", "", false},
		{"trailing octets", ReplyToPrefix + base64.StdEncoding.EncodeToString(append([]byte{131, 103, 115, 1, 'a'}, make([]byte, 10)...)) + ".key", "", false},
		{"empty atom", ReplyToPrefix + base64.StdEncoding.EncodeToString(append([]byte{131, 103, 115, 0}, make([]byte, 9)...)) + ".key", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node, ok := ReplyToNode(tt.replyTo)
			if node != tt.wantNode || ok != tt.wantOK {
				t.Errorf("ReplyToNode(%q) = %q, %v; want %q, %v", tt.replyTo, node, ok, tt.wantNode, tt.wantOK)
			}
		})
	}
}

func TestIsReplyTo(t *testing.T) {
	for name, want := range map[string]bool{
		ReplyToQueue:               true,
		ReplyToPrefix + "abc.def":  true,
		"amq.rabbitmq.reply-tox":   false,
		"amq.rabbitmq.reply":       false,
		"orders":                   false,
		"":                         false,
		"x." + ReplyToPrefix + "a": false,
	} {
		if got := IsReplyTo(name); got != want {
			t.Errorf("IsReplyTo(%q) = %v, want %v", name, got, want)
		}
	}
}

// FuzzReplyToNode checks that the decoder never panics, and that a node it
// finds is one the encoding it read names: encoded again, it decodes the
// same.
func FuzzReplyToNode(f *testing.F) {
	f.Add(replyToName("reply@42875719", true, tagAtomUTF8))
	f.Add(replyToName("rabbit@localhost", false, tagAtom))
	f.Add(ReplyToQueue)
	f.Fuzz(func(t *testing.T, name string) {
		node, ok := ReplyToNode(name)
		if !ok {
			if node != "" {
				t.Fatalf("ReplyToNode(%q) = %q, false: a node with ok false", name, node)
			}
			return
		}
		if node == "" || len(node) > 0xffff {
			t.Fatalf("ReplyToNode(%q) = %q: not an atom's name", name, node)
		}
		if again, ok := ReplyToNode(replyToName(node, true, tagAtomUTF8)); !ok || again != node {
			t.Fatalf("%q encoded again decodes to %q, %v", node, again, ok)
		}
	})
}

package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestParseErlangAtoms(t *testing.T) {
	tests := []struct {
		out  string
		want []string
	}{
		{"['amqpm-1-native1@localhost']\n", []string{"amqpm-1-native1@localhost"}},
		{"['amqpm-1-native1@localhost','amqpm-1-native3@localhost',\n 'amqpm-1-native2@localhost']\n",
			[]string{"amqpm-1-native1@localhost", "amqpm-1-native3@localhost", "amqpm-1-native2@localhost"}},
		{"[]\n", nil},
	}
	for _, tt := range tests {
		if got := parseErlangAtoms(tt.out); !slices.Equal(got, tt.want) {
			t.Errorf("parseErlangAtoms(%q) = %q, want %q", tt.out, got, tt.want)
		}
	}
}

func TestPrintFailover(t *testing.T) {
	results := []failoverResult{{
		Target: targetMirror, KilledNodes: []string{"plain1", "plain2", "plain3"}, ResumeSeconds: []float64{0.3, 0.05, 0.1},
		Published: 100, Confirmed: 99, Lost: 1, Duplicates: 2, Unanswered: 3, Nacked: 4,
	}}
	var out bytes.Buffer
	if err := printFailover(&out, config{failoverKills: 3, size: 1024}, results); err != nil {
		t.Fatal(err)
	}
	var row string
	for line := range strings.Lines(out.String()) {
		if strings.HasPrefix(strings.TrimSpace(line), targetMirror+" ") {
			row = line
		}
	}
	if got, want := strings.Fields(row), []string{targetMirror, "3", "100", "99", "1", "2", "3", "4", "0", "0.100", "s", "0.300", "s"}; !slices.Equal(got, want) {
		t.Errorf("row = %q, want %q\n%s", got, want, out.String())
	}
}

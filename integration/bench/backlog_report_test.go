package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestBacklogRows(t *testing.T) {
	r := backlogResult{
		Messages: 1000000, BodyBytes: 256, PublishRate: 4321.4, PublishSeconds: 231.4,
		ProxyRSSBefore: 10 << 20, ProxyRSSBacklog: 60 << 20, ProxyRSSPeakFill: 70 << 20, ProxyBytesPerMessage: 52.4,
		ProxyCPUPerPublish: 41.25, FillCPU: cpuUse{Broker: 1.2, Proxy: 0.31, Load: 0.1, Other: 0.05}, SyncedNode: "plain3", SyncSeconds: 120.5, SyncRate: 8298.8, SyncedCopyHolds: 1000000,
		ProxyRSSSyncPeak: 80 << 20, ProxyRSSSynced: 65 << 20, KilledNode: "plain1", NewMaster: "plain2",
		PromotedSeconds: 0.123, FirstDeliverySeconds: 0.456, ConsumeAttempts: 1, ConsumeRate: 5000, ConsumeSeconds: 200,
		Confirmed: 1000000, Lost: 0, Duplicates: 2,
	}
	want := map[string]string{
		"messages":                        "1000000 of 256 B, persistent",
		"publish":                         "4321 msg/s (231.4 s)",
		"proxy RSS before / with backlog": "10.0 MiB / 60.0 MiB (high-water mark 70.0 MiB)",
		"proxy RSS per backlog message":   "52 B",
		"proxy CPU per published message": "41.2 µs",
		"cores during the fill":           "brokers 1.20, proxy 0.31, bench 0.10, other 0.05",
		"sync of plain3, wiped":           "120.5 s, 8299 msg/s; its copy then holds 1000000",
		"proxy RSS during / after sync":   "peak 80.0 MiB / 65.0 MiB",
		"kill -9 of plain1: promoted":     "0.12 s (plain2)",
		"first delivery after the kill":   "0.46 s (consumer connects: 1)",
		"consume":                         "5000 msg/s (200.0 s)",
		"confirmed / nacked":              "1000000 / 0",
		"lost / duplicates":               "0 / 2",
	}
	rows := r.rows()
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d: %q", len(rows), len(want), rows)
	}
	for _, row := range rows {
		if got, ok := want[row[0]]; !ok || got != row[1] {
			t.Errorf("row %q = %q, want %q", row[0], row[1], got)
		}
	}
}

// A scenario that failed early prints its table with what it has, naming no node.
func TestBacklogPrintEarlyFailure(t *testing.T) {
	var out bytes.Buffer
	if err := (backlogResult{Messages: 10, BodyBytes: 8}).print(&out, config{publishers: 2, confirmWindow: 256, prefetch: 256}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"sync of a slave, wiped", "kill -9 of the master: promoted", "0.00 s (-)", "10 of 8 B"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("the table lacks %q:\n%s", s, out.String())
		}
	}
}

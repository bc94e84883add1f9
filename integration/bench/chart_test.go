package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// svgElement is an element of the chart, with its children, as encoding/xml reads it.
type svgElement struct {
	XMLName  xml.Name
	Attrs    []xml.Attr   `xml:",any,attr"`
	Text     string       `xml:",chardata"`
	Children []svgElement `xml:",any"`
}

func (e svgElement) attr(name string) string {
	for _, a := range e.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// walk calls f on e and every element under it.
func (e svgElement) walk(f func(svgElement)) {
	f(e)
	for _, c := range e.Children {
		c.walk(f)
	}
}

// find returns the elements under e (e included) that match.
func (e svgElement) find(match func(svgElement) bool) []svgElement {
	var out []svgElement
	e.walk(func(c svgElement) {
		if match(c) {
			out = append(out, c)
		}
	})
	return out
}

// parseSVG checks that the whole document is well-formed XML and returns its root.
func parseSVG(t *testing.T, data []byte) svgElement {
	t.Helper()
	decoder := xml.NewDecoder(bytes.NewReader(data))
	for {
		_, err := decoder.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, data)
		}
	}
	var root svgElement
	if err := xml.Unmarshal(data, &root); err != nil {
		t.Fatalf("xml.Unmarshal: %v", err)
	}
	if root.XMLName.Local != "svg" || root.XMLName.Space != "http://www.w3.org/2000/svg" {
		t.Fatalf("root element %v, want svg in the SVG namespace", root.XMLName)
	}
	return root
}

// syntheticTimeline is a steady load with an outage of the given buckets after the kill:
// nothing delivered or confirmed in them, then one slow confirm.
func syntheticTimeline(target string, outage int) timelineResult {
	tl := timelineResult{Target: target, KilledNode: "node1", BucketSeconds: 0.1, ResumeSeconds: float64(outage) / 10, Confirmed: 500}
	for i := -30; i < 70; i++ {
		b := timelineBucketResult{Start: float64(i) / 10, Delivered: 40, Confirmed: 40, ConfirmP50: 2, ConfirmP99: 4}
		switch {
		case i >= 0 && i < outage:
			b = timelineBucketResult{Start: float64(i) / 10}
		case i == outage:
			b.ConfirmP99 = float64(outage) * 100
		}
		tl.Buckets = append(tl.Buckets, b)
	}
	return tl
}

func TestWriteFailoverSVG(t *testing.T) {
	tests := []struct {
		name      string
		timelines []timelineResult
		// gaps are the latency paths' expected move commands: 1 for an unbroken line.
		moves []int
	}{
		{
			name: "three targets",
			timelines: []timelineResult{
				syntheticTimeline(targetMirror, 1), syntheticTimeline(targetNativeHA, 2), syntheticTimeline(targetQuorum, 30),
			},
			moves: []int{2, 2, 2},
		},
		{
			name:      "no outage",
			timelines: []timelineResult{syntheticTimeline(targetMirror, 0)},
			moves:     []int{1},
		},
		{
			name:      "a target the chart has no colour for, with markup in its name",
			timelines: []timelineResult{syntheticTimeline(`other<&>"`, 3)},
			moves:     []int{2},
		},
		{
			name:      "no buckets",
			timelines: []timelineResult{{Target: targetMirror, BucketSeconds: 0.1}},
			moves:     []int{0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := writeFailoverSVG(&out, tt.timelines); err != nil {
				t.Fatal(err)
			}
			root := parseSVG(t, out.Bytes())

			for _, panel := range []string{"throughput", "latency"} {
				groups := root.find(func(e svgElement) bool { return e.XMLName.Local == "g" && e.attr("id") == panel })
				if len(groups) != 1 {
					t.Fatalf("got %d groups with id %s, want 1", len(groups), panel)
				}
				paths := groups[0].find(func(e svgElement) bool { return e.XMLName.Local == "path" })
				var targets []string
				for _, p := range paths {
					targets = append(targets, p.attr("data-target"))
				}
				var want []string
				for _, tl := range tt.timelines {
					want = append(want, tl.Target)
				}
				if !slices.Equal(targets, want) {
					t.Errorf("%s panel: paths for %q, want one per target %q", panel, targets, want)
				}
				if panel != "latency" {
					continue
				}
				for i, p := range paths {
					if got := strings.Count(p.attr("d"), "M"); got != tt.moves[i] {
						t.Errorf("latency path of %s has %d moves, want %d (a gap where no confirm came): %s", targets[i], got, tt.moves[i], p.attr("d"))
					}
				}
			}

			kills := root.find(func(e svgElement) bool { return e.attr("id") == "kill" })
			if len(kills) != 1 || kills[0].XMLName.Local != "line" {
				t.Fatalf("got %d elements with id kill, want one line", len(kills))
			}
			if x1, x2 := kills[0].attr("x1"), kills[0].attr("x2"); x1 != x2 {
				t.Errorf("kill line from x %s to x %s, want vertical", x1, x2)
			}
			y1, _ := strconv.ParseFloat(kills[0].attr("y1"), 64)
			y2, _ := strconv.ParseFloat(kills[0].attr("y2"), 64)
			if y1 > firstPanel || y2 < secondPanel+panelHeight {
				t.Errorf("kill line from y %v to %v, want it across both panels (%d to %d)", y1, y2, firstPanel, secondPanel+panelHeight)
			}

			var texts []string
			root.walk(func(e svgElement) {
				if e.XMLName.Local == "text" {
					texts = append(texts, e.Text)
				}
			})
			for _, label := range []string{"delivered, msg/s", "confirm latency p99, ms (log)", "seconds from the kill", "0", "+1"} {
				if !slices.Contains(texts, label) {
					t.Errorf("no text %q in the chart; texts: %q", label, texts)
				}
			}
			for i, tl := range tt.timelines {
				label, _ := seriesStyle(i, tl.Target)
				if !slices.Contains(texts, label) {
					t.Errorf("legend has no %q; texts: %q", label, texts)
				}
			}
		})
	}
}

func TestNiceStep(t *testing.T) {
	tests := []struct{ x, want float64 }{
		{0, 1}, {0.7, 1}, {1, 1}, {1.1, 2}, {3, 5}, {7, 10}, {120, 200}, {450, 500}, {0.03, 0.05},
	}
	for _, tt := range tests {
		if got := niceStep(tt.x); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("niceStep(%v) = %v, want %v", tt.x, got, tt.want)
		}
	}
}

func TestTicks(t *testing.T) {
	tests := []struct {
		lo, hi, step float64
		want         []float64
	}{
		{0, 500, 100, []float64{0, 100, 200, 300, 400, 500}},
		{-3, 7, 1, []float64{-3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7}},
		{-2.95, 1.05, 1, []float64{-2, -1, 0, 1}},
		{-0.3, 0.3, 0.1, []float64{-0.3, -0.2, -0.1, 0, 0.1, 0.2, 0.3}},
	}
	for _, tt := range tests {
		got := ticks(tt.lo, tt.hi, tt.step)
		if len(got) != len(tt.want) {
			t.Errorf("ticks(%v, %v, %v) = %v, want %v", tt.lo, tt.hi, tt.step, got, tt.want)
			continue
		}
		for i := range got {
			if math.Abs(got[i]-tt.want[i]) > 1e-9 {
				t.Errorf("ticks(%v, %v, %v) = %v, want %v", tt.lo, tt.hi, tt.step, got, tt.want)
				break
			}
		}
	}
}

func TestDecades(t *testing.T) {
	tests := []struct {
		name   string
		values []float64
		wantLo float64
		wantHi float64
	}{
		{"none: a default", nil, 1, 1000},
		{"no positive value: a default", []float64{0, -1}, 1, 1000},
		{"bounding decades", []float64{2.5, 4, 3100}, 1, 10000},
		{"at least one decade", []float64{10}, 10, 100},
		{"below one millisecond", []float64{0.4, 0.9}, 0.1, 1},
	}
	for _, tt := range tests {
		lo, hi := decades(tt.values)
		if math.Abs(lo-tt.wantLo) > 1e-12 || math.Abs(hi-tt.wantHi) > 1e-9 {
			t.Errorf("%s: decades(%v) = %v, %v, want %v, %v", tt.name, tt.values, lo, hi, tt.wantLo, tt.wantHi)
		}
	}
}

func TestFormatTick(t *testing.T) {
	tests := []struct {
		v, step float64
		want    string
	}{
		{0, 100, "0"}, {2000, 500, "2 000"}, {-3, 1, "-3"}, {0.6000000000000001, 0.2, "0.6"}, {0.1, 0.1, "0.1"},
		{1000, 1000, "1 000"}, {0.05, 0.05, "0.05"},
	}
	for _, tt := range tests {
		if got := formatTick(tt.v, tt.step); got != tt.want {
			t.Errorf("formatTick(%v, %v) = %q, want %q", tt.v, tt.step, got, tt.want)
		}
	}
}

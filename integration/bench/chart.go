package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// The report's chart: the timelines of the targets through the kill of the master's node,
// in two panels sharing the time axis (messages delivered per second, and the confirms'
// p99 latency on a log scale), one line per target, the kill a dashed vertical line at
// time zero. Plain SVG 1.1 written by hand, so that a browser or a markdown viewer shows
// it and the bench needs nothing beside the standard library.

// The chart's geometry, in SVG user units (pixels).
const (
	chartWidth   = 960
	chartHeight  = 580
	plotLeft     = 80
	plotRight    = 700
	legendLeft   = 730
	panelHeight  = 200
	panelGap     = 50
	firstPanel   = 70
	secondPanel  = firstPanel + panelHeight + panelGap
	timeAxisText = secondPanel + panelHeight + 18
)

// chartSeries are a target's label and colour in the chart.
var chartSeries = map[string]struct{ label, colour string }{
	targetMirror:   {"amqp-mirror, 3 plain nodes", "#1c6ac8"},
	targetNativeHA: {"RabbitMQ classic mirroring", "#d9480f"},
	targetQuorum:   {"RabbitMQ quorum queue", "#2b8a3e"},
}

// otherColours colour targets the chart has no colour for, in turn.
var otherColours = []string{"#7048e8", "#868e96", "#e8590c"}

// seriesStyle is the label and colour of the i-th timeline's target.
func seriesStyle(i int, target string) (label, colour string) {
	if s, ok := chartSeries[target]; ok {
		return s.label, s.colour
	}
	return target, otherColours[i%len(otherColours)]
}

// svgBuilder writes SVG elements; text is escaped.
type svgBuilder struct{ strings.Builder }

func (b *svgBuilder) printf(format string, args ...any) { fmt.Fprintf(&b.Builder, format, args...) }

// text writes a text element; attributes are raw, content is escaped.
func (b *svgBuilder) text(x, y float64, attributes, content string) {
	b.printf(`<text x="%.1f" y="%.1f"%s>%s</text>`+"\n", x, y, attributes, html.EscapeString(content))
}

func (b *svgBuilder) line(x1, y1, x2, y2 float64, attributes string) {
	b.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"%s/>`+"\n", x1, y1, x2, y2, attributes)
}

// linearScale maps [lo, hi] onto [from, to].
type linearScale struct{ lo, hi, from, to float64 }

func (s linearScale) at(v float64) float64 {
	if s.hi == s.lo {
		return s.from
	}
	return s.from + (v-s.lo)/(s.hi-s.lo)*(s.to-s.from)
}

// niceStep is the smallest of 1, 2 and 5 times a power of ten that is at least x.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	power := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*power >= x*(1-1e-9) {
			return m * power
		}
	}
	return 10 * power
}

// ticks are the multiples of step from lo to hi.
func ticks(lo, hi, step float64) []float64 {
	var out []float64
	for i := math.Ceil(lo/step - 1e-9); i*step <= hi+step*1e-9; i++ {
		v := i * step
		if v == 0 {
			v = 0 // i*step is -0 for i = -0
		}
		out = append(out, v)
	}
	return out
}

// decades are the powers of ten that bound the positive values, at least one decade
// apart; [1, 1000] when there are none.
func decades(values []float64) (lo, hi float64) {
	lo, hi = math.Inf(1), 0
	for _, v := range values {
		if v > 0 {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	if hi == 0 {
		return 1, 1000
	}
	lo = math.Pow(10, math.Floor(math.Log10(lo)))
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	return lo, hi
}

// formatTick writes a tick value with the decimals its step needs, thousands grouped.
func formatTick(v, step float64) string {
	decimals := max(0, int(-math.Floor(math.Log10(step)+1e-9)))
	if decimals == 0 {
		return thousands(int64(math.Round(v)))
	}
	return strconv.FormatFloat(v, 'f', decimals, 64)
}

// failoverChart is the chart of some timelines, with its scales.
type failoverChart struct {
	timelines []timelineResult
	from, to  float64 // seconds from the kill
	x         linearScale
	// rate maps msg/s, rateStep apart; latency maps log10(ms), latencyLo to latencyHi.
	rate, latency        linearScale
	rateTop, rateStep    float64
	latencyLo, latencyHi float64
}

func newFailoverChart(timelines []timelineResult) failoverChart {
	c := failoverChart{timelines: timelines}
	c.from, c.to = timelineSpan(timelines)
	if c.to <= c.from {
		c.from, c.to = -timelineBefore.Seconds(), timelineAfter.Seconds()
	}
	c.x = linearScale{lo: c.from, hi: c.to, from: plotLeft, to: plotRight}
	var rates, p99s []float64
	for _, tl := range timelines {
		for _, b := range tl.Buckets {
			rates = append(rates, tl.deliveryRate(b))
			if b.Confirmed > 0 {
				p99s = append(p99s, b.ConfirmP99)
			}
		}
	}
	top := max(largest(rates), 1)
	c.rateStep = niceStep(top / 5)
	c.rateTop = math.Ceil(top/c.rateStep) * c.rateStep
	c.rate = linearScale{lo: 0, hi: c.rateTop, from: firstPanel + panelHeight, to: firstPanel}
	c.latencyLo, c.latencyHi = decades(p99s)
	c.latency = linearScale{lo: math.Log10(c.latencyLo), hi: math.Log10(c.latencyHi), from: secondPanel + panelHeight, to: secondPanel}
	return c
}

// writeFailoverSVG writes the chart of the timelines.
func writeFailoverSVG(out io.Writer, timelines []timelineResult) error {
	c := newFailoverChart(timelines)
	var b svgBuilder
	b.printf(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	b.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		chartWidth, chartHeight, chartWidth, chartHeight)
	b.printf(`<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", chartWidth, chartHeight)
	b.text(plotLeft, 26, ` font-size="16" font-weight="bold"`, "Through a kill -9 of the node holding the queue's master")
	b.text(plotLeft, 46, ` fill="#495057"`, fmt.Sprintf("one publisher waiting for each confirm, at most %d msg/s; one consumer acking each message; buckets of %.0f ms",
		timelineRate, timelineBucket.Seconds()*1000))
	// The time axis first, so that the data is drawn over its grid.
	c.timeAxis(&b)
	c.throughputPanel(&b)
	c.latencyPanel(&b)
	kill := c.x.at(0)
	b.line(kill, firstPanel, kill, secondPanel+panelHeight, ` id="kill" stroke="#212529" stroke-width="1.2" stroke-dasharray="5 4"`)
	b.text(kill+4, firstPanel+14, ` font-size="11" fill="#212529"`, "kill -9")
	c.legend(&b)
	b.printf("</svg>\n")
	_, err := io.WriteString(out, b.String())
	return err
}

// timeAxis writes the shared time axis: grid and ticks on both panels, labels under the
// lower one.
func (c failoverChart) timeAxis(b *svgBuilder) {
	b.printf(`<g id="time-axis">` + "\n")
	step := niceStep((c.to - c.from) / 12)
	for _, v := range ticks(c.from, c.to, step) {
		px := c.x.at(v)
		for _, top := range []float64{firstPanel, secondPanel} {
			b.line(px, top, px, top+panelHeight, ` stroke="#f1f3f5"`)
			b.line(px, top+panelHeight, px, top+panelHeight+5, ` stroke="#868e96"`)
		}
		label := formatTick(v, step)
		if v > 0 {
			label = "+" + label
		}
		b.text(px, timeAxisText, ` text-anchor="middle"`, label)
	}
	b.text((plotLeft+plotRight)/2, timeAxisText+22, ` class="axis-label" text-anchor="middle"`, "seconds from the kill")
	b.printf("</g>\n")
}

// throughputPanel writes the upper panel: messages delivered per second.
func (c failoverChart) throughputPanel(b *svgBuilder) {
	b.printf(`<g id="throughput">` + "\n")
	for _, v := range ticks(0, c.rateTop, c.rateStep) {
		y := c.rate.at(v)
		b.line(plotLeft, y, plotRight, y, ` stroke="#e9ecef"`)
		b.text(plotLeft-6, y+4, ` text-anchor="end"`, formatTick(v, c.rateStep))
	}
	b.text(0, 0, fmt.Sprintf(` class="axis-label" text-anchor="middle" transform="translate(22 %d) rotate(-90)"`, firstPanel+panelHeight/2), "delivered, msg/s")
	for i, tl := range c.timelines {
		var d strings.Builder
		for j, bucket := range tl.Buckets {
			command := "L"
			if j == 0 {
				command = "M"
			}
			fmt.Fprintf(&d, "%s%.1f %.1f ", command, c.x.at(bucket.Start+tl.BucketSeconds/2), c.rate.at(tl.deliveryRate(bucket)))
		}
		c.series(b, i, tl.Target, d.String())
	}
	b.printf(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#868e96"/>`+"\n", plotLeft, firstPanel, plotRight-plotLeft, panelHeight)
	b.printf("</g>\n")
}

// latencyPanel writes the lower panel: the confirms' p99 latency on a log scale. A bucket
// without confirms leaves a gap in its line.
func (c failoverChart) latencyPanel(b *svgBuilder) {
	b.printf(`<g id="latency">` + "\n")
	for v := c.latencyLo; v <= c.latencyHi*1.0001; v *= 10 {
		y := c.latency.at(math.Log10(v))
		b.line(plotLeft, y, plotRight, y, ` stroke="#e9ecef"`)
		b.text(plotLeft-6, y+4, ` text-anchor="end"`, formatTick(v, v))
	}
	b.text(0, 0, fmt.Sprintf(` class="axis-label" text-anchor="middle" transform="translate(22 %d) rotate(-90)"`, secondPanel+panelHeight/2), "confirm latency p99, ms (log)")
	for i, tl := range c.timelines {
		var d strings.Builder
		gap := true
		for _, bucket := range tl.Buckets {
			if bucket.Confirmed == 0 {
				gap = true
				continue
			}
			command := "L"
			if gap {
				command = "M"
			}
			gap = false
			fmt.Fprintf(&d, "%s%.1f %.1f ", command, c.x.at(bucket.Start+tl.BucketSeconds/2), c.latency.at(math.Log10(bucket.ConfirmP99)))
		}
		c.series(b, i, tl.Target, d.String())
	}
	b.printf(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#868e96"/>`+"\n", plotLeft, secondPanel, plotRight-plotLeft, panelHeight)
	b.printf("</g>\n")
}

// series writes the i-th timeline's line with the path data d.
func (c failoverChart) series(b *svgBuilder, i int, target, d string) {
	_, colour := seriesStyle(i, target)
	b.printf(`<path class="series" data-target="%s" d="%s" fill="none" stroke="%s" stroke-width="1.5" stroke-linejoin="round"/>`+"\n",
		html.EscapeString(target), strings.TrimSpace(d), colour)
}

// legend writes each target with its resume time and what it lost.
func (c failoverChart) legend(b *svgBuilder) {
	b.printf(`<g id="legend">` + "\n")
	for i, tl := range c.timelines {
		label, colour := seriesStyle(i, tl.Target)
		y := float64(firstPanel + 10 + i*48)
		b.line(legendLeft, y, legendLeft+24, y, fmt.Sprintf(` stroke="%s" stroke-width="3"`, colour))
		b.text(legendLeft+32, y+4, "", label)
		b.text(legendLeft+32, y+20, ` fill="#495057" font-size="11"`, fmt.Sprintf("resumed after %.3f s; %d lost", tl.ResumeSeconds, tl.Lost))
	}
	b.printf("</g>\n")
}

// largest is the largest value, 0 for none.
func largest(values []float64) float64 {
	m := 0.0
	for _, v := range values {
		m = max(m, v)
	}
	return m
}

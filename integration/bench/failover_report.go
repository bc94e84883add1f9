package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// printFailover prints the failover scenario's table: one row per target.
func printFailover(out io.Writer, cfg config, results []failoverResult) error {
	if len(results) == 0 {
		return nil
	}
	fmt.Fprintf(out, "\nfailover: kill -9 of the queue master's node, %d times per target, each time restarted and resynchronised before the next;\n", cfg.failoverKills)
	fmt.Fprintf(out, "1 publisher (one persistent %d B message at a time, waiting for its confirm), 1 consumer (prefetch 20, manual acks), ha-mode all + ha-sync-mode automatic.\n", max(cfg.size, 16))
	fmt.Fprintf(out, "lost: confirmed, never delivered; unanswered: publish attempts that ended neither confirmed nor nacked (channel lost, or no answer in %v);\n", failoverConfirmTimeout)
	fmt.Fprintf(out, "resume: from the kill to the first delivery of a message first published after it\n\n")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "target\tkills\tpublished\tconfirmed\tlost\tduplicates\tunanswered\tnacked\treconnects\tresume median\tmax\t")
	for _, r := range results {
		median, most := "-", "-"
		if len(r.ResumeSeconds) > 0 {
			s := slices.Sorted(slices.Values(r.ResumeSeconds))
			median = fmt.Sprintf("%.3f s", medianOf(s))
			most = fmt.Sprintf("%.3f s", s[len(s)-1])
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t\n", r.Target, len(r.ResumeSeconds),
			r.Published, r.Confirmed, r.Lost, r.Duplicates, r.Unanswered, r.Nacked, r.Reconnects, median, most)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, r := range results {
		var kills []string
		for i, s := range r.ResumeSeconds {
			kills = append(kills, fmt.Sprintf("%s %.3f s", r.KilledNodes[i], s))
		}
		fmt.Fprintf(out, "%s: %s", r.Target, strings.Join(kills, ", "))
		if r.Moves > 0 {
			fmt.Fprintf(out, " (clients moved off the master's node %d times before a kill, publisher paused; not counted)", r.Moves)
		}
		fmt.Fprintln(out)
		for _, e := range r.ClientErrors {
			fmt.Fprintf(out, "  %s client: %s\n", r.Target, e)
		}
	}
	return nil
}

// printTimelines prints the report scenario's master kills: one row per target.
func printTimelines(out io.Writer, timelines []timelineResult) error {
	if len(timelines) == 0 {
		return nil
	}
	fmt.Fprintf(out, "\nmaster kill (report): kill -9 of the node holding the queue's master, once per target, under the failover scenario's load;\n")
	fmt.Fprintf(out, "lost: confirmed, never delivered; resume: from the kill to the first delivery of a message first published after it\n\n")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "target\tkilled\tpublished\tconfirmed\tlost\tduplicates\tunanswered\treconnects\tresume\t")
	for _, tl := range timelines {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.3f s\t\n", tl.Target, tl.KilledNode,
			tl.Published, tl.Confirmed, tl.Lost, tl.Duplicates, tl.Unanswered, tl.Reconnects, tl.ResumeSeconds)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, tl := range timelines {
		for _, e := range tl.ClientErrors {
			fmt.Fprintf(out, "  %s client: %s\n", tl.Target, e)
		}
	}
	return nil
}

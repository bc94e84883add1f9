// Command specgen generates frames/methods_gen.go (and the test samples)
// from the AMQP 0-9-1 spec XML. Run it through `go generate ./frames`.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/amqp-mirror/amqp-mirror/frames/internal/spec"
)

type specList []string

func (l *specList) String() string     { return strings.Join(*l, ",") }
func (l *specList) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var specs specList
	flag.Var(&specs, "spec", "spec XML file; repeat to merge extensions into the first")
	out := flag.String("out", "methods_gen.go", "generated methods file")
	samples := flag.String("samples", "", "generated test samples file (optional)")
	flag.Parse()
	if err := run(specs, *out, *samples); err != nil {
		fmt.Fprintln(os.Stderr, "specgen:", err)
		os.Exit(1)
	}
}

func run(specs []string, out, samples string) error {
	if len(specs) == 0 {
		return fmt.Errorf("no -spec given")
	}
	s, err := spec.Load(specs...)
	if err != nil {
		return err
	}
	src, err := spec.Methods(s)
	if err != nil {
		return fmt.Errorf("formatting methods: %w", err)
	}
	if err := os.WriteFile(out, src, 0o644); err != nil {
		return err
	}
	if samples == "" {
		return nil
	}
	src, err = spec.Samples(s)
	if err != nil {
		return fmt.Errorf("formatting samples: %w", err)
	}
	return os.WriteFile(samples, src, 0o644)
}

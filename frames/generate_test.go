package frames

import (
	"bytes"
	"os"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/frames/internal/spec"
)

// TestGeneratedCodeIsCurrent fails when methods_gen.go or the test samples
// differ from what the generator makes of the committed spec today: someone
// edited generated code by hand, or changed the generator or the XML without
// running go generate.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	s, err := spec.Load("internal/spec/amqp0-9-1.stripped.extended.xml", "internal/spec/rabbitmq-extensions.xml")
	if err != nil {
		t.Fatalf("loading spec: %v", err)
	}
	tests := []struct {
		name   string
		file   string
		render func(*spec.Spec) ([]byte, error)
	}{
		{name: "methods", file: "methods_gen.go", render: spec.Methods},
		{name: "samples", file: "methods_sample_gen_test.go", render: spec.Samples},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := tt.render(s)
			if err != nil {
				t.Fatalf("rendering: %v", err)
			}
			got, err := os.ReadFile(tt.file)
			if err != nil {
				t.Fatalf("reading committed file: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s is stale or edited by hand: run `go generate ./frames` (committed %d bytes, generator %d bytes)",
					tt.file, len(got), len(want))
			}
		})
	}
}

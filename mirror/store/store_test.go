package store

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

func openTestStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(Config{
		Dir:             dir,
		NodeID:          "rabbit1",
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		ElectionTimeout: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func testMeta(name, master string, slaves ...string) mirror.QueueMeta {
	m := mirror.QueueMeta{ID: mirror.QueueID{VHost: "/", Name: name}, Master: master, Durable: true, Arguments: []byte{0, 0, 0, 0}}
	for _, s := range slaves {
		m.Slaves = append(m.Slaves, mirror.Slave{Backend: s})
	}
	return m
}

func TestStorePutGetDelete(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	ctx := context.Background()
	changes, stop := s.Changes()
	defer stop()

	written, err := s.Put(ctx, testMeta("queue_1", "rabbit1", "rabbit2", "rabbit3"), 0)
	if err != nil {
		t.Fatalf("first put: %v", err)
	}
	if written.Version == 0 {
		t.Errorf("written version is 0, want the log index")
	}
	select {
	case <-changes:
	case <-time.After(5 * time.Second):
		t.Fatal("no change notification after a put")
	}
	got, ok := s.Get(written.ID)
	if !ok || !reflect.DeepEqual(got, written) {
		t.Fatalf("Get = %+v, %v; want %+v", got, ok, written)
	}

	if _, err := s.Put(ctx, testMeta("queue_1", "rabbit2"), 0); !errors.Is(err, ErrConflict) {
		t.Errorf("put of an existing queue with expect 0: err = %v, want ErrConflict", err)
	}
	promoted := written.Clone()
	promoted.Master, promoted.Slaves, promoted.Epoch = "rabbit2", promoted.Slaves[1:], 1
	second, err := s.Put(ctx, promoted, written.Version)
	if err != nil {
		t.Fatalf("conditional put with the current version: %v", err)
	}
	if _, err := s.Put(ctx, promoted, written.Version); !errors.Is(err, ErrConflict) {
		t.Errorf("second writer with the same stale version: err = %v, want ErrConflict", err)
	}
	if err := s.Delete(ctx, promoted.ID, written.Version); !errors.Is(err, ErrConflict) {
		t.Errorf("delete with a stale version: err = %v, want ErrConflict", err)
	}
	if err := s.Delete(ctx, promoted.ID, second.Version); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, ok := s.Get(promoted.ID); ok {
		t.Errorf("queue still present after delete")
	}
}

func TestStoreSurvivesRestart(t *testing.T) {
	tests := []struct {
		name     string
		snapshot bool // compact the log into a snapshot before the restart
	}{
		{name: "replaying the log"},
		{name: "from a snapshot", snapshot: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openTestStore(t, dir)
			ctx := context.Background()
			var want []mirror.QueueMeta
			for _, m := range []mirror.QueueMeta{
				testMeta("queue_2", "rabbit2", "rabbit3", "rabbit1"),
				testMeta("queue_1", "rabbit1", "rabbit2", "rabbit3"),
				{ID: mirror.QueueID{VHost: "other", Name: "plain"}, Master: "rabbit3"},
			} {
				w, err := s.Put(ctx, m, 0)
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, w)
			}
			sortMetas(want)
			if tt.snapshot {
				if err := s.Snapshot(); err != nil {
					t.Fatalf("snapshot: %v", err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}

			reopened := openTestStore(t, dir)
			if got := reopened.List(); !reflect.DeepEqual(got, want) {
				t.Fatalf("after restart List() =\n%+v\nwant\n%+v", got, want)
			}
			// The versions carried over still guard writes.
			if _, err := reopened.Put(ctx, want[0], want[0].Version); err != nil {
				t.Errorf("put with the version read before the restart: %v", err)
			}
		})
	}
}

func TestStoreClosed(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Put(context.Background(), testMeta("q", "rabbit1"), 0); err == nil {
		t.Errorf("put after Close succeeded")
	}
}

package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestSettlesReachTheProxyBesideTheSlave sends settles and rejections
// for the copies on rabbit2 and rabbit3 from rabbit1: each arrives at the
// proxy beside that backend only, in order, at the handler of its kind,
// and those for rabbit1's own backend go nowhere.
func TestSettlesReachTheProxyBesideTheSlave(t *testing.T) {
	nodes := startCluster(t, 3)
	var mu sync.Mutex
	settled, rejected := map[string][]mirror.MessageID{}, map[string][]mirror.MessageID{}
	queue := mirror.QueueID{VHost: "/", Name: "queue_1"}
	for _, n := range nodes {
		name := n.cfg.NodeName
		n.Peers().HandleSettles(func(id mirror.QueueID, ids []mirror.MessageID, outcome mirror.Outcome) {
			if id != queue {
				t.Errorf("%s: settles for %v, want queue_1 in /", name, id)
			}
			into := settled
			if outcome == mirror.Rejected {
				into = rejected
			}
			mu.Lock()
			into[name] = append(into[name], ids...)
			mu.Unlock()
		})
	}
	var wantSettled, wantRejected []mirror.MessageID
	for i := 0; i < 1000; i += 10 {
		batch := make([]mirror.MessageID, 10)
		for j := range batch {
			copy(batch[j][:], fmt.Sprintf("message-%08d", i+j))
		}
		reject := i%30 == 0
		for _, backend := range []string{"rabbit1", "rabbit2", "rabbit3"} {
			outcome := mirror.Acked
			if reject {
				outcome = mirror.Rejected
			}
			nodes[0].Peers().SendSettles(backend, queue, batch, outcome)
		}
		if reject {
			wantRejected = append(wantRejected, batch...)
		} else {
			wantSettled = append(wantSettled, batch...)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, name := range []string{"rabbit2", "rabbit3"} {
			if len(settled[name]) != len(wantSettled) || len(rejected[name]) != len(wantRejected) {
				return fmt.Errorf("%s got %d settles and %d rejections, want %d and %d",
					name, len(settled[name]), len(rejected[name]), len(wantSettled), len(wantRejected))
			}
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"rabbit2", "rabbit3"} {
		if !slices.Equal(settled[name], wantSettled) || !slices.Equal(rejected[name], wantRejected) {
			t.Errorf("%s: settles or rejections arrived changed or out of order", name)
		}
	}
	if len(settled["rabbit1"])+len(rejected["rabbit1"]) != 0 {
		t.Errorf("rabbit1 got %d settles and %d rejections for its own backend, want none (its engine settles them itself)",
			len(settled["rabbit1"]), len(rejected["rabbit1"]))
	}
	if d := nodes[0].Peers().PeersDropped(); d != 0 {
		t.Errorf("dropped %d peer messages, want 0", d)
	}
}

// TestSendReachesTheHandlerOfItsKind sends a message of a kind to one
// node; its handler gets it with the sender's name.
func TestSendReachesTheHandlerOfItsKind(t *testing.T) {
	nodes := startCluster(t, 2)
	type message struct{ from, payload string }
	got := make(chan message, 10)
	nodes[1].Peers().Handle("policies", func(from string, payload []byte) {
		got <- message{from, string(payload)}
	})
	nodes[0].Peers().Send("rabbit2", "policies", []byte(`{"version":1}`))
	select {
	case m := <-got:
		if want := (message{"rabbit1", `{"version":1}`}); m != want {
			t.Errorf("got %+v, want %+v", m, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the message did not arrive within 10s")
	}
}

// TestPurgeSlaveWaitsForTheProxyBesideIt asks rabbit1's proxy to have the
// copy on rabbit2 purged: rabbit2's handler runs before PurgeSlave
// returns, and its error comes back; a backend without an alive proxy is
// an error at once.
func TestPurgeSlaveWaitsForTheProxyBesideIt(t *testing.T) {
	nodes := startCluster(t, 2)
	queue := mirror.QueueID{VHost: "/", Name: "queue_2"}
	purged := make(chan mirror.QueueID, 1)
	fail := errors.New("trimmer closed")
	var failNext atomic.Bool
	nodes[1].Peers().HandlePurges(func(ctx context.Context, id mirror.QueueID) error {
		if failNext.Load() {
			return fail
		}
		purged <- id
		return nil
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := nodes[0].Peers().PurgeSlave(ctx, "rabbit2", queue); err != nil {
		t.Fatalf("PurgeSlave: %v", err)
	}
	select {
	case id := <-purged:
		if id != queue {
			t.Errorf("purged %v, want %v", id, queue)
		}
	default:
		t.Fatal("PurgeSlave returned before rabbit2's handler ran")
	}
	failNext.Store(true)
	if err := nodes[0].Peers().PurgeSlave(ctx, "rabbit2", queue); err == nil || !strings.Contains(err.Error(), fail.Error()) {
		t.Errorf("PurgeSlave with a failing handler: got %v, want an error saying %q", err, fail)
	}
	if err := nodes[0].Peers().PurgeSlave(ctx, "rabbit9", queue); err == nil {
		t.Error("PurgeSlave for a backend without a proxy: got nil, want an error")
	}
}

// TestCopyJobsRunOnTheProxyBesideTheSource: StartCopy hands the job, whole,
// to the handler of the proxy beside the source, CopyState carries its
// answers and the cancel flag back and forth, and errors on either side
// come back; a backend without an alive proxy is an error at once.
func TestCopyJobsRunOnTheProxyBesideTheSource(t *testing.T) {
	nodes := startCluster(t, 2)
	job := mirror.CopyJob{ID: "job-1", Queue: mirror.QueueID{VHost: "prod", Name: "orders"}, Target: "rabbit1", Batch: 128}
	started := make(chan mirror.CopyJob, 1)
	refuse := errors.New("no synchronised slave here")
	nodes[1].Peers().HandleCopies(func(_ context.Context, j mirror.CopyJob) error {
		if j.ID == "refused" {
			return refuse
		}
		started <- j
		return nil
	}, func(_ context.Context, name string, cancel bool) (mirror.CopyState, error) {
		switch {
		case name != job.ID:
			return mirror.CopyState{}, fmt.Errorf("no copy named %q here", name)
		case cancel:
			return mirror.CopyState{Done: true, Copied: 3, Err: "cancelled"}, nil
		}
		return mirror.CopyState{Done: true, Copied: 7}, nil
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	peers := nodes[0].Peers()
	if err := peers.StartCopy(ctx, "rabbit2", job); err != nil {
		t.Fatalf("StartCopy: %v", err)
	}
	if got := <-started; got != job {
		t.Errorf("the handler got %+v, want %+v", got, job)
	}
	tests := []struct {
		name    string
		job     string
		cancel  bool
		want    mirror.CopyState
		wantErr string
	}{
		{name: "done", job: job.ID, want: mirror.CopyState{Done: true, Copied: 7}},
		{name: "cancelled", job: job.ID, cancel: true, want: mirror.CopyState{Done: true, Copied: 3, Err: "cancelled"}},
		{name: "unknown job", job: "job-2", wantErr: `no copy named "job-2" here`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := peers.CopyState(ctx, "rabbit2", tt.job, tt.cancel)
			switch {
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("CopyState(%s) = %v, want an error saying %q", tt.job, err, tt.wantErr)
			case tt.wantErr == "" && err != nil:
				t.Errorf("CopyState(%s): %v", tt.job, err)
			case st != tt.want:
				t.Errorf("CopyState(%s) = %+v, want %+v", tt.job, st, tt.want)
			}
		})
	}
	if err := peers.StartCopy(ctx, "rabbit2", mirror.CopyJob{ID: "refused"}); err == nil || !strings.Contains(err.Error(), refuse.Error()) {
		t.Errorf("StartCopy refused: got %v, want an error saying %q", err, refuse)
	}
	if err := peers.StartCopy(ctx, "rabbit9", job); err == nil {
		t.Error("StartCopy for a backend without a proxy: got nil, want an error")
	}
	if _, err := peers.CopyState(ctx, "rabbit9", job.ID, false); err == nil {
		t.Error("CopyState for a backend without a proxy: got nil, want an error")
	}
}

// TestListingsAskEveryOtherProxy: Unrecorded gathers the queues every
// other proxy lists, and Held adds up their counts; a proxy that cannot
// answer makes an error, with the others' queues still returned.
func TestListingsAskEveryOtherProxy(t *testing.T) {
	nodes := startCluster(t, 3)
	q2 := mirror.UnrecordedQueue{ID: mirror.QueueID{VHost: "/", Name: "amq.gen-2"}, Backend: "rabbit2", Exclusive: true}
	q3 := mirror.UnrecordedQueue{ID: mirror.QueueID{VHost: "/", Name: "reply-3"}, Backend: "rabbit3"}
	orders := mirror.QueueID{VHost: "/", Name: "orders"}
	for i, q := range map[int]mirror.UnrecordedQueue{1: q2, 2: q3} {
		nodes[i].Peers().HandleUnrecorded(func(vhost string) []mirror.UnrecordedQueue {
			if vhost != "/" {
				t.Errorf("asked for vhost %q, want /", vhost)
			}
			return []mirror.UnrecordedQueue{q}
		})
		nodes[i].Peers().HandleHeld(func(string) map[mirror.QueueID]mirror.Held {
			return map[mirror.QueueID]mirror.Held{orders: {Unacked: i, Copies: mirror.CopyRuns{Began: uint64(i), Ended: 1}}}
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	testutil.Eventually(t, 10*time.Second, func() error {
		got, err := nodes[0].Peers().Unrecorded(ctx, "/")
		if err != nil {
			return err
		}
		slices.SortFunc(got, func(a, b mirror.UnrecordedQueue) int { return strings.Compare(a.ID.Name, b.ID.Name) })
		if want := []mirror.UnrecordedQueue{q2, q3}; !slices.Equal(got, want) {
			return fmt.Errorf("Unrecorded: got %v, want %v", got, want)
		}
		return nil
	})
	held, err := nodes[0].Peers().Held(ctx, "/")
	if want := (mirror.Held{Unacked: 3, Copies: mirror.CopyRuns{Began: 3, Ended: 2}}); err != nil || held[orders] != want {
		t.Errorf("Held: got %v, %v; want orders: %+v", held, err, want)
	}

	nodes[2].peers.calls.Delete(unrecordedCall)
	got, err := nodes[0].Peers().Unrecorded(ctx, "/")
	if err == nil || !strings.Contains(err.Error(), "rabbit3") {
		t.Errorf("Unrecorded with rabbit3 not answering: got error %v, want one naming rabbit3", err)
	}
	if want := []mirror.UnrecordedQueue{q2}; !slices.Equal(got, want) {
		t.Errorf("Unrecorded with rabbit3 not answering: got %v, want rabbit2's %v", got, want)
	}
}

// TestCountDownAsksEveryOtherProxy: CountDown counts the other proxies that
// count a backend down, with the cluster's size; one that has no answer to give
// counts as not seeing it down, and the error names it.
func TestCountDownAsksEveryOtherProxy(t *testing.T) {
	nodes := startCluster(t, 3)
	for i, downs := range map[int][]string{1: {"rabbit3"}, 2: {"rabbit3", "rabbit1"}} {
		nodes[i].Peers().HandleDown(func(backend string) bool { return slices.Contains(downs, backend) })
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	testutil.Eventually(t, 10*time.Second, func() error {
		for backend, want := range map[string]int{"rabbit3": 2, "rabbit1": 1, "rabbit2": 0} {
			down, members, err := nodes[0].Peers().CountDown(ctx, backend)
			if err != nil || down != want || members != 3 {
				return fmt.Errorf("CountDown(%s): %d of %d, %v; want %d of 3", backend, down, members, err, want)
			}
		}
		return nil
	})

	nodes[2].peers.calls.Delete(downCall)
	down, members, err := nodes[0].Peers().CountDown(ctx, "rabbit1")
	if down != 0 || members != 3 || err == nil || !strings.Contains(err.Error(), "calls of kind") {
		t.Errorf("CountDown(rabbit1) with the third proxy not answering: %d of %d, %v; want 0 of 3 and an error naming the call it cannot answer", down, members, err)
	}
}

func TestDeliveredAsksEveryOtherProxy(t *testing.T) {
	nodes := startCluster(t, 3)
	q := mirror.QueueID{VHost: "v", Name: "q"}
	delivered := map[int][]mirror.MessageID{1: {{1}, {2}}, 2: {{3}}}
	for i, ids := range delivered {
		nodes[i].Peers().HandleDelivered(func(id mirror.QueueID, epoch uint64) []mirror.MessageID {
			if id != q || epoch != 4 {
				return nil
			}
			return ids
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	want := []mirror.MessageID{{1}, {2}, {3}}
	testutil.Eventually(t, 10*time.Second, func() error {
		got, err := nodes[0].Peers().Delivered(ctx, q, 4)
		slices.SortFunc(got, func(a, b mirror.MessageID) int { return bytes.Compare(a[:], b[:]) })
		if err != nil || !slices.Equal(got, want) {
			return fmt.Errorf("Delivered: %v, %v; want %v", got, err, want)
		}
		return nil
	})

	nodes[2].peers.calls.Delete(deliveredCall)
	got, err := nodes[0].Peers().Delivered(ctx, q, 4)
	if len(got) != 2 || err == nil || !strings.Contains(err.Error(), "calls of kind") {
		t.Errorf("Delivered with the third proxy not answering: %v, %v; want the second's two and an error naming the call", got, err)
	}
}

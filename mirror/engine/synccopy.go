package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Syncs across proxies. In a sidecar cluster each proxy trims only its own
// broker's slave copies, so the proxy beside a slave that synchronises has
// no synchronised slave's trimmer to copy from. A copy from the master sees
// only the messages it holds ready: those clients hold unacknowledged are not
// copied, and once a client gives them back (its channel closes) or the master
// dies with them in flight, the new slave lacks messages that were confirmed.
// So the proxy beside the target asks the proxy beside a synchronised slave to
// copy that slave's copy into the target (controllink.Trimmer.CopyTo, which
// holds every message the master has not settled), keeps the target's trimmer
// expecting the copies, and asks after the copy until it is done. A copy
// outlasts one call between proxies, so it runs on the source's proxy as a job
// the asker names, and the source's proxy drops a job nobody asked after for
// copyAbandoned.

const (
	// copyAbandoned is how long a copy for another proxy goes on after that
	// proxy last asked after it: it went away, and nobody will take the result.
	copyAbandoned = 30 * time.Second
	// copyQuestionWait is how long a question about a copy waits for the copy
	// to end before it answers that it has not.
	copyQuestionWait = time.Second
	// copyQuestionTimeout bounds one question about a copy, its wait included.
	copyQuestionTimeout = 5 * time.Second
)

// errNoPeerSource says that no synchronised slave beside another proxy can be
// copied: the master alone holds the queue's messages.
var errNoPeerSource = errors.New("no synchronised slave beside another proxy")

// copiesForPeers are the copies this proxy runs for other proxies' syncs, by
// job name, behind a lock of their own, taken alone.
type copiesForPeers struct {
	mu   sync.Mutex
	jobs map[string]*copyForPeer
}

// copyForPeer is one copy of this node's slave copy into another node's.
type copyForPeer struct {
	cancel context.CancelFunc
	done   chan struct{}
	asked  atomic.Int64 // when the asker last asked, in Unix nanoseconds
	copied int          // set before done closes
	err    error        // set before done closes
}

func (c *copiesForPeers) add(name string, job *copyForPeer) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.jobs == nil {
		c.jobs = make(map[string]*copyForPeer)
	}
	if _, taken := c.jobs[name]; taken {
		return false
	}
	c.jobs[name] = job
	return true
}

func (c *copiesForPeers) get(name string) *copyForPeer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.jobs[name]
}

func (c *copiesForPeers) drop(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.jobs, name)
}

// copyLocal is Member.CopyLocal: it starts copying this node's synchronised
// slave copy of job.Queue into the copy on job.Target.
func (s *syncs) copyLocal(job mirror.CopyJob) error {
	node := s.roles.node
	m, ok := s.store.Get(job.Queue)
	if !ok {
		return fmt.Errorf("%s: %w", job.Queue, mirror.ErrQueueNotFound)
	}
	if i := m.SlaveIndex(node); i < 0 || !m.Slaves[i].Synchronised {
		return fmt.Errorf("%s has no synchronised slave on %s", job.Queue, node)
	}
	tr := s.trimmers.get(job.Queue, node)
	if tr == nil {
		return fmt.Errorf("the slave of %s on %s has no trimmer", job.Queue, node)
	}
	ctx, cancel := context.WithCancel(s.life.ctx)
	c := &copyForPeer{cancel: cancel, done: make(chan struct{})}
	c.asked.Store(time.Now().UnixNano())
	if !s.forPeers.add(job.ID, c) {
		cancel()
		return fmt.Errorf("a copy named %q runs already", job.ID)
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		defer cancel()
		c.copied, c.err = s.copyInto(ctx, m, tr, job)
		close(c.done)
	}()
	go func() {
		defer s.wg.Done()
		s.dropWhenAbandoned(job.ID, c)
	}()
	return nil
}

// copyInto copies the slave copy tr trims into job.Target's.
func (s *syncs) copyInto(ctx context.Context, m mirror.QueueMeta, tr *trimmerRun, job mirror.CopyJob) (int, error) {
	dst, err := s.operator.dial(job.Target, m.ID.VHost)
	if err != nil {
		return 0, err
	}
	defer dst.Close()
	copied, err := tr.t.CopyTo(ctx, dst, m.ID.Name, job.Batch)
	log := s.log.With("queue", m.ID.Name, "vhost", m.ID.VHost, "target", job.Target, "copied", copied)
	if err != nil {
		log.Warn("a copy for another proxy's sync failed", "err", err)
	} else {
		log.Info("copied a slave for another proxy's sync")
	}
	return copied, err
}

// dropWhenAbandoned forgets the job once its result was taken, and stops and
// forgets it once its asker has not asked for copyAbandoned.
func (s *syncs) dropWhenAbandoned(name string, c *copyForPeer) {
	tick := time.NewTicker(copyAbandoned / 4)
	defer tick.Stop()
	for {
		select {
		case <-s.life.ctx.Done():
			<-c.done // the copy's context ends with the engine's
			s.forPeers.drop(name)
			return
		case <-tick.C:
		}
		if s.forPeers.get(name) != c {
			return // its result was taken
		}
		if time.Since(time.Unix(0, c.asked.Load())) > copyAbandoned {
			c.cancel()
			<-c.done
			s.forPeers.drop(name)
			s.log.Warn("a copy for another proxy's sync was abandoned by it; stopped", "job", name)
			return
		}
	}
}

// copyState is Member.CopyStateLocal: how the job stands, waiting up to
// copyQuestionWait for it to end; cancel stops it first.
func (s *syncs) copyState(ctx context.Context, name string, cancel bool) (mirror.CopyState, error) {
	c := s.forPeers.get(name)
	if c == nil {
		return mirror.CopyState{}, fmt.Errorf("no copy named %q here: it ended, or this proxy restarted", name)
	}
	c.asked.Store(time.Now().UnixNano())
	if cancel {
		c.cancel()
	}
	wait := time.NewTimer(copyQuestionWait)
	defer wait.Stop()
	select {
	case <-c.done:
		s.forPeers.drop(name)
		st := mirror.CopyState{Done: true, Copied: c.copied}
		if c.err != nil {
			st.Err = c.err.Error()
		}
		return st, nil
	case <-wait.C:
	case <-ctx.Done():
	}
	return mirror.CopyState{}, nil
}

// copyFromPeer synchronises target, a slave beside this proxy, from a live
// synchronised slave beside another proxy, the oldest first, and returns
// the copy's source. It returns errNoPeerSource when there is none (or no
// cluster); when there are some but none could start a copy it fails, and
// the sync is tried again later: a copy from the master instead would leave
// out what clients hold.
func (s *syncs) copyFromPeer(ctx context.Context, m mirror.QueueMeta, target string, batch int) (copied int, source string, err error) {
	if s.peers == nil {
		return 0, "", errNoPeerSource
	}
	live := s.liveness.live()
	var sources []string
	for _, sl := range m.Slaves {
		if sl.Synchronised && sl.Backend != target && sl.Backend != s.roles.node && live.Has(sl.Backend) {
			sources = append(sources, sl.Backend)
		}
	}
	if len(sources) == 0 {
		return 0, "", errNoPeerSource
	}
	// A copy the last sync left half done is stale (it missed publishes):
	// empty it first, as before a copy from the master.
	if err := s.purgePartial(ctx, m.ID, []string{target}); err != nil {
		return 0, "", err
	}
	var refused []error
	for _, source := range sources {
		done, err := s.trimmers.expectCopies(m.ID, []string{target})
		if err != nil {
			return 0, "", err
		}
		copied, started, err := s.copyThroughPeer(ctx, m, source, target, batch)
		done()
		if started {
			return copied, source, err
		}
		refused = append(refused, err)
	}
	return 0, "", fmt.Errorf("no proxy beside a synchronised slave could copy it: %w", errors.Join(refused...))
}

// copyThroughPeer has the proxy beside source copy its slave copy into
// target's and waits for the end. started is false when the copy never
// began.
func (s *syncs) copyThroughPeer(ctx context.Context, m mirror.QueueMeta, source, target string, batch int) (copied int, started bool, err error) {
	job := mirror.CopyJob{ID: newCopyJobName(), Queue: m.ID, Target: target, Batch: batch}
	ask, cancel := context.WithTimeout(ctx, copyQuestionTimeout)
	err = s.peers.StartCopy(ask, source, job)
	cancel()
	if err != nil {
		return 0, false, err
	}
	for {
		ask, cancel := context.WithTimeout(ctx, copyQuestionTimeout)
		st, err := s.peers.CopyState(ask, source, job.ID, false)
		cancel()
		switch {
		case ctx.Err() != nil:
			stop, cancel := context.WithTimeout(context.Background(), copyQuestionWait)
			s.peers.CopyState(stop, source, job.ID, true)
			cancel()
			return 0, true, ctx.Err()
		case err != nil:
			return 0, true, err // the source's proxy went, and the copy with it
		case st.Done && st.Err != "":
			return st.Copied, true, fmt.Errorf("the copy by the proxy beside %s: %s", source, st.Err)
		case st.Done:
			return st.Copied, true, nil
		}
	}
}

// reachedByEveryProxy fails when another proxy counts target down: that
// proxy sends target none of its clients' publishes, so a slave recorded
// synchronised there would lack them. The sync is tried again later. The
// question waits up to timeout for the other proxies' answers.
func (s *syncs) reachedByEveryProxy(ctx context.Context, target string, timeout time.Duration) error {
	if s.peers == nil {
		return nil
	}
	ask, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	down, _, err := s.peers.CountDown(ask, target)
	switch {
	case down > 0:
		return fmt.Errorf("%d other proxies count %s down and send it none of their publishes", down, target)
	case err != nil:
		return fmt.Errorf("asking whether the other proxies reach %s: %w", target, err)
	}
	return nil
}

// newCopyJobName returns a name no other copy has.
func newCopyJobName() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

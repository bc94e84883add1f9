package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestDeletedCopiesStayDeleted: the proxy deletes every copy and only then
// calls Deleted; the trimmers that see their copies go meanwhile must not
// bring them back.
func TestDeletedCopiesStayDeleted(t *testing.T) {
	h := newHarness(t, "", nil)
	setPolicy(t, h.policies, "ha-all", "^deleted-", `{"ha-mode": "all"}`)
	ctx := context.Background()
	placed, err := h.engine.Place(ctx, mirror.QueueMeta{ID: queueID(uniqueName(t, "deleted"))}, "")
	if err != nil {
		t.Fatal(err)
	}
	declareCopies(t, placed)
	m, err := h.engine.Declared(ctx, placed)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range m.Backends() {
		deleteOn(b, m.ID.Name)
	}
	time.Sleep(time.Second) // the trimmers find their copies gone
	h.engine.Deleted(ctx, m.ID)
	time.Sleep(missingGrace + time.Second) // past the grace, and several engine rounds
	for _, b := range m.Backends() {
		if n := readyOn(t, b, m.ID.Name); n != -1 {
			t.Errorf("the deleted queue is back on %s", b)
		}
	}
}

// TestSlaveCopyGoneIsReplaced: a slave copy deleted on its broker, past
// the proxy, leaves the record and the policy adds it again.
func TestSlaveCopyGoneIsReplaced(t *testing.T) {
	h := newHarness(t, "", nil)
	setPolicy(t, h.policies, "ha-all", "^gone-", `{"ha-mode": "all", "ha-sync-mode": "automatic"}`)
	ctx := context.Background()
	placed, err := h.engine.Place(ctx, mirror.QueueMeta{ID: queueID(uniqueName(t, "gone"))}, "")
	if err != nil {
		t.Fatal(err)
	}
	declareCopies(t, placed)
	m, err := h.engine.Declared(ctx, placed)
	if err != nil {
		t.Fatal(err)
	}
	publishTo(t, m.ID.Name, 0, 20, m.Backends()...)
	victim := m.Slaves[0].Backend
	expectHeld(t, h.engine, m.ID, 20, victim)
	deleteOn(victim, m.ID.Name)
	// After the grace the slave leaves the record, and the policy adds it
	// again as the youngest slave, which automatic sync fills again.
	testutil.Eventually(t, 2*time.Minute, func() error {
		got, _ := h.store.Get(m.ID)
		if i := got.SlaveIndex(victim); i != len(got.Slaves)-1 || !got.Slaves[i].Synchronised {
			return fmt.Errorf("slaves %+v, want %s back as the youngest, synchronised", got.Slaves, victim)
		}
		if n := held(h.engine, m.ID, victim); n != 20 {
			return fmt.Errorf("the slave on %s holds %d messages, want 20 again", victim, n)
		}
		return nil
	})
}

package controllink

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// SyncMarkerHeader marks the message a copy puts behind a slave copy's
// messages; it never reaches a client (it is published to a slave, whose
// only consumer is the proxy's trimmer, which removes it on sight).
const SyncMarkerHeader = "x-amqp-mirror-sync-marker"

var errTrimmerClosed = errors.New("trimmer closed")

// CopyTo copies the messages of this trimmer's slave copy to queue on dst
// (a new slave's backend), for the new slave's synchronisation, and returns
// how many it copied. The slave copy keeps serving meanwhile: the trimmer
// goes on trimming, and the queue is never blocked, unlike RabbitMQ's own
// synchronisation.
//
// How it knows it has copied everything: the new slave already receives
// every new publish, so what it lacks is what the queue held when the copy
// began. The copy gives back what the trimmer held (closing its channel, so
// the messages return to their places), puts a marker message behind them,
// and consumes again; every message before the marker is copied unless the
// master already settled it, and the marker ends the copy. Messages that
// arrive both ways are kept once by the new slave's trimmer.
//
// The copy is confirmed by dst's broker in batches of batch messages, at
// most two batches unconfirmed at a time; when CopyTo returns nil every
// copied message was confirmed, and the new slave
// holds everything the master held when the copy began that the master
// still holds.
//
// What it does not keep: the copies are republished with the proxy's
// account, so a message carrying a user_id needs that account to have
// RabbitMQ's impersonator tag (the broker refuses it otherwise, and the copy
// fails). A per-message expiration starts again on the copy. The marker
// counts against the slave's x-max-length while it is there.
func (t *Trimmer) CopyTo(ctx context.Context, dst *amqp.Connection, queue string, batch int) (int, error) {
	if batch <= 0 {
		batch = 4096
	}
	job := &copyJob{ctx: ctx, dst: dst, queue: queue, batch: batch, result: make(chan copyResult, 1)}
	if _, err := rand.Read(job.marker[:]); err != nil {
		return 0, fmt.Errorf("copy of queue %q: %w", t.queue, err)
	}
	select {
	case t.copies <- job:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-t.done:
		return 0, errTrimmerClosed
	}
	// The run goroutine always answers an accepted job, also when it closes.
	res := <-job.result
	if res.err != nil {
		return res.copied, fmt.Errorf("copy of queue %q to %q: %w", t.queue, queue, res.err)
	}
	return res.copied, nil
}

// copyJob is one copy in progress, owned by the trimmer's run goroutine.
type copyJob struct {
	ctx    context.Context
	dst    *amqp.Connection
	queue  string
	batch  int
	marker mirror.MessageID
	result chan copyResult

	ch        *amqp.Channel // on dst, in confirm mode
	unsettled []*amqp.DeferredConfirmation
	copied    int
}

type copyResult struct {
	copied int
	err    error
}

// begin opens the publishing channel on dst and puts the marker behind the
// messages of the source queue, on src.
func (j *copyJob) begin(src *amqp.Connection, sourceQueue string) error {
	ch, err := j.dst.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel on the destination: %w", err)
	}
	j.ch = ch
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode on the destination: %w", err)
	}
	markerCh, err := src.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel for the marker: %w", err)
	}
	defer markerCh.Close()
	if err := markerCh.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode for the marker: %w", err)
	}
	confirmation, err := markerCh.PublishWithDeferredConfirmWithContext(j.ctx, "", sourceQueue, false, false, amqp.Publishing{
		Headers:      amqp.Table{mirror.IdentityHeader: string(j.marker[:]), SyncMarkerHeader: true},
		DeliveryMode: amqp.Transient,
	})
	if err != nil {
		return fmt.Errorf("publishing the marker: %w", err)
	}
	if ok, err := confirmation.WaitContext(j.ctx); err != nil || !ok {
		return fmt.Errorf("the source broker did not take the marker (nacked: %v, err: %v)", !ok, err)
	}
	return nil
}

// send copies one message to the destination queue.
func (j *copyJob) send(d amqp.Delivery) error {
	confirmation, err := j.ch.PublishWithDeferredConfirmWithContext(j.ctx, "", j.queue, false, false, amqp.Publishing{
		Headers:         d.Headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      d.Expiration,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		UserId:          d.UserId,
		AppId:           d.AppId,
		Body:            d.Body,
	})
	if err != nil {
		return fmt.Errorf("copying a message: %w", err)
	}
	j.copied++
	j.unsettled = append(j.unsettled, confirmation)
	// Two batches in flight: the older one's confirms are awaited once the
	// newer one is sent, so that the destination's broker has a batch to
	// take in while the older one's confirms come back, instead of idling
	// between batches.
	if len(j.unsettled) >= 2*j.batch {
		return j.awaitConfirms(j.batch)
	}
	return nil
}

// awaitConfirms waits until the destination confirmed the oldest n copies
// not confirmed yet.
func (j *copyJob) awaitConfirms(n int) error {
	for _, c := range j.unsettled[:n] {
		ok, err := c.WaitContext(j.ctx)
		if err != nil {
			return fmt.Errorf("waiting for the destination's confirms: %w", err)
		}
		if !ok {
			return errors.New("the destination broker nacked a copy")
		}
	}
	j.unsettled = append(j.unsettled[:0], j.unsettled[n:]...)
	return nil
}

// finish ends a copy whose marker arrived: every copy sent is confirmed.
func (j *copyJob) finish() error { return j.awaitConfirms(len(j.unsettled)) }

// end answers CopyTo and releases the destination channel.
func (j *copyJob) end(err error) {
	if j.ch != nil {
		j.ch.Close()
	}
	j.result <- copyResult{copied: j.copied, err: err}
}

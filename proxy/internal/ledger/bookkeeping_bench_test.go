package ledger

import "testing"

// BenchmarkDeliveryTags is the per-delivery cost of the tag map with a
// prefetch window of 100: one delivery in, the oldest acked.
func BenchmarkDeliveryTags(b *testing.B) {
	var d DeliveryTags
	var acks []BackendAck
	for i := uint64(1); i <= 100; i++ {
		d.Deliver(Delivered{BackendTag: i}, true)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := uint64(101); i < uint64(b.N)+101; i++ {
		d.Deliver(Delivered{BackendTag: i}, true)
		acks, _, _ = d.Settle(i-100, false, acks[:0], false, nil, nil)
	}
}

// BenchmarkPublisherConfirms is the per-publish cost of confirm tracking
// with 100 publishes in flight, confirmed one at a time in order.
func BenchmarkPublisherConfirms(b *testing.B) {
	var p PublisherConfirms
	var out []ClientConfirm
	for i := 0; i < 100; i++ {
		p.Publish(0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := uint64(1); i <= uint64(b.N); i++ {
		p.Publish(0)
		out = p.Confirm(0, i, false, false, out[:0], nil)
	}
}

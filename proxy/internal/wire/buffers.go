package wire

import "sync"

// Socket buffers exist only while they hold data. A socket's reader takes one
// when bytes arrive and gives it back when it has parsed them all; a writer
// takes one when the first frame is queued and gives it back when the socket
// took the last byte. An idle connection holds none, so thousands of idle
// connections cost their goroutines and little else, and what a burst of
// traffic needed goes back to the pools, which the garbage collector empties
// within two cycles when nobody takes from them.
//
// Buffers come in size classes, and both sides start small and grow only
// when the traffic needs it: most reads and writes of a quiet connection are
// a heartbeat or a few small methods, and thousands of connections waking at
// once (a storm of opens or closes) must not each take 64 KiB. A busy socket
// works with 64 KiB (a burst of small frames per system call), and a frame
// larger than that (a 128 KiB body frame) gets a class of its own size
// without making every later buffer that large.

// bufferClasses are the pooled sizes, ascending; 128 KiB holds a whole
// frame at the default frame_max (131072 bytes, overhead included).
var bufferClasses = [...]int{4 << 10, 16 << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 20}

// minBufferSize is the first class: what a reader or writer takes first.
const minBufferSize = 4 << 10

// readBufferSize is the most a reader asks of one read system call: a
// reader whose reads fill its buffer moves up a class, up to this.
const readBufferSize = 64 << 10

// writeBufferSize is the most a writer queues before the producer that adds
// more waits for the socket: with the frame being written, it bounds the
// memory a slow peer can pin per socket.
const writeBufferSize = 64 << 10

// buffer is a pooled byte slice; b always has its class's full length.
type buffer struct{ b []byte }

var bufferPools [len(bufferClasses)]sync.Pool

// getBuffer returns a buffer of at least n bytes: pooled up to the largest
// class, allocated beyond it (frames larger than 1 MiB are rare enough).
func getBuffer(n int) *buffer {
	for i, size := range bufferClasses {
		if n <= size {
			if b, ok := bufferPools[i].Get().(*buffer); ok {
				return b
			}
			return &buffer{b: make([]byte, size)}
		}
	}
	return &buffer{b: make([]byte, n)}
}

// nextClass is the class above size, or size when it is the largest.
func nextClass(size int) int {
	for _, c := range bufferClasses {
		if c > size {
			return c
		}
	}
	return size
}

// putBuffer gives b back to its pool. b must not be used afterwards.
func putBuffer(b *buffer) {
	for i, size := range bufferClasses {
		if len(b.b) == size {
			bufferPools[i].Put(b)
			return
		}
	}
}

// Package rawsock reads and writes non-blocking sockets with raw system
// calls, without the runtime's entersyscall/exitsyscall.
//
// The saving is not the few instructions of the bookkeeping: when every P
// was idle, entersyscall wakes the runtime's monitor thread (sysmon), which
// then polls with 20 µs sleeps until the process is idle again. A proxy
// turns idle and busy thousands of times a second, and profiles of it under
// load showed a tenth of its CPU in those wake-ups and sleeps. A
// non-blocking socket call never blocks (it returns EAGAIN instead), which
// is what RawSyscall requires; the runtime's network poller does the
// waiting, through syscall.RawConn.
package rawsock

import (
	"io"
	"syscall"
	"unsafe"
)

// Read is read(2) on the non-blocking socket fd.
func Read(fd uintptr, p []byte) (int, error) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// Write is write(2) on the non-blocking socket fd.
func Write(fd uintptr, p []byte) (int, error) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// WriteUntilFull writes p to the non-blocking socket fd until all of it is
// written or the socket is full. It returns what is left to write and why
// it stopped: nil when all is written, syscall.EAGAIN when the socket is
// full, or the error of a failed write.
func WriteUntilFull(fd uintptr, p []byte) ([]byte, error) {
	for len(p) > 0 {
		n, err := Write(fd, p)
		switch {
		case err == syscall.EINTR:
		case err != nil:
			return p, err
		case n == 0:
			return p, io.ErrShortWrite
		default:
			p = p[n:]
		}
	}
	return p, nil
}

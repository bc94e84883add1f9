package wire

import "syscall"

// ErrTooManyFiles is the accept error that passes once connections close.
var ErrTooManyFiles = syscall.EMFILE

package proxy

import "syscall"

// errTooManyFiles is the accept error that passes once connections close.
var errTooManyFiles = syscall.EMFILE

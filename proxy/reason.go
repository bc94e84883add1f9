package proxy

// CloseReason says why a client connection ended. Every close carries one, so
// that logs and metrics can tell a client that quit from a backend that died.
type CloseReason uint8

const (
	ReasonUnknown CloseReason = iota
	// ReasonClientClosed: the client sent connection.close and the backend confirmed it.
	ReasonClientClosed
	// ReasonClientGone: the client's socket closed or failed without connection.close.
	ReasonClientGone
	// ReasonBackendClosed: the backend sent connection.close (an error or an operator action).
	ReasonBackendClosed
	// ReasonBackendLost: the backend's socket closed or failed, or it stopped answering.
	ReasonBackendLost
	// ReasonBackendUnavailable: no backend connection could be opened for the client.
	ReasonBackendUnavailable
	// ReasonHandshakeFailed: the client sent a wrong protocol header, or the
	// handshake did not finish in time, or the backend refused it (credentials, vhost).
	ReasonHandshakeFailed
	// ReasonProtocolError: the client broke the protocol (malformed or oversized frame).
	ReasonProtocolError
	// ReasonMissedHeartbeats: the client sent nothing for one and a half heartbeat intervals.
	ReasonMissedHeartbeats
	// ReasonShutdown: the proxy is shutting down.
	ReasonShutdown
	// ReasonPaused: the proxy paused, cut off from the majority of its
	// cluster (pause_minority).
	ReasonPaused
)

var reasonNames = [...]string{
	ReasonUnknown:            "unknown",
	ReasonClientClosed:       "client_closed",
	ReasonClientGone:         "client_gone",
	ReasonBackendClosed:      "backend_closed",
	ReasonBackendLost:        "backend_lost",
	ReasonBackendUnavailable: "backend_unavailable",
	ReasonHandshakeFailed:    "handshake_failed",
	ReasonProtocolError:      "protocol_error",
	ReasonMissedHeartbeats:   "missed_heartbeats",
	ReasonShutdown:           "shutdown",
	ReasonPaused:             "paused",
}

func (r CloseReason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

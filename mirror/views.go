package mirror

import "time"

// The rows of the read-only views (ctl list_connections, list_consumers,
// the admin status page's failovers). The proxy or the engine of one proxy
// makes them; in a sidecar cluster they travel between proxies (package
// cluster), so they are plain values with JSON names, those of rabbitmqctl
// where it has one.

// Failover is one promotion after a master's backend was lost, as recorded
// by the proxy that wrote it to the metadata log.
type Failover struct {
	Queue QueueID `json:"queue"`
	// From is the lost master's backend, To the promoted slave's.
	From string `json:"from"`
	To   string `json:"to"`
	// Cause is "failure" or "shutdown" (Cause.String).
	Cause string `json:"cause"`
	// Epoch is the queue's epoch after the promotion.
	Epoch uint64 `json:"epoch"`
	// Synchronised tells whether the promoted slave was synchronised; when
	// it was not, what only the old master held was lost.
	Synchronised bool `json:"synchronised"`
	// DetectedAt is when the proxy saw the master's backend lost, and
	// PromotedAt when the promotion was written; Duration is the time
	// between the two.
	DetectedAt time.Time     `json:"detected_at"`
	PromotedAt time.Time     `json:"promoted_at"`
	Duration   time.Duration `json:"duration_ns"`
	// Node is the proxy that wrote the promotion (its config `node`), ""
	// for a proxy in drop-in mode.
	Node string `json:"node"`
}

// Connection is one client connection of a proxy, as `ctl
// list_connections` shows it: one that finished its handshake.
type Connection struct {
	// Node is the proxy the client is connected to (its config `node`), ""
	// for a proxy in drop-in mode.
	Node string `json:"node"`
	// Name is RabbitMQ's name of a connection: "peer -> local".
	Name     string `json:"name"`
	User     string `json:"user"`
	VHost    string `json:"vhost"`
	PeerHost string `json:"peer_host"`
	PeerPort int    `json:"peer_port"`
	Host     string `json:"host"`
	Port     int    `json:"port"`
	// State is "running", or "closing" while a close handshake runs.
	State    string `json:"state"`
	Channels int    `json:"channels"`
	SSL      bool   `json:"ssl"`
	Protocol string `json:"protocol"`
	// ConnectedAt is when the handshake finished.
	ConnectedAt time.Time `json:"connected_at"`
	FrameMax    uint32    `json:"frame_max"`
	ChannelMax  uint16    `json:"channel_max"`
	// Timeout is the heartbeat interval agreed with the client, in
	// seconds; 0 when heartbeats are off.
	Timeout int `json:"timeout"`
	// Backend is the home backend: the one the handshake opened, or
	// another that took channel 0 over when it was lost. Backends are all
	// those the connection has a link to now, in the config's order.
	Backend  string   `json:"backend"`
	Backends []string `json:"backends"`
}

// Consumer is one consumer of a client channel, as `ctl list_consumers`
// shows it.
type Consumer struct {
	Node  string `json:"node"`
	VHost string `json:"vhost"`
	// Queue is the queue as the client named it in basic.consume.
	Queue string `json:"queue_name"`
	// Connection is the connection's name (Connection.Name), Channel the
	// channel's number on it.
	Connection  string `json:"connection"`
	Channel     uint16 `json:"channel"`
	Tag         string `json:"consumer_tag"`
	AckRequired bool   `json:"ack_required"`
	Exclusive   bool   `json:"exclusive"`
	// PrefetchCount is the channel's per-consumer basic.qos when the
	// consumer started; 0 for none.
	PrefetchCount int `json:"prefetch_count"`
	// Active is false while the consumer waits for its queue's new master
	// after its master's backend was lost.
	Active    bool           `json:"active"`
	Arguments map[string]any `json:"arguments"`
	// Backend is the backend the consumer consumes on: its queue's master.
	Backend string `json:"backend"`
}

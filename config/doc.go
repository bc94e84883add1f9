// Package config turns amqp-mirror's YAML file into a validated, typed,
// immutable *Config, matches policies to queues and exchanges the way
// RabbitMQ 3.x does, keeps runtime policies (set_policy) in a store, and
// reloads the file.
//
// # The file
//
//	node: rabbit1                 # backend this proxy sits beside (sidecar); optional
//	listen:
//	  amqp: 0.0.0.0:5672          # AMQP listener
//	  amqps: ""                   # AMQPS listener; 0.0.0.0:5671 when tls is set
//	  admin: 127.0.0.1:15680      # admin API (ctl), /metrics, /healthz, /readyz; "" disables
//	  tls: {cert: "", key: ""}    # both set: AMQPS enabled
//	  admin_tls: {cert: "", key: "", ca: ""}  # cert and key set: the admin API is HTTPS only; ca: what ctl trusts
//	backends:                     # at least one; names unique; amqp:// or amqps://
//	  - {name: rabbit1, url: "amqp://mirror:secret@127.0.0.1:5681/"}
//	  - name: rabbit2
//	    url: "amqps://mirror:secret@10.0.0.2/"
//	    tls:                      # amqps:// only; every key optional; files relative to this file
//	      ca: ca.pem              # the broker's CA; "" = the system's roots
//	      cert: client.pem        # client certificate, with key (mode 0600): both or neither
//	      key: client.key
//	      server_name: ""         # the name the broker's certificate must carry; "" = the URL's host
//	cluster:                      # the sidecar cluster; bind "" = this proxy runs alone
//	  bind: 10.0.0.1:7946         # serf gossip (UDP+TCP); needs node
//	  join: [10.0.0.2:7946]       # other proxies' gossip addresses
//	  advertise: ""               # gossip address others dial (default bind; required for 0.0.0.0)
//	  raft_bind: ""               # raft (metadata log, TCP); "" = bind's port + 1
//	  bootstrap_expect: 3         # a new cluster's size, the same on every proxy; 0 = join one
//	  encrypt: ""                 # base64 gossip key (amqp-mirror keygen); "" = unencrypted
//	  encrypt_file: ""            # or a file (mode 0600) holding that key
//	  tls: {ca: "", cert: "", key: "", identity: member.amqp-mirror}  # all three files: mutual TLS on raft
//	  require_encryption: false   # true: refuse to start beyond loopback without encrypt and tls
//	queue_master_locator: min-masters   # min-masters | client-local | random
//	failover_grace: 2s            # silence before an unresponsive backend counts as down
//	state_dir: ./state            # metadata log (raft/, runtime policies), admin.token; relative to this file
//	admin_token: ""               # "" = generated into state_dir/admin.token (0600)
//	log: {level: info, format: text}    # debug|info|warn|error ; text|json
//	metrics: {per_queue: false}   # true: /metrics series per queue
//	handshake_timeout: 10s        # limit for a client's AMQP handshake
//	shutdown_timeout: 30s         # limit for a graceful shutdown
//	heartbeat: 60s                # backend-leg heartbeat when a client turns its own off; whole seconds
//	frame_max: 131072             # proposed to clients, 4096 .. 4294967295
//	channel_max: 2047             # proposed to clients, 1 .. 65535
//	policies:                     # like rabbitmqctl set_policy
//	  - {name: ha, vhost: /, pattern: "^queue_", apply-to: queues, priority: 0,
//	     definition: {ha-mode: exactly, ha-params: 2, ha-sync-mode: automatic}}
//	operator_policies: []         # like set_operator_policy (fewer keys allowed)
//
// ../amqp-mirror.example.yaml is the same with comments (docs/configuration.md shows it), and a
// test keeps the two and the loader in step.
//
// Every key is checked: unknown keys at any depth (policy definitions
// included), wrong types, ports outside 1-65535 and values RabbitMQ would
// refuse are all reported together, one per key, each as a *FieldError
// naming the file, the key path and what was expected and found. A URL is
// never shown with its password (RedactURL), and a YAML syntax error names
// its line counted from 1 (yamlSyntaxError).
//
// # Overrides
//
// Precedence: flags > environment > file > Default(). Every scalar key
// (everything except backends, policies and operator_policies) can be
// overridden by the environment variable EnvName(key) — AMQP_MIRROR_ then
// the key upper-cased with dots as underscores (AMQP_MIRROR_LISTEN_AMQP,
// AMQP_MIRROR_FAILOVER_GRACE; cluster.join takes a comma-separated list) —
// and by a flag named by its key path (--listen.amqp) that RegisterFlags
// defines; Load applies only flags that were Changed.
//
// # Reload
//
// A Watcher re-reads the file on Reload (SIGHUP in main.go) or when the
// file changes. Policies, operator policies and log.level apply live; any
// other changed key is refused with a log line naming it ("listen.amqp
// changed: restart required") and keeps its running value, while the
// policy part of the same reload still applies. An invalid file is refused
// as a whole and the running configuration stays.
package config

package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Config is the validated content of the file, after environment and flag
// overrides. It is a snapshot: nothing changes it after Load returns.
type Config struct {
	Path               string // the file it was loaded from; "" when none
	Node               string
	Listen             Listen
	Backends           []Backend
	Cluster            Cluster
	QueueMasterLocator Locator
	FailoverGrace      time.Duration
	StateDir           string
	AdminToken         string
	Policies           []Policy
	OperatorPolicies   []Policy
	Log                Log
	Metrics            Metrics
	HandshakeTimeout   time.Duration
	ShutdownTimeout    time.Duration
	Heartbeat          time.Duration
	FrameMax           int
	ChannelMax         int
}

// Listen holds the listener addresses.
type Listen struct {
	AMQP  string
	AMQPS string // defaults to 0.0.0.0:5671 when TLS is configured
	Admin string // "" disables the admin API
	TLS   TLS
	// AdminTLS, when set, serves the admin API over HTTPS.
	AdminTLS AdminTLS
}

// TLS enables the AMQPS listener when both files are set.
type TLS struct {
	Cert string
	Key  string
}

// Enabled reports whether both certificate and key are configured.
func (t TLS) Enabled() bool { return t.Cert != "" && t.Key != "" }

// AdminTLS serves the admin API over HTTPS when Cert and Key are set. CA
// is for ctl, which reads the proxy's file: the authority that signed
// Cert, when it is a private one (empty: the system's roots).
type AdminTLS struct {
	Cert, Key, CA string
}

// Enabled reports whether the admin API is served over HTTPS.
func (t AdminTLS) Enabled() bool { return t.Cert != "" && t.Key != "" }

// Backend is one broker.
type Backend struct {
	Name string
	URL  string // amqp:// or amqps://, the proxy's own account for mirroring work
	// TLS is how an amqps:// URL's connections are verified and which
	// client certificate they present; zero for amqp://.
	TLS BackendTLS
}

// Cluster configures the sidecar cluster of proxies: serf gossip for
// membership and a raft log for the queue metadata. Bind "" means the
// proxy runs alone (drop-in mode).
type Cluster struct {
	Bind string   // serf gossip address (UDP and TCP)
	Join []string // serf addresses of other proxies
	// Advertise is the gossip address other proxies reach this one at;
	// "" means Bind (which then must not be 0.0.0.0).
	Advertise string
	// RaftBind is the raft transport's address (TCP); "" means Bind's host
	// with Bind's port + 1.
	RaftBind string
	// BootstrapExpect is the size of a new cluster: once that many proxies
	// with the same value see each other, the log is formed with all of
	// them as voters. 0 joins a cluster that exists.
	BootstrapExpect int
	// Encrypt is the base64 AES-256 key that encrypts gossip: the first
	// key of the keyring in state_dir/raft/keyring.json, which `ctl keys`
	// rotates. A secret: never shown.
	Encrypt string
	// EncryptFile names a file (mode 0600) that holds Encrypt instead,
	// for keys that a deployment hands out as files (Docker and
	// Kubernetes secrets).
	EncryptFile string
	// TLS, when set, puts the raft port (the metadata log, forwarded
	// writes, settles between proxies) under mutual TLS.
	TLS ClusterTLS
	// RequireEncryption refuses to start a proxy whose gossip or raft
	// address is not loopback while that traffic is not protected
	// (cluster.encrypt, cluster.tls): the warning it gets otherwise becomes
	// an error.
	RequireEncryption bool
}

// ClusterTLS is the raft port's mutual TLS: every proxy presents Cert and
// accepts only peers whose certificate CA signed and whose subject
// alternative names include Identity.
type ClusterTLS struct {
	CA, Cert, Key string
	Identity      string
}

// GossipKey returns the gossip key from Encrypt or EncryptFile; "" when
// neither is set.
func (cl Cluster) GossipKey() (string, error) {
	if cl.EncryptFile == "" {
		return cl.Encrypt, nil
	}
	return ReadSecretFile(cl.EncryptFile, "the gossip key's file")
}

// DefaultClusterIdentity is the name every member's certificate carries
// unless cluster.tls.identity says otherwise.
const DefaultClusterIdentity = "member.amqp-mirror"

// Enabled reports whether the raft port runs mutual TLS.
func (t ClusterTLS) Enabled() bool { return t.CA != "" || t.Cert != "" || t.Key != "" }

// RaftAddresses returns the raft bind address and the address other
// proxies dial for it: cluster.raft_bind, or Bind's host and port + 1;
// the host other proxies dial is Advertise's, or the bind host.
func (c Cluster) RaftAddresses() (bind, advertise string) {
	bind = c.RaftBind
	if bind == "" {
		host, port, err := net.SplitHostPort(c.Bind)
		if n, convErr := strconv.Atoi(port); err == nil && convErr == nil {
			bind = net.JoinHostPort(host, strconv.Itoa(n+1))
		}
	}
	host, port, err := net.SplitHostPort(bind)
	if err != nil {
		return bind, ""
	}
	if c.Advertise != "" {
		if advHost, _, err := net.SplitHostPort(c.Advertise); err == nil {
			host = advHost
		}
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		return bind, ""
	}
	return bind, net.JoinHostPort(host, port)
}

// Log configures the proxy's slog handler.
type Log struct {
	Level  string // debug | info | warn | error
	Format string // text | json
}

// Metrics configures what /metrics exposes beyond the fixed set.
type Metrics struct {
	// PerQueue adds series labelled by vhost and queue: one set per
	// queue, so many queues make many series.
	PerQueue bool
}

// Default returns the configuration used for keys the file does not set. It
// has no backends: a default backend at 127.0.0.1:5672 would collide with
// the proxy's own default listener, so Load requires at least one backend.
func Default() *Config {
	return &Config{
		Listen:             Listen{AMQP: "0.0.0.0:5672", Admin: "127.0.0.1:15680"},
		Cluster:            Cluster{TLS: ClusterTLS{Identity: DefaultClusterIdentity}},
		QueueMasterLocator: LocatorMinMasters,
		FailoverGrace:      2 * time.Second,
		StateDir:           "./state",
		Log:                Log{Level: "info", Format: "text"},
		HandshakeTimeout:   10 * time.Second,
		ShutdownTimeout:    30 * time.Second,
		Heartbeat:          60 * time.Second,
		FrameMax:           131072,
		ChannelMax:         2047,
	}
}

// EnvPrefix prefixes the environment variable of every scalar key:
// listen.amqp is AMQP_MIRROR_LISTEN_AMQP, failover_grace AMQP_MIRROR_FAILOVER_GRACE.
const EnvPrefix = "AMQP_MIRROR"

// EnvName returns the environment variable that overrides key.
func EnvName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

// Load reads the file at path (YAML; "" means no file), applies environment
// overrides (EnvName), then the flags of flags that were Changed (flag names
// are key paths: --listen.amqp; see RegisterFlags), and validates the
// result. Every problem is reported in one errors.Join, each naming its
// source, key path, what was expected and what was found.
func Load(path string, flags *pflag.FlagSet) (*Config, error) {
	c := Default()
	c.Path = path
	source := "config file " + path
	if path == "" {
		source = "config (no file)"
	}
	var errs []error
	if path != "" {
		v := viper.New()
		v.SetConfigFile(path)
		// The file is YAML whatever its name (amqp-mirror.conf, a ConfigMap key):
		// viper would otherwise pick the parser by extension, or refuse the file.
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("%s: %w", source, yamlSyntaxError(err))
		}
		p := &problems{source: source}
		decodeTop(p, c, v.AllSettings())
		errs = append(errs, p.errs...)
		resolvePaths(c, filepath.Dir(path))
	}
	errs = append(errs, applyEnv(c)...)
	errs = append(errs, applyFlags(c, flags)...)
	p := &problems{source: source}
	crossCheck(p, c)
	errs = append(errs, p.errs...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// resolvePaths makes the file's relative paths relative to the file itself,
// so that serve and ctl, run from any directory, find the same state_dir
// (and admin token) and TLS files. Environment and flag values stay
// relative to the working directory, as a shell user expects.
func resolvePaths(c *Config, dir string) {
	for _, p := range []*string{&c.StateDir, &c.Listen.TLS.Cert, &c.Listen.TLS.Key,
		&c.Listen.AdminTLS.Cert, &c.Listen.AdminTLS.Key, &c.Listen.AdminTLS.CA,
		&c.Cluster.TLS.CA, &c.Cluster.TLS.Cert, &c.Cluster.TLS.Key, &c.Cluster.EncryptFile} {
		*p = resolvePath(dir, *p)
	}
	for i := range c.Backends {
		c.Backends[i].TLS.resolve(dir)
	}
}

// resolvePath is path relative to dir, unless it is empty or absolute.
func resolvePath(dir, path string) string {
	if path == "" || filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(dir, path)
}

var topKeys = []string{
	"node", "listen", "backends", "cluster", "queue_master_locator", "failover_grace",
	"state_dir", "admin_token", "policies", "operator_policies", "log", "metrics",
	"handshake_timeout", "shutdown_timeout", "heartbeat", "frame_max", "channel_max",
}

func decodeTop(p *problems, c *Config, m map[string]any) {
	p.unknownKeys("", m, topKeys, "top-level")
	for _, f := range scalarFields {
		if v, ok := lookup(p, m, f.key); ok {
			if problem := f.set(c, v, false); problem != "" {
				p.add(f.key, "%s", problem)
			}
		}
	}
	if v, ok := m["backends"]; ok {
		c.Backends = decodeBackends(p, v)
	}
	if v, ok := m["policies"]; ok {
		c.Policies = decodePolicies(p, "policies", v, false)
	}
	if v, ok := m["operator_policies"]; ok {
		c.OperatorPolicies = decodePolicies(p, "operator_policies", v, true)
	}
}

// lookup walks a dotted key through nested mappings, reporting a section
// that is not a mapping and unknown keys inside known sections.
func lookup(p *problems, m map[string]any, key string) (any, bool) {
	parts := strings.Split(key, ".")
	cur := m
	for i, part := range parts[:len(parts)-1] {
		v, ok := cur[part]
		if !ok || v == nil {
			return nil, false
		}
		next, ok := v.(map[string]any)
		path := strings.Join(parts[:i+1], ".")
		if !ok {
			if p.once(path) {
				p.add(path, "expected a mapping with keys %v, found %s", sectionKeys(path), describe(v))
			}
			return nil, false
		}
		if p.once(path) {
			p.unknownKeys(path, next, sectionKeys(path), path)
		}
		cur = next
	}
	v, ok := cur[parts[len(parts)-1]]
	return v, ok
}

func sectionKeys(section string) []string {
	var keys []string
	seen := map[string]bool{}
	for _, f := range scalarFields {
		rest, ok := strings.CutPrefix(f.key, section+".")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, ".")
		if !seen[name] {
			seen[name] = true
			keys = append(keys, name)
		}
	}
	sort.Strings(keys)
	return keys
}

// field is one scalar key. set stores v and returns "" or, when v is
// unacceptable, the problem: "expected X, found Y". text says v is a
// string from an environment variable or flag and may be parsed.
type field struct {
	key string
	set func(c *Config, v any, text bool) string
}

// expected is the problem "expected want, found v".
func expected(want string, v any, text bool) string {
	return "expected " + want + ", found " + found(v, text)
}

// found renders v for a problem. An environment variable or a flag is
// always text, so saying "(string)" of it would only confuse: --frame_max
// 100 was found "100" (string). Text is shown quoted, as given.
func found(v any, text bool) string {
	if s, ok := v.(string); ok && text {
		return strconv.Quote(s)
	}
	return describe(v)
}

var scalarFields = []field{
	stringField("node", false, func(c *Config) *string { return &c.Node }),
	addressField("listen.amqp", false, func(c *Config) *string { return &c.Listen.AMQP }),
	addressField("listen.amqps", true, func(c *Config) *string { return &c.Listen.AMQPS }),
	addressField("listen.admin", true, func(c *Config) *string { return &c.Listen.Admin }),
	stringField("listen.tls.cert", true, func(c *Config) *string { return &c.Listen.TLS.Cert }),
	stringField("listen.tls.key", true, func(c *Config) *string { return &c.Listen.TLS.Key }),
	stringField("listen.admin_tls.cert", true, func(c *Config) *string { return &c.Listen.AdminTLS.Cert }),
	stringField("listen.admin_tls.key", true, func(c *Config) *string { return &c.Listen.AdminTLS.Key }),
	stringField("listen.admin_tls.ca", true, func(c *Config) *string { return &c.Listen.AdminTLS.CA }),
	addressField("cluster.bind", true, func(c *Config) *string { return &c.Cluster.Bind }),
	listField("cluster.join", func(c *Config) *[]string { return &c.Cluster.Join }),
	addressField("cluster.advertise", true, func(c *Config) *string { return &c.Cluster.Advertise }),
	addressField("cluster.raft_bind", true, func(c *Config) *string { return &c.Cluster.RaftBind }),
	intField("cluster.bootstrap_expect", 0, 99, func(c *Config) *int { return &c.Cluster.BootstrapExpect }),
	secretField("cluster.encrypt", true, func(c *Config) *string { return &c.Cluster.Encrypt }),
	stringField("cluster.encrypt_file", true, func(c *Config) *string { return &c.Cluster.EncryptFile }),
	stringField("cluster.tls.ca", true, func(c *Config) *string { return &c.Cluster.TLS.CA }),
	stringField("cluster.tls.cert", true, func(c *Config) *string { return &c.Cluster.TLS.Cert }),
	stringField("cluster.tls.key", true, func(c *Config) *string { return &c.Cluster.TLS.Key }),
	stringField("cluster.tls.identity", false, func(c *Config) *string { return &c.Cluster.TLS.Identity }),
	boolField("cluster.require_encryption", func(c *Config) *bool { return &c.Cluster.RequireEncryption }),
	{"queue_master_locator", func(c *Config, v any, text bool) string {
		s, _ := v.(string)
		l, ok := ParseLocator(s)
		if !ok {
			return expected(expectedOneOf(locatorNames), v, text)
		}
		c.QueueMasterLocator = l
		return ""
	}},
	durationField("failover_grace", time.Millisecond, func(c *Config) *time.Duration { return &c.FailoverGrace }),
	stringField("state_dir", false, func(c *Config) *string { return &c.StateDir }),
	secretField("admin_token", true, func(c *Config) *string { return &c.AdminToken }),
	enumField("log.level", []string{"debug", "info", "warn", "error"}, func(c *Config) *string { return &c.Log.Level }),
	enumField("log.format", []string{"text", "json"}, func(c *Config) *string { return &c.Log.Format }),
	boolField("metrics.per_queue", func(c *Config) *bool { return &c.Metrics.PerQueue }),
	durationField("handshake_timeout", time.Millisecond, func(c *Config) *time.Duration { return &c.HandshakeTimeout }),
	durationField("shutdown_timeout", 0, func(c *Config) *time.Duration { return &c.ShutdownTimeout }),
	{"heartbeat", func(c *Config, v any, text bool) string {
		const want = "a duration of whole seconds from 0s (off) to 65535s, such as 60s"
		d, ok := toDuration(v)
		if !ok || d < 0 || d%time.Second != 0 || d > 65535*time.Second {
			return expected(want, v, text)
		}
		c.Heartbeat = d
		return ""
	}},
	intField("frame_max", 4096, math.MaxUint32, func(c *Config) *int { return &c.FrameMax }),
	intField("channel_max", 1, 65535, func(c *Config) *int { return &c.ChannelMax }),
}

func stringField(key string, emptyOK bool, ptr func(*Config) *string) field {
	return field{key, func(c *Config, v any, text bool) string {
		s, ok := v.(string)
		if !ok || (!emptyOK && s == "") {
			return expected("a non-empty string", v, text)
		}
		*ptr(c) = s
		return ""
	}}
}

// boolField is true or false; the environment and flags give it as text.
func boolField(key string, ptr func(*Config) *bool) field {
	return field{key, func(c *Config, v any, text bool) string {
		b, ok := v.(bool)
		if s, isText := v.(string); isText && text {
			b, ok = s == "true", s == "true" || s == "false"
		}
		if !ok {
			return expected("true or false", v, text)
		}
		*ptr(c) = b
		return ""
	}}
}

// secretField is a string key that holds a secret (admin_token). Its
// problems name the key and the type found but never the value: a token
// written as a number is still the token, and an error message ends up in
// logs, terminals and bug reports.
func secretField(key string, emptyOK bool, ptr func(*Config) *string) field {
	return field{key, func(c *Config, v any, text bool) string {
		s, ok := v.(string)
		if !ok || (!emptyOK && s == "") {
			return "expected a non-empty string, found " + secretKind(key, v)
		}
		*ptr(c) = s
		return ""
	}}
}

// addressField is a listen address. The port must be a number from 1 to
// 65535: 0 would make the system pick a port that neither clients nor ctl
// could know, and a service name hides the number from the operator.
func addressField(key string, emptyOK bool, ptr func(*Config) *string) field {
	return field{key, func(c *Config, v any, text bool) string {
		const want = "an address host:port such as 0.0.0.0:5672"
		s, ok := v.(string)
		if ok && s == "" && emptyOK {
			*ptr(c) = s
			return ""
		}
		if !ok {
			return expected(want, v, text)
		}
		_, port, err := net.SplitHostPort(s)
		if err != nil || port == "" {
			return expected(want, v, text)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("expected %s with a port from 1 to 65535, found %s", want, found(v, text))
		}
		*ptr(c) = s
		return ""
	}}
}

func enumField(key string, values []string, ptr func(*Config) *string) field {
	return field{key, func(c *Config, v any, text bool) string {
		s, _ := v.(string)
		if !contains(values, s) {
			return expected("one of "+strings.Join(values, ", "), v, text)
		}
		*ptr(c) = s
		return ""
	}}
}

func listField(key string, ptr func(*Config) *[]string) field {
	return field{key, func(c *Config, v any, text bool) string {
		const want = "a list of host:port strings"
		var out []string
		switch x := v.(type) {
		case []string:
			out = x
		case string:
			if !text {
				return expected(want, v, text)
			}
			for _, s := range strings.Split(x, ",") {
				if s = strings.TrimSpace(s); s != "" {
					out = append(out, s)
				}
			}
		case []any:
			for _, item := range x {
				s, ok := item.(string)
				if !ok || s == "" {
					return expected(want, v, text)
				}
				out = append(out, s)
			}
		default:
			return expected(want, v, text)
		}
		*ptr(c) = out
		return ""
	}}
}

func toDuration(v any) (time.Duration, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	return d, err == nil
}

func durationField(key string, min time.Duration, ptr func(*Config) *time.Duration) field {
	return field{key, func(c *Config, v any, text bool) string {
		want := "a duration such as 2s or 500ms"
		if min > 0 {
			want = "a positive duration such as 2s or 500ms"
		}
		d, ok := toDuration(v)
		if !ok || d < min {
			return expected(want, v, text)
		}
		*ptr(c) = d
		return ""
	}}
}

// intField is an integer key. Text from the environment or a flag is
// parsed first, so that --frame_max 100 is judged as the number 100.
func intField(key string, min, max int64, ptr func(*Config) *int) field {
	return field{key, func(c *Config, v any, text bool) string {
		want := fmt.Sprintf("an integer from %d to %d", min, max)
		n, ok := asInt(v)
		if s, isString := v.(string); isString && text {
			parsed, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			n, ok = parsed, err == nil
		}
		switch {
		case !ok:
			return expected(want, v, text)
		case n < min:
			return fmt.Sprintf("expected %s, found %d, below the minimum %d", want, n, min)
		case n > max:
			return fmt.Sprintf("expected %s, found %d, above the maximum %d", want, n, max)
		}
		*ptr(c) = int(n)
		return ""
	}}
}

func applyEnv(c *Config) []error {
	ev := viper.New()
	ev.SetEnvPrefix(EnvPrefix)
	ev.SetEnvKeyReplacer(strings.NewReplacer(".", "_", "-", "_"))
	ev.AutomaticEnv()
	var errs []error
	for _, f := range scalarFields {
		if !ev.IsSet(f.key) {
			continue
		}
		s := ev.GetString(f.key)
		if problem := f.set(c, s, true); problem != "" {
			errs = append(errs, &FieldError{Source: "environment " + EnvName(f.key), Path: f.key, Message: problem})
		}
	}
	return errs
}

func applyFlags(c *Config, flags *pflag.FlagSet) []error {
	if flags == nil {
		return nil
	}
	var errs []error
	for _, f := range scalarFields {
		fl := flags.Lookup(f.key)
		if fl == nil || !fl.Changed {
			continue
		}
		var v any = fl.Value.String()
		if sv, ok := fl.Value.(pflag.SliceValue); ok {
			v = sv.GetSlice()
		}
		if problem := f.set(c, v, true); problem != "" {
			errs = append(errs, &FieldError{Source: "flag --" + f.key, Path: f.key, Message: problem})
		}
	}
	return errs
}

// RegisterFlags defines one flag per scalar key, named by its key path
// (--listen.amqp, --failover_grace, --cluster.join a,b), with the defaults of
// Default. Load applies only the flags that were Changed, so an unset flag
// never hides the file or the environment. Number and duration flags keep
// their text until Load validates it, so that a wrong value gets the same
// message as in the file (expected an integer from 4096 ..., found 100,
// below the minimum 4096) rather than pflag's parse error.
func RegisterFlags(fs *pflag.FlagSet) {
	d := Default()
	fs.String("node", d.Node, "the backend this proxy sits beside (sidecar mode); clients are served by it when it is up (default: the first backend up)")
	fs.String("listen.amqp", d.Listen.AMQP, "AMQP listener address")
	fs.String("listen.amqps", d.Listen.AMQPS, "AMQPS listener address (default 0.0.0.0:5671 when TLS is set)")
	fs.String("listen.admin", d.Listen.Admin, "admin API and /metrics address; empty disables it")
	fs.String("listen.tls.cert", "", "TLS certificate file for AMQPS")
	fs.String("listen.tls.key", "", "TLS key file for AMQPS")
	fs.String("listen.admin_tls.cert", "", "certificate file of the admin API: set with listen.admin_tls.key, the admin API and /metrics are served over HTTPS only")
	fs.String("listen.admin_tls.key", "", "key file of the admin API's certificate, mode 0600 (a key group or others may read is refused)")
	fs.String("listen.admin_tls.ca", "", "CA certificate file ctl trusts for the admin API when a private CA signed it (default: the system's roots); serve does not read it")
	fs.String("cluster.bind", d.Cluster.Bind, "serf gossip bind address of the sidecar cluster; empty runs alone (needs node)")
	fs.StringSlice("cluster.join", nil, "serf addresses of other proxies to join")
	fs.String("cluster.advertise", "", "gossip address other proxies reach this one at (default: cluster.bind)")
	fs.String("cluster.raft_bind", "", "raft address of the metadata log (default: cluster.bind's port + 1)")
	textFlag(fs, "cluster.bootstrap_expect", "int", "0", "size of a new cluster, the same on every proxy; 0 joins one that exists")
	fs.String("cluster.encrypt", "", "base64 32-byte key encrypting gossip (amqp-mirror keygen prints one); prefer the file or AMQP_MIRROR_CLUSTER_ENCRYPT: flags show in ps")
	fs.String("cluster.encrypt_file", "", "file (mode 0600) holding cluster.encrypt's key, instead of the key itself")
	fs.String("cluster.tls.ca", "", "CA certificate file that signs every member's certificate (mutual TLS on the raft port; amqp-mirror tls ca makes one)")
	fs.String("cluster.tls.cert", "", "this proxy's member certificate file (amqp-mirror tls cert)")
	fs.String("cluster.tls.key", "", "this proxy's member key file, mode 0600")
	fs.String("cluster.tls.identity", d.Cluster.TLS.Identity, "DNS name every member's certificate must carry; peers without it are refused")
	textFlag(fs, "cluster.require_encryption", "bool", "false", "true refuses to start when gossip or raft listens beyond loopback without cluster.encrypt or cluster.tls")
	fs.String("queue_master_locator", d.QueueMasterLocator.String(), "where a new queue's master goes unless its x-queue-master-locator or policy says: min-masters|client-local|random")
	textFlag(fs, "failover_grace", "duration", d.FailoverGrace.String(), "how long a backend may leave the proxy's probe unanswered before it counts as down and its queues fail over (a reset or refused connection counts at once)")
	fs.String("state_dir", d.StateDir, "directory for runtime policies, metadata and the admin token")
	fs.String("admin_token", "", "admin API token; empty generates one into state_dir/admin.token")
	fs.String("log.level", d.Log.Level, "debug|info|warn|error (reloads live)")
	fs.String("log.format", d.Log.Format, "text|json")
	textFlag(fs, "metrics.per_queue", "bool", "false", "true adds /metrics series per queue (labels vhost and queue): as many as there are queues")
	textFlag(fs, "handshake_timeout", "duration", d.HandshakeTimeout.String(), "limit for a client's AMQP handshake")
	textFlag(fs, "shutdown_timeout", "duration", d.ShutdownTimeout.String(), "limit for a graceful shutdown")
	textFlag(fs, "heartbeat", "duration", d.Heartbeat.String(), "heartbeat kept on the backend connection when a client turns heartbeats off (clients are offered the broker's own), whole seconds")
	textFlag(fs, "frame_max", "int", strconv.Itoa(d.FrameMax), "largest frame proposed to clients, 4096 to 4294967295")
	textFlag(fs, "channel_max", "int", strconv.Itoa(d.ChannelMax), "most channels per client connection, 1 to 65535")
}

// NotUsedYet marks the keys that are accepted and validated but have no
// effect in this build, in flag help and docs/configuration.md alike.
const NotUsedYet = "(accepted and validated; the sidecar cluster is not wired into serve yet)"

// textValue is a flag that keeps its text for Load to validate; typ is
// the type shown in the help (int, duration).
type textValue struct{ text, typ string }

func (v *textValue) String() string     { return v.text }
func (v *textValue) Set(s string) error { v.text = s; return nil }
func (v *textValue) Type() string       { return v.typ }

func textFlag(fs *pflag.FlagSet, name, typ, def, usage string) {
	fs.Var(&textValue{text: def, typ: typ}, name, usage)
}

func decodeBackends(p *problems, v any) []Backend {
	list, ok := v.([]any)
	if !ok {
		p.add("backends", "expected a list of {name, url} mappings, found %s", describe(v))
		return nil
	}
	var out []Backend
	for i, item := range list {
		path := index("backends", i)
		m, ok := item.(map[string]any)
		if !ok {
			p.add(path, "expected a mapping with keys name and url (and tls for amqps://), found %s", describe(item))
			continue
		}
		p.unknownKeys(path, m, []string{"name", "url", "tls"}, "backend")
		var b Backend
		if s, ok := m["name"].(string); ok && s != "" {
			b.Name = s
		} else {
			p.add(join(path, "name"), "expected a non-empty string, found %s", describe(m["name"]))
		}
		switch s, ok := m["url"].(string); {
		case !ok || s == "":
			p.add(join(path, "url"), "expected %s, found %s", wantBackendURL, describe(m["url"]))
		default:
			b.URL = s
			if problem := checkBackendURL(s); problem != "" {
				p.add(join(path, "url"), "%s", problem)
			}
		}
		if v, ok := m["tls"]; ok {
			b.TLS = decodeBackendTLS(p, join(path, "tls"), v)
			checkBackendTLS(p, path, b)
		}
		out = append(out, b)
	}
	return out
}

// crossCheck validates what involves several keys, on the final values.
func crossCheck(p *problems, c *Config) {
	if len(c.Backends) == 0 {
		p.add("backends", "at least one backend is required")
	}
	names := map[string]int{}
	for i, b := range c.Backends {
		path := index("backends", i)
		if b.Name != "" {
			if j, dup := names[b.Name]; dup {
				p.add(join(path, "name"), "expected a unique backend name, found %q again (already backends[%d])", b.Name, j)
			} else {
				names[b.Name] = i
			}
		}
	}
	if c.Node != "" {
		if _, ok := names[c.Node]; !ok {
			p.add("node", "expected the name of a backend (%s), found %q", strings.Join(backendNames(c), ", "), c.Node)
		}
	}
	checkCluster(p, c)
	tls := c.Listen.TLS
	if (tls.Cert == "") != (tls.Key == "") {
		p.add("listen.tls", "expected both cert and key (or neither), found only one of them")
	}
	if tls.Enabled() && c.Listen.AMQPS == "" {
		c.Listen.AMQPS = "0.0.0.0:5671"
	}
	if !tls.Enabled() && c.Listen.AMQPS != "" {
		p.add("listen.amqps", "expected listen.tls.cert and listen.tls.key to be set for an AMQPS listener, found them empty")
	}
	checkAdminTLS(p, c.Listen)
	checkPolicyNames(p, "policies", c.Policies)
	checkPolicyNames(p, "operator_policies", c.OperatorPolicies)
}

// checkAdminTLS validates listen.admin_tls: a certificate without its key
// (or the other way round) would quietly serve plain HTTP, and a CA
// without either is trust in a certificate that is never served.
func checkAdminTLS(p *problems, l Listen) {
	t := l.AdminTLS
	switch {
	case (t.Cert == "") != (t.Key == ""):
		set, missing := "cert", "key"
		if t.Key != "" {
			set, missing = "key", "cert"
		}
		p.add("listen.admin_tls", "expected both cert and key (or neither), found only %s: set listen.admin_tls.%s too", set, missing)
	case t.CA != "" && !t.Enabled():
		p.add("listen.admin_tls.ca", "expected listen.admin_tls.cert and listen.admin_tls.key to be set too (the CA is what ctl trusts for them), found them empty")
	case t.Enabled() && l.Admin == "":
		p.add("listen.admin_tls", "expected listen.admin to be set for the admin API to serve HTTPS, found it empty (the admin API is disabled)")
	}
}

// checkCluster validates the cluster keys together: a sidecar proxy names
// its node (the raft and serf name), its raft port follows from the gossip
// one, and other proxies must be able to dial both.
func checkCluster(p *problems, c *Config) {
	cl := c.Cluster
	if cl.Bind == "" {
		for _, k := range []struct {
			key string
			set bool
		}{
			{"cluster.join", len(cl.Join) > 0}, {"cluster.advertise", cl.Advertise != ""},
			{"cluster.raft_bind", cl.RaftBind != ""}, {"cluster.bootstrap_expect", cl.BootstrapExpect != 0},
			{"cluster.encrypt", cl.Encrypt != ""}, {"cluster.encrypt_file", cl.EncryptFile != ""}, {"cluster.tls", cl.TLS.Enabled()},
			{"cluster.require_encryption", cl.RequireEncryption},
		} {
			if k.set {
				p.add(k.key, "expected cluster.bind to be set too (the sidecar cluster), found it empty")
			}
		}
		return
	}
	if c.Node == "" {
		p.add("node", "expected the name of the backend beside this proxy when cluster.bind is set (it names the proxy in the cluster), found it empty")
	}
	for i, addr := range cl.Join {
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
			p.add(index("cluster.join", i), "expected an address host:port such as 10.0.0.2:7946, found %q", addr)
		}
	}
	host, port, _ := net.SplitHostPort(cl.Bind)
	if ip := net.ParseIP(host); cl.Advertise == "" && (ip == nil || ip.IsUnspecified()) {
		p.add("cluster.advertise", "expected an IP address:port other proxies reach this one at, since cluster.bind %s is not one, found it empty", cl.Bind)
	}
	if cl.RaftBind == "" {
		if n, _ := strconv.Atoi(port); n >= 65535 {
			p.add("cluster.raft_bind", "expected an address, since cluster.bind's port + 1 (%d) is no port, found it empty", n+1)
		}
	} else if cl.RaftBind == cl.Bind {
		p.add("cluster.raft_bind", "expected an address other than cluster.bind (raft needs a TCP port of its own), found %s", cl.RaftBind)
	}
	keyName, gossipKey := "cluster.encrypt", cl.Encrypt
	if cl.EncryptFile != "" {
		keyName = "cluster.encrypt_file"
		if cl.Encrypt != "" {
			p.add(keyName, "expected cluster.encrypt or cluster.encrypt_file, found both")
		}
		var err error
		if gossipKey, err = cl.GossipKey(); err != nil {
			p.add(keyName, "%v", err)
		}
	}
	if gossipKey != "" {
		// The key itself is never shown: only what is wrong with it.
		if key, err := base64.StdEncoding.DecodeString(gossipKey); err != nil {
			p.add(keyName, "expected a base64 32-byte key (amqp-mirror keygen prints one), found text that is not base64 (not shown: a secret)")
		} else if len(key) != 32 {
			p.add(keyName, "expected a base64 32-byte key (amqp-mirror keygen prints one), found a %d-byte key (not shown: a secret)", len(key))
		}
	}
	if t := cl.TLS; t.Enabled() && (t.CA == "" || t.Cert == "" || t.Key == "") {
		p.add("cluster.tls", "expected ca, cert and key together (or none), found only %s", strings.Join(setNames(map[string]bool{"ca": t.CA != "", "cert": t.Cert != "", "key": t.Key != ""}), " and "))
	}
	if cl.Advertise != "" {
		if advHost, _, _ := net.SplitHostPort(cl.Advertise); net.ParseIP(advHost) == nil || net.ParseIP(advHost).IsUnspecified() {
			p.add("cluster.advertise", "expected an IP address:port other proxies can dial, found %q", cl.Advertise)
		}
	}
}

// setNames lists the names marked true, sorted.
func setNames(set map[string]bool) []string {
	var out []string
	for name, ok := range set {
		if ok {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func backendNames(c *Config) []string {
	var out []string
	for _, b := range c.Backends {
		if b.Name != "" && !contains(out, b.Name) {
			out = append(out, b.Name)
		}
	}
	return out
}

func checkPolicyNames(p *problems, path string, policies []Policy) {
	seen := map[[2]string]int{}
	for i, pol := range policies {
		if pol.Name == "" {
			continue
		}
		k := [2]string{pol.VHost, pol.Name}
		if j, dup := seen[k]; dup {
			p.add(join(index(path, i), "name"), "expected a unique policy name in vhost %q, found %q again (already %s[%d])", pol.VHost, pol.Name, path, j)
			continue
		}
		seen[k] = i
	}
}

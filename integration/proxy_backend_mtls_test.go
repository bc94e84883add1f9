package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
)

// mtlsFiles are the PEM files of a broker that wants a client certificate
// of its own authority: the authority, the broker's certificate for
// 127.0.0.1, the proxy's client certificate, and another authority's
// certificate, which did not sign the broker's.
type mtlsFiles struct {
	ca, otherCA           string
	serverCert, serverKey string
	clientCert, clientKey string
}

func newMTLSFiles(t testing.TB, dir string) mtlsFiles {
	t.Helper()
	ca, _, err := pki.NewCA("amqp-mirror test brokers CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := pki.NewCA("an unrelated CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := mtlsFiles{ca: filepath.Join(dir, "ca.pem"), otherCA: filepath.Join(dir, "other-ca.pem")}
	cliWriteFile(t, f.ca, string(ca.CertPEM))
	cliWriteFile(t, f.otherCA, string(other.CertPEM))
	issue := func(name string, req pki.Request) (string, string) {
		t.Helper()
		certPEM, keyPEM, err := ca.Issue(req)
		if err != nil {
			t.Fatal(err)
		}
		// The key is written 0600: the broker runs as this user (root on the test
		// machines), and the proxy refuses a key others may read.
		cert, key := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		if err := pki.WriteFiles(cert, certPEM, key, keyPEM); err != nil {
			t.Fatal(err)
		}
		return cert, key
	}
	f.serverCert, f.serverKey = issue("broker", pki.Request{CommonName: "broker", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usage: pki.Server, ValidFor: time.Hour})
	f.clientCert, f.clientKey = issue("proxy", pki.Request{CommonName: "amqp-mirror", Usage: pki.Client, ValidFor: time.Hour})
	return f
}

// startMTLSNode starts a RabbitMQ node of its own whose TLS listener wants a
// client certificate of f's authority (verify_peer, fail_if_no_peer_cert),
// and returns it with its TLS port. Its plain listener stays for the
// harness's readiness check; the proxy is given only the TLS port.
func startMTLSNode(t testing.TB, dir string, f mtlsFiles) (*localbroker.Node, int) {
	t.Helper()
	tlsPort := freePort(t)
	ctx := testContext(t, testutil.StartTimeout)
	nodes, err := localbroker.Start(ctx, localbroker.Options{
		Names:   []string{"mtls"},
		BaseDir: filepath.Join(dir, "nodes"),
		ExtraConfig: fmt.Sprintf("listeners.ssl.default = 127.0.0.1:%d\n"+
			"ssl_options.cacertfile = %s\nssl_options.certfile = %s\nssl_options.keyfile = %s\n"+
			"ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n",
			tlsPort, f.ca, f.serverCert, f.serverKey),
	})
	if err != nil {
		t.Fatalf("start a node whose TLS listener wants a client certificate: %v", err)
	}
	t.Cleanup(func() { nodes.Close() })
	return nodes.Nodes()[0], tlsPort
}

// mtlsBackendYAML is the backends entry of the TLS node, with tls (a flow
// mapping) given.
func mtlsBackendYAML(tlsPort int, tls string) string {
	return fmt.Sprintf("  - name: mtls\n    url: \"amqps://guest:guest@127.0.0.1:%d/\"\n    tls: %s\n", tlsPort, tls)
}

// serveMTLS writes a config with the given backends entries (and extra
// top-level YAML) and serves it.
func serveMTLS(t testing.TB, backends, extra string) *cliProxy {
	t.Helper()
	dir := t.TempDir()
	yaml := fmt.Sprintf("listen:\n  amqp: %s\n  admin: %s\nstate_dir: %s\nshutdown_timeout: 5s\nfailover_grace: 10s\nlog:\n  format: text\nbackends:\n%s%s",
		cliFreeAddr(t), cliFreeAddr(t), filepath.Join(dir, "state"), backends, extra)
	path := filepath.Join(dir, "amqp-mirror.yaml")
	cliWriteFile(t, path, yaml)
	return newCLI(t).serve(t, path, nil)
}

// TestBackendTLSClientCertificate: a broker with a private CA that wants a
// client certificate (RabbitMQ's ssl_options.verify = verify_peer,
// fail_if_no_peer_cert = true) is a backend of a mirroring proxy through
// backends[].tls, for the clients' links and the proxy's own connections
// alike: an automatic sync copies to it, publishes fan out to it, and the
// proxy trims its copy after the acks. Without the client certificate, or
// with an authority that did not sign the broker's certificate, the
// broker is refused with the reason, and the proxy keeps running.
func TestBackendTLSClientCertificate(t *testing.T) {
	dir := t.TempDir()
	files := newMTLSFiles(t, dir)
	tlsNode, tlsPort := startMTLSNode(t, dir, files)
	withCertificate := fmt.Sprintf("{ca: %q, cert: %q, key: %q}", files.ca, files.clientCert, files.clientKey)

	t.Run("mirrored to it", func(t *testing.T) {
		plain := cluster.Nodes()[0]
		// The master on the plain node (client-local, the proxy's node), so that the
		// copy on the TLS node is a slave: synchronised, fed and trimmed by the proxy.
		p := serveMTLS(t,
			fmt.Sprintf("  - name: %s\n    url: %q\n", plain.Name, plain.URL())+mtlsBackendYAML(tlsPort, withCertificate),
			fmt.Sprintf("node: %s\nqueue_master_locator: client-local\n", plain.Name))
		queue := queueName(t)
		conn, err := amqp.Dial(p.url("guest", "guest"))
		if err != nil {
			t.Fatalf("dial the proxy: %v", err)
		}
		t.Cleanup(func() { conn.Close() })
		declareMirrored(t, p, conn, queue, true, nil)
		message := func(i int) amqp.Publishing {
			return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: fmt.Appendf(nil, "over mutual TLS %d", i)}
		}

		publishConfirmed(t, conn, queue, 20, message)
		setPolicy(t, p, "mtls-all", exactly(queue), `{"ha-mode":"all","ha-sync-mode":"automatic"}`)
		// The automatic sync runs on a connection of the proxy's own.
		awaitCopies(t, queue, map[*localbroker.Node]int{plain: 20, tlsNode: 20})
		// Through the client's link to the TLS node.
		publishConfirmed(t, conn, queue, 10, func(i int) amqp.Publishing { return message(20 + i) })
		awaitCopies(t, queue, map[*localbroker.Node]int{plain: 30, tlsNode: 30})
		requireClientCertificateConnections(t, tlsNode)

		deliveries := consumeAcked(t, conn, queue, 30)
		for i, d := range deliveries {
			if want := fmt.Sprintf("over mutual TLS %d", i); string(d.Body) != want {
				t.Fatalf("delivery %d: got %q, want %q", i, d.Body, want)
			}
		}
		// The proxy's trimmer of the slave on the TLS node.
		awaitCopies(t, queue, map[*localbroker.Node]int{plain: 0, tlsNode: 0})
	})

	refusals := []struct {
		name string
		tls  string
		want string // in the client's refusal and the proxy's log
	}{
		{"without the client certificate", fmt.Sprintf("{ca: %q}", files.ca), "certificate required"},
		{"with another CA", fmt.Sprintf("{ca: %q, cert: %q, key: %q}", files.otherCA, files.clientCert, files.clientKey), "certificate signed by unknown authority"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			p := serveMTLS(t, mtlsBackendYAML(tlsPort, tc.tls), "")
			record := p.awaitRecord(t, "the watcher's refusal", map[string]string{"msg": "backend unreachable; retrying", "backend": "mtls"})
			if got := record.text("err"); !strings.Contains(got, tc.want) {
				t.Errorf("the proxy's log says %q, want it to say %q", got, tc.want)
			}
			_, err := amqp.Dial(p.url("guest", "guest"))
			code, reason := amqpErrorDetails(err)
			if code != amqp.ConnectionForced || !strings.Contains(reason, "backend mtls unavailable") || !strings.Contains(reason, tc.want) {
				t.Errorf("a client of the proxy got %d %q, want 320 naming the backend and %q", code, reason, tc.want)
			}
			if p.exited() {
				t.Fatalf("the proxy exited: %v", p.command.ProcessState)
			}
		})
	}
}

// TestBackendTLSRefusesALooseKey: a client key that others may read stops
// the start, with the backend's name and key path.
func TestBackendTLSRefusesALooseKey(t *testing.T) {
	dir := t.TempDir()
	files := newMTLSFiles(t, dir)
	if err := os.Chmod(files.clientKey, 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "amqp-mirror.yaml")
	cliWriteFile(t, path, fmt.Sprintf("listen:\n  amqp: %s\n  admin: \"\"\nstate_dir: %s\nbackends:\n%s",
		cliFreeAddr(t), filepath.Join(dir, "state"),
		mtlsBackendYAML(freePort(t), fmt.Sprintf("{ca: %q, cert: %q, key: %q}", files.ca, files.clientCert, files.clientKey))))
	result := newCLI(t).run(t, nil, "serve", "--config", path)
	if result.code == 0 {
		t.Fatalf("serve with a loose key exited 0, want a refusal; stderr:\n%s", result.stderr)
	}
	for _, want := range []string{"backend mtls: backends[0].tls.key: ", "permissions 0644 for " + files.clientKey + " are too open"} {
		if !strings.Contains(result.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, result.stderr)
		}
	}
}

// awaitCopies waits until each node holds want[node] messages (ready and
// unacknowledged) of queue.
func awaitCopies(t testing.TB, queue string, want map[*localbroker.Node]int) {
	t.Helper()
	awaitCondition(t, time.Minute, func() error {
		var errs []error
		for n, count := range want {
			held, err := nodeMessages(t.Context(), n)
			if err != nil {
				return err
			}
			if got, ok := held[queue]; !ok || got != count {
				errs = append(errs, fmt.Errorf("%s holds %d messages of %s (a copy: %v), want %d", n.Name, got, queue, ok, count))
			}
		}
		return errors.Join(errs...)
	})
}

// requireClientCertificateConnections checks, on the node itself, that the
// proxy's connections to it run TLS with the proxy's client certificate:
// the watcher's (the proxy's own account) and the client's link.
func requireClientCertificateConnections(t testing.TB, n *localbroker.Node) {
	t.Helper()
	output, err := n.Ctl(testContext(t, 30*time.Second), "--formatter", "json", "list_connections", "ssl", "peer_cert_subject")
	if err != nil {
		t.Fatal(err)
	}
	var connections []struct {
		SSL             bool   `json:"ssl"`
		PeerCertSubject string `json:"peer_cert_subject"`
	}
	if err := json.Unmarshal(output, &connections); err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v\n%s", err, output)
	}
	if len(connections) < 2 {
		t.Errorf("%s has %d connections, want the proxy's own and the client's link at least:\n%s", n.Name, len(connections), output)
	}
	for _, c := range connections {
		if !c.SSL || !strings.Contains(c.PeerCertSubject, "CN=amqp-mirror") {
			t.Errorf("a connection to %s without TLS or the client certificate: %s", n.Name, output)
			break
		}
	}
}

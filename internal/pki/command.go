package pki

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// File names in a directory that the tls command manages: the authority
// as ca.pem and ca-key.pem, each certificate as NAME.pem and NAME-key.pem.
const (
	CAFileName    = "ca.pem"
	CAKeyFileName = "ca-key.pem"
)

// DefaultValidity is how long the tls command's certificates stay valid
// unless --days says otherwise: ten years for the authority, about two
// (825 days, the most browsers accept) for the others.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultCertValidity = 825 * 24 * time.Hour
)

const commandUsage = `Usage:
  amqp-mirror tls ca [--dir DIR]                       create a private certificate authority
  amqp-mirror tls cert member NAME [--dir DIR]         a sidecar's raft certificate (cluster.tls)
  amqp-mirror tls cert server NAME --dns|--ip ... [--dir DIR]
                                                       the admin API's certificate (listen.admin_tls)
  amqp-mirror tls cert client NAME [--dir DIR]         a client certificate for backends (backends[].tls)

The authority is DIR/ca.pem with its key DIR/ca-key.pem; each certificate is
DIR/NAME.pem with its key DIR/NAME-key.pem. Keys are written with mode 0600 and
no file is ever overwritten. Keep ca-key.pem off the proxies' machines: only
ca.pem and each proxy's own certificate and key go there.

A member certificate names the cluster's identity (--identity, default
member.amqp-mirror) as a DNS name: every proxy's raft port accepts only peers
whose certificate the authority signed AND names that identity, so another
certificate of the same authority (a server or client certificate) is refused.
`

// Main runs `amqp-mirror tls` with args (without "tls") and returns the
// exit code: 0 done, 1 a file could not be read or written, 2 a usage
// error.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, commandUsage)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, commandUsage)
		return 0
	case "ca":
		return runCA(args[1:], stdout, stderr)
	case "cert":
		return runCert(args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "amqp-mirror tls: unknown command %q\n\n%s", args[0], commandUsage)
		return 2
	}
}

func newFlags(name string, stdout io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() { fmt.Fprintf(stdout, "%s\nFlags:\n%s", commandUsage, fs.FlagUsages()) }
	return fs
}

// parse parses args; ok false means return code.
func parse(fs *pflag.FlagSet, args []string, stderr io.Writer) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0, false
		}
		fmt.Fprintf(stderr, "amqp-mirror %s: %v\n", fs.Name(), err)
		return 2, false
	}
	return 0, true
}

func runCA(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("tls ca", stdout)
	dir := fs.String("dir", ".", "directory to write ca.pem and ca-key.pem into")
	name := fs.String("name", "amqp-mirror CA", "the authority's common name")
	days := fs.Int("days", int(DefaultCAValidity/(24*time.Hour)), "days the authority stays valid")
	if code, ok := parse(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 || *days < 1 {
		fmt.Fprintf(stderr, "amqp-mirror tls ca: takes no arguments and --days of at least 1, found %q and %d\n", fs.Args(), *days)
		return 2
	}
	certFile, keyFile := filepath.Join(*dir, CAFileName), filepath.Join(*dir, CAKeyFileName)
	if err := CreateCA(*dir, *name, time.Duration(*days)*24*time.Hour); err != nil {
		fmt.Fprintf(stderr, "amqp-mirror tls ca: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s (give it to every proxy) and %s (mode 0600: keep it away from the proxies)\n", certFile, keyFile)
	return 0
}

// CreateCA writes a new authority into dir as ca.pem and ca-key.pem,
// creating dir (0700) if it does not exist.
func CreateCA(dir, name string, validFor time.Duration) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, keyPEM, err := NewCA(name, validFor)
	if err != nil {
		return err
	}
	return WriteFiles(filepath.Join(dir, CAFileName), ca.CertPEM, filepath.Join(dir, CAKeyFileName), keyPEM)
}

func runCert(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("tls cert", stdout)
	dir := fs.String("dir", ".", "directory holding ca.pem and ca-key.pem, and where NAME.pem and NAME-key.pem are written")
	identity := fs.String("identity", config.DefaultClusterIdentity, "member: the identity every member's certificate names (cluster.tls.identity)")
	dnsNames := fs.StringSlice("dns", nil, "server: DNS names clients reach it by (comma-separated or repeated)")
	ips := fs.StringSlice("ip", nil, "server: IP addresses clients reach it at")
	days := fs.Int("days", int(DefaultCertValidity/(24*time.Hour)), "days the certificate stays valid")
	if code, ok := parse(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() != 2 || *days < 1 {
		fmt.Fprintf(stderr, "amqp-mirror tls cert: expected a kind (member, server or client) and a NAME, and --days of at least 1\n\n%s", commandUsage)
		return 2
	}
	req := CertRequest{Kind: fs.Arg(0), Name: fs.Arg(1), Identity: *identity, DNSNames: *dnsNames, ValidFor: time.Duration(*days) * 24 * time.Hour}
	for _, s := range *ips {
		ip := net.ParseIP(s)
		if ip == nil {
			fmt.Fprintf(stderr, "amqp-mirror tls cert: --ip: expected an IP address, found %q\n", s)
			return 2
		}
		req.IPs = append(req.IPs, ip)
	}
	files, err := CreateCert(*dir, req)
	if err != nil {
		fmt.Fprintf(stderr, "amqp-mirror tls cert: %v\n", err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s and %s (mode 0600)\n", files.Cert, files.Key)
	return 0
}

// errUsage marks a CertRequest that is wrong in itself, not a file
// problem.
var errUsage = errors.New("usage")

// CertRequest is one certificate of the tls command.
type CertRequest struct {
	Kind     string // member, server or client
	Name     string // the common name, and the files' base name
	Identity string // member: the cluster's identity, as a DNS name
	DNSNames []string
	IPs      []net.IP
	ValidFor time.Duration
}

// CreateCert issues req with the authority in dir and writes it beside
// it as NAME.pem and NAME-key.pem. The returned Files name the authority's
// certificate too, ready for Mutual or a client's RootCAs.
func CreateCert(dir string, req CertRequest) (Files, error) {
	if req.Name == "" || strings.ContainsAny(req.Name, `/\`) || strings.HasPrefix(req.Name, ".") || req.Name == "ca" {
		return Files{}, fmt.Errorf("%w: NAME %q must be a plain file name, not ca", errUsage, req.Name)
	}
	issue := Request{CommonName: req.Name, ValidFor: req.ValidFor}
	switch req.Kind {
	case "member":
		if req.Identity == "" {
			return Files{}, fmt.Errorf("%w: a member certificate needs --identity", errUsage)
		}
		issue.Usage = Member
		issue.DNSNames = append([]string{req.Identity}, req.DNSNames...)
		issue.IPs = req.IPs
	case "server":
		if len(req.DNSNames) == 0 && len(req.IPs) == 0 {
			return Files{}, fmt.Errorf("%w: a server certificate needs the names clients reach it by: --dns or --ip", errUsage)
		}
		issue.Usage = Server
		issue.DNSNames, issue.IPs = req.DNSNames, req.IPs
	case "client":
		issue.Usage = Client
	default:
		return Files{}, fmt.Errorf("%w: kind %q: expected member, server or client", errUsage, req.Kind)
	}
	ca, err := LoadCA(filepath.Join(dir, CAFileName), filepath.Join(dir, CAKeyFileName))
	if err != nil {
		return Files{}, fmt.Errorf("the authority (amqp-mirror tls ca --dir %s makes one): %w", dir, err)
	}
	certPEM, keyPEM, err := ca.Issue(issue)
	if err != nil {
		return Files{}, err
	}
	f := Files{CA: filepath.Join(dir, CAFileName), Cert: filepath.Join(dir, req.Name+".pem"), Key: filepath.Join(dir, req.Name+"-key.pem")}
	if err := WriteFiles(f.Cert, certPEM, f.Key, keyPEM); err != nil {
		return Files{}, err
	}
	return f, nil
}

// EnsureMembers makes sure dir holds an authority and a member
// certificate for each of names, issuing only what is missing, and
// returns the files it wrote. A deployment can run it at every start.
func EnsureMembers(dir, identity string, names []string) ([]string, error) {
	var wrote []string
	caFile := filepath.Join(dir, CAFileName)
	if _, err := os.Stat(caFile); errors.Is(err, os.ErrNotExist) {
		if err := CreateCA(dir, "amqp-mirror CA", DefaultCAValidity); err != nil {
			return wrote, err
		}
		wrote = append(wrote, caFile, filepath.Join(dir, CAKeyFileName))
	}
	for _, name := range names {
		certFile := filepath.Join(dir, name+".pem")
		if _, err := os.Stat(certFile); err == nil {
			continue
		}
		f, err := CreateCert(dir, CertRequest{Kind: "member", Name: name, Identity: identity, ValidFor: DefaultCertValidity})
		if err != nil {
			return wrote, fmt.Errorf("%s's member certificate: %w", name, err)
		}
		wrote = append(wrote, f.Cert, f.Key)
	}
	return wrote, nil
}

// GossipKeyFileName is the file EnsureClusterKeys keeps the gossip key in
// (for cluster.encrypt_file).
const GossipKeyFileName = "gossip.key"

// EnsureClusterKeys makes sure dir (created 0700) holds everything a
// sidecar cluster's proxies need to trust each other: gossipKey in
// gossip.key (mode 0600) unless a key is there already, and an authority
// and a member certificate for each of members (EnsureMembers). It
// returns the files it wrote.
func EnsureClusterKeys(dir, gossipKey, identity string, members []string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var wrote []string
	keyFile := filepath.Join(dir, GossipKeyFileName)
	switch err := writeNew(keyFile, []byte(gossipKey+"\n"), 0o600); {
	case err == nil:
		wrote = append(wrote, keyFile)
	case !errors.Is(err, os.ErrExist):
		return nil, err
	}
	certs, err := EnsureMembers(dir, identity, members)
	return append(wrote, certs...), err
}

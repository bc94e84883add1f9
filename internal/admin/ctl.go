package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/spf13/pflag"
)

// Exit codes of RunCtl, following rabbitmqctl (sysexits.h).
const (
	ExitOK          = 0
	ExitUsage       = 64 // bad command line
	ExitDataErr     = 65 // the server refused the input
	ExitUnavailable = 69 // the admin API could not be reached, or its metadata log has no leader
	ExitSoftware    = 70 // anything else
	ExitTempFail    = 75 // sync_queue --wait: --timeout ran out first
	ExitNoPerm      = 77 // wrong or missing token
)

// DefaultAdminAddress is where ctl looks for the admin API when neither
// --admin nor --config says.
const DefaultAdminAddress = "127.0.0.1:15680"

type command struct {
	usage   string
	brief   string // one line, for the command list
	summary string
	args    int // positional arguments required
	// moreArgs: further positional arguments may follow the required ones.
	moreArgs bool
	// check refuses bad positional arguments as a usage error, before the
	// proxy is asked anything.
	check func(args []string) error
	// tokenless: the command asks only endpoints served without a token,
	// so none is looked for, and a missing one is no error.
	tokenless bool
	run       func(ctx context.Context, c *Client, o *ctlOptions, args []string) error
}

type ctlOptions struct {
	vhost     string
	priority  int
	applyTo   string
	explain   string
	wait      bool
	quiet     bool
	formatter string
	stdout    io.Writer
}

// Output formats of the list commands, as rabbitmqctl names them: table
// is tab-separated with a header line; json is an array of objects.
const (
	formatTable = "table"
	formatJSON  = "json"
)

var commands = map[string]command{
	"set_policy": {
		usage:   "set_policy [-p VHOST] [--priority N] [--apply-to queues|exchanges|all] NAME PATTERN DEFINITION",
		brief:   "sets a policy (DEFINITION is JSON, as for rabbitmqctl)",
		summary: "Sets a policy: objects whose name matches PATTERN (a regular expression) get DEFINITION,\na JSON object such as '{\"ha-mode\":\"exactly\",\"ha-params\":2}'. The highest priority matching policy wins.",
		args:    3,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Setting policy %q for pattern %q to %q with priority %q for vhost %q ...", a[0], a[1], a[2], fmt.Sprint(o.priority), o.vhost)
			return c.SetPolicy(ctx, o.vhost, a[0], a[1], o.applyTo, o.priority, a[2])
		},
	},
	"clear_policy": {
		usage:   "clear_policy [-p VHOST] NAME",
		brief:   "clears a runtime policy",
		summary: "Clears a runtime policy. Policies from the config file are changed in the file.",
		args:    1,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Clearing policy %q on vhost %q ...", a[0], o.vhost)
			return c.ClearPolicy(ctx, o.vhost, a[0])
		},
	},
	"list_policies": {
		usage:   "list_policies [-p VHOST] [--explain QUEUE] [--formatter table|json]",
		brief:   "lists the policies of a vhost, or explains which one applies to a queue",
		summary: "Lists the policies of a vhost with their source (file, runtime). With --explain, tells\nwhich policy and operator policy apply to QUEUE, and why.",
		run: func(ctx context.Context, c *Client, o *ctlOptions, _ []string) error {
			if o.explain != "" {
				r, err := c.Explain(ctx, o.vhost, o.explain)
				if err != nil {
					return err
				}
				if o.formatter == formatJSON {
					return o.json(r)
				}
				fmt.Fprint(o.stdout, r.String())
				return nil
			}
			o.say("Listing policies for vhost %q ...", o.vhost)
			list, err := c.ListPolicies(ctx, o.vhost)
			if err != nil {
				return err
			}
			return o.list(list)
		},
	},
	"set_operator_policy": {
		usage:   "set_operator_policy [-p VHOST] [--priority N] [--apply-to queues|exchanges|all] NAME PATTERN DEFINITION",
		brief:   "sets an operator policy, merged with the user policy",
		summary: "Sets an operator policy, merged with the user policy (ha-mode all > exactly > nodes, larger\nha-params, operator's ha-sync-mode, smaller limits). Keys: ha-mode, ha-params, ha-sync-mode,\nexpires, message-ttl, max-length, max-length-bytes, max-in-memory-length, max-in-memory-bytes, delivery-limit.",
		args:    3,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Setting operator policy override %q for pattern %q to %q with priority %q for vhost %q ...", a[0], a[1], a[2], fmt.Sprint(o.priority), o.vhost)
			return c.SetOperatorPolicy(ctx, o.vhost, a[0], a[1], o.applyTo, o.priority, a[2])
		},
	},
	"clear_operator_policy": {
		usage:   "clear_operator_policy [-p VHOST] NAME",
		brief:   "clears a runtime operator policy",
		summary: "Clears a runtime operator policy.",
		args:    1,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Clearing operator policy %q on vhost %q ...", a[0], o.vhost)
			return c.ClearOperatorPolicy(ctx, o.vhost, a[0])
		},
	},
	"list_operator_policies": {
		usage:   "list_operator_policies [-p VHOST] [--formatter table|json]",
		brief:   "lists the operator policies of a vhost",
		summary: "Lists the operator policies of a vhost with their source.",
		run: func(ctx context.Context, c *Client, o *ctlOptions, _ []string) error {
			o.say("Listing operator policy overrides for vhost %q ...", o.vhost)
			list, err := c.ListOperatorPolicies(ctx, o.vhost)
			if err != nil {
				return err
			}
			return o.list(list)
		},
	},
	"list_queues":       listQueuesCommand,
	"cluster_status":    clusterStatusCommand,
	"check_ready":       checkReadyCommand,
	"check_alive":       checkAliveCommand,
	"list_connections":  listConnectionsCommand,
	"list_consumers":    listConsumersCommand,
	"sync_queue":        syncQueueCommand,
	"cancel_sync_queue": cancelSyncQueueCommand,
	"drain":             drainCommand,
	"undrain":           undrainCommand,
	"keys":              keysCommand,
}

func (o *ctlOptions) say(format string, args ...any) {
	// JSON output is for programs: nothing but the document on stdout.
	if !o.quiet && o.formatter != formatJSON {
		fmt.Fprintf(o.stdout, format+"\n", args...)
	}
}

// policyRow is one policy in --formatter json output: rabbitmqctl's
// list_policies keys in its column order, plus where the policy comes from.
type policyRow struct {
	VHost         string            `json:"vhost"`
	Name          string            `json:"name"`
	Pattern       string            `json:"pattern"`
	ApplyTo       string            `json:"apply-to"`
	Definition    config.Definition `json:"definition"`
	Priority      int               `json:"priority"`
	Source        string            `json:"source"`
	OverridesFile bool              `json:"overrides_file"`
}

// list prints policies in the chosen format.
func (o *ctlOptions) list(list []config.Policy) error {
	if o.formatter == formatJSON {
		rows := make([]policyRow, 0, len(list))
		for _, p := range list {
			rows = append(rows, policyRow{p.VHost, p.Name, p.Pattern, p.ApplyTo.String(), p.Definition, p.Priority, p.Source, p.OverridesFile})
		}
		return o.json(rows)
	}
	o.table(list)
	return nil
}

func (o *ctlOptions) json(v any) error {
	enc := json.NewEncoder(o.stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// table prints rabbitmqctl's list_policies columns plus source.
func (o *ctlOptions) table(list []config.Policy) {
	fmt.Fprintln(o.stdout, "vhost\tname\tpattern\tapply-to\tdefinition\tpriority\tsource")
	for _, p := range list {
		source := p.Source
		if p.OverridesFile {
			source += " (overrides file)"
		}
		fmt.Fprintf(o.stdout, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", p.VHost, p.Name, p.Pattern, p.ApplyTo, p.Definition, p.Priority, source)
	}
}

// connection is how ctl reaches the admin API, from its flags.
type connection struct {
	configPath, admin, token, tokenFile string
	adminCA                             string
	timeout                             time.Duration
}

// TokenEnv is the environment variable ctl reads the admin credential
// from. It is the same variable that sets admin_token for the proxy
// (config.EnvName("admin_token")), so one export serves both.
const TokenEnv = "AMQP_MIRROR_ADMIN_TOKEN"

// globalValueFlags are the flags every command takes that carry a value,
// so that the command word can be told from a flag's value wherever the
// flags stand: `ctl --config FILE list_policies` and `ctl list_policies
// --config FILE` are the same.
var globalValueFlags = []string{"config", "admin", "admin-ca", "token", "token-file", "timeout", "vhost", "p", "formatter"}

// commandValueFlags are the commands' own flags that carry a value.
var commandValueFlags = []string{"priority", "apply-to", "explain"}

// Main runs `amqp-mirror ctl ARGS`: it finds the admin API from --admin or
// --config and the credential from --token, --token-file, getenv's
// AMQP_MIRROR_ADMIN_TOKEN or --config, in that order, runs the command and
// returns the exit code.
// Every flag may stand before or after the command, as in rabbitmqctl.
func Main(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	return runCtl(context.Background(), args, nil, getenv, stdout, stderr)
}

// RunCtl runs one ctl command (args without the program and "ctl" words)
// against client, printing rabbitmqctl-style output, and returns the exit
// code. Commands: set_policy, clear_policy, list_policies,
// set_operator_policy, clear_operator_policy, list_operator_policies,
// list_queues, sync_queue, cancel_sync_queue, drain, undrain, keys,
// cluster_status, list_connections, list_consumers, check_ready,
// check_alive, help.
// The connection flags (--config, --admin, --admin-ca, --token, --token-file) are accepted and
// ignored: client is used.
func RunCtl(ctx context.Context, args []string, client *Client, stdout, stderr io.Writer) int {
	return runCtl(ctx, args, client, func(string) string { return "" }, stdout, stderr)
}

func runCtl(ctx context.Context, args []string, client *Client, getenv func(string) string, stdout, stderr io.Writer) int {
	name, rest := splitCommand(args)
	if name == "" || name == "help" {
		return runHelp(name, rest, stdout, stderr)
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "Error: unknown command %q\n\n", name)
		printUsage(stderr)
		return ExitUsage
	}
	o := &ctlOptions{stdout: stdout}
	var conn connection
	fs, help := commandFlags(name, cmd, o, &conn)
	if err := fs.Parse(rest); err != nil {
		fmt.Fprintf(stderr, "Error: %v\nUsage: amqp-mirror ctl %s\n", err, cmd.usage)
		return ExitUsage
	}
	if *help {
		fmt.Fprintf(stdout, "Usage: amqp-mirror ctl %s\n\n%s\n\nOptions:\n%s", cmd.usage, cmd.summary, fs.FlagUsages())
		return ExitOK
	}
	if err := checkInvocation(cmd, o, fs.Args()); err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return ExitUsage
	}
	if client == nil {
		var code int
		var err error
		if client, code, err = conn.client(getenv, !cmd.tokenless); err != nil {
			fmt.Fprintf(stderr, "Error: %v\n", err)
			return code
		}
	}
	warned := *client
	warned.Warn = func(warning string) { fmt.Fprintf(stderr, "warning: %s\n", warning) }
	ctx, cancel := context.WithTimeout(ctx, conn.timeout)
	defer cancel()
	if err := cmd.run(ctx, &warned, o, fs.Args()); err != nil {
		err = explainTransport(err, client.BaseURL)
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return exitCode(err)
	}
	return ExitOK
}

// runHelp answers a call without a command (name "") and `help [command]`.
func runHelp(name string, rest []string, stdout, stderr io.Writer) int {
	if name == "" {
		if contains(rest, "-h", "--help") {
			printUsage(stdout)
			return ExitOK
		}
		fmt.Fprintln(stderr, "Error: no command given")
		printUsage(stderr)
		return ExitUsage
	}
	for _, a := range rest {
		if strings.HasPrefix(a, "-") {
			continue // an option, such as --config, taken and ignored
		}
		cmd, ok := commands[a]
		if !ok {
			fmt.Fprintf(stderr, "Error: unknown command %q\n\n", a)
			printUsage(stderr)
			return ExitUsage
		}
		fmt.Fprintf(stdout, "Usage: amqp-mirror ctl %s\n\n%s\n", cmd.usage, cmd.summary)
		return ExitOK
	}
	printUsage(stdout)
	return ExitOK
}

// commandFlags is the flag set of command name, filling o and conn, and
// the --help flag.
func commandFlags(name string, cmd command, o *ctlOptions, conn *connection) (*pflag.FlagSet, *bool) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.SortFlags = false
	fs.StringVarP(&o.vhost, "vhost", "p", "/", "virtual host")
	fs.BoolVarP(&o.quiet, "quiet", "q", false, "print only results")
	help := fs.BoolP("help", "h", false, "show this help")
	if cmd.args == 3 {
		fs.IntVar(&o.priority, "priority", 0, "priority; the highest matching policy wins")
		fs.StringVar(&o.applyTo, "apply-to", "all", "queues, exchanges or all")
	}
	if name == "list_policies" {
		fs.StringVar(&o.explain, "explain", "", "explain which policies apply to this queue")
	}
	if name == "sync_queue" {
		fs.BoolVar(&o.wait, "wait", false, "wait until every slave is synchronised (at most --timeout)")
	}
	// Every command takes --formatter, as in rabbitmqctl, so that scripts can
	// pass it to all; only the list commands have a table to format, and the
	// others print no banner with json.
	fs.StringVar(&o.formatter, "formatter", formatTable, "output format of list commands: table (tab-separated, with a header) or json (an array of objects)")
	addConnectionFlags(fs, conn)
	return fs, help
}

// checkInvocation checks the parsed options and the positional arguments
// of cmd; an error about the arguments ends with the command's usage.
func checkInvocation(cmd command, o *ctlOptions, args []string) error {
	if o.formatter != formatTable && o.formatter != formatJSON {
		return fmt.Errorf("--formatter: expected table or json, found %q", o.formatter)
	}
	if len(args) < cmd.args || (len(args) > cmd.args && !cmd.moreArgs) {
		atLeast := ""
		if cmd.moreArgs {
			atLeast = "at least "
		}
		return fmt.Errorf("expected %s%d argument(s), found %d\nUsage: amqp-mirror ctl %s", atLeast, cmd.args, len(args), cmd.usage)
	}
	if cmd.check != nil {
		if err := cmd.check(args); err != nil {
			return fmt.Errorf("%w\nUsage: amqp-mirror ctl %s", err, cmd.usage)
		}
	}
	return nil
}

func addConnectionFlags(fs *pflag.FlagSet, c *connection) {
	fs.StringVar(&c.configPath, "config", "", "the proxy's YAML config file: finds the admin address (listen.admin) and credential (admin_token, or state_dir/admin.token)")
	fs.StringVar(&c.admin, "admin", "", "the admin API's base URL or host:port (default: listen.admin of --config, else "+DefaultAdminAddress+"); a host:port is https:// when --config sets listen.admin_tls or --admin-ca is given")
	fs.StringVar(&c.adminCA, "admin-ca", "", "CA certificate file (PEM) that signed the admin API's HTTPS certificate, for a private CA (default: listen.admin_tls.ca of --config, else the system's roots)")
	fs.StringVar(&c.token, "token", "", "the admin credential; it shows up in ps and shell history, so prefer --token-file or $"+TokenEnv)
	fs.StringVar(&c.tokenFile, "token-file", "", "a file holding the admin credential (mode 0600; surrounding whitespace is ignored)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "how long to wait for the admin API")
}

// client resolves the admin address and credential: flags first, then the
// config file, then the defaults. The credential is --token, else
// --token-file, else $AMQP_MIRROR_ADMIN_TOKEN, else the config's
// admin_token or state_dir/admin.token. The admin API is reached over
// HTTPS when the URL says so, when the config serves it so
// (listen.admin_tls) or when --admin-ca is given; the authority trusted
// then is --admin-ca, else listen.admin_tls.ca, else the system's roots.
func (c connection) client(getenv func(string) string, needToken bool) (*Client, int, error) {
	var token string
	var err error
	if needToken {
		if token, err = c.explicitToken(getenv); err != nil {
			return nil, ExitNoPerm, err
		}
	}
	client := &Client{BaseURL: c.admin, Token: token}
	https := c.adminCA != ""
	ca := trustedCA{file: c.adminCA, source: "--admin-ca"}
	if c.configPath != "" {
		cfg, err := config.Load(c.configPath, nil)
		if err != nil {
			return nil, ExitUsage, err
		}
		if client.BaseURL == "" {
			client.BaseURL = cfg.Listen.Admin
		}
		https = https || cfg.Listen.AdminTLS.Enabled()
		if ca.file == "" && cfg.Listen.AdminTLS.CA != "" {
			ca = trustedCA{file: cfg.Listen.AdminTLS.CA, source: "listen.admin_tls.ca of " + c.configPath}
		}
		if needToken && client.Token == "" {
			if client.Token, err = config.LoadAdminToken(cfg); err != nil {
				return nil, ExitNoPerm, err
			}
		}
	}
	if client.BaseURL == "" {
		client.BaseURL = DefaultAdminAddress
	}
	if !strings.Contains(client.BaseURL, "://") {
		scheme := "http://"
		if https {
			scheme = "https://"
		}
		client.BaseURL = scheme + client.BaseURL
	}
	if strings.HasPrefix(client.BaseURL, "https://") {
		if client.HTTP, err = ca.httpClient(); err != nil {
			return nil, ExitUsage, err
		}
	}
	return client, ExitOK, nil
}

// explicitToken is the credential given to ctl itself rather than through
// the proxy's config: --token, else --token-file, else the environment.
// "" means none was given.
func (c connection) explicitToken(getenv func(string) string) (string, error) {
	switch {
	case c.token != "":
		return c.token, nil
	case c.tokenFile != "":
		return readTokenFile(c.tokenFile)
	}
	return getenv(TokenEnv), nil
}

// readTokenFile reads --token-file, refusing one that group or others
// may read or write (config.ReadSecretFile).
func readTokenFile(path string) (string, error) {
	return config.ReadSecretFile(path, "--token-file")
}

// splitCommand finds the command word among args, skipping flags and the
// values of the flags that take one, and returns it with the other
// arguments in their order. name is "" when there is none.
func splitCommand(args []string) (name string, rest []string) {
	takesValue := func(arg string) bool {
		if strings.Contains(arg, "=") {
			return false
		}
		return contains(append(globalValueFlags, commandValueFlags...), strings.TrimLeft(arg, "-"))
	}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		switch {
		case arg == "--":
			if i+1 < len(args) {
				return args[i+1], append(append([]string{}, args[:i]...), args[i+2:]...)
			}
			return "", args[:i]
		case strings.HasPrefix(arg, "-") && len(arg) > 1:
			if takesValue(arg) {
				i++
			}
		default:
			return arg, append(append([]string{}, args[:i]...), args[i+1:]...)
		}
	}
	return "", args
}

func contains(list []string, values ...string) bool {
	for _, s := range list {
		for _, v := range values {
			if s == v {
				return true
			}
		}
	}
	return false
}

func exitCode(err error) int {
	var api *APIError
	var wait *waitTimeoutError
	var netErr net.Error
	var opErr *net.OpError
	var transport *transportError
	var notReady *NotReadyError
	switch {
	case errors.As(err, &wait):
		return ExitTempFail
	case errors.As(err, &notReady):
		return ExitUnavailable
	case errors.As(err, &transport):
		return ExitUnavailable
	case errors.As(err, &api) && api.Status == 401:
		return ExitNoPerm
	case errors.As(err, &api) && api.Status == 503:
		// The metadata log has no leader at the moment: try again.
		return ExitUnavailable
	case errors.As(err, &api) && api.Status < 500:
		return ExitDataErr
	case errors.As(err, &opErr), errors.As(err, &netErr):
		return ExitUnavailable
	case strings.HasPrefix(err.Error(), "definition:"):
		return ExitDataErr
	}
	return ExitSoftware
}

// printUsage lists every command with one line each, then the options
// every command takes.
func printUsage(w io.Writer) {
	names := make([]string, 0, len(commands))
	width := 0
	for n := range commands {
		names = append(names, n)
		width = max(width, len(n))
	}
	sort.Strings(names)
	fmt.Fprintln(w, `Usage: amqp-mirror ctl [options] <command> [arguments]

Administers a running proxy through its admin API, like rabbitmqctl. Options
may stand before or after the command.

Commands:`)
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, commands[n].brief)
	}
	fmt.Fprintf(w, "  %-*s  %s\n", width, "help", "describes a command: help <command>, or <command> --help")
	var conn connection
	fs := pflag.NewFlagSet("ctl", pflag.ContinueOnError)
	fs.SortFlags = false
	addConnectionFlags(fs, &conn)
	fs.StringP("vhost", "p", "/", "the virtual host")
	fs.BoolP("quiet", "q", false, "print only results")
	fs.String("formatter", formatTable, "list_* output: table (tab-separated, with a header) or json (an array of objects)")
	fmt.Fprintf(w, "\nOptions:\n%s", fs.FlagUsages())
	fmt.Fprintln(w, `
The credential is --token, else --token-file, else $AMQP_MIRROR_ADMIN_TOKEN,
else the admin_token or state_dir/admin.token of --config. --token shows up in
ps and shell history: prefer --token-file (mode 0600) or the environment
variable. With --config the admin address also comes from the proxy's file.
When the proxy serves the admin API over HTTPS (listen.admin_tls in --config,
or an https:// --admin), ctl checks its certificate against --admin-ca, else
listen.admin_tls.ca of --config, else the system's CA certificates.
Exit codes: 64 usage, 65 refused input (also an unknown queue or backend,
or mirroring off), 69 admin API or metadata log unavailable (nothing listening, not
the admin API, or no metadata leader), 70 an unexpected error, 75 sync_queue --wait
timed out, 77 wrong or missing credential.`)
}

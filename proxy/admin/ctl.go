package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/spf13/pflag"
)

// Exit codes of RunCtl, following rabbitmqctl (sysexits.h).
const (
	ExitOK          = 0
	ExitUsage       = 64 // bad command line
	ExitDataErr     = 65 // the server refused the input
	ExitUnavailable = 69 // the admin API could not be reached
	ExitSoftware    = 70 // anything else
	ExitNoPerm      = 77 // wrong or missing token
)

type command struct {
	usage   string
	summary string
	args    int // positional arguments required
	run     func(ctx context.Context, c *Client, o *ctlOptions, args []string) error
}

type ctlOptions struct {
	vhost    string
	priority int
	applyTo  string
	explain  string
	quiet    bool
	stdout   io.Writer
}

var commands = map[string]command{
	"set_policy": {
		usage:   "set_policy [-p VHOST] [--priority N] [--apply-to queues|exchanges|all] NAME PATTERN DEFINITION",
		summary: "Sets a policy: objects whose name matches PATTERN (a regular expression) get DEFINITION,\na JSON object such as '{\"ha-mode\":\"exactly\",\"ha-params\":2}'. The highest priority matching policy wins.",
		args:    3,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Setting policy %q for pattern %q to %q with priority %q for vhost %q ...", a[0], a[1], a[2], fmt.Sprint(o.priority), o.vhost)
			return c.SetPolicy(ctx, o.vhost, a[0], a[1], o.applyTo, o.priority, a[2])
		},
	},
	"clear_policy": {
		usage:   "clear_policy [-p VHOST] NAME",
		summary: "Clears a runtime policy. Policies from the config file are changed in the file.",
		args:    1,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Clearing policy %q on vhost %q ...", a[0], o.vhost)
			return c.ClearPolicy(ctx, o.vhost, a[0])
		},
	},
	"list_policies": {
		usage:   "list_policies [-p VHOST] [--explain QUEUE]",
		summary: "Lists the policies of a vhost with their source (file, runtime). With --explain, tells\nwhich policy and operator policy apply to QUEUE, and why.",
		run: func(ctx context.Context, c *Client, o *ctlOptions, _ []string) error {
			if o.explain != "" {
				r, err := c.Explain(ctx, o.vhost, o.explain)
				if err != nil {
					return err
				}
				fmt.Fprint(o.stdout, r.String())
				return nil
			}
			o.say("Listing policies for vhost %q ...", o.vhost)
			list, err := c.ListPolicies(ctx, o.vhost)
			if err == nil {
				o.table(list)
			}
			return err
		},
	},
	"set_operator_policy": {
		usage:   "set_operator_policy [-p VHOST] [--priority N] [--apply-to queues|exchanges|all] NAME PATTERN DEFINITION",
		summary: "Sets an operator policy, merged with the user policy (ha-mode all > exactly > nodes, larger\nha-params, operator's ha-sync-mode, smaller limits). Keys: ha-mode, ha-params, ha-sync-mode,\nexpires, message-ttl, max-length, max-length-bytes, max-in-memory-length, max-in-memory-bytes, delivery-limit.",
		args:    3,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Setting operator policy override %q for pattern %q to %q with priority %q for vhost %q ...", a[0], a[1], a[2], fmt.Sprint(o.priority), o.vhost)
			return c.SetOperatorPolicy(ctx, o.vhost, a[0], a[1], o.applyTo, o.priority, a[2])
		},
	},
	"clear_operator_policy": {
		usage:   "clear_operator_policy [-p VHOST] NAME",
		summary: "Clears a runtime operator policy.",
		args:    1,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Clearing operator policy %q on vhost %q ...", a[0], o.vhost)
			return c.ClearOperatorPolicy(ctx, o.vhost, a[0])
		},
	},
	"list_operator_policies": {
		usage:   "list_operator_policies [-p VHOST]",
		summary: "Lists the operator policies of a vhost with their source.",
		run: func(ctx context.Context, c *Client, o *ctlOptions, _ []string) error {
			o.say("Listing operator policy overrides for vhost %q ...", o.vhost)
			list, err := c.ListOperatorPolicies(ctx, o.vhost)
			if err == nil {
				o.table(list)
			}
			return err
		},
	},
}

func (o *ctlOptions) say(format string, args ...any) {
	if !o.quiet {
		fmt.Fprintf(o.stdout, format+"\n", args...)
	}
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

// RunCtl runs one ctl command (args without the program and "ctl" words)
// against client, printing rabbitmqctl-style output, and returns the exit
// code. Commands: set_policy, clear_policy, list_policies,
// set_operator_policy, clear_operator_policy, list_operator_policies, help.
func RunCtl(ctx context.Context, args []string, client *Client, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "--help" || args[0] == "-h" {
		if len(args) > 1 {
			if cmd, ok := commands[args[1]]; ok {
				fmt.Fprintf(stdout, "Usage: amqp-mirror ctl %s\n\n%s\n", cmd.usage, cmd.summary)
				return ExitOK
			}
		}
		printUsage(stdout)
		if len(args) == 0 {
			return ExitUsage
		}
		return ExitOK
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "Error: unknown command %q\n\n", args[0])
		printUsage(stderr)
		return ExitUsage
	}
	o := &ctlOptions{stdout: stdout}
	fs := pflag.NewFlagSet(args[0], pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVarP(&o.vhost, "vhost", "p", "/", "virtual host")
	fs.BoolVarP(&o.quiet, "quiet", "q", false, "print only results")
	help := fs.BoolP("help", "h", false, "show this help")
	if cmd.args == 3 {
		fs.IntVar(&o.priority, "priority", 0, "priority; the highest matching policy wins")
		fs.StringVar(&o.applyTo, "apply-to", "all", "queues, exchanges or all")
	}
	if args[0] == "list_policies" {
		fs.StringVar(&o.explain, "explain", "", "explain which policies apply to this queue")
	}
	if err := fs.Parse(args[1:]); err != nil {
		fmt.Fprintf(stderr, "Error: %v\nUsage: amqp-mirror ctl %s\n", err, cmd.usage)
		return ExitUsage
	}
	if *help {
		fmt.Fprintf(stdout, "Usage: amqp-mirror ctl %s\n\n%s\n\nOptions:\n%s", cmd.usage, cmd.summary, fs.FlagUsages())
		return ExitOK
	}
	if fs.NArg() != cmd.args {
		fmt.Fprintf(stderr, "Error: expected %d argument(s), found %d\nUsage: amqp-mirror ctl %s\n", cmd.args, fs.NArg(), cmd.usage)
		return ExitUsage
	}
	if err := cmd.run(ctx, client, o, fs.Args()); err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return exitCode(err)
	}
	return ExitOK
}

func exitCode(err error) int {
	var api *APIError
	var netErr net.Error
	var opErr *net.OpError
	switch {
	case errors.As(err, &api) && api.Status == 401:
		return ExitNoPerm
	case errors.As(err, &api) && api.Status < 500:
		return ExitDataErr
	case errors.As(err, &opErr), errors.As(err, &netErr):
		return ExitUnavailable
	case strings.HasPrefix(err.Error(), "definition:"):
		return ExitDataErr
	}
	return ExitSoftware
}

func printUsage(w io.Writer) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "Usage: amqp-mirror ctl <command> [options] [arguments]\n\nCommands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %s\n", commands[n].usage)
	}
	fmt.Fprintln(w, "\namqp-mirror ctl help <command> (or <command> --help) describes one command.")
}

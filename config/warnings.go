package config

import (
	"fmt"
	"strings"
)

// UnknownNodes returns the names in ha-params of an ha-mode nodes
// definition that are not among backends, in the order written. RabbitMQ
// ignores such names (a node that is not in the cluster), and so does the
// proxy; a name such as rabbit@r9 is most often an Erlang node name where a
// backend name was meant.
func (d Definition) UnknownNodes(backends []string) []string {
	if d.HAMode != HANodes {
		return nil
	}
	var unknown []string
	for _, n := range d.HAParams.Nodes {
		if !contains(backends, n) {
			unknown = append(unknown, n)
		}
	}
	return unknown
}

// PolicyWarning returns what is legal in p but probably a mistake, given the
// configured backend names, or "" when nothing is: today, ha-mode nodes
// naming a backend that does not exist.
func PolicyWarning(p Policy, backends []string) string {
	unknown := p.Definition.UnknownNodes(backends)
	if len(unknown) == 0 {
		return ""
	}
	vhost := p.VHost
	if vhost == "" {
		vhost = "/"
	}
	return fmt.Sprintf("policy %q in vhost %q: ha-params names %s, not a backend (backends: %s); ignored, as RabbitMQ ignores unknown nodes",
		p.Name, vhost, quoteAll(unknown), strings.Join(backends, ", "))
}

// Warnings returns PolicyWarning for every policy and operator policy of
// the file, in file order.
func (c *Config) Warnings() []string {
	names := c.BackendNames()
	var out []string
	for _, list := range [][]Policy{c.Policies, c.OperatorPolicies} {
		for _, p := range list {
			if w := PolicyWarning(p, names); w != "" {
				out = append(out, w)
			}
		}
	}
	return out
}

// BackendNames returns the backends' names in the order configured.
func (c *Config) BackendNames() []string {
	names := make([]string, len(c.Backends))
	for i, b := range c.Backends {
		names[i] = b.Name
	}
	return names
}

func quoteAll(list []string) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

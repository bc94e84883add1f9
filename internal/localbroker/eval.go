package localbroker

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Eval evaluates an Erlang expression on the node and returns its value, which must be
// iodata (a string, a binary or a list of them). It runs erl_call, a small C program that
// joins the node as a hidden node for the one call: a few milliseconds and almost no CPU,
// where rabbitmqctl boots an Erlang VM of its own (about four seconds and most of a second
// of CPU per call on two cores). That difference matters to anyone looking at brokers
// often, as tests waiting for a queue's count do, beside busy brokers.
//
// The expression may be a sequence of expressions separated by commas, as in a function
// body; its value is the last one's.
func (n *Node) Eval(ctx context.Context, expression string) ([]byte, error) {
	erlCall, err := exec.LookPath("erl_call")
	if err != nil {
		return nil, fmt.Errorf("eval on %s: erl_call (package erlang-base) not found: %w", n.Name, err)
	}
	// erl_call prints the result as an Erlang term and abbreviates long binaries, so the
	// value comes back as a base64 string, which it prints whole and needs no unescaping.
	wrapped := "base64:encode_to_string(iolist_to_binary(begin " + expression + " end)).\n"
	command := exec.CommandContext(ctx, erlCall, "-n", n.ErlangName, "-e")
	command.Stdin = strings.NewReader(wrapped)
	output, err := command.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("eval on %s: erl_call: %w: %s", n.Name, err, abbreviate(output))
	}
	encoded, err := okString(bytes.TrimSpace(output))
	if err != nil {
		return nil, fmt.Errorf("eval on %s: %w", n.Name, err)
	}
	value, err := base64.StdEncoding.AppendDecode(nil, encoded)
	if err != nil {
		return nil, fmt.Errorf("eval on %s: decode the result: %w", n.Name, err)
	}
	return value, nil
}

// okString is the string in erl_call's {ok, "..."}, which it prints as a list of
// integers instead once the string is long, and as [] when it is empty. An expression
// that raised comes back as {error, ...}, with exit status 0.
func okString(output []byte) ([]byte, error) {
	if quoted, ok := bytes.CutPrefix(output, []byte(`{ok, "`)); ok {
		if s, ok := bytes.CutSuffix(quoted, []byte(`"}`)); ok {
			return s, nil
		}
	} else if list, ok := bytes.CutPrefix(output, []byte(`{ok, [`)); ok {
		if list, ok := bytes.CutSuffix(list, []byte(`]}`)); ok {
			s := make([]byte, 0, len(list)/4)
			for field := range bytes.SplitSeq(list, []byte(",")) {
				field = bytes.TrimSpace(field)
				if len(field) == 0 {
					continue
				}
				c, err := strconv.ParseUint(string(field), 10, 8)
				if err != nil {
					return nil, fmt.Errorf("a result that is not a string: %s", abbreviate(output))
				}
				s = append(s, byte(c))
			}
			return s, nil
		}
	}
	return nil, fmt.Errorf("%s", abbreviate(output))
}

// abbreviate is erl_call's output cut to a length an error message can carry.
func abbreviate(output []byte) string {
	const limit = 400
	output = bytes.TrimSpace(output)
	if len(output) > limit {
		return fmt.Sprintf("%s... (%d bytes)", output[:limit], len(output))
	}
	return string(output)
}

// QueueCounts is what a queue holds on one node, as rabbitmqctl list_queues reports it.
type QueueCounts struct {
	Messages               int `json:"messages"`
	MessagesReady          int `json:"messages_ready"`
	MessagesUnacknowledged int `json:"messages_unacknowledged"`
}

// Queues returns every queue of vhost on the node with its counts, through Eval. A queue
// whose process does not answer (busy or gone) is an error naming it, as rabbitmqctl lists
// such a queue without counts, so that a caller never takes a silent queue for an empty one.
func (n *Node) Queues(ctx context.Context, vhost string) (map[string]QueueCounts, error) {
	// info_all asks each queue process in turn; a queue that cannot answer has '' for
	// counts, which rabbit_json encodes as an empty string and the decoding below refuses.
	expression := `rabbit_json:encode(maps:from_list(
		[{Name, #{messages => M, messages_ready => R, messages_unacknowledged => U}}
		 || [{name, {resource, _, queue, Name}}, {messages, M}, {messages_ready, R},
		     {messages_unacknowledged, U}]
		    <- rabbit_amqqueue:info_all(` + erlangBinary(vhost) + `,
		       [name, messages, messages_ready, messages_unacknowledged])]))`
	output, err := n.Eval(ctx, expression)
	if err != nil {
		return nil, fmt.Errorf("list queues of vhost %q: %w", vhost, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(output, &raw); err != nil {
		return nil, fmt.Errorf("list queues of vhost %q on %s: %w: %s", vhost, n.Name, err, output)
	}
	queues := make(map[string]QueueCounts, len(raw))
	for name, counts := range raw {
		var c QueueCounts
		if err := json.Unmarshal(counts, &c); err != nil {
			return nil, fmt.Errorf("list queues of vhost %q on %s: queue %q did not answer: %s", vhost, n.Name, name, counts)
		}
		queues[name] = c
	}
	return queues, nil
}

// erlangBinary is s as an Erlang UTF-8 binary literal.
func erlangBinary(s string) string {
	var b strings.Builder
	b.WriteString(`<<"`)
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x{%x}`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteString(`"/utf8>>`)
	return b.String()
}

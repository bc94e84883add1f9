package config

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
)

// yamlParserProblems are the problems go.yaml.in/yaml/v3's parser (as
// opposed to its scanner) reports. For these it prints the mark's line as
// it is, counted from 0, while for scanner problems it adds one: a syntax
// error on line 2, such as an unclosed "[" there, came out as "line 1", and
// one on line 1 without any line. yamlSyntaxError adds the missing one.
var yamlParserProblems = []string{
	"did not find expected <stream-start>",
	"did not find expected <document start>",
	"found undefined tag handle",
	"did not find expected node content",
	"did not find expected '-' indicator",
	"did not find expected key",
	"did not find expected ',' or ']'",
	"did not find expected ',' or '}'",
	"found duplicate %YAML directive",
	"found incompatible YAML document",
	"found duplicate %TAG directive",
}

var yamlLinePrefix = regexp.MustCompile(`^yaml: (?:line (\d+): )?`)

// yamlSyntaxError rewrites the error of reading a config file that is not
// valid YAML as "line N: problem (YAML syntax)", N counted from 1 for
// every kind of problem. Other errors (a missing file) are returned as
// they are. The offending line itself is not quoted: it may hold a
// backend's password.
func yamlSyntaxError(err error) error {
	inner := err
	for {
		next := errors.Unwrap(inner)
		if next == nil {
			break
		}
		inner = next
	}
	text := inner.Error()
	m := yamlLinePrefix.FindStringSubmatch(text)
	if m == nil {
		return err
	}
	problem := strings.TrimPrefix(text, m[0])
	if strings.HasPrefix(problem, "unmarshal errors:") {
		// Decoding errors (a key given twice) carry their own lines,
		// already counted from 1.
		return errors.New("YAML " + strings.Join(strings.Fields(problem), " "))
	}
	line := 0
	if m[1] != "" {
		line, _ = strconv.Atoi(m[1])
	}
	for _, p := range yamlParserProblems {
		if problem == p {
			line++
			break
		}
	}
	if line == 0 {
		return errors.New(problem + " (YAML syntax)")
	}
	return errors.New("line " + strconv.Itoa(line) + ": " + problem + " (YAML syntax)")
}

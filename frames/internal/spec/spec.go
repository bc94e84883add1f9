// Package spec reads the AMQP 0-9-1 spec XML into a small model and renders
// the frames package's generated code from it. It lives apart from the
// specgen command so that frames' drift test can run the generator in-process.
package spec

import (
	"encoding/xml"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Spec is the merged protocol description the generator works from.
type Spec struct {
	Constants []Constant
	Classes   []Class
}

// Constant is a <constant>; reply codes are those with a class attribute or
// named reply-success.
type Constant struct {
	Name  string // "not-found"
	Value int
	Class string // "soft-error", "hard-error" or ""
}

// Class is one AMQP class with its methods, in index order.
type Class struct {
	Name       string
	Index      int
	Properties []Field // content properties (only basic has them)
	Methods    []Method
}

// Method is one <method>.
type Method struct {
	Name        string
	Index       int
	Synchronous bool
	Content     bool
	// ServerReceives / ClientReceives come from <chassis name="server"|"client">:
	// the chassis that implements a method is the peer that receives it.
	ServerReceives bool
	ClientReceives bool
	Fields         []Field
}

// Field is one method argument with its domain resolved to a wire type.
type Field struct {
	Name string // "routing-key"
	Type string // octet, short, long, longlong, bit, shortstr, longstr, table, timestamp
}

type xmlSpec struct {
	Constants []struct {
		Name  string `xml:"name,attr"`
		Value string `xml:"value,attr"`
		Class string `xml:"class,attr"`
	} `xml:"constant"`
	Domains []struct {
		Name string `xml:"name,attr"`
		Type string `xml:"type,attr"`
	} `xml:"domain"`
	Classes []struct {
		Name    string     `xml:"name,attr"`
		Index   string     `xml:"index,attr"`
		Fields  []xmlField `xml:"field"`
		Methods []struct {
			Name        string `xml:"name,attr"`
			Index       string `xml:"index,attr"`
			Synchronous string `xml:"synchronous,attr"`
			Content     string `xml:"content,attr"`
			Chassis     []struct {
				Name string `xml:"name,attr"`
			} `xml:"chassis"`
			Fields []xmlField `xml:"field"`
		} `xml:"method"`
	} `xml:"class"`
}

type xmlField struct {
	Name   string `xml:"name,attr"`
	Domain string `xml:"domain,attr"`
	Type   string `xml:"type,attr"`
}

// Load parses the spec files in order and merges them: the first is the
// base spec, later ones add constants, and methods to classes matched by name.
func Load(paths ...string) (*Spec, error) {
	var docs []xmlSpec
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var doc xmlSpec
		if err := xml.Unmarshal(data, &doc); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		docs = append(docs, doc)
	}
	return build(docs)
}

var primitiveTypes = map[string]bool{
	"octet": true, "short": true, "long": true, "longlong": true, "bit": true,
	"shortstr": true, "longstr": true, "table": true, "timestamp": true,
}

func build(docs []xmlSpec) (*Spec, error) {
	domains := map[string]string{}
	for _, doc := range docs {
		for _, d := range doc.Domains {
			domains[d.Name] = d.Type
		}
	}
	resolve := func(f xmlField) (Field, error) {
		typ := f.Type
		if typ == "" {
			typ = domains[f.Domain]
		}
		if !primitiveTypes[typ] {
			return Field{}, fmt.Errorf("field %q: unknown type (domain %q, type %q)", f.Name, f.Domain, f.Type)
		}
		return Field{Name: f.Name, Type: typ}, nil
	}

	s := &Spec{}
	classIndex := map[string]int{}
	for _, doc := range docs {
		for _, c := range doc.Constants {
			v, err := strconv.Atoi(c.Value)
			if err != nil {
				return nil, fmt.Errorf("constant %s: %w", c.Name, err)
			}
			s.Constants = append(s.Constants, Constant{Name: c.Name, Value: v, Class: c.Class})
		}
		for _, xc := range doc.Classes {
			i, ok := classIndex[xc.Name]
			if !ok {
				idx, err := strconv.Atoi(xc.Index)
				if err != nil {
					return nil, fmt.Errorf("class %s: %w", xc.Name, err)
				}
				i = len(s.Classes)
				classIndex[xc.Name] = i
				s.Classes = append(s.Classes, Class{Name: xc.Name, Index: idx})
			}
			c := &s.Classes[i]
			for _, f := range xc.Fields {
				rf, err := resolve(f)
				if err != nil {
					return nil, fmt.Errorf("class %s: %w", xc.Name, err)
				}
				c.Properties = append(c.Properties, rf)
			}
			for _, xm := range xc.Methods {
				idx, err := strconv.Atoi(xm.Index)
				if err != nil {
					return nil, fmt.Errorf("%s.%s: %w", xc.Name, xm.Name, err)
				}
				m := Method{Name: xm.Name, Index: idx, Synchronous: xm.Synchronous == "1", Content: xm.Content == "1"}
				for _, ch := range xm.Chassis {
					switch ch.Name {
					case "server":
						m.ServerReceives = true
					case "client":
						m.ClientReceives = true
					}
				}
				for _, f := range xm.Fields {
					rf, err := resolve(f)
					if err != nil {
						return nil, fmt.Errorf("%s.%s: %w", xc.Name, xm.Name, err)
					}
					m.Fields = append(m.Fields, rf)
				}
				c.Methods = append(c.Methods, m)
			}
		}
	}
	for i := range s.Classes {
		ms := s.Classes[i].Methods
		sort.SliceStable(ms, func(a, b int) bool { return ms[a].Index < ms[b].Index })
		for j := 1; j < len(ms); j++ {
			if ms[j].Index == ms[j-1].Index {
				return nil, fmt.Errorf("class %s: methods %s and %s share index %d", s.Classes[i].Name, ms[j-1].Name, ms[j].Name, ms[j].Index)
			}
		}
	}
	sort.SliceStable(s.Constants, func(a, b int) bool { return s.Constants[a].Value < s.Constants[b].Value })
	return s, nil
}

// ReplyCodes are the constants that are reply codes (not frame constants).
func (s *Spec) ReplyCodes() []Constant {
	var out []Constant
	for _, c := range s.Constants {
		if c.Class != "" || c.Name == "reply-success" {
			out = append(out, c)
		}
	}
	return out
}

// initialisms are spelled in capitals in Go names (class-id -> ClassID).
var initialisms = map[string]string{"id": "ID"}

// GoName turns a spec name ("routing-key", "nowait") into a Go identifier.
func GoName(name string) string {
	if name == "nowait" { // confirm.select spells no-wait without the dash
		return "NoWait"
	}
	var b strings.Builder
	for _, part := range strings.Split(name, "-") {
		if part == "" {
			continue
		}
		if s, ok := initialisms[part]; ok {
			b.WriteString(s)
			continue
		}
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}

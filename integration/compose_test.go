package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// No Docker engine runs on the build machines, so docker-compose.yml and the
// Dockerfile are kept true by reading them: the tests below parse both and
// check them against each other, against go.mod, and against the configs the
// compose file mounts, which they load with the proxy's own loader.

// repositoryRoot is where docker-compose.yml, the Dockerfile and go.mod are,
// seen from the integration package's directory (go test's working directory).
const repositoryRoot = ".."

// composeFile is the part of the compose file the tests check.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Networks map[string]struct {
		IPAM struct {
			Config []struct {
				Subnet string `yaml:"subnet"`
			} `yaml:"config"`
		} `yaml:"ipam"`
	} `yaml:"networks"`
	Volumes map[string]any `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"` // a context path, or a mapping with context and dockerfile
	Hostname    string            `yaml:"hostname"`
	Command     any               `yaml:"command"`
	Entrypoint  any               `yaml:"entrypoint"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	Networks    any               `yaml:"networks"` // a list of names, or a mapping with ipv4_address
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// The deployment's shape: a broker per node and the proxy beside it.
var (
	composeBrokers = []string{"rabbit1", "rabbit2", "rabbit3"}
	composeProxies = map[string]string{"amqp-mirror1": "rabbit1", "amqp-mirror2": "rabbit2", "amqp-mirror3": "rabbit3"}
)

// brokerAMQPPort is where the official RabbitMQ image listens for AMQP.
const brokerAMQPPort = "5672"

func TestComposeBrokersAreSingleOfficialNodes(t *testing.T) {
	compose := loadCompose(t)
	var got []string
	for name, s := range compose.Services {
		if s.Build == nil {
			got = append(got, name)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, composeBrokers) {
		t.Fatalf("services from an image: got %v, want the brokers %v", got, composeBrokers)
	}
	for _, name := range composeBrokers {
		s := compose.Services[name]
		if !strings.HasPrefix(s.Image, "rabbitmq:3.") {
			t.Errorf("%s: image %q, want the official rabbitmq:3.x image", name, s.Image)
		}
		// The node name rabbit@<hostname> names the broker's data directory.
		if s.Hostname != name {
			t.Errorf("%s: hostname %q, want %q", name, s.Hostname, name)
		}
		// Clustering needs a shared Erlang cookie and a peer list; the brokers
		// must stay independent, amqp-mirror does the mirroring.
		for key := range s.Environment {
			if strings.Contains(key, "ERLANG_COOKIE") || strings.Contains(key, "CLUSTER") {
				t.Errorf("%s: environment %s: the brokers must not form a RabbitMQ cluster", name, key)
			}
		}
		for _, mount := range s.Volumes {
			if target := mountTarget(mount); strings.HasPrefix(target, "/etc/rabbitmq") {
				t.Errorf("%s: mounts %s: the image's own configuration is wanted (no cluster formation)", name, target)
			}
		}
		checkHealthcheck(t, name, s)
	}
}

func TestComposeProxiesAreBuiltFromTheDockerfile(t *testing.T) {
	compose := loadCompose(t)
	dockerfile := loadDockerfile(t)
	configPath := dockerfile.configPath(t)
	for proxy := range composeProxies {
		s, ok := compose.Services[proxy]
		if !ok {
			t.Errorf("no service %s", proxy)
			continue
		}
		buildDir, file := buildContext(t, proxy, s.Build)
		if got, want := filepath.Clean(buildDir), "."; got != want {
			t.Errorf("%s: build context %q, want %q (the repository)", proxy, got, want)
		}
		if _, err := os.Stat(filepath.Join(repositoryRoot, buildDir, file)); err != nil {
			t.Errorf("%s: build file: %v", proxy, err)
		}
		if strings.HasPrefix(s.Image, "golang") {
			t.Errorf("%s: image %q: the proxy runs from the Dockerfile's image, not a Go toolchain", proxy, s.Image)
		}
		// The Dockerfile's ENTRYPOINT and CMD are the command, so that the
		// config path below is the one serve reads.
		if s.Command != nil || s.Entrypoint != nil {
			t.Errorf("%s: command %v, entrypoint %v: want the Dockerfile's", proxy, s.Command, s.Entrypoint)
		}
		checkHealthcheck(t, proxy, s)
		if s.Healthcheck != nil && !slices.Contains(s.Healthcheck.Test, configPath) {
			t.Errorf("%s: healthcheck %v does not use the config at %s", proxy, s.Healthcheck.Test, configPath)
		}
		for _, broker := range composeBrokers {
			if got, want := s.DependsOn[broker].Condition, "service_healthy"; got != want {
				t.Errorf("%s: depends_on %s: condition %q, want %q", proxy, broker, got, want)
			}
		}
	}
}

func TestComposeMountsExist(t *testing.T) {
	compose := loadCompose(t)
	for name, s := range compose.Services {
		for _, mount := range s.Volumes {
			source := strings.SplitN(mount, ":", 2)[0]
			if !isBindSource(source) {
				if _, ok := compose.Volumes[source]; !ok {
					t.Errorf("%s: volume %q is not declared under volumes", name, source)
				}
				continue
			}
			if _, err := os.Stat(filepath.Join(repositoryRoot, source)); err != nil {
				t.Errorf("%s: mounts %s: %v", name, mount, err)
			}
		}
	}
}

// TestComposeConfigsAreValid loads the config every proxy mounts with the
// proxy's own loader, and checks it against the service it configures: the
// node beside it, the brokers by their hostnames, the published ports, the
// state volume and the addresses of the other proxies.
func TestComposeConfigsAreValid(t *testing.T) {
	compose := loadCompose(t)
	dockerfile := loadDockerfile(t)
	configPath, exposed := dockerfile.configPath(t), dockerfile.exposed()
	binds := map[string]string{} // proxy -> cluster.bind
	joins := map[string][]string{}
	keys := composeClusterKeys(t, compose, configPath)
	for proxy, node := range composeProxies {
		t.Run(proxy, func(t *testing.T) {
			s := compose.Services[proxy]
			file := mountedFile(t, s, configPath)
			for _, variable := range keys[proxy] {
				name, value, _ := strings.Cut(variable, "=")
				t.Setenv(name, value)
			}
			cfg, err := config.Load(filepath.Join(repositoryRoot, file), nil)
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			// Gossip and raft listen beyond loopback: protected, or no start.
			if !cfg.Cluster.RequireEncryption || !cfg.Cluster.TLS.Enabled() || cfg.Cluster.EncryptFile == "" {
				t.Errorf("%s: want cluster.encrypt_file, cluster.tls and cluster.require_encryption set", file)
			}
			if cfg.Node != node {
				t.Errorf("%s: node %q, want %q (the broker beside %s)", file, cfg.Node, node, proxy)
			}
			var backends []string
			for _, b := range cfg.Backends {
				backends = append(backends, b.Name)
				u, err := url.Parse(b.URL)
				if err != nil {
					t.Errorf("%s: backend %s: %v", file, b.Name, err)
					continue
				}
				broker, ok := compose.Services[b.Name]
				if got, want := u.Host, broker.Hostname+":"+brokerAMQPPort; !ok || got != want {
					t.Errorf("%s: backend %s at %s, want %s (the service's hostname)", file, b.Name, got, want)
				}
			}
			slices.Sort(backends)
			if !slices.Equal(backends, composeBrokers) {
				t.Errorf("%s: backends %v, want %v", file, backends, composeBrokers)
			}
			published := containerPorts(t, s.Ports)
			for _, listener := range []struct{ key, address string }{
				{"listen.amqp", cfg.Listen.AMQP}, {"listen.admin", cfg.Listen.Admin},
			} {
				if _, port := splitAddress(t, listener.address); !published[port] {
					t.Errorf("%s: %s %s: port not published by %s (ports %v)", file, listener.key, listener.address, proxy, s.Ports)
				}
			}
			if !slices.ContainsFunc(s.Volumes, func(mount string) bool {
				return !isBindSource(strings.SplitN(mount, ":", 2)[0]) && mountTarget(mount) == cfg.StateDir
			}) {
				t.Errorf("%s: state_dir %s is not on a named volume of %s (the metadata log must survive a restart)", file, cfg.StateDir, proxy)
			}
			address := serviceAddress(t, compose, proxy)
			raftBind, raftAdvertise := cfg.Cluster.RaftAddresses()
			for _, cluster := range []struct{ key, address string }{
				{"cluster.bind", cfg.Cluster.Bind}, {"cluster.raft_bind", raftBind}, {"the raft address advertised", raftAdvertise},
			} {
				// Other containers reach the image's ports whether EXPOSEd or
				// not; EXPOSE is what tells a reader of the image they exist.
				host, port := splitAddress(t, cluster.address)
				if host != address {
					t.Errorf("%s: %s on %s, want %s, the address the compose file gives %s", file, cluster.key, host, address, proxy)
				}
				if !exposed[port] {
					t.Errorf("%s: %s port %s is not EXPOSEd by the Dockerfile", file, cluster.key, port)
				}
			}
			// Every proxy of a new cluster waits for this many before the
			// metadata log is formed, so it must be the compose file's count.
			if got, want := cfg.Cluster.BootstrapExpect, len(composeProxies); got != want {
				t.Errorf("%s: cluster.bootstrap_expect %d, want %d (the proxies of the compose file)", file, got, want)
			}
			if cfg.Cluster.Bind != "" {
				binds[proxy], joins[proxy] = cfg.Cluster.Bind, cfg.Cluster.Join
			}
		})
	}
	if len(binds) != len(composeProxies) {
		return // a config that did not load has been reported
	}
	for proxy := range composeProxies {
		var want []string
		for other := range composeProxies {
			if other != proxy {
				want = append(want, binds[other])
			}
		}
		slices.Sort(want)
		got := slices.Sorted(slices.Values(joins[proxy]))
		if !slices.Equal(got, want) {
			t.Errorf("%s: cluster.join %v, want the other proxies' cluster.bind %v", proxy, got, want)
		}
	}
}

func TestComposePorts(t *testing.T) {
	compose := loadCompose(t)
	exposed := loadDockerfile(t).exposed()
	hostPorts := map[string]string{} // host port -> service
	for name, s := range compose.Services {
		for _, mapping := range s.Ports {
			host, hostPort, containerPort := parsePort(t, name, mapping)
			if other, ok := hostPorts[hostPort]; ok {
				t.Errorf("%s and %s both publish host port %s", other, name, hostPort)
			}
			hostPorts[hostPort] = name
			if _, ok := composeProxies[name]; !ok {
				continue
			}
			if !exposed[containerPort] {
				t.Errorf("%s: publishes %s, which the Dockerfile does not EXPOSE (%v)", name, containerPort, exposed)
			}
			// The admin API's token guards /api, but /metrics is open.
			if containerPort == "15680" && host != "127.0.0.1" {
				t.Errorf("%s: admin port published on %q, want 127.0.0.1", name, host)
			}
		}
	}
}

func TestDockerfile(t *testing.T) {
	d := loadDockerfile(t)
	goVersion := goDirective(t)
	stages := d.all("FROM")
	if len(stages) < 2 {
		t.Fatalf("FROM: got %d stages, want a build stage and a small final stage", len(stages))
	}
	build := d.expand(stages[0])
	if got, want := strings.Fields(build)[0], "golang:"+goVersion; got != want {
		t.Errorf("build stage FROM %s, want %s (go.mod's go directive)", got, want)
	}
	final := strings.Fields(d.expand(stages[len(stages)-1]))[0]
	if !strings.HasPrefix(final, "gcr.io/distroless/static") && !strings.HasPrefix(final, "alpine") {
		t.Errorf("final stage FROM %s, want distroless/static or alpine", final)
	}
	var goBuild string
	for _, run := range d.all("RUN") {
		if strings.Contains(run, "go build") {
			goBuild = run
		}
		if strings.Contains(run, "go run") {
			t.Errorf("RUN %s: the image is built, not run with go run", run)
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "-s -w"`} {
		if !strings.Contains(goBuild, want) {
			t.Errorf("go build %q lacks %s", goBuild, want)
		}
	}
	users := d.all("USER")
	if len(users) == 0 {
		t.Errorf("no USER: the proxy would run as root")
	} else if user := strings.SplitN(users[len(users)-1], ":", 2)[0]; user == "root" || user == "0" {
		t.Errorf("USER %s: want a user other than root", users[len(users)-1])
	}
	tests := []struct {
		instruction string
		want        []string
	}{
		{"ENTRYPOINT", []string{"amqp-mirror"}},
		{"CMD", []string{"serve", "--config", "/etc/amqp-mirror/amqp-mirror.yaml"}},
	}
	for _, tt := range tests {
		if got := d.jsonList(t, tt.instruction); !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %q, want %q", tt.instruction, got, tt.want)
		}
	}
	for _, port := range []string{"5672", "15680", "7946"} {
		if !d.exposed()[port] {
			t.Errorf("EXPOSE lacks %s", port)
		}
	}
	// The image's health check is the compose proxies' one, which
	// TestComposeTopologyOnNetworkNamespaces runs against real proxies.
	checks := d.all("HEALTHCHECK")
	if len(checks) != 1 {
		t.Fatalf("HEALTHCHECK: got %d, want one", len(checks))
	}
	_, argv, found := strings.Cut(checks[0], "CMD ")
	var got []string
	if err := json.Unmarshal([]byte(argv), &got); !found || err != nil {
		t.Fatalf("HEALTHCHECK %s: want CMD in exec form (%v)", checks[0], err)
	}
	want := loadCompose(t).Services["amqp-mirror1"].Healthcheck.Test[1:]
	if !slices.Equal(got, want) {
		t.Errorf("HEALTHCHECK runs %q, the compose proxies %q", got, want)
	}
}

// TestDockerignoreKeepsTheBuildInputs: the build stage sees the repository
// less what .dockerignore leaves out, and a pattern that drops go.mod,
// go.sum or a file of a package the binary needs would break docker build,
// which nothing here runs.
func TestDockerignoreKeepsTheBuildInputs(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repositoryRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		// A "!" line takes files back in: it cannot drop an input.
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "!") {
			continue
		}
		patterns = append(patterns, strings.Trim(filepath.ToSlash(filepath.Clean(line)), "/"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list := exec.CommandContext(ctx, "go", "list", "-deps", "-f",
		`{{if .Module}}{{if eq .Module.Path "github.com/amqp-mirror/amqp-mirror"}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}
{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}
{{end}}{{end}}{{end}}`, ".")
	list.Dir = repositoryRoot
	output, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs(repositoryRoot)
	if err != nil {
		t.Fatal(err)
	}
	inputs := []string{"go.mod", "go.sum"}
	for _, file := range strings.Fields(string(output)) {
		relative, err := filepath.Rel(root, file)
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, filepath.ToSlash(relative))
	}
	if len(inputs) < 10 {
		t.Fatalf("build inputs: got %v, want go.mod, go.sum and the Go files of the binary's packages", inputs)
	}
	for _, input := range inputs {
		// A pattern that matches a directory drops everything in it.
		parts := strings.Split(input, "/")
		for i := range parts {
			prefix := strings.Join(parts[:i+1], "/")
			for _, pattern := range patterns {
				if dockerignoreMatches(pattern, prefix) {
					t.Errorf(".dockerignore %q drops %s, which the build needs", pattern, input)
				}
			}
		}
	}
}

// dockerignoreMatches reports whether a .dockerignore pattern (root-relative,
// filepath.Match syntax, a leading **/ for any depth) matches path.
func dockerignoreMatches(pattern, path string) bool {
	if rest, ok := strings.CutPrefix(pattern, "**/"); ok {
		parts := strings.Split(path, "/")
		for i := range parts {
			if matched, _ := filepath.Match(rest, strings.Join(parts[i:], "/")); matched {
				return true
			}
		}
		return false
	}
	matched, _ := filepath.Match(pattern, path)
	return matched
}

// TestComposeConfigCommand asks Docker Compose itself to validate the file
// where a compose binary is installed; the other tests do not depend on it.
func TestComposeConfigCommand(t *testing.T) {
	command := composeCommand()
	if command == nil {
		t.Log("no docker compose or docker-compose here: the file is checked by the other TestCompose tests only")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, command[0], append(command[1:], "config", "--quiet")...)
	cmd.Dir = repositoryRoot
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s config --quiet: %v\n%s", strings.Join(command, " "), err, output)
	}
}

// composeCommand returns docker compose (the plugin) or docker-compose, or
// nil when neither runs. The plugin's presence is known only by asking it.
func composeCommand() []string {
	if _, err := exec.LookPath("docker"); err == nil {
		if exec.Command("docker", "compose", "version").Run() == nil {
			return []string{"docker", "compose"}
		}
	}
	if path, err := exec.LookPath("docker-compose"); err == nil {
		return []string{path}
	}
	return nil
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repositoryRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var compose composeFile
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return compose
}

func checkHealthcheck(t *testing.T, name string, s composeService) {
	t.Helper()
	if s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 || s.Healthcheck.Test[0] != "CMD" {
		t.Errorf("%s: healthcheck %+v, want a test in exec form [CMD, ...]", name, s.Healthcheck)
	}
}

// buildContext returns the build's context and Dockerfile, in either form.
func buildContext(t *testing.T, name string, build any) (context, dockerfile string) {
	t.Helper()
	switch b := build.(type) {
	case string:
		return b, "Dockerfile"
	case map[string]any:
		context, _ := b["context"].(string)
		dockerfile, _ := b["dockerfile"].(string)
		if dockerfile == "" {
			dockerfile = "Dockerfile"
		}
		return context, dockerfile
	}
	t.Errorf("%s: build %v: want a context path or a mapping", name, build)
	return "", ""
}

// isBindSource tells a host path (a bind mount) from a named volume.
func isBindSource(source string) bool {
	return strings.HasPrefix(source, ".") || strings.HasPrefix(source, "/") || strings.HasPrefix(source, "~")
}

// mountTarget is the path inside the container of a short-syntax mount.
func mountTarget(mount string) string {
	parts := strings.Split(mount, ":")
	if len(parts) < 2 {
		return parts[0]
	}
	return parts[1]
}

// mountedFile returns the repository path that s mounts at target.
func mountedFile(t *testing.T, s composeService, target string) string {
	t.Helper()
	for _, mount := range s.Volumes {
		if source := strings.SplitN(mount, ":", 2)[0]; mountTarget(mount) == target && isBindSource(source) {
			return source
		}
	}
	t.Fatalf("no file of the repository mounted at %s (volumes %v)", target, s.Volumes)
	return ""
}

// parsePort splits a short-syntax port mapping [host_ip:]host_port:container_port[/proto].
func parsePort(t *testing.T, name, mapping string) (host, hostPort, containerPort string) {
	t.Helper()
	parts := strings.Split(strings.SplitN(mapping, "/", 2)[0], ":")
	switch len(parts) {
	case 2:
		return "", parts[0], parts[1]
	case 3:
		return parts[0], parts[1], parts[2]
	}
	t.Errorf("%s: port %q: want [host_ip:]host_port:container_port (a published port the operator chose)", name, mapping)
	return "", "", ""
}

func containerPorts(t *testing.T, mappings []string) map[string]bool {
	t.Helper()
	ports := map[string]bool{}
	for _, mapping := range mappings {
		_, _, port := parsePort(t, "", mapping)
		ports[port] = true
	}
	return ports
}

func splitAddress(t *testing.T, address string) (host, port string) {
	t.Helper()
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		t.Errorf("address %q: %v", address, err)
	}
	return host, port
}

// serviceAddress returns the fixed IPv4 address of a service on its one
// network, checked to be inside that network's subnet.
func serviceAddress(t *testing.T, compose composeFile, name string) string {
	t.Helper()
	networks, ok := compose.Services[name].Networks.(map[string]any)
	if !ok || len(networks) != 1 {
		t.Fatalf("%s: networks %v, want one network with ipv4_address", name, compose.Services[name].Networks)
	}
	for network, settings := range networks {
		settings, _ := settings.(map[string]any)
		address, _ := settings["ipv4_address"].(string)
		ip := net.ParseIP(address)
		n, ok := compose.Networks[network]
		if ip == nil || !ok || len(n.IPAM.Config) == 0 {
			t.Fatalf("%s: network %s: ipv4_address %q, want an address in the network's ipam subnet", name, network, address)
		}
		_, subnet, err := net.ParseCIDR(n.IPAM.Config[0].Subnet)
		if err != nil || !subnet.Contains(ip) {
			t.Fatalf("%s: ipv4_address %s outside network %s's subnet %q", name, address, network, n.IPAM.Config[0].Subnet)
		}
		return address
	}
	return ""
}

// goDirective returns go.mod's go version as major.minor, the golang image's tag.
func goDirective(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repositoryRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return string(m[1])
}

// dockerfile is the Dockerfile as instructions, continuation lines joined
// and comments dropped: enough to check what it builds, not a full parser.
type dockerfile struct {
	instructions [][2]string // keyword (upper case), arguments
}

func loadDockerfile(t *testing.T) dockerfile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repositoryRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var d dockerfile
	var pending string
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && pending == "") {
			continue
		}
		if rest, ok := strings.CutSuffix(trimmed, `\`); ok {
			pending += rest + " "
			continue
		}
		instruction := strings.TrimSpace(pending + trimmed)
		pending = ""
		keyword, arguments, _ := strings.Cut(instruction, " ")
		d.instructions = append(d.instructions, [2]string{strings.ToUpper(keyword), strings.TrimSpace(arguments)})
	}
	if pending != "" {
		t.Fatalf("Dockerfile ends in a continuation line: %q", pending)
	}
	return d
}

// all returns the arguments of every instruction named keyword, in order.
func (d dockerfile) all(keyword string) []string {
	var out []string
	for _, in := range d.instructions {
		if in[0] == keyword {
			out = append(out, in[1])
		}
	}
	return out
}

// expand replaces ${NAME} with the default of ARG NAME=default.
func (d dockerfile) expand(s string) string {
	for _, arg := range d.all("ARG") {
		if name, value, ok := strings.Cut(arg, "="); ok {
			s = strings.ReplaceAll(s, "${"+name+"}", value)
		}
	}
	return s
}

// jsonList returns the exec form of the last instruction named keyword.
func (d dockerfile) jsonList(t *testing.T, keyword string) []string {
	t.Helper()
	all := d.all(keyword)
	if len(all) == 0 {
		t.Errorf("no %s", keyword)
		return nil
	}
	var list []string
	if err := json.Unmarshal([]byte(all[len(all)-1]), &list); err != nil {
		t.Errorf("%s %s: want the exec form, a JSON list: %v", keyword, all[len(all)-1], err)
	}
	return list
}

// configPath is the file serve reads: the argument of --config in CMD.
func (d dockerfile) configPath(t *testing.T) string {
	t.Helper()
	command := d.jsonList(t, "CMD")
	if i := slices.Index(command, "--config"); i >= 0 && i+1 < len(command) {
		return command[i+1]
	}
	t.Fatalf("CMD %q has no --config FILE", command)
	return ""
}

// exposed returns the EXPOSEd ports, TCP only.
func (d dockerfile) exposed() map[string]bool {
	ports := map[string]bool{}
	for _, expose := range d.all("EXPOSE") {
		for _, port := range strings.Fields(expose) {
			if number, protocol, _ := strings.Cut(port, "/"); protocol == "" || protocol == "tcp" {
				if _, err := strconv.Atoi(number); err == nil {
					ports[number] = true
				}
			}
		}
	}
	return ports
}

// composeKeysService makes the sidecar cluster's keys on a volume that every proxy
// mounts read-only.
const composeKeysService = "cluster-keys"

// composeClusterKeys runs the cluster-keys service's command as Docker would, with the
// volume it writes on a temporary directory, and returns for each proxy the
// environment that points its config's key files (cluster.encrypt_file, cluster.tls.*)
// at that directory instead of where the proxy's container mounts the volume. It fails
// the test if the service and the proxies do not share one volume, or a config names a
// key file outside it.
func composeClusterKeys(t *testing.T, compose composeFile, configPath string) map[string][]string {
	t.Helper()
	keys, ok := compose.Services[composeKeysService]
	if !ok || len(keys.Volumes) != 1 {
		t.Fatalf("want a service %s with one volume, found %+v", composeKeysService, keys)
	}
	volume, written := strings.SplitN(keys.Volumes[0], ":", 2)[0], mountTarget(keys.Volumes[0])
	var args []string
	command, _ := keys.Command.([]any)
	for _, a := range command {
		args = append(args, fmt.Sprint(a))
	}
	dirAt := slices.Index(args, "--dir")
	if len(args) == 0 || args[0] != "keygen" || dirAt < 0 || dirAt+1 >= len(args) || args[dirAt+1] != written {
		t.Fatalf("%s: command %v, want keygen --dir %s (its volume)", composeKeysService, args, written)
	}
	dir := t.TempDir()
	args[dirAt+1] = dir
	// Twice: the service runs at every `up` and must keep what is there.
	for range 2 {
		if res := newCLI(t).run(t, nil, args...); res.code != 0 {
			t.Fatalf("%s: amqp-mirror %s: exit %d: %s", composeKeysService, strings.Join(args, " "), res.code, res.stderr)
		}
	}

	env := map[string][]string{}
	for proxy := range composeProxies {
		s := compose.Services[proxy]
		if got := s.DependsOn[composeKeysService].Condition; got != "service_completed_successfully" {
			t.Errorf("%s: depends_on %s: condition %q, want service_completed_successfully", proxy, composeKeysService, got)
		}
		var mounted string
		for _, m := range s.Volumes {
			if strings.SplitN(m, ":", 2)[0] == volume {
				mounted = mountTarget(m)
				if !strings.HasSuffix(m, ":ro") {
					t.Errorf("%s: mounts %s writable, want :ro", proxy, m)
				}
			}
		}
		if mounted == "" {
			t.Fatalf("%s does not mount the %s volume", proxy, volume)
		}
		data, err := os.ReadFile(filepath.Join(repositoryRoot, mountedFile(t, s, configPath)))
		if err != nil {
			t.Fatal(err)
		}
		var file struct {
			Cluster struct {
				EncryptFile string `yaml:"encrypt_file"`
				TLS         struct{ CA, Cert, Key string }
			}
		}
		if err := yaml.Unmarshal(data, &file); err != nil {
			t.Fatal(err)
		}
		for key, path := range map[string]string{
			"cluster.encrypt_file": file.Cluster.EncryptFile, "cluster.tls.ca": file.Cluster.TLS.CA,
			"cluster.tls.cert": file.Cluster.TLS.Cert, "cluster.tls.key": file.Cluster.TLS.Key,
		} {
			rest, ok := strings.CutPrefix(path, mounted+"/")
			if !ok {
				t.Fatalf("%s: %s %q is not on the %s volume mounted at %s", proxy, key, path, volume, mounted)
			}
			env[proxy] = append(env[proxy], config.EnvName(key)+"="+filepath.Join(dir, rest))
		}
	}
	return env
}

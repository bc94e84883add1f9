package admin

import (
	"bytes"
	"context"
	_ "embed"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// The status page: one server-rendered HTML page on the admin listener
// (GET / and /status) for a person with a browser, showing what ctl
// cluster_status, list_queues and the failover history say. It is
// read-only and served without a token, like /metrics, so it shows
// nothing secret: names, states and addresses of listeners, never a
// backend's URL or a credential. html/template escapes every value (queue
// names are the clients' input); the page loads nothing from elsewhere and
// runs no script, which its Content-Security-Policy enforces.

//go:embed status.html
var statusHTML string

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"list":     func(s []string) string { return strings.Join(s, ", ") },
	"duration": func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"clock":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
}).Parse(statusHTML))

// statusPageQueues bounds the queues the page lists, so that an install
// with many thousands of queues gets a page a browser shows at once; the
// page says how many it left out.
const statusPageQueues = 500

// statusPageFailovers bounds the failovers the page lists, newest first.
const statusPageFailovers = 50

// statusPageWait bounds the questions the page asks the other proxies of
// a sidecar cluster: a proxy that does not answer leaves its failovers
// out, and the page says so.
const statusPageWait = 2 * time.Second

// statusRefresh is how often the page reloads itself.
const statusRefresh = 5

// statusPage is what the template shows.
type statusPage struct {
	Generated time.Time
	Refresh   int
	// Ready is /readyz's verdict: "" when ready, else why not.
	NotReady string
	Cluster  *ClusterStatus // nil without views
	// Queues are the first statusPageQueues queues by vhost and name, of
	// QueueCount; Mirroring is false with one backend (no queue list).
	Queues     []queueLine
	QueueCount int
	Mirroring  bool
	Failovers  []mirror.Failover
	// Problems are what the page could not find out, in words.
	Problems []string
}

// queueLine is one queue row of the page.
type queueLine struct {
	VHost, Name, Master, Policy string
	Slaves, Synchronised        []string
	Syncing                     []string
	// SyncCopied is how many messages the sync copied so far.
	SyncCopied int
	// Unsynchronised are the slaves not synchronised and not syncing.
	Unsynchronised []string
}

// statusPage serves GET / and GET /status.
func (s *Server) statusPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), statusPageWait)
	defer cancel()
	page := s.gatherStatus(ctx)
	var b bytes.Buffer
	if err := statusTemplate.Execute(&b, page); err != nil {
		s.logger.Warn("status page: rendering failed", "err", err)
		http.Error(w, "the status page could not be rendered", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	_, _ = w.Write(b.Bytes())
}

// gatherStatus asks the views what the page shows; what it cannot learn
// becomes a problem line, never a failed page.
func (s *Server) gatherStatus(ctx context.Context) statusPage {
	page := statusPage{Generated: time.Now(), Refresh: statusRefresh}
	if s.ready != nil {
		if err := s.ready(); err != nil {
			page.NotReady = err.Error()
		}
	}
	if s.views == nil {
		return page
	}
	if st, err := s.views.ClusterStatus(ctx); err != nil {
		page.Problems = append(page.Problems, "cluster status: "+err.Error())
	} else {
		page.Cluster = &st
		page.Mirroring = st.Mirroring
	}
	page.Queues, page.QueueCount = queueLines(s.views.Queues(), statusPageQueues)
	failovers, err := s.views.Failovers(ctx)
	if err != nil {
		page.Problems = append(page.Problems, "failovers: "+strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	slices.SortFunc(failovers, func(a, b mirror.Failover) int { return b.PromotedAt.Compare(a.PromotedAt) })
	page.Failovers = failovers[:min(len(failovers), statusPageFailovers)]
	return page
}

// queueLines sorts the queues by vhost and name and returns the first
// limit as page rows, with the count of all.
func queueLines(queues []mirror.QueueStatus, limit int) ([]queueLine, int) {
	slices.SortFunc(queues, func(a, b mirror.QueueStatus) int {
		if c := strings.Compare(a.Meta.ID.VHost, b.Meta.ID.VHost); c != 0 {
			return c
		}
		return strings.Compare(a.Meta.ID.Name, b.Meta.ID.Name)
	})
	lines := make([]queueLine, 0, min(len(queues), limit))
	for _, q := range queues[:min(len(queues), limit)] {
		line := queueLine{
			VHost: q.Meta.ID.VHost, Name: q.Meta.ID.Name, Master: q.Meta.Master, Policy: q.Policy,
			Slaves: slaveNames(q.Meta.Slaves), Synchronised: q.Meta.SynchronisedSlaves(), Syncing: q.Syncing,
			SyncCopied: q.SyncCopied,
		}
		for _, sl := range q.Meta.Slaves {
			if !sl.Synchronised && !slices.Contains(q.Syncing, sl.Backend) {
				line.Unsynchronised = append(line.Unsynchronised, sl.Backend)
			}
		}
		lines = append(lines, line)
	}
	return lines, len(queues)
}

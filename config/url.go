package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
)

// redactedPassword replaces a password wherever a URL is shown, as
// RabbitMQ shows amqp://user:xxxxx@host in its own logs.
const redactedPassword = "xxxxx"

// RedactURL returns raw with its password replaced by xxxxx, for error
// messages and logs. It works on text that url.Parse refuses too (an
// unclosed IPv6 bracket, an unescaped '/' in the password): the password is
// taken to run from the first ':' after the scheme to the last '@', the way
// a person writing user:password@host means it. Text without a password is
// returned unchanged.
func RedactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil && !hiddenAuthority(raw) {
		if _, has := u.User.Password(); has {
			return u.Redacted()
		}
		return raw
	}
	start := 0
	if i := strings.Index(raw, "://"); i >= 0 {
		start = i + len("://")
	}
	at := strings.LastIndex(raw[start:], "@")
	if at < 0 {
		return raw
	}
	at += start
	colon := strings.Index(raw[start:at], ":")
	if colon < 0 {
		return raw
	}
	colon += start
	return raw[:colon+1] + redactedPassword + raw[at:]
}

// hiddenAuthority reports whether raw has a user:password@ that url.Parse
// does not see, as in amqp://user:12/ss@host/: url.Parse ends the authority
// at the first '/', reads "12" as a port and the rest as a path, so its
// Redacted would show the whole password.
func hiddenAuthority(raw string) bool {
	rest := raw
	if i := strings.Index(raw, "://"); i >= 0 {
		rest = raw[i+len("://"):]
	}
	end := strings.IndexAny(rest, "/?#")
	at := strings.LastIndex(rest, "@")
	return end >= 0 && at > end && strings.Contains(rest[:at], ":")
}

// LogValue shows a backend in logs with its URL's password redacted, so a
// logger given a Backend can never print the password.
func (b Backend) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", b.Name), slog.String("url", RedactURL(b.URL)))
}

// String is the backend's name and redacted URL.
func (b Backend) String() string { return b.Name + " " + RedactURL(b.URL) }

const wantBackendURL = "an amqp:// or amqps:// URL"

// checkBackendURL returns "" or what is wrong with a backend URL. Every
// message shows the URL with its password redacted.
func checkBackendURL(raw string) string {
	shown := strconv.Quote(RedactURL(raw))
	u, err := url.Parse(raw)
	if err == nil && hiddenAuthority(raw) && u.User == nil {
		err = errors.New("unescaped character before '@'")
	}
	if err != nil {
		return fmt.Sprintf("expected %s, found %s (%s)", wantBackendURL, shown, urlProblem(raw))
	}
	switch {
	case u.Scheme != "amqp" && u.Scheme != "amqps":
		return fmt.Sprintf("expected %s, found scheme %q in %s", wantBackendURL, u.Scheme, shown)
	case u.Hostname() == "":
		return fmt.Sprintf("expected a URL with a host, found %s", shown)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("expected a port from 1 to 65535, found %s in %s", p, shown)
		}
	}
	return ""
}

// urlProblem says why url.Parse refused raw without quoting raw's
// password: the reason is taken from parsing the redacted text, whose
// password is xxxxx. When only the real password made raw unparseable, the
// cause is a character the password should have percent-encoded.
func urlProblem(raw string) string {
	_, err := url.Parse(RedactURL(raw))
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	if err != nil {
		return err.Error()
	}
	return "a character in the user name or password, such as / ? # @ % or :, must be percent-encoded"
}

package publish

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// SplitURLs splits a Config.URL value into its URLs: one URL, or several
// separated by commas (the nodes of a cluster, tried in turn). Spaces around
// a comma are ignored; a comma inside a password must be written %2C. It
// refuses an empty element and a URL that does not parse or whose scheme is
// not amqp or amqps, with a message naming the fix and no password.
func SplitURLs(raw string) ([]string, error) {
	parts := strings.Split(raw, ",")
	urls := make([]string, 0, len(parts))
	for i, part := range parts {
		u := strings.TrimSpace(part)
		if u == "" {
			if len(parts) == 1 {
				return nil, fmt.Errorf("Config.URL is empty: give the broker's URL, amqp://user:pass@host:5672/vhost")
			}
			return nil, fmt.Errorf("Config.URL %s: URL %d of %d is empty (two commas in a row, or a comma at an end): remove the extra comma",
				redact.URL(raw), i+1, len(parts))
		}
		uri, err := amqp.ParseURI(u)
		if err != nil {
			// A parse error quotes the URL, and a piece of the password where
			// it cut one out: redact.ParseError masks both.
			return nil, fmt.Errorf("Config.URL %s: %v; the form is amqp://user:pass@host:5672/vhost (amqps:// for TLS), "+
				"and several nodes are separated by commas, each URL with its scheme", redact.URL(u), redact.ParseError(err, u))
		}
		if uri.Port < 1 || uri.Port > 65535 {
			return nil, fmt.Errorf("Config.URL %s: port %d out of range 1..65535", redact.URL(u), uri.Port)
		}
		urls = append(urls, u)
	}
	return urls, nil
}

// nodeOf is the host:port of an AMQP URL that SplitURLs accepted: how logs,
// readiness and metrics name a broker node, never with credentials.
func nodeOf(rawURL string) string {
	uri, err := amqp.ParseURI(rawURL)
	if err != nil {
		return redact.URL(rawURL)
	}
	return net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
}

package relay

import (
	"errors"
	"testing"

	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// Two services' databases on one server, each with a relay of the default
// name: the name's lock is the server's, so the second relay stops with a
// ConfigError naming the database whose relay leads and the way out, and
// the first delivers its stream whole, its term untouched (one epoch).
func TestSecondDatabaseSameRelayNameRefused(t *testing.T) {
	t.Parallel()
	const name = "same-name" // of this test only: the others run beside it on the shared server
	first, b := setup(t)
	second := testenv.MySQL(t)
	second.Migrate(testenv.WorkContext(t), t)
	v := consume(t, b, b.Queue)
	startRelay(t, first, b, func(c *Config) { c.RelayName = name })
	ctx := testenv.WorkContext(t)

	rr := runRelay(t, Config{MySQLDSN: second.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, RelayName: name}, nil)
	err := exitErr(t, rr, "the second database's relay went on")
	var cfgErr *ConfigError
	var taken *leadership.NameTakenError
	if !errors.As(err, &cfgErr) || !errors.As(err, &taken) || taken.Other != first.Name || taken.Database != second.Name {
		t.Fatalf("second database's relay: %v, want a ConfigError naming database %s as the leader's", err, first.Name)
	}

	produce(ctx, t, first, b, v, load{producers: 2, partitions: 5, total: 300})
	waitReceived(ctx, t, v, 300)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	var epoch int64
	if err := first.SQL.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ?", name).Scan(&epoch); err != nil || epoch != 1 {
		t.Fatalf("the first relay's epoch %d (%v): want 1, its term never ended", epoch, err)
	}
}

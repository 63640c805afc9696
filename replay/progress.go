package replay

import (
	"context"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/position"
)

// Progress is a replay's state, for a progress line or log.
type Progress struct {
	Messages  int           // published so far (dry run: counted)
	Confirmed int           // confirmed by the broker so far
	Elapsed   time.Duration // since the stream started
	// Rate is messages per second since the previous Progress.
	Rate float64
	// Done is the share of the range read, 0 to 1, counted in
	// transactions (GTID sequence numbers); -1 when unknown (file
	// positions). ETA is the time left at the average pace so far; -1 when
	// unknown.
	Done float64
	ETA  time.Duration
	// Position is the position after the last transaction read.
	Position position.Position
	// Final: the last Progress of the replay (the stream has ended).
	Final bool
}

// fraction estimates how much of the range from..to a stream at cur has
// read, counting transactions by GTID: on MariaDB the sequence numbers per
// domain, on MySQL the number of GTIDs. -1 when it cannot tell.
func fraction(flavor string, from, to, cur position.Position) float64 {
	if to.GTIDSet == "" || cur.GTIDSet == "" && cur.File != "" {
		return -1
	}
	var total, done float64
	switch flavor {
	case canal.FlavorMariaDB:
		f, t, c := mariaSeqs(from.GTIDSet), mariaSeqs(to.GTIDSet), mariaSeqs(cur.GTIDSet)
		if t == nil || f == nil || c == nil {
			return -1
		}
		for d, end := range t {
			start := min(f[d], end)
			total += float64(end - start)
			done += float64(min(max(c[d], start), end) - start)
		}
	case canal.FlavorMySQL:
		f, t, c := mysqlCount(from.GTIDSet), mysqlCount(to.GTIDSet), mysqlCount(cur.GTIDSet)
		if f < 0 || t < 0 || c < 0 {
			return -1
		}
		total, done = float64(t-f), float64(min(c, t)-f)
	default:
		return -1
	}
	if total <= 0 {
		return -1
	}
	return min(max(done/total, 0), 1)
}

// mariaSeqs is a MariaDB position's sequence number per domain; nil when it
// does not parse. "" is the empty map.
func mariaSeqs(s string) map[uint32]uint64 {
	set, err := mysql.ParseMariadbGTIDSet(s)
	if err != nil {
		return nil
	}
	out := map[uint32]uint64{}
	for d, g := range set.(*mysql.MariadbGTIDSet).Sets {
		out[d] = g.SequenceNumber
	}
	return out
}

// mysqlCount is the number of GTIDs in a MySQL set; -1 when it does not
// parse.
func mysqlCount(s string) int64 {
	set, err := mysql.ParseMysqlGTIDSet(s)
	if err != nil {
		return -1
	}
	var n int64
	for _, tags := range *set.(*mysql.MysqlGTIDSet) {
		for _, ivs := range tags {
			for _, iv := range ivs {
				n += iv.Stop - iv.Start
			}
		}
	}
	return n
}

// eta is the time left at the average pace so far, -1 when unknown.
func eta(elapsed time.Duration, done float64) time.Duration {
	if done <= 0 || elapsed <= 0 {
		return -1
	}
	return time.Duration(float64(elapsed) * (1 - done) / done)
}

// limiter is a token bucket: rate tokens per second, holding at most burst.
// Only one goroutine uses it (the stream's).
type limiter struct {
	rate, burst, tokens float64
	last                time.Time
	now                 func() time.Time
	sleep               func(context.Context, time.Duration) error
}

// newLimiter returns a limiter of rate per second, nil (no limit) for 0. The
// burst is a tenth of a second's worth, at least one message, so the rate
// holds over any second, not only on average.
func newLimiter(rate float64) *limiter {
	if rate <= 0 {
		return nil
	}
	burst := max(1, rate/10)
	return &limiter{rate: rate, burst: burst, tokens: burst, now: time.Now, sleep: sleepCtx}
}

// wait takes one token, sleeping until there is one or ctx ends.
func (l *limiter) wait(ctx context.Context) error {
	if l == nil {
		return nil
	}
	now := l.now()
	if !l.last.IsZero() {
		l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	}
	l.last = now
	if l.tokens >= 1 {
		l.tokens--
		return nil
	}
	need := time.Duration((1 - l.tokens) / l.rate * float64(time.Second))
	if err := l.sleep(ctx, need); err != nil {
		return err
	}
	// The sleep produced exactly the missing share of the token, which
	// this message takes.
	l.tokens = 0
	l.last = l.last.Add(need)
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

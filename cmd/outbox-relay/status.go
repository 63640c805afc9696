package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func init() {
	register(&command{
		name:    "status",
		summary: "show each relay's status, leader, standbys, checkpoint and backlog",
		help: `Reads outbox_relay_progress (every relay name, or --relay-name's),
outbox_relay_instances, the outbox table (--table) and outbox_failed; changes
nothing.

leader is none when the row names no leader (never started, or stopped
cleanly). A leader whose heartbeat is older than --leader-lease (give run's
value) is shown as not alive: the process is gone or stuck, and the next run
or a standby takes over. standbys lists the other processes of the relay name
waiting for leadership (none when there are none), each with its start and
the age of its heartbeat; a standby beats at least every 4/5 of the lease, so one whose
heartbeat is older than --leader-lease is shown as not alive: it was killed or
hangs (a clean stop removes it from the list; a dead one is listed for an
hour). table is the outbox table the relay name's leaders publish (unknown
until a leader of this version has run); other relay names lists every other
relay name recorded on the same table, each with its status and leader: one
table is published by one relay name, and a second one is refused while the
first leads (docs/operations.md, "Several instances"). broker is the RabbitMQ node the leader publishes to (none while it is
not connected, paused, or no leader runs) and, once the broker has not
confirmed the messages on the wire for 10s, since when. pending_rows counts
the rows not yet delivered: with --on-delivered=delete every row of the
table, with mark those whose delivered_at is NULL (give run's value). retention_headroom_seconds is how
long the checkpoint's binlog file is certain to survive the server's expiry;
null when unknown (polling, no binlog, or no expiry bound).

--json prints an array with one object per relay name. Exit codes: 0 done, 1
a database failure, 2 bad usage or an unknown relay name.`,
		setup: setupStatus,
	})
}

// readFlags are what status, pause, resume and checkpoint read the
// database with.
type readFlags struct {
	*dbFlags
	onDelivered string
	lease       time.Duration
}

func declareRead(fs *flag.FlagSet, relayHelp, relayDefault string) *readFlags {
	r := &readFlags{dbFlags: declareDB(fs, relayHelp, relayDefault, "print JSON for scripts instead of text for people")}
	fs.DurationVar(&r.lease, "leader-lease", leadership.DefaultLeaderLease, "run's --leader-lease: a leader whose heartbeat is older is shown as not alive")
	return r
}

// open checks the flags and connects to the database.
func (r *readFlags) open(ctx context.Context) (*sql.DB, error) {
	if _, err := outbox.QuoteTable(r.table); err != nil {
		return nil, usagef("--table: %v", err)
	}
	if r.lease <= 0 {
		return nil, usagef("--leader-lease %s: want a positive duration", r.lease)
	}
	db, _, err := openMySQL(ctx, r.mysql)
	return db, err
}

// unknownRelay makes a missing relay name bad usage (exit 2).
func unknownRelay(err error) error {
	if errors.Is(err, operator.ErrUnknownRelay) {
		return &usageError{err}
	}
	return err
}

func setupStatus(fs *flag.FlagSet) runFunc {
	r := declareRead(fs, "show only this relay `name`; default every relay name", "")
	fs.StringVar(&r.onDelivered, "on-delivered", checkpoint.Delete, "run's --on-delivered (delete|mark): which rows count as pending")
	return func(ctx context.Context, inv *invocation) error {
		if err := noArgs(inv, "status"); err != nil {
			return err
		}
		if r.onDelivered != checkpoint.Delete && r.onDelivered != checkpoint.Mark {
			return usagef("--on-delivered %q: want delete or mark", r.onDelivered)
		}
		db, err := r.open(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		list, err := readStatus(ctx, db, r)
		if err != nil {
			return unknownRelay(err)
		}
		return render(inv.stdout, r.json, list, func(w io.Writer) error { return printStatus(w, list) })
	}
}

// statusJSON is one relay's status (docs/operations.md, "Status and checkpoint").
type statusJSON struct {
	RelayName               string            `json:"relay_name"`
	Table                   *string           `json:"table"`
	OtherRelayNames         []tableRelayJSON  `json:"other_relay_names"`
	Status                  string            `json:"status"`
	Paused                  *pausedJSON       `json:"paused"`
	Failed                  *failedStatusJSON `json:"failed"`
	Mode                    string            `json:"mode"`
	ModeReason              *string           `json:"mode_reason"`
	Epoch                   int64             `json:"epoch"`
	Leader                  *leaderJSON       `json:"leader"`
	Broker                  *brokerJSON       `json:"broker"`
	Standbys                []standbyJSON     `json:"standbys"`
	Checkpoint              checkpointJSON    `json:"checkpoint"`
	PendingRows             int64             `json:"pending_rows"`
	OldestPendingAgeSeconds *float64          `json:"oldest_pending_age_seconds"`
	FailedRows              int64             `json:"failed_rows"`
	RetentionHeadroom       *float64          `json:"retention_headroom_seconds"`
	ErrorCount              int64             `json:"error_count"`
	LastError               *string           `json:"last_error"`
	LastEventAt             *time.Time        `json:"last_event_at"`
}

// pausedJSON is a pause: since when, for how long, and whether the leader
// has stopped (false while it finishes in-flight messages, or with no leader).
type pausedJSON struct {
	Since         *time.Time `json:"since"`
	Seconds       float64    `json:"seconds"`
	LeaderStopped bool       `json:"leader_stopped"`
}

func pausedOf(s operator.RelayStatus) *pausedJSON {
	if s.Paused == nil {
		return nil
	}
	return &pausedJSON{Since: timeOrNull(s.Paused.Since), Seconds: math.Round(s.Paused.Seconds*1000) / 1000, LeaderStopped: s.Paused.Stopped}
}

// failedStatusJSON is a FAILED status: since when; the reason is last_error.
type failedStatusJSON struct {
	Since   *time.Time `json:"since"`
	Seconds float64    `json:"seconds"`
}

func failedOf(s operator.RelayStatus) *failedStatusJSON {
	if s.Failed == nil {
		return nil
	}
	return &failedStatusJSON{Since: timeOrNull(s.Failed.Since), Seconds: math.Round(s.Failed.Seconds*1000) / 1000}
}

func failedText(f *failedStatusJSON) string {
	if f == nil {
		return ""
	}
	since := "?"
	if f.Since != nil {
		since = utcText(*f.Since)
	}
	return fmt.Sprintf(" since %s (%s ago; the leader stopped on the last error below, which a restart does not cure)",
		since, time.Duration(f.Seconds*float64(time.Second)).Round(time.Second))
}

func pausedText(p *pausedJSON) string {
	if p == nil {
		return ""
	}
	since := "?"
	if p.Since != nil {
		since = utcText(*p.Since)
	}
	state := "the leader has stopped"
	if !p.LeaderStopped {
		state = "no leader has stopped for it yet"
	}
	return fmt.Sprintf(" since %s (%s; %s)", since, time.Duration(p.Seconds*float64(time.Second)).Round(time.Second), state)
}

// brokerJSON is the RabbitMQ node the leader publishes to and, when the
// broker has stopped confirming, since when; null when the row names none.
type brokerJSON struct {
	Node            string            `json:"node"`
	ConfirmsStalled *failedStatusJSON `json:"confirms_stalled"`
}

func brokerOf(s operator.RelayStatus) *brokerJSON {
	if s.Broker == nil {
		return nil
	}
	b := &brokerJSON{Node: s.Broker.Node}
	if st := s.Broker.Stalled; st != nil {
		b.ConfirmsStalled = &failedStatusJSON{Since: timeOrNull(st.Since), Seconds: math.Round(st.Seconds*1000) / 1000}
	}
	return b
}

// brokerText is status's broker line: the node, and a stall of confirms
// with how long and since when.
func brokerText(b *brokerJSON) string {
	if b == nil {
		return "none (not connected, or no leader)"
	}
	if b.ConfirmsStalled == nil {
		return b.Node
	}
	since := "?"
	if b.ConfirmsStalled.Since != nil {
		since = utcText(*b.ConfirmsStalled.Since)
	}
	return fmt.Sprintf("%s, no publisher confirms for %s (since %s; the messages are held, not given up)", b.Node,
		time.Duration(b.ConfirmsStalled.Seconds*float64(time.Second)).Round(time.Second), since)
}

// tableRelayJSON is another relay name recorded on the same outbox table:
// its status and leader (null when its row names none).
type tableRelayJSON struct {
	RelayName string      `json:"relay_name"`
	Status    string      `json:"status"`
	Leader    *leaderJSON `json:"leader"`
}

// othersOnTable lists the relay names other than s's whose rows record s's
// table, from every progress row. Never nil: JSON shows [] when there is
// none, or when s's table is not recorded yet.
func othersOnTable(s operator.RelayStatus, all []operator.RelayStatus) []tableRelayJSON {
	list := []tableRelayJSON{}
	for _, o := range all {
		if s.Table != "" && o.Table == s.Table && o.RelayName != s.RelayName {
			list = append(list, tableRelayJSON{RelayName: o.RelayName, Status: o.Status, Leader: leaderOf(o)})
		}
	}
	return list
}

// othersText lists the other relay names of a table on one line.
func othersText(list []tableRelayJSON) string {
	if len(list) == 0 {
		return "none"
	}
	parts := make([]string, len(list))
	for i, o := range list {
		parts[i] = fmt.Sprintf("%s: %s, leader %s", o.RelayName, o.Status, leaderText(o.Leader))
	}
	return strings.Join(parts, "; ")
}

type leaderJSON struct {
	Instance            string     `json:"instance"`
	Since               *time.Time `json:"since"`
	HeartbeatAgeSeconds float64    `json:"heartbeat_age_seconds"`
	Alive               bool       `json:"alive"`
}

// standbyJSON is a process of the relay name waiting for leadership, from
// outbox_relay_instances. Alive is false when its heartbeat is older than
// the lease: it was killed or hangs.
type standbyJSON struct {
	Instance            string    `json:"instance"`
	StartedAt           time.Time `json:"started_at"`
	HeartbeatAgeSeconds float64   `json:"heartbeat_age_seconds"`
	Alive               bool      `json:"alive"`
}

type checkpointJSON struct {
	Flavor     *string `json:"flavor"`
	GTIDSet    *string `json:"gtid_set"`
	BinlogFile *string `json:"binlog_file"`
	BinlogPos  *uint32 `json:"binlog_pos"`
}

func orNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func timeOrNull(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func leaderOf(s operator.RelayStatus) *leaderJSON {
	if s.Leader == nil {
		return nil
	}
	return &leaderJSON{Instance: s.Leader.Instance, Since: timeOrNull(s.Leader.Since),
		HeartbeatAgeSeconds: math.Round(s.Leader.HeartbeatAgeSeconds*1000) / 1000, Alive: s.Leader.Alive}
}

// standbysOf picks the relay's standbys out of every instance row: role
// standby, and not the instance the progress row names as leader (a standby
// that has just taken over, before its first beat as leader). Alive or not.
// Never nil: JSON shows [] when there is none.
func standbysOf(s operator.RelayStatus, instances []operator.InstanceState) []standbyJSON {
	list := []standbyJSON{}
	for _, in := range instances {
		if in.RelayName != s.RelayName || in.Role != leadership.RoleStandby || s.Leader != nil && in.Instance == s.Leader.Instance {
			continue
		}
		list = append(list, standbyJSON{Instance: in.Instance, StartedAt: in.StartedAt,
			HeartbeatAgeSeconds: math.Round(in.HeartbeatAgeSeconds*1000) / 1000, Alive: in.Alive})
	}
	return list
}

func checkpointOf(s operator.RelayStatus) checkpointJSON {
	c := checkpointJSON{Flavor: orNull(s.Position.Flavor), GTIDSet: orNull(s.Position.GTIDSet), BinlogFile: orNull(s.Position.File)}
	if s.Position.File != "" {
		p := s.Position.Pos
		c.BinlogPos = &p
	}
	return c
}

// readStatus gathers the progress rows, the standbys, the backlog and the
// retention headroom. The headroom is best effort: a server without binlogs, without
// expiry, or a position it cannot place gives null, not a failure.
func readStatus(ctx context.Context, db *sql.DB, r *readFlags) ([]statusJSON, error) {
	rows, err := operator.ReadStatus(ctx, db, r.relayName, r.lease)
	if err != nil {
		return nil, err
	}
	all := rows
	if r.relayName != "" {
		// The other relay names of the same table.
		if all, err = operator.ReadStatus(ctx, db, "", r.lease); err != nil {
			return nil, err
		}
	}
	instances, err := operator.ReadInstances(ctx, db, r.relayName, r.lease)
	if err != nil {
		return nil, err
	}
	backlog, err := operator.ReadBacklog(ctx, db, r.table, r.onDelivered)
	if err != nil {
		return nil, err
	}
	retention, retErr := metrics.ReadBinlogRetention(ctx, db)
	list := make([]statusJSON, 0, len(rows))
	for _, s := range rows {
		j := statusJSON{RelayName: s.RelayName, Table: orNull(s.Table), OtherRelayNames: othersOnTable(s, all), Status: s.Status, Paused: pausedOf(s), Failed: failedOf(s), Mode: s.Mode, ModeReason: orNull(flagNames(s.ModeReason)),
			Epoch: s.Epoch, Leader: leaderOf(s), Broker: brokerOf(s), Standbys: standbysOf(s, instances), Checkpoint: checkpointOf(s),
			PendingRows: backlog.PendingRows, OldestPendingAgeSeconds: backlog.OldestPendingAgeSeconds,
			FailedRows: backlog.FailedRows, ErrorCount: s.ErrorCount, LastError: orNull(flagNames(s.LastError)),
			LastEventAt: timeOrNull(s.LastEventAt)}
		if retErr == nil && s.Mode == "binlog" && s.Position.File != "" {
			// Purged is a headroom of 0; no expiry (+Inf) has no JSON
			// number and shows as null, like unknown.
			h, err := retention.Headroom(s.Position.File, s.LastEventAt)
			if errors.Is(err, metrics.ErrBinlogPurged) || err == nil && !math.IsNaN(h) && !math.IsInf(h, 0) {
				h = max(h, 0)
				j.RetentionHeadroom = &h
			}
		}
		list = append(list, j)
	}
	return list, nil
}

func printStatus(w io.Writer, list []statusJSON) error {
	if len(list) == 0 {
		_, err := fmt.Fprintln(w, "no relay has a progress row yet: none has run against this database")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for i, s := range list {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "relay\t%s\n", s.RelayName)
		table := "unknown (no leader of this version has run)"
		if s.Table != nil {
			table = *s.Table
		}
		fmt.Fprintf(tw, "table\t%s\n", table)
		fmt.Fprintf(tw, "other relay names\t%s\n", othersText(s.OtherRelayNames))
		fmt.Fprintf(tw, "status\t%s%s%s\n", s.Status, pausedText(s.Paused), failedText(s.Failed))
		for i, line := range wrapText(s.Mode+paren(s.ModeReason), statusWidth) {
			label := "mode"
			if i > 0 {
				label = ""
			}
			fmt.Fprintf(tw, "%s\t%s\n", label, line)
		}
		fmt.Fprintf(tw, "epoch\t%d\n", s.Epoch)
		fmt.Fprintf(tw, "leader\t%s\n", leaderText(s.Leader))
		fmt.Fprintf(tw, "broker\t%s\n", brokerText(s.Broker))
		fmt.Fprintf(tw, "standbys\t%s\n", standbysText(s.Standbys))
		fmt.Fprintf(tw, "checkpoint\t%s\n", checkpointText(s.Checkpoint))
		fmt.Fprintf(tw, "pending rows\t%d%s\n", s.PendingRows, ageText(", oldest ", s.OldestPendingAgeSeconds, " old"))
		fmt.Fprintf(tw, "failed rows\t%d\n", s.FailedRows)
		fmt.Fprintf(tw, "retention headroom\t%s\n", ageText("", s.RetentionHeadroom, ""))
		fmt.Fprintf(tw, "errors\t%d%s\n", s.ErrorCount, paren(s.LastError))
		fmt.Fprintf(tw, "last event\t%s\n", timeText(s.LastEventAt))
	}
	return tw.Flush()
}

// statusWidth is the width status's text wraps a long value at (the mode
// reason of poll mode is a paragraph).
const statusWidth = 76

// wrapText breaks s at spaces into lines of at most width bytes (a longer
// word has a line of its own).
func wrapText(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return append(lines, line)
}

func paren(s *string) string {
	if s == nil {
		return ""
	}
	return " (" + *s + ")"
}

func leaderText(l *leaderJSON) string {
	if l == nil {
		return "none"
	}
	return processText(l.Instance, l.Since, l.HeartbeatAgeSeconds, l.Alive)
}

// processText is one relay process, leader or standby, for people.
func processText(instance string, since *time.Time, heartbeatAge float64, alive bool) string {
	state := "alive"
	if !alive {
		state = "NOT ALIVE (heartbeat older than the lease)"
	}
	at := "?"
	if since != nil {
		at = utcText(*since)
	}
	return fmt.Sprintf("%s since %s, heartbeat %ss ago, %s", instance, at,
		strconv.FormatFloat(heartbeatAge, 'f', 1, 64), state)
}

// standbysText lists the standbys on one line, like leaderText each.
func standbysText(list []standbyJSON) string {
	if len(list) == 0 {
		return "none"
	}
	parts := make([]string, len(list))
	for i, sb := range list {
		parts[i] = processText(sb.Instance, &sb.StartedAt, sb.HeartbeatAgeSeconds, sb.Alive)
	}
	return strings.Join(parts, "; ")
}

func checkpointText(c checkpointJSON) string {
	var out string
	if c.GTIDSet != nil {
		out = "gtid " + *c.GTIDSet
	}
	if c.BinlogFile != nil {
		if out != "" {
			out += ", "
		}
		out += fmt.Sprintf("file %s pos %d", *c.BinlogFile, *c.BinlogPos)
	}
	if out == "" {
		return "none"
	}
	return out
}

func ageText(prefix string, secs *float64, suffix string) string {
	if secs == nil {
		if prefix == "" {
			return "unknown"
		}
		return ""
	}
	return prefix + (time.Duration(*secs * float64(time.Second))).Round(time.Second).String() + suffix
}

func timeText(t *time.Time) string {
	if t == nil {
		return "none"
	}
	return utcText(*t)
}

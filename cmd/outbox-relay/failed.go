package main

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/maintenance"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func init() {
	register(&command{
		name:    "failed",
		summary: "list, show, retry or purge the messages in outbox_failed",
		usage:   "list|show ID|retry ID...|retry --all|purge ID...|purge --older-than AGE [flags]",
		help: `Messages the relay could not publish (unroutable, exchange missing, nacked
--max-attempts times, headers not a JSON object) and messages an inbox consumer
gave up on wait in outbox_failed. Flags may come before or after the
subcommand and the ids. ID is a message id (UUID text: every failure of the
message) or a failure's row id (a number, ROW ID in list: that failure
alone). A failure whose message id was not a UUID (an inbox got such a
message; list shows "(not a UUID)") has only its row id.

  list                 the newest failures first (--limit, --source relay|inbox)
  show ID              the failures ID names, with headers and payload
  retry ID...          put the messages back into the outbox (--table) in one
                       transaction, with the same message id, partition key,
                       exchange, routing key, type, headers, payload and content
                       type, and delete the failed rows put back. They get new
                       outbox ids, so each goes after the rows of its partition
                       key already waiting; created_at is the time of the retry.
                       A failure without a UUID goes back under a new UUIDv7,
                       printed. The failures of one message id must be copies
                       of one message (it failed more than once): it goes back
                       once. A message still pending in the outbox, failures of
                       one id that differ, or an ID not in outbox_failed are
                       refused (exit 2) and nothing changes. A copy left marked
                       delivered (--on-delivered=mark) is replaced. Consumers
                       that processed the message before still skip it by its
                       id. No failure is deleted that was not put back.
  retry --all          every failed message (each failure without a UUID on its
                       own), oldest first, 100 per transaction; those that
                       cannot be retried are named and stay (exit 2)
  purge --older-than AGE
                       delete failures older than AGE, for good
  purge ID...          delete the failures ID names, for good, in one
                       transaction; an ID not in outbox_failed is refused
                       (exit 2) and nothing is deleted

AGE is a Go duration (90m, 36h) or whole days (7d, 30d). --dry-run prints what
retry or purge would change and changes nothing. Exit codes: 0 done, 1 runtime
failure, 2 bad usage or a refused request.`,
		subs:  []*subcommand{{"list", setupFailedList}, {"show", setupFailedShow}, {"retry", setupFailedRetry}, {"purge", setupFailedPurge}},
		noSub: "failed: give a subcommand: list, show ID, retry ID... or purge --older-than AGE|ID...",
	})
}

// declareFailed declares the flags every failed sub-command has.
func declareFailed(fs *flag.FlagSet) *dbFlags { return declareOps(fs, "failed") }

// declareDryRun declares --dry-run of failed retry and purge.
func declareDryRun(fs *flag.FlagSet) *bool {
	return fs.Bool("dry-run", false, "retry, purge: print what would change and change nothing")
}

// failedRun checks that sub got need ids (-1: any number), opens the
// database and calls f; a refusal of the maintenance package exits 2.
func failedRun(ctx context.Context, o *dbFlags, sub string, ids []string, need int, f func(db *sql.DB) error) error {
	if need >= 0 && len(ids) != need {
		if need == 0 {
			return usagef("failed %s takes no arguments, got %q", sub, ids[0])
		}
		return usagef("failed %s takes %d ID (a message id or a row id), got %d", sub, need, len(ids))
	}
	db, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	return refusal(f(db))
}

func setupFailedList(fs *flag.FlagSet) runFunc {
	o := declareFailed(fs)
	limit := fs.Int("limit", 50, "list: at most this many messages, newest first")
	source := fs.String("source", "", "list: only messages given up by the relay or an inbox (relay|inbox)")
	return func(ctx context.Context, inv *invocation) error {
		if *limit < 1 {
			return usagef("failed list: --limit %d: want at least 1", *limit)
		}
		return failedRun(ctx, o, "list", inv.args, 0, func(db *sql.DB) error {
			list, total, err := maintenance.ListFailed(ctx, db, maintenance.ListOptions{Limit: *limit, Source: *source})
			if err != nil {
				return err
			}
			return printFailedList(inv.stdout, o.json, list, total)
		})
	}
}

func setupFailedShow(fs *flag.FlagSet) runFunc {
	o := declareFailed(fs)
	return func(ctx context.Context, inv *invocation) error {
		msgs, rows, err := parseFailedIDs(inv.args)
		if err != nil {
			return err
		}
		return failedRun(ctx, o, "show", inv.args, 1, func(db *sql.DB) error {
			if len(rows) == 1 {
				f, err := maintenance.ShowFailedRow(ctx, db, rows[0])
				if err != nil {
					return err
				}
				return printFailedShow(inv.stdout, o.json, f.MessageID, []maintenance.Failed{f})
			}
			list, err := maintenance.ShowFailed(ctx, db, msgs[0])
			if err != nil {
				return err
			}
			return printFailedShow(inv.stdout, o.json, msgs[0], list)
		})
	}
}

func setupFailedRetry(fs *flag.FlagSet) runFunc {
	o := declareFailed(fs)
	dryRun := declareDryRun(fs)
	all := new(bool)
	declareOverride(fs, all, "all", "retry: every message in outbox_failed")
	return func(ctx context.Context, inv *invocation) error {
		if *all == (len(inv.args) > 0) {
			return usagef("failed retry: give IDs (message ids or row ids) or --all (not both)")
		}
		msgs, rows, err := parseFailedIDs(inv.args)
		if err != nil {
			return err
		}
		return failedRun(ctx, o, "retry", inv.args, -1, func(db *sql.DB) error {
			res, err := maintenance.Retry(ctx, db, maintenance.RetryOptions{
				Table: o.table, IDs: msgs, RowIDs: rows, All: *all, DryRun: *dryRun})
			if perr := printRetry(inv.stdout, o.json, o.table, *dryRun, res); perr != nil && err == nil {
				err = perr
			}
			return err
		})
	}
}

func setupFailedPurge(fs *flag.FlagSet) runFunc {
	o := declareFailed(fs)
	dryRun := declareDryRun(fs)
	older := &ageValue{}
	fs.Var(older, "older-than", "purge: delete failures older than this `age`, "+ageHelp)
	batch := declareBatch(fs)
	for _, name := range []string{"batch-size", "batch-pause"} {
		f := fs.Lookup(name)
		f.Usage = "purge only: " + f.Usage
	}
	return func(ctx context.Context, inv *invocation) error {
		if older.set == (len(inv.args) > 0) {
			return usagef("failed purge: give IDs (message ids or row ids) or --older-than AGE, e.g. --older-than 30d (not both)")
		}
		if len(inv.args) > 0 {
			for _, f := range []string{"batch-size", "batch-pause"} {
				if inv.typed[f] { // they size the batches of --older-than
					return usagef("failed purge does not take --%s", f)
				}
			}
			msgs, rows, err := parseFailedIDs(inv.args)
			if err != nil {
				return err
			}
			return failedRun(ctx, o, "purge", inv.args, -1, func(db *sql.DB) error {
				list, err := maintenance.PurgeFailedIDs(ctx, db, maintenance.PurgeIDsOptions{IDs: msgs, RowIDs: rows, DryRun: *dryRun})
				if err != nil {
					return err
				}
				return printPurgedIDs(inv.stdout, o.json, *dryRun, list)
			})
		}
		b, err := batch.batch(inv.log, "failed purge")
		if err != nil {
			return err
		}
		return failedRun(ctx, o, "purge", inv.args, 0, func(db *sql.DB) error {
			res, err := maintenance.PurgeFailed(ctx, db, maintenance.PurgeOptions{OlderThan: older.d, Batch: b, DryRun: *dryRun})
			if err != nil {
				return err
			}
			if o.json {
				return printJSON(inv.stdout, deleteJSON(maintenance.FailedTable, *dryRun, res))
			}
			verb := "purged"
			if *dryRun {
				verb = "would purge"
			}
			_, err = fmt.Fprintf(inv.stdout, "%s %d failed %s that failed before %s\n", verb, res.Rows, plural(res.Rows, "message"), utcText(res.Cutoff))
			return err
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// parseFailedIDs reads IDs: a message id (UUID text) or a failure's row id
// (a positive decimal number); anything else is bad usage.
func parseFailedIDs(args []string) (msgs []outbox.MessageID, rows []uint64, err error) {
	for _, a := range args {
		if a != "" && strings.Trim(a, "0123456789") == "" {
			n, err := strconv.ParseUint(a, 10, 64)
			if err != nil || n == 0 {
				return nil, nil, usagef("%q is not a row id: want a number from 1 up, as the ROW ID column of 'failed list' shows", a)
			}
			rows = append(rows, n)
			continue
		}
		id, err := outbox.ParseMessageID(a)
		if err != nil {
			return nil, nil, usagef("%q is neither a message id (UUID text such as 0190a5e2-7c3b-7d4e-8f00-112233445566) "+
				"nor a row id (a number: the ROW ID column of 'failed list')", a)
		}
		msgs = append(msgs, id)
	}
	return msgs, rows, nil
}

// messageIDJSON is a message id for --json: null when it is the zero id
// (the message's id was not a UUID).
func messageIDJSON(id outbox.MessageID) *string {
	if id == (outbox.MessageID{}) {
		return nil
	}
	s := id.String()
	return &s
}

// messageIDText is a message id for people.
func messageIDText(id outbox.MessageID) string {
	if id == (outbox.MessageID{}) {
		return "(not a UUID)"
	}
	return id.String()
}

// failedJSON is one failed row for --json.
type failedJSON struct {
	RowID         uint64          `json:"row_id"`
	MessageID     *string         `json:"message_id"` // null: it was not a UUID
	OutboxID      uint64          `json:"outbox_id"`
	PartitionKey  string          `json:"partition_key"`
	Exchange      string          `json:"exchange"`
	RoutingKey    string          `json:"routing_key"`
	MessageType   string          `json:"message_type"`
	ContentType   string          `json:"content_type"`
	Headers       json.RawMessage `json:"headers"`
	PayloadBytes  int64           `json:"payload_bytes"`
	Payload       *string         `json:"payload,omitempty"`        // show: the payload when it is UTF-8 text
	PayloadBase64 *string         `json:"payload_base64,omitempty"` // show: always
	CreatedAt     time.Time       `json:"created_at"`
	Attempts      uint32          `json:"attempts"`
	Source        string          `json:"source"`
	Error         string          `json:"error"`
	FailedAt      time.Time       `json:"failed_at"`
}

func toJSON(f maintenance.Failed, withPayload bool) failedJSON {
	j := failedJSON{
		RowID: f.RowID, MessageID: messageIDJSON(f.MessageID), OutboxID: f.OutboxID, PartitionKey: f.PartitionKey, Exchange: f.Exchange,
		RoutingKey: f.RoutingKey, MessageType: f.MessageType, ContentType: f.ContentType, PayloadBytes: f.PayloadBytes,
		CreatedAt: f.CreatedAt, Attempts: f.Attempts, Source: f.Source, Error: f.Error, FailedAt: f.FailedAt,
		Headers: json.RawMessage("null"),
	}
	if f.Headers != nil && json.Valid(f.Headers) {
		j.Headers = f.Headers
	} else if f.Headers != nil {
		b, _ := json.Marshal(string(f.Headers)) // not JSON: as a string
		j.Headers = b
	}
	if withPayload {
		b64 := base64.StdEncoding.EncodeToString(f.Payload)
		j.PayloadBase64 = &b64
		if utf8.Valid(f.Payload) {
			text := string(f.Payload)
			j.Payload = &text
		}
	}
	return j
}

func printFailedList(w io.Writer, asJSON bool, list []maintenance.Failed, total int64) error {
	if asJSON {
		out := struct {
			Total    int64        `json:"total"`
			Messages []failedJSON `json:"messages"`
		}{Total: total, Messages: make([]failedJSON, 0, len(list))}
		for _, f := range list {
			out.Messages = append(out.Messages, toJSON(f, false))
		}
		return printJSON(w, out)
	}
	if total == 0 {
		_, err := fmt.Fprintln(w, "no failed messages")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ROW ID\tMESSAGE ID\tFAILED AT (UTC)\tSOURCE\tPARTITION KEY\tEXCHANGE\tROUTING KEY\tTYPE\tERROR")
	for _, f := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.RowID, messageIDText(f.MessageID), f.FailedAt.Format("2006-01-02 15:04:05"), f.Source,
			cell(f.PartitionKey, 24), cell(f.Exchange, 24), cell(f.RoutingKey, 24), cell(f.MessageType, 24), cell(f.Error, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var err error
	if int64(len(list)) < total {
		_, err = fmt.Fprintf(w, "%d of %d failed messages shown; --limit shows more\n", len(list), total)
	} else {
		_, err = fmt.Fprintf(w, "%d failed %s\n", total, plural(total, "message"))
	}
	return err
}

// cell fits s into a table cell: one line, at most max characters.
func cell(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if s == "" {
		return "-"
	}
	if utf8.RuneCountInString(s) > max {
		r := []rune(s)
		return string(r[:max-1]) + "…"
	}
	return s
}

// showPayloadMax bounds the payload printed for people.
const showPayloadMax = 64 << 10

func printFailedShow(w io.Writer, asJSON bool, id outbox.MessageID, list []maintenance.Failed) error {
	if asJSON {
		out := struct {
			MessageID *string      `json:"message_id"`
			Failures  []failedJSON `json:"failures"`
		}{MessageID: messageIDJSON(id)}
		for _, f := range list {
			out.Failures = append(out.Failures, toJSON(f, true))
		}
		return printJSON(w, out)
	}
	if id == (outbox.MessageID{}) {
		fmt.Fprintf(w, "failed row %d: its message id was not a UUID; a retry gives it a new one\n", list[0].RowID)
	} else {
		fmt.Fprintf(w, "message %s: %d failure(s) in outbox_failed\n", id, len(list))
	}
	for i, f := range list {
		fmt.Fprintf(w, "\nfailure %d of %d (row id %d)\n", i+1, len(list), f.RowID)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		headers := "(none)"
		if f.Headers != nil {
			headers = string(f.Headers)
		}
		for _, kv := range [][2]string{
			{"failed at", utcText(f.FailedAt)}, {"source", f.Source}, {"error", f.Error},
			{"outbox id", fmt.Sprint(f.OutboxID)}, {"partition key", orEmpty(f.PartitionKey, "'' (no ordering constraint)")},
			{"exchange", orEmpty(f.Exchange, "'' (the relay's --default-exchange)")},
			{"routing key", f.RoutingKey}, {"type", orEmpty(f.MessageType, "''")}, {"content type", f.ContentType},
			{"created at", utcText(f.CreatedAt)}, {"attempts", fmt.Sprint(f.Attempts)}, {"headers", headers},
		} {
			fmt.Fprintf(tw, "  %s\t%s\n", kv[0], kv[1])
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "  payload (%d bytes):\n", len(f.Payload))
		p, cut := f.Payload, false
		if len(p) > showPayloadMax {
			p, cut = p[:showPayloadMax], true
		}
		if printable(p) {
			fmt.Fprintf(w, "%s\n", p)
		} else {
			fmt.Fprint(w, hex.Dump(p))
		}
		if cut {
			fmt.Fprintf(w, "  (the first %d bytes; --json has it all)\n", showPayloadMax)
		}
	}
	return nil
}

// plural is word, with an s unless n is 1.
func plural(n int64, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

func orEmpty(s, empty string) string {
	if s == "" {
		return empty
	}
	return s
}

// printable reports whether b is UTF-8 text without control characters
// other than tab and newline.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r' {
			return false
		}
	}
	return true
}

func printRetry(w io.Writer, asJSON bool, table string, dryRun bool, res maintenance.RetryResult) error {
	if asJSON {
		return printJSON(w, retryJSON(table, dryRun, res))
	}
	for _, r := range res.Retried {
		extra := ""
		if r.ReplacedDelivered {
			extra = ", replacing its copy marked delivered"
		}
		rows := fmt.Sprintf("failed %s %s", pluralInt(len(r.RowIDs), "row"), joinUints(r.RowIDs))
		switch {
		case dryRun && r.NewMessageID:
			fmt.Fprintf(w, "would retry %s under a new message id (its own was not a UUID)\n", rows)
		case dryRun:
			fmt.Fprintf(w, "would retry %s (%s)%s\n", r.MessageID, rows, extra)
		case r.NewMessageID:
			fmt.Fprintf(w, "retried %s as %s id %d under the new message id %s (its own was not a UUID)\n", rows, table, r.NewID, r.MessageID)
		default:
			fmt.Fprintf(w, "retried %s as %s id %d (%s deleted)%s\n", r.MessageID, table, r.NewID, rows, extra)
		}
	}
	for _, s := range res.Skipped {
		fmt.Fprintf(w, "cannot retry %s: %s\n", s.Name(), s.Reason)
	}
	var err error
	switch {
	case len(res.Retried)+len(res.Skipped) == 0:
		_, err = fmt.Fprintln(w, "no failed messages")
	case dryRun:
		_, err = fmt.Fprintf(w, "dry run: nothing was changed\n")
	}
	return err
}

// retryJSON is a retry's result for --json.
func retryJSON(table string, dryRun bool, res maintenance.RetryResult) any {
	type retried struct {
		MessageID         *string  `json:"message_id"`     // null: a new one, in a dry run
		NewMessageID      bool     `json:"new_message_id"` // the failure's own was not a UUID
		OutboxID          uint64   `json:"outbox_id,omitempty"`
		RowIDs            []uint64 `json:"row_ids"`
		FailedRows        int      `json:"failed_rows"`
		ReplacedDelivered bool     `json:"replaced_delivered"`
	}
	type skipped struct {
		MessageID *string `json:"message_id"`
		RowID     uint64  `json:"row_id,omitempty"`
		Reason    string  `json:"reason"`
	}
	out := struct {
		Table   string    `json:"table"`
		DryRun  bool      `json:"dry_run"`
		Retried []retried `json:"retried"`
		Skipped []skipped `json:"skipped"`
	}{Table: table, DryRun: dryRun, Retried: []retried{}, Skipped: []skipped{}}
	for _, r := range res.Retried {
		out.Retried = append(out.Retried, retried{messageIDJSON(r.MessageID), r.NewMessageID, r.NewID, r.RowIDs, len(r.RowIDs), r.ReplacedDelivered})
	}
	for _, s := range res.Skipped {
		out.Skipped = append(out.Skipped, skipped{messageIDJSON(s.MessageID), s.RowID, s.Reason})
	}
	return out
}

// joinUints writes ids as "3, 5".
func joinUints(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(s, ", ")
}

func pluralInt(n int, word string) string { return plural(int64(n), word) }

// printPurgedIDs prints the failures `failed purge ID...` deleted.
func printPurgedIDs(w io.Writer, asJSON, dryRun bool, list []maintenance.Failed) error {
	if asJSON {
		type purged struct {
			RowID     uint64  `json:"row_id"`
			MessageID *string `json:"message_id"`
		}
		out := struct {
			Table  string   `json:"table"`
			DryRun bool     `json:"dry_run"`
			Rows   int      `json:"rows"`
			Purged []purged `json:"purged"`
		}{Table: maintenance.FailedTable, DryRun: dryRun, Rows: len(list), Purged: []purged{}}
		for _, f := range list {
			out.Purged = append(out.Purged, purged{f.RowID, messageIDJSON(f.MessageID)})
		}
		return printJSON(w, out)
	}
	verb := "purged"
	if dryRun {
		verb = "would purge"
	}
	for _, f := range list {
		fmt.Fprintf(w, "%s failed row %d (message %s, failed at %s)\n", verb, f.RowID, messageIDText(f.MessageID), utcText(f.FailedAt))
	}
	if dryRun {
		_, err := fmt.Fprintln(w, "dry run: nothing was changed")
		return err
	}
	return nil
}

// deleteJSON is a batched delete's result for --json.
func deleteJSON(table string, dryRun bool, res maintenance.DeleteResult) any {
	return struct {
		Table   string    `json:"table"`
		DryRun  bool      `json:"dry_run"`
		Cutoff  time.Time `json:"cutoff"`
		Rows    int64     `json:"rows"`
		Batches int       `json:"batches"`
	}{table, dryRun, res.Cutoff, res.Rows, res.Batches}
}

package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// tablePrivilege is one privilege the relay needs on one of its tables
// (docs/operations.md, "Grants per role"), with a statement that needs it
// and matches no row. INSERT probes are INSERT IGNORE: a plain one names
// only some columns and would be refused for the others' missing defaults.
type tablePrivilege struct {
	name  string // SELECT, INSERT, UPDATE or DELETE
	table string // unquoted
	why   string // what the relay does with it
	probe string
}

// tablePrivileges lists what `run` needs on its tables, in every mode.
// quoted is the outbox table, quoted.
func (r *Relay) tablePrivileges(quoted string) []tablePrivilege {
	const (
		progress  = migrations.ProgressTable
		instances = migrations.InstancesTable
		failed    = migrations.FailedTable
	)
	out := r.cfg.Table
	privs := []tablePrivilege{
		{"SELECT", progress, "the checkpoint and leadership are read from it", "SELECT 1 FROM `" + progress + "` LIMIT 0"},
		{"INSERT", progress, "the relay name's row is created at first start", "INSERT IGNORE INTO `" + progress + "` (relay_name) SELECT '' FROM DUAL WHERE FALSE"},
		{"UPDATE", progress, "the checkpoint, epoch, heartbeat and mode are written to it", "UPDATE `" + progress + "` SET last_error = NULL WHERE FALSE"},
		{"SELECT", instances, "status lists the relay's processes from it", "SELECT 1 FROM `" + instances + "` LIMIT 0"},
		{"INSERT", instances, "each process records itself", "INSERT IGNORE INTO `" + instances + "` (relay_name) SELECT '' FROM DUAL WHERE FALSE"},
		{"UPDATE", instances, "each process beats its row", "UPDATE `" + instances + "` SET role = '' WHERE FALSE"},
		{"DELETE", instances, "a process removes its row when it stops, and stale rows", "DELETE FROM `" + instances + "` WHERE FALSE"},
		{"SELECT", out, "poll mode and the handover read the pending rows", "SELECT 1 FROM " + quoted + " LIMIT 0"},
	}
	if r.cfg.OnDelivered == checkpoint.Mark {
		privs = append(privs, tablePrivilege{"UPDATE", out, "delivered rows are marked, Config.OnDelivered=mark",
			"UPDATE " + quoted + " SET delivered_at = NULL WHERE FALSE"})
	} else {
		privs = append(privs, tablePrivilege{"DELETE", out, "delivered rows are deleted, Config.OnDelivered=delete",
			"DELETE FROM " + quoted + " WHERE FALSE"})
	}
	return append(privs,
		tablePrivilege{"SELECT", failed, "rows already moved there are looked up", "SELECT 1 FROM `" + failed + "` LIMIT 0"},
		tablePrivilege{"INSERT", failed, "messages that cannot be delivered are moved there", "INSERT IGNORE INTO `" + failed + "` (outbox_id) SELECT 0 FROM DUAL WHERE FALSE"},
	)
}

// checkGrants makes sure the relay's MySQL user holds every privilege
// tablePrivileges lists, so that a missing one is named at start, with the
// GRANT that adds it, instead of failing the first write of its kind while
// the relay publishes the same messages again and again. Each privilege is
// tried with its statement, all in one transaction that is rolled back:
// nothing is written and nothing reaches the binlog. Missing privileges
// are a *ConfigError naming each and the GRANT statements that add them.
func (r *Relay) checkGrants(ctx context.Context, quoted string) error {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("check the relay's privileges: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var missing []tablePrivilege
	for _, p := range r.tablePrivileges(quoted) {
		_, err := tx.ExecContext(ctx, p.probe)
		var me *mysql.MySQLError
		switch {
		case err == nil:
		case errors.As(err, &me) && (me.Number == 1142 || me.Number == 1143 || me.Number == 1044):
			missing = append(missing, p)
		default:
			return fmt.Errorf("check the privilege %s on table %q: %w", p.name, p.table, err)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	account, err := canal.CurrentAccount(ctx, r.db)
	if err != nil {
		return fmt.Errorf("check the relay's privileges: %w", err)
	}
	return &ConfigError{&grantsError{account: account, schema: r.canal.Schema, missing: missing}}
}

// grantsError: the relay's MySQL user lacks privileges `run` needs on its
// tables. Its message names each (privilege, table, what for) and the
// GRANT statements that add them.
type grantsError struct {
	account string // 'user'@'host'
	schema  string
	missing []tablePrivilege
}

func (e *grantsError) Error() string {
	var what []string
	var tables []string
	byTable := map[string][]string{}
	for _, p := range e.missing {
		what = append(what, fmt.Sprintf("%s on `%s`.`%s` (%s)", p.name, e.schema, p.table, p.why))
		if byTable[p.table] == nil {
			tables = append(tables, p.table)
		}
		byTable[p.table] = append(byTable[p.table], p.name)
	}
	grants := make([]string, len(tables))
	for i, t := range tables {
		grants[i] = fmt.Sprintf("GRANT %s ON `%s`.`%s` TO %s", strings.Join(byTable[t], ", "), e.schema, t, e.account)
	}
	if len(e.missing) == 1 {
		return fmt.Sprintf("user %s lacks %s: %s", e.account, what[0], grants[0])
	}
	return fmt.Sprintf("user %s lacks %d privileges the relay needs: %s; grant them: %s",
		e.account, len(e.missing), strings.Join(what, ", "), strings.Join(grants, "; "))
}

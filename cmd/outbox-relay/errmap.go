package main

import (
	"errors"
	"fmt"
	"regexp"
	"syscall"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
)

// grantsDoc is where the grants each command needs are listed.
const grantsDoc = "see \"Grants per role\" in docs/operations.md"

// explainError is the one mapping, used for the error of every command,
// from a database or broker error to what to do about it: it returns err
// with the fix appended when err's chain holds an error it knows (access
// denied, a missing table, a missing privilege, a refused connection, a
// refused broker login, an unknown relay name), else err unchanged. Errors
// already explained by a command (relay's preflight) carry no driver error
// in their chain and pass unchanged. The exit code err implies is kept.
func explainError(err error) error {
	fix := fixFor(err)
	if fix == "" {
		return err
	}
	explained := fmt.Errorf("%w; %s", err, fix)
	var ue *usageError
	if errors.As(err, &ue) {
		return &usageError{explained}
	}
	return explained
}

// fixFor returns what to do about err, or "" when it knows nothing to add.
func fixFor(err error) string {
	var me *mysql.MySQLError
	var ae *amqp.Error
	switch {
	case errors.As(err, &me):
		switch me.Number {
		case 1045: // ER_ACCESS_DENIED_ERROR
			return "check the user and password in --mysql-dsn or --mysql-password-file and that the user may connect from this host"
		case 1044: // ER_DBACCESS_DENIED_ERROR
			return "the user has no grant on this database; grant it the privileges of its role (" + grantsDoc + ") or fix the database in --mysql-dsn"
		case 1049: // ER_BAD_DB_ERROR
			return "create the database (CREATE DATABASE … CHARACTER SET utf8mb4) and run `outbox-relay migrate`, or fix --mysql-dsn"
		case 1146: // ER_NO_SUCH_TABLE
			return "the relay's tables are missing: run `outbox-relay migrate` with the same --mysql-dsn (and --table) first"
		case 1142, 1143, 1227: // ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR, ER_SPECIFIC_ACCESS_DENIED_ERROR
			return "the MySQL user lacks the privilege named above; GRANT it to the user (" + grantsDoc + "; migrate needs CREATE, ALTER and SELECT on the relay's tables)"
		}
	case errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
		return "check the user and password in --amqp-url or --amqp-password-file and the user's permissions on the vhost"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: check the host and port and that the server is running"
	case errors.Is(err, operator.ErrUnknownRelay):
		return "no relay has run with this --relay-name yet: check the name (`outbox-relay status` lists the relays)"
	}
	return ""
}

// flagOfField is the one table from the Config fields the library's errors
// name (Config.LeaderLease, ConnOptions.TLSCA) to the flags that set them:
// the CLI prints the flag (--leader-lease) where the library names the
// field. It returns "" for a field no flag sets.
func flagOfField(field string) string {
	switch field {
	case "Config.MySQLDSN":
		return "--mysql-dsn"
	case "Config.MySQLPasswordFile":
		return "--mysql-password-file"
	case "Config.MySQLTLSCA":
		return "--mysql-tls-ca"
	case "Config.MySQLTLSCert":
		return "--mysql-tls-cert"
	case "Config.MySQLTLSKey":
		return "--mysql-tls-key"
	case "Config.AMQPURL", "Config.URL": // relay's and publish's
		return "--amqp-url"
	case "ConnOptions.TLSCA":
		return "--amqp-tls-ca"
	case "ConnOptions.TLSCert":
		return "--amqp-tls-cert"
	case "ConnOptions.TLSKey":
		return "--amqp-tls-key"
	case "ConnOptions.PasswordFile":
		return "--amqp-password-file"
	case "Config.Table":
		return "--table"
	case "Config.RelayName":
		return "--relay-name"
	case "Config.ServerID":
		return "--server-id"
	case "Config.DefaultExchange":
		return "--default-exchange"
	case "Config.OnDelivered":
		return "--on-delivered"
	case "Config.Mode":
		return "--mode"
	case "Config.FallbackAfter":
		return "--fallback-after"
	case "Config.BinlogRetryInterval":
		return "--binlog-retry-interval"
	case "Config.PollInterval":
		return "--poll-interval"
	case "Config.PollBatch":
		return "--poll-batch"
	case "Config.PollWorkers":
		return "--poll-workers"
	case "Config.MaxInflightBytes":
		return "--max-inflight-bytes"
	case "Config.Lanes":
		return "--lanes"
	case "Config.ConfirmWindow":
		return "--confirm-window"
	case "Config.MaxAttempts":
		return "--max-attempts"
	case "Config.HeartbeatInterval":
		return "--heartbeat-interval"
	case "Config.LeaderLease":
		return "--leader-lease"
	case "Config.CheckpointInterval":
		return "--checkpoint-interval"
	case "Config.ShutdownTimeout":
		return "--shutdown-timeout"
	case "Config.AcceptLostGTIDs":
		return "--accept-lost-gtids"
	case "Config.StateFile":
		return "--state-file"
	case "Range.FromGTID":
		return "--from-gtid"
	case "Range.FromTime":
		return "--from-time"
	case "Range.ToGTID":
		return "--to-gtid"
	case "Range.ToTime":
		return "--to-time"
	}
	return ""
}

// fieldName matches a Config field as the library's errors name it.
var fieldName = regexp.MustCompile(`\b(?:Config|ConnOptions|Range)\.[A-Z][A-Za-z]*\b`)

// flagNames rewrites the Config fields msg names into the flags that set
// them (flagOfField); a field without a flag stays as it is.
func flagNames(msg string) string {
	return fieldName.ReplaceAllStringFunc(msg, func(field string) string {
		if f := flagOfField(field); f != "" {
			return f
		}
		return field
	})
}

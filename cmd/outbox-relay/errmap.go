package main

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/checkpoint"
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
	case errors.Is(err, checkpoint.ErrUnknownRelay):
		return "no relay has run with this --relay-name yet: check the name (`outbox-relay status` lists the relays)"
	}
	return ""
}

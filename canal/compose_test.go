package canal

import (
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/internal/mysqldouble"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// mysqlDefaults are MySQL 8.4's defaults of the settings the preflight
// reads, before docker-compose.yml's flags.
var mysqlDefaults = map[string]string{
	"log_bin": "1", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "MINIMAL",
	"gtid_mode": "OFF", "server_id": "1",
}

// composeMySQL reads docker-compose.yml's mysql service: its server
// variables (MySQL's defaults overridden by its --flags), the relay
// service's OUTBOX_RELAY_SERVER_ID.
func composeMySQL(t *testing.T) (vars map[string]string, relayServerID uint32) {
	t.Helper()
	raw, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatal(err)
	}
	vars = map[string]string{}
	for k, v := range mysqlDefaults {
		vars[k] = v
	}
	for _, arg := range compose.Services["mysql"].Command {
		name, value, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		name = strings.ReplaceAll(name, "-", "_")
		switch name {
		case "log_bin":
			value = "1" // --log-bin=<basename> turns it on
		case "skip_log_bin", "disable_log_bin":
			name, value = "log_bin", "0"
		}
		vars[name] = value
	}
	id, err := strconv.ParseUint(compose.Services["relay"].Environment["OUTBOX_RELAY_SERVER_ID"], 10, 32)
	if err != nil {
		t.Fatalf("relay service OUTBOX_RELAY_SERVER_ID: %v", err)
	}
	return vars, uint32(id)
}

// initGrants are deploy/mysql-init.sql's global grants to user, as MySQL's
// SHOW GRANTS prints them.
func initGrants(t *testing.T, user string) []string {
	t.Helper()
	raw, err := os.ReadFile("../deploy/mysql-init.sql")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^GRANT (.+) ON (\S+) TO '` + user + `'@'%';`)
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(raw), -1) {
		on := m[2]
		if on != "*.*" {
			schema, table, _ := strings.Cut(on, ".")
			on = "`" + schema + "`." + table
		}
		out = append(out, "GRANT "+m[1]+" ON "+on+" TO `"+user+"`@`%`")
	}
	return out
}

// TestComposeMySQLPassesPreflight: the MySQL 8.4 service of
// docker-compose.yml, with deploy/mysql-init.sql's grants to the relay's
// user, passes the preflight (checked offline: the MySQL test double
// answers with the service's settings), and has GTIDs on. Without its
// binlog-row-metadata flag it would not.
func TestComposeMySQLPassesPreflight(t *testing.T) {
	t.Parallel()
	vars, relayID := composeMySQL(t)
	if !strings.EqualFold(vars["gtid_mode"], "ON") || !strings.EqualFold(vars["enforce_gtid_consistency"], "ON") {
		t.Errorf("docker-compose.yml's mysql: gtid_mode %q, enforce_gtid_consistency %q; want ON, ON (the checkpoint survives a failover by GTID)",
			vars["gtid_mode"], vars["enforce_gtid_consistency"])
	}
	serverID, err := strconv.ParseUint(vars["server_id"], 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	preflight := func(vars map[string]string) error {
		srv, err := mysqldouble.Start(mysqldouble.Config{Version: mysqldouble.MySQL84, User: "relay", Password: "relay",
			ServerUUID: doubleUUID, ServerID: uint32(serverID), Variables: vars, Grants: initGrants(t, "relay")})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		cfg := doubleConfig(t, srv)
		cfg.Password, cfg.ServerID = "relay", relayID
		db := doubleDBAs(t, srv, "relay", "relay")
		defer db.Close()
		return Preflight(testenv.WorkContext(t), db, cfg)
	}
	if err := preflight(vars); err != nil {
		t.Fatalf("docker-compose.yml's MySQL 8.4 fails the preflight: %v", err)
	}
	// The check has teeth: MySQL's default binlog_row_metadata is refused.
	vars["binlog_row_metadata"] = mysqlDefaults["binlog_row_metadata"]
	var pe *PreflightError
	if err := preflight(vars); !errors.As(err, &pe) || pe.Check != CheckRowMetadata {
		t.Fatalf("with MySQL's default binlog_row_metadata: %v; want a %s refusal", err, CheckRowMetadata)
	}
}

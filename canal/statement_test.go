package canal

import "testing"

func TestWritesOutbox(t *testing.T) {
	for _, tc := range []struct {
		q, db string
		want  bool
	}{
		{"INSERT INTO outbox (a) VALUES (1)", "app", true},
		{"insert into OUTBOX values (1)", "app", true},
		{"INSERT outbox SET a = 1", "app", true},
		{"INSERT LOW_PRIORITY IGNORE INTO `outbox` (a) VALUES (1)", "app", true},
		{"/* app:checkout */ INSERT INTO app.outbox (a) VALUES (1)", "other", true},
		{"-- note\nREPLACE INTO `app`.`outbox` (a) VALUES (1)", "", true},
		{"# note\nINSERT DELAYED INTO outbox VALUES (1)", "app", true},
		{"/*!40000 INSERT INTO outbox VALUES (1) */", "app", true},
		{"INSERT INTO outbox\n(a) SELECT a FROM staging", "app", true},
		{"LOAD DATA LOCAL INFILE 'x.csv' REPLACE INTO TABLE outbox (a)", "app", true},
		{"LOAD XML INFILE 'x.xml' INTO TABLE app.outbox", "", true},
		{"LOAD DATA INFILE 'into table outbox' INTO TABLE staging", "app", false},
		{"INSERT INTO outbox (a) VALUES (1)", "other", false},
		{"INSERT INTO other.outbox (a) VALUES (1)", "app", false},
		{"INSERT INTO outbox_failed (a) SELECT * FROM outbox", "app", false},
		{"INSERT INTO staging SELECT * FROM outbox", "app", false},
		{"UPDATE outbox SET delivered_at = NOW(6)", "app", false},
		{"DELETE FROM outbox WHERE id = 1", "app", false},
		{"TRUNCATE outbox", "app", false},
		{"SET STATEMENT max_statement_time=100 FOR INSERT INTO outbox VALUES (1)", "app", true},
		{"SET STATEMENT a=1, b='for' FOR REPLACE app.outbox VALUES (1)", "", true},
		{"--\nINSERT INTO outbox VALUES (1)", "app", true},
		{"SET @x = 1", "app", false},
		{"ALTER TABLE outbox ADD COLUMN x INT", "app", false},
		{"BEGIN", "app", false},
		{"", "app", false},
		{"INSERT INTO", "app", false},
	} {
		if got := writesOutbox([]byte(tc.q), tc.db, "app", "outbox"); got != tc.want {
			t.Errorf("writesOutbox(%q, db %q) = %v, want %v", tc.q, tc.db, got, tc.want)
		}
	}
}

func TestXAStatement(t *testing.T) {
	for _, tc := range []struct {
		q, verb, xid string
		onePhase     bool
	}{
		{"XA START X'7831',X'',1", "START", "x'7831',x'',1", false},
		{"XA COMMIT X'7832',X'',1", "COMMIT", "x'7832',x'',1", false},
		{"xa commit X'7832', X'aa', 3 ONE PHASE", "COMMIT", "x'7832',x'aa',3", true},
		{"XA ROLLBACK X'7831',X'',1", "ROLLBACK", "x'7831',x'',1", false},
		{"XA END X'7831',X'',1", "END", "x'7831',x'',1", false},
		{"COMMIT", "", "", false},
		{"XAVIER", "", "", false},
	} {
		verb, xid, one := xaStatement([]byte(tc.q))
		if verb != tc.verb || xid != tc.xid || one != tc.onePhase {
			t.Errorf("xaStatement(%q) = %q %q %v, want %q %q %v", tc.q, verb, xid, one, tc.verb, tc.xid, tc.onePhase)
		}
	}
}

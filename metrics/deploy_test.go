package metrics_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The dashboard and the alert rules in deploy/ use only metric names this
// package registers (histogram series with their _bucket/_sum/_count
// suffixes), and every relay metric appears on the dashboard.
func TestDeployFilesUseRegisteredMetrics(t *testing.T) {
	mfs := registeredFamilies(t)
	known := map[string]string{} // series name → family name
	for _, mf := range mfs {
		n := mf.GetName()
		known[n] = n
		if mf.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				known[n+s] = n
			}
		}
	}
	name := regexp.MustCompile(`outbox_relay_[a-z_]+`)

	dash, err := os.ReadFile("../deploy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(dash, &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	onDashboard := map[string]bool{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				fam, ok := known[n]
				if !ok {
					t.Errorf("dashboard panel %q uses %s, which the relay does not export", p.Title, n)
				}
				onDashboard[fam] = true
			}
		}
	}
	for _, mf := range mfs {
		if !onDashboard[mf.GetName()] {
			t.Errorf("%s is on no dashboard panel", mf.GetName())
		}
	}

	alerts, err := os.ReadFile("../deploy/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(alerts), "\n") {
		if !strings.Contains(line, "expr:") {
			continue
		}
		for _, n := range name.FindAllString(line, -1) {
			if _, ok := known[n]; !ok {
				t.Errorf("alerts.yml: %q uses %s, which the relay does not export", strings.TrimSpace(line), n)
			}
		}
	}
}

package metrics_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outbox-relay/outbox-relay/metrics"
)

// The package documentation (doc.go) and the metrics table of
// docs/operations.md list exactly the series the relay registers: a new
// metric cannot go undocumented, and a documented one cannot vanish.
func TestDocsListEveryRegisteredMetric(t *testing.T) {
	mfs := registeredFamilies(t)
	var registered []string
	for _, mf := range mfs {
		registered = append(registered, mf.GetName())
	}
	slices.Sort(registered)

	for _, doc := range []struct {
		file, section string         // the section is from its heading to the next one of its level
		line          *regexp.Regexp // a documented series: the name is the first group
	}{
		// The indented list: "//\toutbox_relay_x{label}  type  meaning".
		{"doc.go", "// # Metrics", regexp.MustCompile(`^//\t(outbox_relay_[a-z_]+)\b`)},
		// The table: "| `outbox_relay_x{label}` | meaning |".
		{"../docs/operations.md", "## Metrics and health", regexp.MustCompile("^\\| `(outbox_relay_[a-z_]+)[`{]")},
	} {
		text, err := os.ReadFile(doc.file)
		if err != nil {
			t.Fatal(err)
		}
		_, rest, ok := strings.Cut(string(text), "\n"+doc.section+"\n")
		if !ok {
			t.Fatalf("%s has no line %q", doc.file, doc.section)
		}
		heading := doc.section[:strings.LastIndex(doc.section, "#")+1] + " "
		section, _, _ := strings.Cut(rest, "\n"+heading)
		var listed []string
		for _, l := range strings.Split(section, "\n") {
			if m := doc.line.FindStringSubmatch(l); m != nil {
				listed = append(listed, m[1])
			}
		}
		slices.Sort(listed)
		for _, n := range registered {
			if _, found := slices.BinarySearch(listed, n); !found {
				t.Errorf("%s does not list %s, which the relay registers", doc.file, n)
			}
		}
		for i, n := range listed {
			if _, found := slices.BinarySearch(registered, n); !found {
				t.Errorf("%s lists %s, which the relay does not register", doc.file, n)
			}
			if i > 0 && listed[i-1] == n {
				t.Errorf("%s lists %s twice", doc.file, n)
			}
		}
	}
}

// registeredFamilies is every metric family the relay registers.
func registeredFamilies(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

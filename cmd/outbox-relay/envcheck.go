package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// unknownEnvWarnings returns one warning per OUTBOX_RELAY_* variable of
// environ (KEY=VALUE entries) that no flag of any command reads: a typo,
// silently ignored otherwise. It names the closest variable that is read,
// when one is near. Variables read by another command's flags are not
// reported: one environment is often shared by every command (a Kubernetes
// ConfigMap). Values are never printed.
func unknownEnvWarnings(environ []string, known map[string]bool) []string {
	knownEnv := make([]string, 0, len(known))
	isKnown := map[string]bool{}
	for k := range known {
		knownEnv = append(knownEnv, envName(k))
		isKnown[envName(k)] = true
	}
	sort.Strings(knownEnv)
	var out []string
	seen := map[string]bool{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || isKnown[name] || seen[name] {
			continue
		}
		seen[name] = true
		msg := fmt.Sprintf("outbox-relay: warning: environment variable %s is ignored: no flag of any command reads it", name)
		if near := closest(name, knownEnv); near != "" {
			msg += fmt.Sprintf("; did you mean %s?", near)
		}
		out = append(out, msg)
	}
	sort.Strings(out)
	return out
}

// warnUnknownEnv prints unknownEnvWarnings for every command's flags to w.
func warnUnknownEnv(w io.Writer, environ []string) {
	for _, line := range unknownEnvWarnings(environ, knownKeys()) {
		fmt.Fprintln(w, line)
	}
}

// closest returns the candidate nearest to name by edit distance, if it is
// within a third of name's length after the prefix (at least 2), else "".
func closest(name string, candidates []string) string {
	best, bestD := "", len(name)-len(envPrefix)
	limit := max(2, bestD/3)
	for _, c := range candidates {
		if d := editDistance(name, c); d < bestD {
			best, bestD = c, d
		}
	}
	if bestD > limit {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

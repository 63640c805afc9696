package testenv

import (
	"regexp"
	"strings"
	"testing"
)

func TestObjectName(t *testing.T) {
	valid := regexp.MustCompile(`^t_[a-z0-9_]*_[0-9a-f]{8}$`)
	for _, name := range []string{
		"TestX", "TestX/sub test/ü-ñ#1", "Test/" + strings.Repeat("Long/", 40), "////",
	} {
		a, b := objectName(name, "t_", "_", 64), objectName(name, "t_", "_", 64)
		if len(a) > 64 || !valid.MatchString(a) || a == b {
			t.Errorf("objectName(%q) = %q, %q", name, a, b)
		}
	}
	if got := objectName("TestA/b", "test.", ".", 200); !regexp.MustCompile(`^test\.testa_b\.[0-9a-f]{8}$`).MatchString(got) {
		t.Errorf("exchange name %q", got)
	}
}

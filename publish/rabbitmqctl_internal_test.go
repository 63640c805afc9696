package publish

import (
	"os/exec"
	"testing"
)

func rabbitmqctl(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		t.Errorf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
}

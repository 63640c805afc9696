package testenv

import (
	"testing"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// DeleteStreamsAtCleanup deletes the named streams of the broker at url
// (rabbitmq-stream://...) when the test ends, over a connection of its own:
// the streams a test declared, whatever state it left its own connections
// in. A stream already gone, or a broker that cannot be reached then, is
// only logged.
func DeleteStreamsAtCleanup(t testing.TB, url string, names ...string) {
	t.Helper()
	t.Cleanup(func() {
		env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(url))
		if err != nil {
			t.Logf("testenv: delete the test's streams: %v", err)
			return
		}
		defer env.Close()
		for _, name := range names {
			if err := env.DeleteStream(name); err != nil {
				t.Logf("testenv: delete stream %s: %v", name, err)
			}
		}
	})
}

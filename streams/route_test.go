package streams

import (
	"testing"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
	"github.com/spaolacci/murmur3"
)

// The murmur3 implementation against the algorithm's published test
// vectors (MurmurHash3_x86_32), then the seed the super-stream clients use.
func TestMurmur3KnownValues(t *testing.T) {
	for _, tc := range []struct {
		in   string
		seed uint32
		want uint32
	}{
		{"", 0, 0},
		{"", 1, 0x514E28B7},
		{"", 0xffffffff, 0x81F16F39},
		{"Hello, world!", 1234, 0xFAF6CDB3},
		{"The quick brown fox jumps over the lazy dog", 0x9747b28c, 0x2FA826CD},
	} {
		if got := murmur3.Sum32WithSeed([]byte(tc.in), tc.seed); got != tc.want {
			t.Errorf("murmur3(%q, %#x) = %#x, want %#x", tc.in, tc.seed, got, tc.want)
		}
	}
}

// A key lands in the partition the Go client's super-stream producer
// (HashRoutingMurmurStrategy, the same routing as Java, .NET and Python)
// chooses over the partitions NAME-0 … NAME-(N-1).
func TestPartitionMatchesSuperStreamRouting(t *testing.T) {
	const n = 8
	parts := make([]string, n)
	for i := range parts {
		parts[i] = Config{Stream: "orders"}.PartitionName(i)
	}
	for _, key := range []string{"a", "order-1", "order-2", "customer-42", "ü-ñ", "0", "hello"} {
		strategy := stream.NewHashRoutingStrategy(func(message.StreamMessage) string { return key })
		routed, err := strategy.Route(amqp.NewMessage(nil), parts)
		if err != nil || len(routed) != 1 {
			t.Fatalf("client routing of %q: %v %v", key, routed, err)
		}
		if got := parts[Partition(key, "unused", n)]; got != routed[0] {
			t.Errorf("key %q: Partition chose %s, the super-stream producer %s", key, got, routed[0])
		}
	}
}

// Rows with the key ” spread by message id: the same row always goes to
// the same partition, and different rows use every partition.
func TestPartitionEmptyKeySpreadsDeterministically(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 200; i++ {
		id := "0190a8c2-0000-7000-8000-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		p := Partition("", id, 4)
		if p != Partition("", id, 4) {
			t.Fatal("not deterministic")
		}
		seen[p] = true
	}
	if len(seen) != 4 {
		t.Errorf("200 rows with the key '' used partitions %v of 4", seen)
	}
	if Partition("k", "x", 1) != 0 {
		t.Error("one partition: not 0")
	}
}

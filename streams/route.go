package streams

import (
	"github.com/spaolacci/murmur3"
)

// Seed is the murmur3 seed of the super-stream clients' hash routing (Java,
// .NET, Python, Go, Node.js): a key routed here lands in the partition their
// super-stream producer would choose.
const Seed = 104729

// Partition returns the partition (0 … n-1) of a row with partitionKey: murmur3
// (32 bit, seed 104729) of the key's UTF-8 bytes modulo n. A row with the key
// ” has no ordering constraint; it is spread by the hash of its message id
// (messageID, any stable text), so the same row lands in the same partition
// every time it is published: the publishing ids of a partition depend only
// on the rows, never on timing.
func Partition(partitionKey, messageID string, n int) int {
	if n <= 1 {
		return 0
	}
	key := partitionKey
	if key == "" {
		key = messageID
	}
	return int(murmur3.Sum32WithSeed([]byte(key), Seed) % uint32(n))
}

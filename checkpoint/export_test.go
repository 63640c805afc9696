package checkpoint

// PauseAcks makes each acknowledging transaction of s call f once its rows
// are acknowledged, before it checks the epoch and commits: where a leader
// stopped mid-acknowledgement holds them locked.
func PauseAcks(s *Store, f func()) { s.acks.afterRows = f }

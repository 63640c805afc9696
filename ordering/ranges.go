package ordering

// Range is a closed interval of outbox row ids [Lo, Hi]. A transaction's rows
// are recorded as ranges because a multi-row INSERT gets consecutive ids: a
// 200,000-row transaction usually acknowledges as a handful of ranges rather
// than 200,000 ids. A range only ever holds ids seen in one transaction, and
// ids are unique, so acknowledging a range never touches another
// transaction's rows.
type Range struct{ Lo, Hi uint64 }

// addID appends id to rs, extending the last range when id follows it.
func addID(rs []Range, id uint64) []Range {
	if n := len(rs); n > 0 && rs[n-1].Hi+1 == id {
		rs[n-1].Hi = id
		return rs
	}
	return append(rs, Range{id, id})
}

// Count is the number of ids in rs.
func Count(rs []Range) int {
	n := 0
	for _, r := range rs {
		n += int(r.Hi - r.Lo + 1)
	}
	return n
}

// RangesOf returns ids, sorted ascending, as ranges.
func RangesOf(ids []uint64) []Range {
	var rs []Range
	for _, id := range ids {
		rs = addID(rs, id)
	}
	return rs
}

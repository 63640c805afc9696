// Package sqltime reads DATETIME(6) columns as UTC instants. Every time
// column of the relay's tables holds UTC (docs/tables.md), and a pool may
// hand such a column over as text or, with parseTime, as a time.Time in the
// pool's loc; UTC gives the same instant either way.
package sqltime

package sqltime

import (
	"fmt"
	"time"
)

// Layout is the text form of a DATETIME(6) value.
const Layout = "2006-01-02 15:04:05.999999"

// UTC scans a DATETIME(6) column as UTC; NULL leaves the zero time.
type UTC struct{ T time.Time }

// Scan implements sql.Scanner.
func (u *UTC) Scan(v any) error {
	switch v := v.(type) {
	case nil:
		u.T = time.Time{}
	case time.Time:
		// A pool with parseTime and another loc has read the UTC wall
		// clock as that zone's: keep the wall clock, call it UTC.
		u.T = time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC)
	case []byte:
		return u.parse(string(v))
	case string:
		return u.parse(v)
	default:
		return fmt.Errorf("DATETIME value of type %T", v)
	}
	return nil
}

func (u *UTC) parse(s string) error {
	t, err := time.ParseInLocation(Layout, s, time.UTC)
	if err != nil {
		return fmt.Errorf("parse DATETIME %q: %w", s, err)
	}
	u.T = t
	return nil
}

package canal

import "github.com/outbox-relay/outbox-relay/position"

// Flavors of server, the values of Config.Flavor (the same as position's).
const (
	FlavorMySQL   = position.FlavorMySQL   // "mysql"
	FlavorMariaDB = position.FlavorMariaDB // "mariadb"
)

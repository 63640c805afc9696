// Package bench measures the relay the way its users judge it (design; the
// `outbox-relay bench` command): commit → receive latency at a fixed rate,
// catch-up throughput on a backlog against the ceiling a bare amqp091
// publisher reaches to the same queue with the same confirm window, database
// queries per second while idle, and the relay process's CPU time and peak
// RSS. The relay runs as a subprocess so its resources are its own; every
// figure is the median of several runs, with min and max.
package bench

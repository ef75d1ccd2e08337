//go:build race

package tcp_test

// raceEnabled: the race detector is on.
const raceEnabled = true

//go:build race

package testenv

// Race reports whether the race detector is on: tests that measure
// allocations or move volumes scale to it (it slows code tenfold, and
// sync.Pool drops items on purpose under it).
const Race = true

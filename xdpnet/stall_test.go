package xdpnet

import (
	"testing"
	"time"
)

// CheckStall's rules on a loop whose state the test sets by hand, as the
// loop would (the heartbeat, sleeping, queued calls): a loop inside one
// turn, or asleep with calls queued, for the threshold is stalled, once
// per episode; asleep with nothing queued, or not running, it never is.
func TestCheckStallRules(t *testing.T) {
	const after = 5 * time.Second
	p := &Poller{calls: make(chan call, 16)}
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	expect := func(sec int, want bool, stalls uint64) {
		t.Helper()
		if got := p.CheckStall(at(sec), after); got != want {
			t.Fatalf("at %d s: CheckStall %v, want %v", sec, got, want)
		}
		if got := p.Stats().Stalls; got != stalls {
			t.Fatalf("at %d s: Stats.Stalls %d, want %d", sec, got, stalls)
		}
	}

	// Not running: the heartbeat never moves, and that is no stall.
	for s := range 12 {
		expect(s, false, 0)
	}

	// Running and asleep with nothing queued: idle for any time.
	p.looping.Store(true)
	p.beat.Store(1)
	p.sleeping.Store(true)
	for s := 12; s < 30; s++ {
		expect(s, false, 0)
	}

	// Turns going by: progress.
	p.sleeping.Store(false)
	for s := 30; s <= 40; s++ {
		p.beat.Add(1)
		expect(s, false, 0)
	}

	// Inside one turn from 40 s on: reported at 45 s, once.
	for s := 41; s < 45; s++ {
		expect(s, false, 0)
	}
	expect(45, true, 1)
	for s := 46; s < 60; s++ {
		expect(s, false, 1)
	}

	// The turn ends (a new one starts): the episode ends; stuck in the
	// next one, it is a second episode.
	p.beat.Add(1)
	expect(60, false, 1)
	expect(64, false, 1)
	expect(65, true, 2)
	expect(70, false, 2)

	// Asleep but with a Do call queued that is not taken (a lost wakeup):
	// stalled; with an Async function instead: the same.
	p.beat.Add(1)
	p.sleeping.Store(true)
	expect(80, false, 2)
	p.calls <- call{}
	expect(81, false, 2)
	expect(86, true, 3)
	<-p.calls
	expect(87, false, 3) // idle again: the episode ends
	p.asyncPending.Store(1)
	expect(88, false, 3)
	expect(93, true, 4)
	p.asyncPending.Store(0)

	// Run returned: whatever the heartbeat says, no stall.
	p.sleeping.Store(false)
	p.looping.Store(false)
	for s := 100; s < 120; s++ {
		expect(s, false, 4)
	}
}

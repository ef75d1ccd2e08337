package xdpnet_test

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/tcp"
)

// A running Poller, with the test as its watchdog: asleep with nothing to
// do (each sleep lasts up to a second, several thresholds) it is never
// stalled; a turn held by a Do function, then by an Async function, that
// blocks on a channel the test holds is reported once per episode and
// counted in Stats.Stalls, and the loop recovers when the test lets go.
func TestPollerStall(t *testing.T) {
	e := start(t, bpf.ModeGeneric, tcp.Options{})
	const after = 400 * time.Millisecond
	const every = after / 5
	// look calls CheckStall every tick for d and returns how many times
	// it reported a stall.
	look := func(d time.Duration) int {
		n := 0
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(every) {
			if e.p.CheckStall(time.Now(), after) {
				n++
			}
		}
		return n
	}
	if n := look(2500 * time.Millisecond); n != 0 {
		t.Fatalf("an idle poller was reported stalled %d times", n)
	}
	if st := e.p.Stats().Stalls; st != 0 {
		t.Fatalf("idle: Stats.Stalls %d", st)
	}

	blockers := []struct {
		name  string
		block func(release chan struct{}) (returned <-chan struct{})
	}{
		{"Do", func(release chan struct{}) <-chan struct{} {
			done := make(chan struct{})
			go func() {
				defer close(done)
				if err := e.p.Do(func(*tcp.Stack, tcp.Time) { <-release }); err != nil {
					t.Errorf("Do: %v", err)
				}
			}()
			return done
		}},
		{"Async", func(release chan struct{}) <-chan struct{} {
			done := make(chan struct{})
			e.p.Async(func() { <-release; close(done) })
			return done
		}},
	}
	for i, b := range blockers {
		release := make(chan struct{})
		returned := b.block(release)
		if n := look(3 * after); n != 1 {
			t.Fatalf("%s blocking the loop: reported %d times, want once", b.name, n)
		}
		if st := e.p.Stats().Stalls; st != uint64(i+1) {
			t.Fatalf("%s: Stats.Stalls %d, want %d", b.name, st, i+1)
		}
		close(release)
		select {
		case <-returned:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the blocked function did not return", b.name)
		}
		// Recovered: idle again, no further report.
		if n := look(2 * after); n != 0 {
			t.Fatalf("after %s returned: reported %d times", b.name, n)
		}
	}
	// The loop works after both episodes.
	if err := e.p.Do(func(*tcp.Stack, tcp.Time) {}); err != nil {
		t.Fatalf("Do after the stalls: %v", err)
	}
}

package daemon

import (
	"testing"
	"time"
)

// A wave of QPs, once quiet, is trimmed once; a trickle is not.
func TestTrimmerTrimsOncePerWave(t *testing.T) {
	tr := startTrimmer(nil)
	defer tr.stop()
	for range trimAfter - 1 {
		tr.note()
	}
	time.Sleep(trimQuiet + 3*trimEvery)
	if n := tr.trims.Load(); n != 0 {
		t.Fatalf("%d trims after %d QPs, fewer than a wave", n, trimAfter-1)
	}
	tr.note()
	deadline := time.Now().Add(30 * time.Second)
	for tr.trims.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a quiet wave was never trimmed")
		}
		time.Sleep(trimEvery)
	}
	time.Sleep(trimQuiet + 3*trimEvery)
	if n := tr.trims.Load(); n != 1 {
		t.Fatalf("%d trims of one wave", n)
	}
}

package xdpnet

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/tcp"
)

// A yield that comes back soon keeps the spin yielding; one that does not
// stops it for a backoff that doubles while such yields follow each other
// (a busy-polling thread on the core) up to its maximum, and starts over
// after one that comes back soon.
func TestYieldBackoff(t *testing.T) {
	us := func(n int) tcp.Time { return tcp.Time(time.Duration(n) * time.Microsecond) }
	var y yielding
	if y.yielded(us(0), us(5)) || y.again != 0 {
		t.Fatal("a quick yield backed off")
	}
	now := us(1000)
	want := yieldBackoffMin
	for i := range 12 {
		end := now + tcp.Time(3*time.Millisecond) // a scheduler slice
		if !y.yielded(now, end) {
			t.Fatalf("yield %d: a slow yield did not back off", i)
		}
		if y.again != end+tcp.Time(want) {
			t.Fatalf("yield %d: backoff %v, want %v", i, time.Duration(y.again-end), want)
		}
		now = y.again
		want = min(2*want, yieldBackoffMax)
	}
	if y.backoff != tcp.Time(yieldBackoffMax) {
		t.Fatalf("backoff %v, want the maximum", time.Duration(y.backoff))
	}
	if y.yielded(now, now+us(3)) || y.backoff != 0 {
		t.Fatal("a quick yield did not start the backoff over")
	}
	if !y.yielded(now, now+tcp.Time(time.Millisecond)) || y.backoff != tcp.Time(yieldBackoffMin) {
		t.Fatal("the next slow yield did not back off by the minimum")
	}
}

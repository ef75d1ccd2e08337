package xdpnet_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xdpnet"
)

// ringLike is a Source with the need-wakeup protocol of the daemon's
// rings: a producer posts, then rings the doorbell if the flag is up.
type ringLike struct {
	posted, taken atomic.Int64
	flag          atomic.Bool
	polls, awake  atomic.Int64
}

func (r *ringLike) Poll() bool {
	r.polls.Add(1)
	if n := r.posted.Load() - r.taken.Load(); n > 0 {
		r.taken.Add(n)
		return true
	}
	return false
}

func (r *ringLike) Sleeping() bool {
	r.flag.Store(true)
	return r.posted.Load() != r.taken.Load()
}

func (r *ringLike) Awake() {
	r.awake.Add(1)
	r.flag.Store(false)
}

// TestSourceDoorbell: a Source's work is taken by the loop, a sleeping
// loop is woken through Doorbell (a lost wake-up would cost maxSleep, a
// second, per post), and a removed Source is never called again.
func TestSourceDoorbell(t *testing.T) {
	e := start(t, bpf.ModeGeneric, tcp.Options{})
	db, err := e.p.Doorbell()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r := &ringLike{}
	if err := e.p.AddSource(r); err != nil {
		t.Fatal(err)
	}
	const posts = 100
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	slept := 0
	for i := range posts {
		// Give the loop time to fall asleep, so most posts find the
		// flag up and need the doorbell.
		time.Sleep(time.Millisecond)
		if r.flag.Load() {
			slept++
		}
		r.posted.Add(1)
		if r.flag.Load() {
			if err := shm.Signal(db); err != nil {
				t.Fatal(err)
			}
		}
		for r.taken.Load() != int64(i+1) {
			if ctx.Err() != nil {
				t.Fatalf("post %d not taken after %d: %d taken (a lost wake-up costs a second each)", i+1, posts, r.taken.Load())
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	if slept == 0 || r.awake.Load() == 0 {
		t.Fatalf("the loop never slept with the source (flag up before %d posts, %d wake-ups)", slept, r.awake.Load())
	}
	if err := e.p.RemoveSource(r); err != nil {
		t.Fatal(err)
	}
	polls := r.polls.Load()
	for range 10 {
		if err := e.p.Do(func(*tcp.Stack, tcp.Time) {}); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.polls.Load(); got != polls {
		t.Fatalf("removed source polled %d more times", got-polls)
	}
	t.Logf("%d of %d posts rang the doorbell", slept, posts)
}

var _ xdpnet.Source = (*ringLike)(nil)

package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

// evdApp is a connected application whose request EVD holds only a few
// events.
func evdApp(t *testing.T, depth int) (*app, *client.EP) {
	t.Helper()
	sock, _ := startDaemon(t)
	server, a := newApp(t, sock, "server"), newApp(t, sock, "evd-room")
	var err error
	a.req, err = a.ia.CreateEVD(client.EVDOptions{Depth: depth, Kind: client.DTOEvents})
	must(t, err)
	_, ep, _ := connectPair(t, server, a, nil)
	return a, ep
}

// More events than the EVD's ring holds: the daemon keeps the rest until
// the application makes room, and every one arrives. The application
// takes them with Wait, which sleeps; the daemon used to sleep too, with
// events waiting and nothing to wake it.
func TestEventsBeyondTheRing(t *testing.T) {
	a, ep := evdApp(t, 8)
	const posts = 40
	bad := []client.Segment{{LMR: a.lmr, Offset: 2 << 20, Length: 8}} // beyond the LMR
	for i := range posts {
		must(t, ep.PostSend(uint64(i), bad, client.Signaled))
	}
	for i := range posts {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ev, err := a.req.Wait(ctx)
		cancel()
		if err != nil {
			t.Fatalf("event %d of %d: %v", i, posts, err)
		}
		if ev.Cookie != uint64(i) || ev.Status != completion.LocalProtectionError {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
}

// An application that keeps posting failing work requests and never reads
// its EVD cannot make the daemon hold events without bound: once a few
// thousand wait, the daemon stops taking its work requests, its send ring
// fills and PostSend says so. Every accepted request still gets its event.
func TestEventBacklogBounded(t *testing.T) {
	a, ep := evdApp(t, 16)
	bad := []client.Segment{{LMR: a.lmr, Offset: 2 << 20, Length: 8}}
	const limit = 100000
	accepted := 0
	fullSince := time.Time{}
	for accepted < limit {
		err := ep.PostSend(uint64(accepted), bad, client.Signaled)
		if errors.Is(err, client.ErrQueueFull) {
			if fullSince.IsZero() {
				fullSince = time.Now()
			} else if time.Since(fullSince) > 500*time.Millisecond {
				break
			}
			time.Sleep(time.Millisecond)
			continue
		}
		must(t, err)
		fullSince = time.Time{}
		accepted++
	}
	if accepted >= limit {
		t.Fatalf("%d failing posts accepted with no event read", accepted)
	}
	t.Logf("accepted %d posts before back-pressure", accepted)
	for i := range accepted {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ev, err := a.req.Wait(ctx)
		cancel()
		if err != nil || ev.Cookie != uint64(i) {
			t.Fatalf("event %d of %d: %+v %v", i, accepted, ev, err)
		}
	}
}

package xdpnet_test

import (
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xdpnet"
)

// waiter is a handler whose protocol says it waits on the peer while
// waiting is set.
type waiter struct {
	waiting atomic.Bool
	got     atomic.Int64
}

func (w *waiter) Receive(_ *tcp.Conn, b []byte) int { w.got.Add(int64(len(b))); return len(b) }
func (w *waiter) Event(*tcp.Conn, tcp.Event)        {}
func (w *waiter) Waiting() bool                     { return w.waiting.Load() }
func (w *waiter) Diag() string                      { return "the test's protocol waits" }

// A connection whose handler waits on a silent peer is reported once per
// episode, with the TCP state and the handler's; an idle one is not; one
// that receives starts a new episode; and a connection whose octets are
// never acknowledged (the peer's kernel stopped answering) is reported
// however idle its handler.
func TestConnStallReport(t *testing.T) {
	const after = 300 * time.Millisecond
	warns := make(chan string, 16)
	e := startWith(t, xdpnet.Config{Mode: bpf.ModeGeneric, ConnStallAfter: after,
		Warn: func(msg string) {
			select {
			case warns <- msg:
			default:
			}
		}})
	ln, err := e.tp.A.ListenTCP(netip.AddrPortFrom(e.tp.A.Addr.Addr(), kernelPort))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	h := &waiter{}
	c, err := e.p.Connect(netip.AddrPortFrom(e.tp.A.Addr.Addr(), kernelPort), h, 5*time.Second)
	if err != nil {
		t.Fatalf("engine connect: %v", err)
	}
	ln.SetDeadline(time.Now().Add(5 * time.Second))
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	expect := func(what string, want int) []string {
		t.Helper()
		var got []string
		// The sweep comes round to the flow within a second.
		end := time.After(after + 1500*time.Millisecond)
		for {
			select {
			case m := <-warns:
				got = append(got, m)
			case <-end:
				if len(got) != want {
					t.Fatalf("%s: %d reports, want %d: %q", what, len(got), want, got)
				}
				return got
			}
		}
	}
	expect("idle", 0)
	h.waiting.Store(true)
	got := expect("waiting on a silent peer", 1)
	if !strings.Contains(got[0], "connection stalled") || !strings.Contains(got[0], "ESTABLISHED") ||
		!strings.Contains(got[0], "the test's protocol waits") {
		t.Fatalf("report: %q", got[0])
	}
	expect("the same episode", 0)
	// The peer speaks: progress, then a new episode.
	if _, err := peer.Write([]byte("progress")); err != nil {
		t.Fatal(err)
	}
	expect("after progress", 1)
	if st := e.p.Stats().ConnStalls; st != 2 {
		t.Fatalf("Stats.ConnStalls %d, want 2", st)
	}
	// A peer that stops answering: its kernel drops what the engine
	// sends, so nothing is acknowledged while the handler is idle.
	h.waiting.Store(false)
	expect("idle again", 0)
	if out, err := e.tp.A.Command("ip", "link", "set", e.tp.A.Link, "down").CombinedOutput(); err != nil {
		t.Fatalf("link down: %v %s", err, out)
	}
	if err := e.p.Do(func(*tcp.Stack, tcp.Time) {
		if n, err := c.Write(make([]byte, 1000)); n != 1000 || err != nil {
			t.Errorf("write: %d %v", n, err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	got = expect("unacknowledged", 1)
	if !strings.Contains(got[0], "flight=1000") {
		t.Fatalf("report of the unacknowledged octets: %q", got[0])
	}
}

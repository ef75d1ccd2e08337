package rnic

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/qp"
)

// Issue 16: an idle connected QP costs at most 8 KiB of daemon memory,
// fresh or after any number of open/close rounds, and closing every
// connection gives the memory back. The daemon adds its own per-endpoint
// structures (rings, sessions), so the device's part — the QP engine, MPA,
// the LLP connection (the TCP engine's connection and its buffers, or the
// kernel socket's Go side), the tables that find them — is held to
// idleQPBudget of heap, and to no goroutine: an idle QP on the kernel
// datapath hands its socket to the idle set instead of keeping a receive
// goroutine, and its stack, waiting.

// idleQPBudget bounds the heap one idle connected QP holds in the device,
// both ends of each connection counted, half each, with a receive posted,
// measured against the device before the first round: what the tables
// keep of earlier rounds counts. Measured (issue 16's note): 3.3 to 3.5
// KiB on the kernel datapath, 3.8 to 4.2 KiB on xdp, of which about 800
// octets are the device QP and its event channel, 1 KiB the TCP
// connection, and 0.4 to 0.7 KiB xdpnet's flow tables at their high
// water. The bound leaves room for a busy machine and the race detector,
// and none for what issue 16 found held per connection: a 4 MiB TCP send
// buffer, a 256 KiB I/O buffer, or even one 4 KiB ring or goroutine stack
// more per QP.
const idleQPBudget = 5 << 10

// idleQPs is how many connections a round opens: enough that per-QP costs
// dwarf what a round's goroutines and timers leave in passing.
const idleQPs = 200

// idleRounds: a fresh round, then churn (connections closed and opened
// again), which is where buffers not given back used to pile up.
const idleRounds = 3

// maxExtraGoroutines bounds the goroutines that idle QPs may add: a few
// come and go (the idle set's, timers' callbacks); one per QP would be
// 400.
const maxExtraGoroutines = 16

// liveHeap is the heap in use by live objects, after collections that
// empty sync.Pools (two) and the goroutines running.
func liveHeap() (int64, int) {
	for range 3 {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc), runtime.NumGoroutine()
}

func TestIdleQPMemory(t *testing.T) { onBothDatapaths(t, testIdleQPMemory) }

func testIdleQPMemory(t *testing.T, f *fabric) {
	if testing.Short() {
		t.Skip("opens 600 connections")
	}
	srv, cli := f.hosts(t)
	smr, cmr := srv.mr(64, qp.LocalWrite), cli.mr(64, qp.LocalWrite)
	ln := f.listen(t, srv, ListenOptions{Backlog: idleQPs})
	attr := QPAttr{SQDepth: 4, RQDepth: 4, IRD: 4, ORD: 4}
	// The device's own first-use costs (pollers' tables at their first
	// sizes, pools) are not per QP: a connection opened and closed
	// before the baseline pays them.
	closeIdle(t, openIdle(t, f, ln, srv, cli, smr, cmr, attr, 1))
	base, baseG := liveHeap()
	var lefts [idleRounds]int64
	for round := range idleRounds {
		qs := openIdle(t, f, ln, srv, cli, smr, cmr, attr, idleQPs)
		// Delayed ACKs, the nudge timer, and the receive goroutines'
		// idle deadline pass; on a busy machine the last of them may
		// take a little longer to park.
		time.Sleep(kernelIdleAfter)
		for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > baseG+maxExtraGoroutines && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		held, g := liveHeap()
		perQP := float64(held-base) / (2 * idleQPs)
		closeIdle(t, qs)
		qs = nil
		left, _ := liveHeap()
		left -= base
		lefts[round] = left
		t.Logf("round %d: %.0f B of heap per idle connected QP, %d goroutines more than before; %d B left after closing",
			round, perQP, g-baseG, left)
		if perQP > idleQPBudget {
			t.Errorf("round %d: %.0f B per idle connected QP, want at most %d", round, perQP, idleQPBudget)
		}
		if g-baseG > maxExtraGoroutines {
			t.Errorf("round %d: %d goroutines more with %d idle QPs", round, g-baseG, 2*idleQPs)
		}
		// What closed connections leave is tables at their high water
		// (xdpnet's flow maps do not shrink) and the runtime's records
		// of goroutines that ended (kept for reuse), 0.2 to 0.3 MB here:
		// not the QPs, which held 1.7 GB on xdp before issue 16.
		if limit := int64(2 * idleQPs * 1536); left > limit {
			t.Errorf("round %d: %d B still held after closing every connection, want at most %d", round, left, limit)
		}
	}
	// Churn does not pile up: a round adds at most a little to the
	// tables' high water (xdpnet's maps grow with deletions for a few
	// rounds), where anything a closed QP kept would add 0.2 MB a round
	// per 512 octets.
	if grew := lefts[idleRounds-1] - lefts[idleRounds-2]; grew > 2*idleQPs*512 {
		t.Errorf("what closed connections leave grew by %d B in the last round: %v", grew, lefts)
	}
}

// openIdle connects n client QPs of cli to server QPs of srv through ln,
// each with one receive posted, and returns them server, client, server,
// client, ...
func openIdle(t *testing.T, f *fabric, ln *Listener, srv, cli *host, smr, cmr *MR, attr QPAttr, n int) []*QP {
	t.Helper()
	qs := make([]*QP, 0, 2*n)
	for range n {
		s, c := srv.qp(attr), cli.qp(attr)
		for _, q := range []*QP{s, c} {
			// Every close here completes: the timer that would end
			// one the peer leaves half done is not started, so that
			// it does not hold closed QPs into the next measurement
			// for closeTimeout.
			q.closeTimer = func(func()) {}
		}
		must(t, s.PostRecv(&qp.RecvWR{ID: 1, SGL: []qp.SGE{{LKey: smr.STag, Addr: smr.Base, Length: 64}}}))
		must(t, c.PostRecv(&qp.RecvWR{ID: 1, SGL: []qp.SGE{{LKey: cmr.STag, Addr: cmr.Base, Length: 64}}}))
		accepted := make(chan error, 1)
		go func() {
			cr, err := ln.Accept(context.Background())
			if err == nil {
				err = cr.Accept(s, nil)
			}
			accepted <- err
		}()
		_, err := c.Connect(context.Background(), f.connectAddr(ln), ConnectOptions{Timeout: 10 * time.Second})
		must(t, err)
		must(t, <-accepted)
		for _, q := range []*QP{s, c} {
			waitEvent(t, q, Established)
		}
		qs = append(qs, s, c)
	}
	return qs
}

// closeIdle disconnects each pair gracefully from the client, waits for
// both ends to see the end, and destroys the QPs; their receives are
// flushed.
func closeIdle(t *testing.T, qs []*QP) {
	t.Helper()
	for i := 0; i < len(qs); i += 2 {
		qs[i+1].Disconnect(true)
	}
	for _, q := range qs {
		waitEvent(t, q, Disconnected, Broken)
	}
	for _, q := range qs {
		q.Destroy()
	}
	for _, q := range qs {
		drainCQ(q.attr.SendCQ)
		drainCQ(q.attr.RecvCQ)
	}
}

func drainCQ(cq *completion.CQ) {
	var buf [64]completion.Completion
	for cq.Poll(buf[:]) > 0 {
	}
}

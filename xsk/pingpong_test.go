package xsk

import (
	"bytes"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
)

// BenchmarkXSKPingPong measures the round trip of a 64-octet UDP datagram
// between two copy-mode AF_XDP sockets, one on each end of the veth pair
// (native XDP on both), each served by a thread that busy-polls its rings
// on a CPU of its own: no protocol, no application beside it, no sleep.
// It is the floor of any request/response over copy-mode AF_XDP on this
// link, for the RNIC's round trips to be read against. b.N round trips,
// or as many as fit in 20 s; reported as the median and p99 in µs.
func BenchmarkXSKPingPong(b *testing.B) {
	if runtime.NumCPU() < 2 {
		testenv.Unmet(b, "needs two CPUs, has %d", runtime.NumCPU())
	}
	v, err := newVethXSK(b, topology.Options{}, link.XDPDriverMode)
	if err != nil {
		b.Fatal(err)
	}
	// B's end gets a program and a socket of its own, and learns A's
	// address statically, as A learned B's.
	mB, progB := newXSKProgram(b)
	ifiB, err := v.p.B.Interface()
	if err != nil {
		b.Fatal(err)
	}
	if err := v.p.B.Do(func() error {
		l, err := link.AttachXDP(link.XDPOptions{Program: progB, Interface: ifiB.Index, Flags: link.XDPDriverMode})
		if err != nil {
			return err
		}
		b.Cleanup(func() { l.Close() })
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	staticNeighbour(b, v.p.A, v.p.B.Addr.Addr(), v.macB)
	opts := SocketOptions{RXSize: 256, TXSize: 256, FillSize: 256, CompletionSize: 256}
	uA, uB := newTestUMEM(b, 512), newTestUMEM(b, 512)
	optsA := opts
	optsA.Ifindex = v.ifindexA
	sA, err := v.socket(b, uA, optsA, true)
	if err != nil {
		b.Fatal(err)
	}
	sB := v.socketB(b, uB, opts)
	if err := mB.Put(uint32(0), uint32(sB.FD())); err != nil {
		b.Fatal(err)
	}
	payload := bytes.Repeat([]byte{0x5a}, 64)
	ping := make([]byte, 2048)
	pong := make([]byte, 2048)
	nPing := buildUDP(ping, v.macB, v.macA, v.p.B.Addr.Addr(), v.p.A.Addr.Addr(), xskPort, rxPort, 0, payload)
	nPong := buildUDP(pong, v.macA, v.macB, v.p.A.Addr.Addr(), v.p.B.Addr.Addr(), rxPort, xskPort, 0, payload)

	deadline := time.Now().Add(20 * time.Second)
	rounds := b.N
	b.ResetTimer()
	echoDone := make(chan error, 1)
	stop := make(chan struct{})
	go func() { echoDone <- pinned(0, func() { echo(sA, uA, pong[:nPong], stop, deadline) }) }()
	rtts := make([]time.Duration, 0, rounds)
	if err := pinned(1, func() { rtts = pinger(sB, uB, ping[:nPing], rounds, deadline, rtts) }); err != nil {
		b.Fatal(err)
	}
	close(stop)
	if err := <-echoDone; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if len(rtts) == 0 {
		b.Fatal("no round trip completed")
	}
	slices.Sort(rtts)
	us := func(q float64) float64 { return float64(rtts[int(q*float64(len(rtts)-1))]) / 1e3 }
	b.ReportMetric(us(0.5), "median-µs")
	b.ReportMetric(us(0.99), "p99-µs")
	if len(rtts) < rounds {
		b.Logf("%d of %d round trips before the deadline", len(rtts), rounds)
	}
}

// pinned runs fn on a locked OS thread pinned to cpu.
func pinned(cpu int, fn func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- err
			return
		}
		fn()
		errc <- nil
	}()
	return <-errc
}

// rings is one socket's frames: the upper half of the UMEM for sending,
// the lower for the fill ring.
type rings struct {
	s      *Socket
	u      *UMEM
	rxFree *FreeList
	txFree *FreeList
}

func newRings(s *Socket, u *UMEM) *rings {
	half := u.FrameCount() / 2
	r := &rings{s: s, u: u, rxFree: NewFreeList(u.FrameSize(), 0, half), txFree: NewFreeList(u.FrameSize(), half, half)}
	s.Fill().Refill(r.rxFree, uint32(r.rxFree.Len()))
	return r
}

// send copies frame into a TX frame, submits it and kicks the kernel.
func (r *rings) send(frame []byte) bool {
	r.s.Completion().Drain(r.txFree, r.s.Completion().Size())
	addr, ok := r.txFree.Alloc()
	if !ok {
		return false
	}
	copy(r.u.Frame(addr), frame)
	idx, n := r.s.TX().Reserve(1)
	if n == 0 {
		r.txFree.Free(addr)
		return false
	}
	r.s.TX().Set(idx, Desc{Addr: addr, Len: uint32(len(frame))})
	r.s.TX().Submit(1)
	_ = r.s.Kick()
	return true
}

// receive takes what the RX ring holds, recycles it and reports how many.
func (r *rings) receive() int {
	rx := r.s.RX()
	idx, n := rx.Peek(64)
	for i := uint32(0); i < n; i++ {
		r.rxFree.Free(rx.Get(idx + i).Addr)
	}
	if n > 0 {
		rx.Release(n)
		r.s.Fill().Refill(r.rxFree, uint32(r.rxFree.Len()))
	}
	return int(n)
}

// echo answers every frame A's socket receives with pong until stop.
func echo(s *Socket, u *UMEM, pong []byte, stop chan struct{}, deadline time.Time) {
	r := newRings(s, u)
	for i := 0; ; i++ {
		if i%1024 == 0 {
			select {
			case <-stop:
				return
			default:
			}
			if time.Now().After(deadline) {
				return
			}
		}
		for n := r.receive(); n > 0; n-- {
			r.send(pong)
		}
	}
}

// pinger sends ping and waits for the answer, rounds times or until the
// deadline, appending each round trip to rtts.
func pinger(s *Socket, u *UMEM, ping []byte, rounds int, deadline time.Time, rtts []time.Duration) []time.Duration {
	r := newRings(s, u)
	for len(rtts) < rounds && time.Now().Before(deadline) {
		start := time.Now()
		if !r.send(ping) {
			continue
		}
		// A lost datagram ends the wait after a millisecond, and
		// counts for nothing.
		for r.receive() == 0 {
			if time.Since(start) > time.Millisecond {
				break
			}
		}
		if d := time.Since(start); d <= time.Millisecond {
			rtts = append(rtts, d)
		}
	}
	return rtts
}

// Package sim runs TCP engines over a simulated network with a manual
// clock: two hosts, one link each way with delay, jitter, bandwidth, a
// bounded queue, loss, reordering, duplication and corruption, all drawn
// from a seeded generator so every run can be replayed exactly.
package sim

import (
	"container/heap"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/tcp"
)

// Link is one direction of the network.
type Link struct {
	// Delay is the one-way propagation delay; Jitter adds up to that much
	// more, uniformly.
	Delay, Jitter time.Duration
	// Rate in bits per second; 0 is unlimited. Queue bounds the octets
	// waiting to be serialized (drop-tail); 0 is unbounded.
	Rate  int64
	Queue int
	// Probabilities per packet.
	Loss, Duplicate, Reorder, Corrupt float64
	// ReorderDelay is the extra delay of a reordered packet (default
	// 3*Delay+1ms).
	ReorderDelay time.Duration
	// Drop, if set, decides the fate of each packet before the random
	// impairments (scenario tests drop chosen segments with it).
	Drop func(seg []byte) bool
	// JitterKeepsOrder: jitter never makes a packet due before the one
	// sent ahead of it (tc-netem with a rate set, and internal/impair);
	// reordering is then Reorder's alone.
	JitterKeepsOrder bool

	busyUntil tcp.Time
	lastAt    tcp.Time // when the last packet not reordered is due
	queued    []queuedLen
	Stats     LinkStats
}

type queuedLen struct {
	done tcp.Time
	n    int
}

// LinkStats count what a link did.
type LinkStats struct {
	Sent, Delivered, Lost, QueueDrops, Duplicated, Reordered, Corrupted uint64
	Octets                                                              uint64
}

// Host is one end: a stack and its address.
type Host struct {
	Stack *tcp.Stack
	Addr  netip.Addr
	// Unplugged: packets that reach the host are lost (counted in the
	// link's Lost), as while a connection is handed from one stack to
	// another.
	Unplugged bool
	out       *Link
	peer      *Host
}

// Network is two hosts joined by two links.
type Network struct {
	Now  tcp.Time
	A, B *Host
	// AB carries A's packets to B, BA the other way.
	AB, BA *Link
	// Tap, if set, sees every packet as it is sent (before impairment).
	Tap func(from *Host, seg []byte)

	rng     *rand.Rand
	flight  packetHeap
	serial  uint64
	scratch []byte
}

type packet struct {
	at       tcp.Time
	serial   uint64
	to       *Host
	src, dst netip.Addr
	b        []byte
}

// New joins two stacks. The clock starts at one second, not zero, so that
// no timer lands on the zero "unset" value.
func New(seed uint64, a, b *tcp.Stack, ab, ba *Link) *Network {
	n := &Network{
		Now:     tcp.Time(time.Second),
		A:       &Host{Stack: a, Addr: netip.MustParseAddr("192.0.2.1")},
		B:       &Host{Stack: b, Addr: netip.MustParseAddr("192.0.2.2")},
		AB:      ab,
		BA:      ba,
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		scratch: make([]byte, 65536+tcp.MaxHeader),
	}
	n.A.out, n.A.peer = ab, n.B
	n.B.out, n.B.peer = ba, n.A
	return n
}

// Flush sends everything both stacks have to send now.
func (n *Network) Flush() {
	for _, h := range []*Host{n.A, n.B} {
		for i := 0; i < 1<<20; i++ {
			k, src, dst := h.Stack.Output(n.Now, n.scratch)
			if k == 0 {
				break
			}
			n.send(h, src, dst, n.scratch[:k])
		}
	}
}

func (n *Network) send(h *Host, src, dst netip.Addr, seg []byte) {
	l := h.out
	l.Stats.Sent++
	if n.Tap != nil {
		n.Tap(h, seg)
	}
	if l.Drop != nil && l.Drop(seg) {
		l.Stats.Lost++
		return
	}
	if l.Loss > 0 && n.rng.Float64() < l.Loss {
		l.Stats.Lost++
		return
	}
	copies := 1
	if l.Duplicate > 0 && n.rng.Float64() < l.Duplicate {
		copies = 2
		l.Stats.Duplicated++
	}
	// Serialization behind what is queued, drop-tail when full.
	start := max(n.Now, l.busyUntil)
	var tx time.Duration
	if l.Rate > 0 {
		tx = time.Duration(int64(len(seg)+40) * 8 * int64(time.Second) / l.Rate)
		backlog := 0
		k := 0
		for _, q := range l.queued {
			if q.done > n.Now {
				l.queued[k] = q
				k++
				backlog += q.n
			}
		}
		l.queued = l.queued[:k]
		if l.Queue > 0 && backlog+len(seg) > l.Queue {
			l.Stats.QueueDrops++
			return
		}
		l.busyUntil = start.Add(tx)
		l.queued = append(l.queued, queuedLen{l.busyUntil, len(seg)})
	}
	for c := 0; c < copies; c++ {
		at := start.Add(tx + l.Delay)
		if l.Jitter > 0 {
			at = at.Add(time.Duration(n.rng.Int64N(int64(l.Jitter))))
			if l.JitterKeepsOrder {
				at = max(at, l.lastAt)
				l.lastAt = at
			}
		}
		if l.Reorder > 0 && n.rng.Float64() < l.Reorder {
			d := l.ReorderDelay
			if d == 0 {
				d = 3*l.Delay + time.Millisecond
			}
			at = at.Add(d)
			l.Stats.Reordered++
		}
		b := append([]byte(nil), seg...)
		if l.Corrupt > 0 && n.rng.Float64() < l.Corrupt {
			i := n.rng.IntN(len(b))
			b[i] ^= byte(1 + n.rng.IntN(255))
			l.Stats.Corrupted++
		}
		n.serial++
		heap.Push(&n.flight, &packet{at: at, serial: n.serial, to: h.peer, src: src, dst: dst, b: b})
		l.Stats.Octets += uint64(len(seg))
	}
}

// next is the time of the next event, or false if nothing will ever
// happen again.
func (n *Network) next() (tcp.Time, bool) {
	t, ok := tcp.Time(0), false
	if len(n.flight) > 0 {
		t, ok = n.flight[0].at, true
	}
	for _, h := range []*Host{n.A, n.B} {
		if x, has := h.Stack.NextTimer(); has && (!ok || x < t) {
			t, ok = x, true
		}
	}
	return t, ok
}

// Step flushes output, moves the clock to the next event and handles it.
// It returns false when nothing is left to happen.
func (n *Network) Step() bool {
	n.Flush()
	t, ok := n.next()
	if !ok {
		return false
	}
	if t > n.Now {
		n.Now = t
	}
	for len(n.flight) > 0 && n.flight[0].at <= n.Now {
		p := heap.Pop(&n.flight).(*packet)
		if p.to.Unplugged {
			n.linkTo(p.to).Stats.Lost++
			continue
		}
		n.linkTo(p.to).Stats.Delivered++
		p.to.Stack.Input(n.Now, p.src, p.dst, p.b)
	}
	n.A.Stack.Advance(n.Now)
	n.B.Stack.Advance(n.Now)
	n.Flush()
	return true
}

func (n *Network) linkTo(h *Host) *Link {
	if h == n.B {
		return n.AB
	}
	return n.BA
}

// Run steps until done returns true or the simulated time passes limit;
// it reports whether done was reached.
func (n *Network) Run(limit time.Duration, done func() bool) bool {
	end := n.Now.Add(limit)
	for !done() {
		if n.Now > end || !n.Step() {
			return done()
		}
	}
	return true
}

// RunFor advances the simulation by d.
func (n *Network) RunFor(d time.Duration) {
	end := n.Now.Add(d)
	for {
		n.Flush()
		t, ok := n.next()
		if !ok || t > end {
			n.Now = end
			n.A.Stack.Advance(n.Now)
			n.B.Stack.Advance(n.Now)
			n.Flush()
			return
		}
		n.Step()
	}
}

type packetHeap []*packet

func (h packetHeap) Len() int { return len(h) }
func (h packetHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].serial < h[j].serial
}
func (h packetHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *packetHeap) Push(x any)   { *h = append(*h, x.(*packet)) }
func (h *packetHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return p
}

package xdpnet

import (
	"bytes"
	"encoding/binary"
	"math"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/tcp"
)

// The handoff ring, without sockets: it holds handoffSlots frames, copies
// them in, gives them back in order, at most max per drain, and carries
// on across the end of its slots and of its uint32 indices.
func TestHandoffRing(t *testing.T) {
	for _, start := range []uint32{0, math.MaxUint32 - handoffSlots/2} {
		h := newHandoff()
		h.head.Store(start)
		h.tail.Store(start)
		var pushed, taken byte
		push := func() bool {
			frame := []byte{pushed, pushed + 1}
			if !h.push(frame) {
				return false
			}
			frame[0] = 0xff // the ring holds a copy
			pushed++
			return true
		}
		drain := func(max int) int {
			return h.drain(max, func(f []byte) {
				if !bytes.Equal(f, []byte{taken, taken + 1}) {
					t.Fatalf("start %#x: frame %x, want %x", start, f, []byte{taken, taken + 1})
				}
				taken++
			})
		}
		for i := range handoffSlots {
			if !push() {
				t.Fatalf("start %#x: push %d of %d refused", start, i, handoffSlots)
			}
		}
		if push() {
			t.Fatalf("start %#x: a full ring took a frame", start)
		}
		if n := drain(10); n != 10 {
			t.Fatalf("start %#x: drained %d, want 10", start, n)
		}
		// The slots drained are free again: the tail wraps onto them.
		for i := range 10 {
			if !push() {
				t.Fatalf("start %#x: push %d after the drain refused", start, i)
			}
		}
		if push() {
			t.Fatalf("start %#x: the ring took more than it freed", start)
		}
		total := 10
		for {
			n := drain(rxBatch)
			if n > rxBatch {
				t.Fatalf("start %#x: drained %d, more than %d", start, n, rxBatch)
			}
			if n == 0 {
				break
			}
			total += n
		}
		if total != handoffSlots+10 {
			t.Fatalf("start %#x: %d frames came out, %d went in", start, total, handoffSlots+10)
		}
		if h.head.Load() != h.tail.Load() || h.head.Load() != start+handoffSlots+10 {
			t.Fatalf("start %#x: head %#x tail %#x after draining all", start, h.head.Load(), h.tail.Load())
		}
	}
}

// The Group's bookkeeping: owners, listeners and flows being moved, and
// the rings join makes between every two members.
func TestGroupRoute(t *testing.T) {
	g := NewGroup()
	a, b, c := &Poller{}, &Poller{}, &Poller{}
	for _, p := range []*Poller{a, b, c} {
		g.join(p)
	}
	for _, p := range []*Poller{a, b, c} {
		if len(p.in) != 2 || len(p.out) != 2 {
			t.Fatalf("%d rings in, %d out: want 2 each", len(p.in), len(p.out))
		}
		for q, h := range p.out {
			if q == p || !containsRing(q.in, h) {
				t.Fatal("a ring out is not the other poller's ring in")
			}
		}
	}
	id := tcp.FourTuple{LocalAddr: netip.MustParseAddr("10.0.0.2"), RemoteAddr: netip.MustParseAddr("10.0.0.1"),
		LocalPort: 7001, RemotePort: 40000}
	route := func(syn bool, wantOwner *Poller, wantDrop bool) {
		t.Helper()
		if owner, drop := g.route(id, syn); owner != wantOwner || drop != wantDrop {
			t.Fatalf("route(syn %v): %p %v, want %p %v", syn, owner, drop, wantOwner, wantDrop)
		}
	}
	route(false, nil, false)
	route(true, nil, false)
	g.setListen(id.LocalPort, b)
	route(true, b, false)
	route(false, nil, false) // only SYNs go to the listener
	g.setOwner(id, a)
	route(true, a, false)
	route(false, a, false)
	g.setMoving(id, true)
	route(false, nil, true)
	g.setOwner(id, c)
	g.setMoving(id, false)
	route(false, c, false)
	g.clearOwner(id, a) // not a's any more: stays c's
	route(false, c, false)
	g.clearOwner(id, c)
	route(false, nil, false)
	route(true, b, false)
	g.setListen(id.LocalPort, nil)
	route(true, nil, false)

	// A poller outside any Group: the bookkeeping is a no-op.
	var none *Group
	none.setOwner(id, a)
	none.clearOwner(id, a)
	none.setListen(id.LocalPort, a)
}

func containsRing(rings []*handoff, h *handoff) bool {
	for _, r := range rings {
		if r == h {
			return true
		}
	}
	return false
}

// A segment of a flow another poller owns is handed to it; handed on to a
// poller whose flow Move gave to a third meanwhile, it is dropped, not
// answered by that poller's Stack with a reset.
func TestInputFrameOwnership(t *testing.T) {
	local, remote := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1")
	g := NewGroup()
	var ps [3]*Poller
	for i := range ps {
		s, err := tcp.NewStack(tcp.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ps[i] = &Poller{cfg: Config{Addr: local, Group: g}, stack: s, eventfd: -1}
		g.join(ps[i])
	}
	a, b, c := ps[0], ps[1], ps[2]
	id := tcp.FourTuple{LocalAddr: local, RemoteAddr: remote, LocalPort: 7001, RemotePort: 40000}
	frame := ackFrame(id)
	now := tcp.Time(1e9)

	g.setOwner(id, c)
	a.inputFrame(now, frame, false)
	if a.stats.HandedOff != 1 || a.stack.Stats.SegmentsIn != 0 {
		t.Fatalf("a: handed off %d, its Stack took %d; want 1, 0", a.stats.HandedOff, a.stack.Stats.SegmentsIn)
	}
	if n := a.out[c].drain(rxBatch, func(f []byte) {
		if !bytes.Equal(f, frame) {
			t.Fatal("c got another frame than a handed off")
		}
	}); n != 1 {
		t.Fatalf("c's ring from a held %d frames, want 1", n)
	}

	// Handed to b, which owned the flow, after it moved on to c.
	b.inputFrame(now, frame, true)
	if b.stats.MovingDrops != 1 || b.stack.Stats.SegmentsIn != 0 || b.stack.Stats.RSTsSent != 0 {
		t.Fatalf("b: moving drops %d, its Stack took %d and reset %d; want 1, 0, 0",
			b.stats.MovingDrops, b.stack.Stats.SegmentsIn, b.stack.Stats.RSTsSent)
	}
	if b.stats.HandedOff != 0 {
		t.Fatal("b handed a handed frame on")
	}

	// Handed to its owner, the frame goes to the owner's Stack (which has
	// no connection for it here, and answers it).
	c.inputFrame(now, frame, true)
	if c.stack.Stats.SegmentsIn != 1 || c.stats.MovingDrops != 0 {
		t.Fatalf("c: its Stack took %d, moving drops %d; want 1, 0", c.stack.Stats.SegmentsIn, c.stats.MovingDrops)
	}
}

// ackFrame is an Ethernet frame with a bare ACK from id's remote end.
func ackFrame(id tcp.FourTuple) []byte {
	frame := make([]byte, header.EthernetLen+header.IPv4MinLen+header.TCPMinLen)
	header.Ethernet(frame).Encode(&header.EthernetFields{Type: header.EtherTypeIPv4})
	header.IPv4(frame[header.EthernetLen:]).Encode(&header.IPv4Fields{
		TotalLen: header.IPv4MinLen + header.TCPMinLen, TTL: 64, Protocol: header.IPProtocolTCP,
		Src: id.RemoteAddr, Dst: id.LocalAddr,
	})
	seg := header.TCP(frame[header.EthernetLen+header.IPv4MinLen:])
	seg.Encode(&header.TCPFields{SrcPort: id.RemotePort, DstPort: id.LocalPort, Seq: 1, Ack: 1,
		Flags: header.TCPFlagACK, Window: 1000})
	seg.SetChecksum(id.RemoteAddr, id.LocalAddr)
	return frame
}

// Frames and Async calls for a sleeping loop write its eventfd once per
// sleep, however many there are; for a loop awake, not at all.
func TestWakeOncePerSleep(t *testing.T) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	p := &Poller{eventfd: fd}
	writes := func() uint64 {
		var b [8]byte
		if _, err := unix.Read(fd, b[:]); err == unix.EAGAIN {
			return 0
		} else if err != nil {
			t.Fatal(err)
		}
		return binary.NativeEndian.Uint64(b[:])
	}
	for range 3 {
		p.Wake()
	}
	if n := writes(); n != 0 {
		t.Fatalf("awake: %d writes", n)
	}
	for sleep := range 2 {
		// As sleep does before ppoll.
		p.woken.Store(false)
		p.sleeping.Store(true)
		for range 5 {
			p.Wake()
		}
		p.Async(func() {})
		if n := writes(); n != 1 {
			t.Fatalf("sleep %d: %d writes, want 1", sleep, n)
		}
		p.sleeping.Store(false)
	}
	if !p.runAsync() || p.runAsync() {
		t.Fatal("runAsync did not run the queued functions exactly once")
	}
}

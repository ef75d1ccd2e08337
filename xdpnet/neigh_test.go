package xdpnet

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/tcp"
)

// OffLinkPeer gives A an address off the link, 10.99.0.1 on its loopback,
// which B routes through A, and returns it. Exported for the package's
// external tests (TestPollerRoutedPeer).
func OffLinkPeer(tb testing.TB, tp *topology.Pair) netip.Addr {
	tb.Helper()
	ip(tb, tp.A, "addr", "add", "10.99.0.1/32", "dev", "lo")
	ip(tb, tp.B, "route", "add", "10.99.0.0/24", "via", tp.A.Addr.Addr().String())
	return netip.MustParseAddr("10.99.0.1")
}

// ip runs ip(8) with args in h's namespace.
func ip(tb testing.TB, h topology.Host, args ...string) {
	tb.Helper()
	if out, err := h.Command("ip", args...).CombinedOutput(); err != nil {
		tb.Fatalf("ip %v: %v %s", args, err, out)
	}
}

// The neighbour cache follows the kernel: a peer off the link is reached
// through its route's gateway, a replaced neighbour entry is picked up at
// the next sweep rather than after neighbourTTL, and an address the kernel
// routes elsewhere is refused.
func TestNeighboursFollowKernel(t *testing.T) {
	tp := topology.NewTest(t, topology.Options{})
	off := OffLinkPeer(t, tp)
	ifindex := linkOf(t, tp.B).Index
	var n *neighbours
	if err := tp.B.Do(func() error {
		var err error
		n, err = newNeighbours(ifindex)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer n.close()
	macA := [6]byte(linkOf(t, tp.A).HardwareAddr)
	now := tcp.Time(time.Second)
	// lookup runs in B's namespace: it may solicit the kernel there.
	lookup := func(addr netip.Addr) (mac [6]byte, ok bool) {
		_ = tp.B.Do(func() error { mac, ok = n.lookup(now, addr); return nil })
		return mac, ok
	}
	resolve := func(addr netip.Addr) ([6]byte, bool) {
		t.Helper()
		var mac [6]byte
		var ok bool
		for range 200 {
			now += tcp.Time(retrigger)
			if mac, ok = lookup(addr); ok {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		return mac, ok
	}
	// followed drains the notifications until changed reports the change
	// they should have brought; now stays well within neighbourTTL, so
	// only a notification can bring it.
	followed := func(what string, changed func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Second); ; {
			n.follow()
			if changed() {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the %s was not followed", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if hop, st := n.nextHop(now, off); st != routed || hop != tp.A.Addr.Addr() {
		t.Fatalf("next hop of %v: %v %v, want the gateway %v", off, hop, st, tp.A.Addr.Addr())
	}
	if mac, ok := resolve(off); !ok || mac != macA {
		t.Fatalf("MAC for %v: %x %v, want A's %x", off, mac, ok, macA)
	}
	if mac, ok := resolve(tp.A.Addr.Addr()); !ok || mac != macA {
		t.Fatalf("MAC for A: %x %v", mac, ok)
	}

	// The kernel's entry changes: the cache follows at the next drain of
	// the notifications, well within neighbourTTL.
	other := [6]byte{0x02, 0, 0, 0, 0, 0x99}
	ip(t, tp.B, "neigh", "replace", tp.A.Addr.Addr().String(), "lladdr", net.HardwareAddr(other[:]).String(), "dev", tp.B.Link, "nud", "permanent")
	now += tcp.Time(time.Millisecond)
	followed("neighbour change", func() bool {
		mac, ok := lookup(off)
		return ok && mac == other
	})

	// A route change is followed too: 10.99.0.0/24 now goes nowhere
	// through this interface.
	ip(t, tp.B, "route", "replace", "unreachable", "10.99.0.0/24")
	followed("route change", func() bool {
		_, st := n.nextHop(now, off)
		return st == notRouted
	})
	if _, ok := lookup(off); ok {
		t.Fatal("a MAC for an unreachable destination")
	}
}

// linkOf is h's veth interface.
func linkOf(t testing.TB, h topology.Host) *net.Interface {
	t.Helper()
	ifi, err := h.Interface()
	if err != nil {
		t.Fatal(err)
	}
	return ifi
}

// BenchmarkNeigh measures the resolution path as the loop runs it, from
// B towards A over the test pair:
//   - Hit: the MAC of the peer the last segment went to, the lookup of
//     every segment transmit sends;
//   - Alternate: two peers in turn, each a cache hit;
//   - Refresh: every lookup finds its entry expired and asks the kernel
//     for the route and the neighbour, what each peer costs every
//     neighbourTTL and what Connect costs for a new peer;
//   - Follow: a drain of the notifications with none pending, every
//     sweep (100 ms).
func BenchmarkNeigh(b *testing.B) {
	tp := topology.NewTest(b, topology.Options{})
	off := OffLinkPeer(b, tp)
	var n *neighbours
	if err := tp.B.Do(func() (err error) {
		n, err = newNeighbours(linkOf(b, tp.B).Index)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer n.close()
	peer := tp.A.Addr.Addr()
	now := tcp.Time(time.Second)
	resolved := false
	for range 200 {
		now += tcp.Time(retrigger)
		_ = tp.B.Do(func() error { _, resolved = n.lookup(now, peer); return nil })
		if resolved {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !resolved {
		b.Fatalf("%v not resolved", peer)
	}
	// A permanent entry: Refresh must not depend on the kernel's timers.
	ip(b, tp.B, "neigh", "replace", peer.String(), "lladdr", linkOf(b, tp.A).HardwareAddr.String(), "dev", tp.B.Link, "nud", "permanent")
	check := func(b *testing.B, addr netip.Addr) {
		if _, ok := n.lookup(now, addr); !ok {
			b.Fatalf("lookup of %v failed", addr)
		}
	}
	b.Run("Hit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			check(b, peer)
		}
	})
	b.Run("Alternate", func(b *testing.B) {
		b.ReportAllocs()
		addrs := [2]netip.Addr{peer, off}
		i := 0
		for b.Loop() {
			check(b, addrs[i&1])
			i++
		}
	})
	b.Run("Refresh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			now += tcp.Time(neighbourTTL)
			check(b, peer)
		}
	})
	b.Run("Follow", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n.follow()
		}
	})
}

package xdpnet

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/tcp"
)

// The neighbour cache follows the kernel: a peer off the link is reached
// through its route's gateway, a replaced neighbour entry is picked up at
// the next sweep rather than after neighbourTTL, and an address the kernel
// routes elsewhere is refused.
func TestNeighboursFollowKernel(t *testing.T) {
	testenv.RequireRoot(t)
	tp := topology.NewTest(t, topology.Options{})
	run := func(h topology.Host, args ...string) {
		t.Helper()
		if out, err := h.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	// A has an address off the link, which B routes through A.
	run(tp.A, "addr", "add", "10.99.0.1/32", "dev", "lo")
	run(tp.B, "route", "add", "10.99.0.0/24", "via", tp.A.Addr.Addr().String())
	ifi, err := interfaceIn(tp.B, tp.B.Link)
	if err != nil {
		t.Fatal(err)
	}
	var n *neighbours
	if err := tp.B.Do(func() error {
		var err error
		n, err = newNeighbours(ifi.Index)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer n.close()
	macA := [6]byte(mustIface(t, tp.A).HardwareAddr)
	now := tcp.Time(time.Second)
	resolve := func(addr netip.Addr) ([6]byte, bool) {
		t.Helper()
		var mac [6]byte
		var ok bool
		for range 200 {
			now += tcp.Time(retrigger)
			_ = tp.B.Do(func() error { mac, ok = n.lookup(now, addr); return nil })
			if ok {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		return mac, ok
	}
	off := netip.MustParseAddr("10.99.0.1")
	if hop, ok := n.nextHop(now, off); !ok || hop != tp.A.Addr.Addr() {
		t.Fatalf("next hop of %v: %v %v, want the gateway %v", off, hop, ok, tp.A.Addr.Addr())
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
	run(tp.B, "neigh", "replace", tp.A.Addr.Addr().String(), "lladdr", net.HardwareAddr(other[:]).String(), "dev", tp.B.Link, "nud", "permanent")
	now += tcp.Time(time.Millisecond)
	for i := 0; n.follow() == 0; i++ {
		if i == 100 {
			t.Fatal("no notification of the neighbour change")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var mac [6]byte
	var ok bool
	_ = tp.B.Do(func() error { mac, ok = n.lookup(now, off); return nil })
	if !ok || mac != other {
		t.Fatalf("after the change: %x %v, want %x", mac, ok, other)
	}

	// A route change is followed too: 10.99.0.0/24 now goes nowhere
	// through this interface.
	run(tp.B, "route", "replace", "unreachable", "10.99.0.0/24")
	for i := 0; n.follow() == 0; i++ {
		if i == 100 {
			t.Fatal("no notification of the route change")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if hop, ok := n.nextHop(now, off); ok {
		t.Fatalf("next hop %v for an unreachable destination", hop)
	}
	if _, ok := n.lookup(now, off); ok {
		t.Fatal("a MAC for an unreachable destination")
	}
}

func interfaceIn(h topology.Host, name string) (*net.Interface, error) {
	var ifi *net.Interface
	err := h.Do(func() error {
		var err error
		ifi, err = net.InterfaceByName(name)
		return err
	})
	return ifi, err
}

func mustIface(t *testing.T, h topology.Host) *net.Interface {
	t.Helper()
	ifi, err := interfaceIn(h, h.Link)
	if err != nil {
		t.Fatal(err)
	}
	return ifi
}

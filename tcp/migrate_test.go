package tcp_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
)

// A connection moved to another Stack in the middle of a lossy transfer
// both ways (as a poller hands a connection to the QP's poller) goes on
// as if nothing happened: every octet arrives, in order, and both sides
// close cleanly; the old Stack no longer knows it.
func TestDetachAdopt(t *testing.T) {
	o := tcp.Options{TimeWait: time.Second}
	a, b := newStack(t, o), newStack(t, o)
	lossy := func() *sim.Link { return &sim.Link{Delay: time.Millisecond, Loss: 0.02, Reorder: 0.01} }
	n := sim.New(7, a, b, lossy(), lossy())
	const up, down = 2 << 20, 1 << 20
	srv := &sim.Endpoint{Seed: 2, PeerSeed: 1, Total: down, CloseWhenDone: true}
	l, err := b.Listen(netip.Addr{}, 6000, srv)
	if err != nil {
		t.Fatal(err)
	}
	var c *tcp.Conn
	cli := &sim.Endpoint{Seed: 1, PeerSeed: 2, Total: up, CloseWhenDone: true}
	c, err = a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, 6000), cli)
	if err != nil {
		t.Fatal(err)
	}
	cli.Conn = c
	if !n.Run(10*time.Second, func() bool { return srv.Recvd > up/3 && cli.Recvd > down/3 }) {
		t.Fatalf("transfer did not start: %d %d", srv.Recvd, cli.Recvd)
	}
	sc := b.Lookup(tcp.FourTuple{LocalAddr: n.B.Addr, RemoteAddr: n.A.Addr, LocalPort: 6000, RemotePort: c.ID().LocalPort})
	if sc == nil {
		t.Fatal("server connection not found")
	}
	// Accepted connections leave the listener's queue first.
	if err := b.Detach(sc); err == nil {
		t.Fatal("detached a connection still in the accept queue")
	}
	l.Accept()
	b2 := newStack(t, o)
	if err := b.Detach(sc); err != nil {
		t.Fatal(err)
	}
	if b.Lookup(sc.ID()) != nil || b.Conns() != 0 {
		t.Fatal("old stack still has the connection")
	}
	if _, ok := b.NextTimer(); ok {
		t.Fatal("old stack kept the connection's timer")
	}
	if err := b.Detach(sc); err == nil {
		t.Fatal("detached twice")
	}
	if err := b2.Adopt(sc); err != nil {
		t.Fatal(err)
	}
	if err := b2.Adopt(sc); err == nil {
		t.Fatal("adopted twice")
	}
	n.B.Stack = b2
	if !n.Run(time.Minute, func() bool { return srv.Recvd == up && cli.Recvd == down && srv.Closed && cli.Closed }) {
		t.Fatalf("after the move: recvd %d/%d and %d/%d, closed %v %v", srv.Recvd, up, cli.Recvd, down, srv.Closed, cli.Closed)
	}
	if srv.Corrupt != nil || cli.Corrupt != nil || srv.Err != nil || cli.Err != nil {
		t.Fatalf("corrupt %v %v, errors %v %v", srv.Corrupt, cli.Corrupt, srv.Err, cli.Err)
	}
	if b2.Stats.NoSocket != 0 || b.Stats.RSTsSent != 0 || b2.Stats.RSTsSent != 0 {
		t.Fatalf("stray segments: %+v / %+v", b.Stats, b2.Stats)
	}
}

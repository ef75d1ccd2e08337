package tcp_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
)

// A peer that acknowledges our FIN and never sends its own does not hold
// the connection for ever: FIN-WAIT-2 ends after FinTimeout with a reset,
// as Linux ends an orphaned socket's.
func TestFinWait2Timeout(t *testing.T) {
	a := newStack(t, tcp.Options{FinTimeout: 30 * time.Second})
	b := newStack(t, tcp.Options{})
	n := sim.New(1, a, b, plainLink(), plainLink())
	srv := &sim.Endpoint{} // never closes its side
	if _, err := b.Listen(netip.Addr{}, port, srv); err != nil {
		t.Fatal(err)
	}
	cli := &sim.Endpoint{}
	c, err := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, port), cli)
	if err != nil {
		t.Fatal(err)
	}
	if !n.Run(time.Second, func() bool { return srv.Established && cli.Established }) {
		t.Fatal("no handshake")
	}
	c.Close()
	if !n.Run(time.Second, func() bool { return c.State() == tcp.StateFinWait2 }) {
		t.Fatalf("state %v, want FIN-WAIT-2", c.State())
	}
	start := n.Now
	if !n.Run(time.Minute, func() bool { return cli.Closed }) {
		t.Fatalf("still %v after a minute", c.State())
	}
	if took := n.Now.Sub(start); took < 29*time.Second || took > 31*time.Second {
		t.Errorf("FIN-WAIT-2 lasted %v, want the 30 s FinTimeout", took)
	}
	if !errors.Is(cli.Err, tcp.ErrTimedOut) {
		t.Errorf("ended with %v, want ErrTimedOut", cli.Err)
	}
	if !n.Run(time.Second, func() bool { return srv.Closed }) || !errors.Is(srv.Err, tcp.ErrReset) {
		t.Errorf("the peer: closed %v with %v, want the reset", srv.Closed, srv.Err)
	}
	if a.Conns() != 0 {
		t.Errorf("%d connections left", a.Conns())
	}
}

package xdpnet

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The port table on loopback: connections to different remote ends share
// the ports held, one kernel socket each, which keeps the kernel off them;
// a remote end with as many connections as ports held gets a new one; the
// last connection on a port gives it back.
func TestPortTableSharesPortsBetweenRemoteEnds(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	tab := newPortTable(lo)
	defer tab.closeAll()
	r1, r2 := netip.MustParseAddrPort("192.0.2.1:4791"), netip.MustParseAddrPort("192.0.2.1:4792")
	free := func(uint16) bool { return false }
	acquire := func(r netip.AddrPort) uint16 {
		t.Helper()
		port, err := tab.acquire(r, free)
		if err != nil {
			t.Fatal(err)
		}
		return port
	}
	var ports []uint16
	for range 3 {
		ports = append(ports, acquire(r1))
	}
	if tab.held() != 3 {
		t.Fatalf("3 connections to one remote end hold %d ports", tab.held())
	}
	shared := map[uint16]bool{}
	for range 3 {
		shared[acquire(r2)] = true
	}
	if tab.held() != 3 || len(shared) != 3 {
		t.Fatalf("3 more to another remote end: %d ports held, %d distinct; want the same 3", tab.held(), len(shared))
	}
	for _, p := range ports {
		if !shared[p] {
			t.Errorf("port %d of the first remote end not shared", p)
		}
	}
	// A held port is the table's: the kernel gives it to nobody.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Bind(fd, &unix.SockaddrInet4{Addr: lo.As4(), Port: int(ports[0])})
	unix.Close(fd)
	if !errors.Is(err, unix.EADDRINUSE) {
		t.Errorf("bind to held port %d: %v, want EADDRINUSE", ports[0], err)
	}
	// A fourth to r2: every held port is busy towards it.
	p4 := acquire(r2)
	if tab.held() != 4 {
		t.Fatalf("a fourth connection to one remote end: %d ports held, want 4", tab.held())
	}
	// A port the Stack has a connection on is skipped.
	taken := ports[1]
	p5, err := tab.acquire(r1, func(p uint16) bool { return p == taken })
	if err != nil {
		t.Fatal(err)
	}
	if p5 == taken {
		t.Errorf("acquire gave port %d, which the Stack has", taken)
	}
	tab.release(p5, r1)
	// Released, the ports go back once nobody uses them.
	tab.release(p4, r2)
	if tab.held() != 3 {
		t.Fatalf("after the fourth's release: %d ports held, want 3", tab.held())
	}
	for _, p := range ports {
		tab.release(p, r1)
	}
	if tab.held() != 3 {
		t.Fatalf("r2 still uses all 3 ports, but %d are held", tab.held())
	}
	// A late second release of a pair (a connection forgotten twice)
	// must not take the port from r2's connection on it.
	tab.release(ports[0], r1)
	if _, ok := tab.used[portRemote{ports[0], r2}]; tab.held() != 3 || !ok {
		t.Fatalf("a second release of port %d towards r1: %d ports held, r2's pair kept %v", ports[0], tab.held(), ok)
	}
	for p := range shared {
		tab.release(p, r2)
	}
	if tab.held() != 0 || len(tab.used) != 0 || len(tab.remotes) != 0 {
		t.Fatalf("all released: %d ports held, %d pairs, %d remote ends", tab.held(), len(tab.used), len(tab.remotes))
	}
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: lo.As4(), Port: int(ports[0])}); err != nil {
		t.Errorf("bind to released port %d: %v", ports[0], err)
	}
}

// A port whose last kernel connection lingers in TIME_WAIT can still be
// reserved for a listener, as any server with SO_REUSEADDR could take it.
func TestReservePortOverTimeWait(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	// The server's side closes first: its port ends in TIME_WAIT.
	s.Close()
	buf := make([]byte, 1)
	_, _ = c.Read(buf) // EOF: the server's FIN is here
	c.Close()
	ln.Close()
	time.Sleep(50 * time.Millisecond) // the last ACK
	fd, got, err := reservePort(netip.MustParseAddr("127.0.0.1"), port)
	if err != nil {
		t.Fatalf("reserve port %d over a TIME_WAIT: %v", port, err)
	}
	defer unix.Close(fd)
	if got != port {
		t.Fatalf("reserved %d, want %d", got, port)
	}
}

package topology

import (
	"bytes"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPairCarriesTCPAndHonoursOptions(t *testing.T) {
	p := NewTest(t, Options{
		MTU:    3000,
		Queues: 2,
		AddrA:  netip.MustParsePrefix("198.51.100.1/24"),
		AddrB:  netip.MustParsePrefix("198.51.100.2/24"),
	})

	// Only ip's standard output is parsed: while it names the peer's
	// namespace it asks the kernel about every named one, and a namespace
	// another test is deleting at that moment makes it print "Peer netns
	// reference is invalid" on its standard error.
	show := p.A.Command("ip", "-d", "link", "show", p.A.Link)
	var stderr bytes.Buffer
	show.Stderr = &stderr
	out, err := show.Output()
	if err != nil {
		t.Fatalf("ip link show: %v: %s%s", err, out, stderr.Bytes())
	}
	for _, want := range []string{"mtu 3000", "numtxqueues 2", "numrxqueues 2"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("link of A lacks %q:\n%s", want, out)
		}
	}
	// Interface sees the link from inside the namespace: the index and
	// address ip prints there.
	ifi, err := p.A.Interface()
	if err != nil {
		t.Fatal(err)
	}
	if ifi.Name != p.A.Link || ifi.MTU != 3000 || len(ifi.HardwareAddr) != 6 ||
		!strings.HasPrefix(string(out), strconv.Itoa(ifi.Index)+": "+p.A.Link+"@") ||
		!strings.Contains(string(out), "link/ether "+ifi.HardwareAddr.String()+" ") {
		t.Errorf("Interface of A: %s index %d mtu %d mac %v; ip link shows\n%s", ifi.Name, ifi.Index, ifi.MTU, ifi.HardwareAddr, out)
	}
	if _, err := (Host{Namespace: p.A.Namespace, Link: p.B.Link}).Interface(); err == nil {
		t.Errorf("Interface found %s in A's namespace", p.B.Link)
	}
	out, err = p.B.Command("ethtool", "-k", p.B.Link).CombinedOutput()
	if err != nil {
		t.Fatalf("ethtool -k: %v: %s", err, out)
	}
	for _, want := range []string{"tx-checksumming: off", "tcp-segmentation-offload: off", "generic-segmentation-offload: off"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("offloads of B: want %q in\n%s", want, out)
		}
	}

	// A listener in B, a dialer in A: the sockets live in their namespaces.
	ln, err := p.B.ListenTCP(netip.AddrPortFrom(p.B.Addr.Addr(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	payload := bytes.Repeat([]byte("softrnic"), 64<<10)
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	c, err := p.A.DialTCP(ln.Addr().(*net.TCPAddr).AddrPort(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if la, ra := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr(), c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); la != p.A.Addr.Addr() || ra != p.B.Addr.Addr() {
		t.Errorf("connection %v -> %v, want %v -> %v", la, ra, p.A.Addr.Addr(), p.B.Addr.Addr())
	}
	_, err = c.Write(payload)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if !bytes.Equal(b, payload) {
			t.Fatalf("received %d bytes, want %d identical", len(b), len(payload))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no data within 30 s")
	}
}

func TestCloseRemovesNamespacesAndProcesses(t *testing.T) {
	p := NewTest(t, Options{})
	cmd := p.A.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Wait until the process is seen inside the namespace.
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, _ := exec.Command("ip", "netns", "pids", p.A.Namespace).Output()
		if strings.TrimSpace(string(pids)) != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("process never appeared in the namespace")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("process in the namespace survived Close")
	}
	for _, ns := range []string{p.A.Namespace, p.B.Namespace} {
		if exists(ns) {
			t.Errorf("namespace %s survived Close", ns)
		}
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := New(Options{Queues: 65}); err == nil {
		t.Error("65 queues accepted")
	}
	if _, err := New(Options{AddrA: netip.MustParsePrefix("192.0.2.1/24"), AddrB: netip.MustParsePrefix("2001:db8::2/64")}); err == nil {
		t.Error("mixed families accepted")
	}
}

package systest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/internal/streamcheck"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/internal/tshark"
	"github.com/softrnic/softrnic/sdp"
)

// SDP between two namespaces, each with its softrnicd, on both datapaths
// and on an impaired link: sdp connections behave as a net.Conn must
// (x/net's conformance test), move 1 GiB each way at once with random
// write and read sizes, SHA-256 equal (128 MiB under the race detector;
// make test runs the whole of it without), and fall back to TCP both
// ways.
func TestSDPTwoHosts(t *testing.T) {
	testenv.RequireRoot(t)
	tp := topology.NewTest(t, topology.Options{})
	dir := t.TempDir()
	build(t, dir)
	cases := []struct {
		name string
		args []string
	}{
		{"kernel", nil},
		{"xdp", []string{"--datapath", "xdp"}},
		{"xdp-lossy", []string{"--datapath", "xdp", "--impair", "loss=0.2%%,reorder=0.2%%,duplicate=0.1%%,seed=%d"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := func(side int) []string {
				a := append([]string{"--cpus", fmt.Sprint(side)}, tc.args...)
				for j := range a {
					if a[j] == "--impair" {
						a[j+1] = fmt.Sprintf(a[j+1], side+1)
					}
				}
				return a
			}
			sockA, sockB := filepath.Join(dir, fmt.Sprintf("sdp-a%d.sock", i)), filepath.Join(dir, fmt.Sprintf("sdp-b%d.sock", i))
			da, err := startDaemonProc(tp.A, dir, "A", sockA, args(0)...)
			if err != nil {
				t.Fatal(err)
			}
			defer da.kill()
			db, err := startDaemonProc(tp.B, dir, "B", sockB, args(1)...)
			if err != nil {
				t.Fatal(err)
			}
			defer db.kill()
			defer func() {
				if t.Failed() {
					t.Logf("daemon A:\n%s\ndaemon B:\n%s", da.out.String(), db.out.String())
				}
			}()
			port := uint16(27000 + 10*i)
			tl, err := tp.B.ListenTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), port))
			if err != nil {
				t.Fatal(err)
			}
			ln := sdp.NewListener(tl, sdp.ListenConfig{Socket: sockB})
			defer ln.Close()
			// A busy machine under the race detector can take seconds
			// to set a connection up.
			d := &sdp.Dialer{Socket: sockA, NoFallback: true, HelloTimeout: 20 * time.Second}
			addr := ln.Addr().String()
			pipe := func() (net.Conn, net.Conn, error) {
				ch := make(chan net.Conn, 1)
				go func() {
					c, _ := ln.Accept()
					ch <- c
				}()
				c1, err := d.DialContext(context.Background(), "tcp", addr)
				if err != nil {
					return nil, nil, err
				}
				c2 := <-ch
				if _, ok := c2.(*sdp.Conn); !ok {
					c1.Close()
					return nil, nil, fmt.Errorf("accepted a %T, want *sdp.Conn", c2)
				}
				return c1, c2, nil
			}
			if tc.name != "xdp-lossy" {
				t.Run("nettest", func(t *testing.T) {
					nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
						c1, c2, err = pipe()
						if err != nil {
							return nil, nil, nil, err
						}
						return c1, c2, func() { c1.Close(); c2.Close() }, nil
					})
				})
			}
			t.Run("volume", func(t *testing.T) {
				c1, c2, err := pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer c1.Close()
				defer c2.Close()
				total := 1 << 30
				if testenv.Race {
					total = 128 << 20
				}
				start := time.Now()
				errs := make(chan error, 2)
				go func() { errs <- streamcheck.Verified(c1, c2, total, 1) }()
				go func() { errs <- streamcheck.Verified(c2, c1, total, 2) }()
				for range 2 {
					if err := <-errs; err != nil {
						t.Fatal(err)
					}
				}
				el := time.Since(start)
				t.Logf("%d MiB each way at once, SHA-256 equal, in %v (%.2f Gbit/s each way); dialer %+v, acceptor %+v",
					total>>20, el.Round(time.Millisecond), float64(total)*8/el.Seconds()/1e9, c1.(*sdp.Conn).Stats(), c2.(*sdp.Conn).Stats())
				for _, c := range []net.Conn{c1, c2} {
					if st := c.(*sdp.Conn).Stats(); st.MinCredits < 0 || st.ZcopySent == 0 {
						t.Errorf("stats %+v: credits below zero, or no Read Zcopy", st)
					}
				}
			})
			if tc.name == "xdp-lossy" {
				return
			}
			if tc.name == "kernel" {
				// tcpdump sees both directions only where neither
				// end's frames bypass the kernel.
				t.Run("wireshark", func(t *testing.T) { sdpWireshark(t, tp, dir, pipe, port) })
			}
			t.Run("fallback", func(t *testing.T) {
				// A plain TCP client of the sdp listener.
				go streamcheck.EchoServer(ln, func(c net.Conn) {
					if _, ok := c.(*net.TCPConn); !ok {
						t.Errorf("a TCP client accepted as a %T", c)
					}
				})
				c, err := tp.A.DialTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), port), 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if err := streamcheck.Echo(c); err != nil {
					t.Fatal(err)
				}
				// An sdp dialer of a plain TCP server.
				plain, err := tp.B.ListenTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), port+1))
				if err != nil {
					t.Fatal(err)
				}
				defer plain.Close()
				go streamcheck.EchoServer(plain, nil)
				fd := &sdp.Dialer{Socket: sockA, HelloTimeout: 2 * time.Second,
					Fallback: func(ctx context.Context, network, address string) (net.Conn, error) {
						return tp.A.DialTCP(netip.MustParseAddrPort(address), 5*time.Second)
					}}
				fc, err := fd.DialContext(context.Background(), "tcp", plain.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := fc.(*net.TCPConn); !ok {
					t.Fatalf("dialed a %T to a plain TCP server", fc)
				}
				if err := streamcheck.Echo(fc); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// sdpWireshark captures one connection's life (Hello, HelloAck, Data,
// SrcAvail, the RDMA Read, RdmaRdCompl, DisConn) and decodes it with
// Wireshark's InfiniBand SDP dissector through sdp/wireshark/sdp-iwarp.lua:
// every message each side sent decodes, in MSeq order, with the lengths
// and buffer sizes sent.
func sdpWireshark(t *testing.T, tp *topology.Pair, dir string, pipe func() (net.Conn, net.Conn, error), port uint16) {
	testenv.RequireTool(t, "tshark")
	pcap := filepath.Join(dir, "sdp.pcap")
	cp, err := capture.Start(tp.B, tp.B.Link, fmt.Sprintf("tcp port %d", port), pcap)
	if err != nil {
		t.Fatal(err)
	}
	c1, c2, err := pipe()
	if err != nil {
		cp.Stop()
		t.Fatal(err)
	}
	small, large := make([]byte, 100), make([]byte, 200<<10)
	for _, m := range [][]byte{small, large, small} {
		if _, err := c1.Write(m); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c2, make([]byte, len(m))); err != nil {
			t.Fatal(err)
		}
	}
	// Each side's DisConn reaches the other: a half-close, then the
	// other side's Close, then the first's.
	if err := c1.(*sdp.Conn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after the peer's CloseWrite: %v, want EOF", err)
	}
	c2.Close()
	if _, err := c1.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after the peer's Close: %v, want EOF", err)
	}
	c1.Close()
	// Close finishes in the background; the counters are final once it
	// has.
	time.Sleep(500 * time.Millisecond)
	st1, st2 := c1.(*sdp.Conn).Stats(), c2.(*sdp.Conn).Stats()
	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	lua, err := filepath.Abs("../sdp/wireshark/sdp-iwarp.lua")
	if err != nil {
		t.Fatal(err)
	}
	pkts, err := tshark.Dissect(pcap, append([]string{"-X", "lua_script:" + lua}, tshark.IWARPArgs...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			if b, err := os.ReadFile(pcap); err == nil {
				kept := filepath.Join(os.TempDir(), "sdp-wireshark-failed.pcap")
				if os.WriteFile(kept, b, 0o644) == nil {
					t.Logf("the capture is kept in %s", kept)
				}
			}
		}
	}()
	// Per direction (the dialer's source port, the listener's): the
	// messages in order.
	type msg struct {
		mid, len, mseq uint64
		rcvsz          uint64
	}
	msgs := map[bool][]msg{}
	for _, p := range pkts {
		sp, _ := p.Field("tcp.srcport")
		fromListener := sp.Show == fmt.Sprint(port)
		for _, pr := range p.Protos {
			if pr.Name != "infiniband_sdp" {
				continue
			}
			var m msg
			for name, v := range map[string]*uint64{"infiniband_sdp.bsdh.mid": &m.mid, "infiniband_sdp.bsdh.len": &m.len,
				"infiniband_sdp.bsdh.mseq": &m.mseq} {
				f, ok := pr.Get(name)
				if !ok {
					t.Fatalf("packet %d: SDP without %s", p.Number, name)
				}
				if *v, err = f.Uint(); err != nil {
					t.Fatalf("packet %d: %s: %v", p.Number, name, err)
				}
			}
			if f, ok := pr.Get("infiniband_sdp.hh.localrcvsz"); ok {
				m.rcvsz, _ = f.Uint()
			}
			msgs[fromListener] = append(msgs[fromListener], m)
		}
	}
	for _, side := range []struct {
		name     string
		listener bool
		sent     uint64
		first    uint64
	}{{"dialer", false, st1.MessagesSent, uint64(sdp.MIDHello)}, {"listener", true, st2.MessagesSent, uint64(sdp.MIDHelloAck)}} {
		ms := msgs[side.listener]
		if uint64(len(ms)) != side.sent+1 {
			t.Errorf("%s: %d SDP messages decoded, want its %d and its Hello or HelloAck: %v", side.name, len(ms), side.sent, ms)
			continue
		}
		if ms[0].mid != side.first || ms[0].mseq != 0 {
			t.Errorf("%s: first message %+v", side.name, ms[0])
		}
		for i, m := range ms[1:] {
			if m.mseq != uint64(i+1) {
				t.Errorf("%s: message %d has MSeq %d", side.name, i+1, m.mseq)
			}
		}
		t.Logf("%s: %d SDP messages decoded by Wireshark: %v", side.name, len(ms), ms)
	}
	seen := map[uint64]bool{}
	for _, ms := range msgs {
		for _, m := range ms {
			seen[m.mid] = true
		}
	}
	for _, mid := range []sdp.MID{sdp.MIDHello, sdp.MIDHelloAck, sdp.MIDData, sdp.MIDSrcAvail, sdp.MIDRdmaRdCompl, sdp.MIDDisConn} {
		if !seen[uint64(mid)] {
			t.Errorf("no %v decoded", mid)
		}
	}
	if hello := msgs[false]; len(hello) > 0 && hello[0].rcvsz != 64<<10 {
		t.Errorf("the Hello's LocalRcvSz decodes as %d", hello[0].rcvsz)
	}
}

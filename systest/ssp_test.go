package systest

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
)

// TestSSPEveryPairing: two softrnicds, on each pairing of datapaths (the
// kernel's TCP or the xdp datapath's engine, which takes the connection
// over from the kernel). Applications on A and B make their own TCP
// connection and stream over it (a negotiation larger than private data),
// then B makes a Socket Service Point of it with a final streaming
// message, A reads that message and switches with SocketConnect, and every
// RDMA operation runs verified on the same connection.
func TestSSPEveryPairing(t *testing.T) {
	testenv.RequireRoot(t)
	net0 := topology.NewTest(t, topology.Options{})
	dir := t.TempDir()
	build(t, dir)
	for i, dps := range [][2]string{{"kernel", "kernel"}, {"xdp", "kernel"}, {"kernel", "xdp"}, {"xdp", "xdp"}} {
		t.Run(dps[0]+"-"+dps[1], func(t *testing.T) {
			args := func(dp string, cpu int) []string {
				if dp == "xdp" {
					return []string{"--datapath", "xdp", "--cpus", fmt.Sprint(cpu)}
				}
				return nil
			}
			sockA, sockB := filepath.Join(dir, fmt.Sprintf("a%d.sock", i)), filepath.Join(dir, fmt.Sprintf("b%d.sock", i))
			da, err := startDaemonProc(net0.A, dir, "A", sockA, args(dps[0], 0)...)
			if err != nil {
				t.Fatal(err)
			}
			defer da.kill()
			db, err := startDaemonProc(net0.B, dir, "B", sockB, args(dps[1], 1)...)
			if err != nil {
				t.Fatal(err)
			}
			defer db.kill()
			sspPairing(t, net0, sockA, sockB, uint16(26000+i))
			if i == 3 {
				exampleStream(t, net0, dir, sockA, sockB, 26100)
			}
			if t.Failed() {
				t.Logf("daemon A:\n%s\ndaemon B:\n%s", da.out.String(), db.out.String())
			}
		})
	}
}

func sspPairing(t *testing.T, tp *topology.Pair, sockA, sockB string, port uint16) {
	const size = 8 << 20
	a, err := openApp(sockA, "socket-connect", 3*size)
	if err != nil {
		t.Fatal(err)
	}
	defer a.ia.Close()
	b, err := openApp(sockB, "ssp", 3*size)
	if err != nil {
		t.Fatal(err)
	}
	defer b.ia.Close()
	ae, err := a.endpoint(nil)
	if err != nil {
		t.Fatal(err)
	}
	be, err := b.endpoint(nil)
	if err != nil {
		t.Fatal(err)
	}
	cr, err := b.ia.CreateEVD(client.EVDOptions{Depth: 16, Kind: client.CREvents})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []*endpoint{ae, be} {
		if err := e.ep.PostRecv(1, []client.Segment{{LMR: e.a.lmr, Offset: 0, Length: 4096}}); err != nil {
			t.Fatal(err)
		}
	}

	// The applications' own connection, and their stream over it.
	ln, err := tp.B.ListenTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ac, err := tp.A.DialTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	_ = ln.SetDeadline(time.Now().Add(5 * time.Second))
	bc, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	rng := rand.New(rand.NewPCG(uint64(port), 1))
	for round := range 6 {
		for _, dir := range [][2]*net.TCPConn{{ac, bc}, {bc, ac}} {
			msg := make([]byte, 1+rng.IntN(100<<10))
			for i := range msg {
				msg[i] = byte(rng.Uint32())
			}
			errc := make(chan error, 1)
			go func() { _, err := dir[0].Write(msg); errc <- err }()
			got := make([]byte, len(msg))
			_ = dir[1].SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(dir[1], got); err != nil {
				t.Fatalf("stream round %d: %v", round, err)
			}
			if err := <-errc; err != nil || sha256.Sum256(got) != sha256.Sum256(msg) {
				t.Fatalf("stream round %d: %d octets, %v", round, len(msg), err)
			}
		}
	}
	aLocal, aRemote := ac.LocalAddr().String(), ac.RemoteAddr().String()
	_ = ac.SetReadDeadline(time.Time{})

	// The switch.
	final := []byte("agreed: RDMA from here on\n")
	ssp, err := b.ia.CreateSSP(bc, be.ep, cr, final)
	if err != nil {
		t.Fatalf("create SSP: %v", err)
	}
	got := make([]byte, len(final))
	_ = ac.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(ac, got); err != nil || !bytes.Equal(got, final) {
		t.Fatalf("final message %q: %v", got, err)
	}
	if err := ae.ep.SocketConnect(ac, 10*time.Second, []byte("socket connect")); err != nil {
		t.Fatalf("socket connect: %v", err)
	}
	ev, err := waitEvent(cr, 15*time.Second)
	if err != nil || ev.Type != client.ConnectionRequest {
		t.Fatalf("SSP event %+v: %v", ev, err)
	}
	info, err := ev.CR.Query()
	if err != nil || string(info.PrivateData) != "socket connect" {
		t.Fatalf("request %+v: %v", info, err)
	}
	if err := ev.CR.Accept(be.ep, []byte("accepted")); err != nil {
		t.Fatalf("accept: %v", err)
	}
	for _, e := range []*endpoint{ae, be} {
		if c, err := e.waitConn(15 * time.Second); err != nil || c != client.Established {
			t.Fatalf("%s: %v %v", e.a.ia.Attr().Datapath, c, err)
		}
	}
	if _, err := ssp.Free(); err != nil {
		t.Fatal(err)
	}
	ai, err := ae.ep.Query()
	if err != nil {
		t.Fatal(err)
	}
	if ai.LocalAddr != aLocal || ai.RemoteAddr != aRemote || string(ai.PrivateData) != "accepted" {
		t.Fatalf("A's EP %s → %s (%q), want the socket's %s → %s", ai.LocalAddr, ai.RemoteAddr, ai.PrivateData, aLocal, aRemote)
	}

	// Every operation, verified.
	copy(a.buf.Bytes[8192:], "from A")
	copy(b.buf.Bytes[8192:], "from B!")
	post := func(what string, err error) {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	post("send A", ae.ep.PostSend(10, []client.Segment{{LMR: a.lmr, Offset: 8192, Length: 6}}, client.Signaled))
	post("send B", be.ep.PostSend(20, []client.Segment{{LMR: b.lmr, Offset: 8192, Length: 7}}, client.Signaled))
	src := a.buf.Bytes[size : 2*size]
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	for i := range b.buf.Bytes[2*size : 3*size] {
		b.buf.Bytes[2*size+i] = byte(i * 31)
	}
	remote := func(off uint64) client.RemoteBuffer {
		return client.RemoteBuffer{Context: b.lmr.Context, Address: b.lmr.Address(off)}
	}
	post("write", ae.ep.PostWrite(11, []client.Segment{{LMR: a.lmr, Offset: size, Length: size}}, remote(size), client.Signaled))
	post("read", ae.ep.PostRead(12, client.Segment{LMR: a.lmr, Offset: 2 * size, Length: size}, remote(2*size), client.Signaled))
	// openApp's region has no remote atomic right: a second one has.
	atom, err := b.pz.RegisterLMR(b.buf, client.LocalWrite|client.RemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	target := client.RemoteBuffer{Context: atom.Context, Address: atom.Address(32768)}
	post("fetch-add", ae.ep.PostFetchAdd(13, client.Segment{LMR: a.lmr, Offset: 16384, Length: 8}, target, 9, client.Signaled))
	post("cmp-swap", ae.ep.PostCmpSwap(14, client.Segment{LMR: a.lmr, Offset: 16392, Length: 8}, target, 9, 42, client.Signaled))
	for want := uint64(10); want <= 14; want++ {
		ev, err := waitEvent(ae.req, 30*time.Second)
		if err != nil || ev.Cookie != want || ev.Status != completion.Success {
			t.Fatalf("A's completion %+v, want %d: %v", ev, want, err)
		}
	}
	if ev, err := waitEvent(be.req, 10*time.Second); err != nil || ev.Cookie != 20 || ev.Status != completion.Success {
		t.Fatalf("B's send: %+v %v", ev, err)
	}
	if ev, err := waitEvent(be.recv, 10*time.Second); err != nil || string(b.buf.Bytes[:ev.Length]) != "from A" {
		t.Fatalf("B's receive: %+v %v", ev, err)
	}
	if ev, err := waitEvent(ae.recv, 10*time.Second); err != nil || string(a.buf.Bytes[:ev.Length]) != "from B!" {
		t.Fatalf("A's receive: %+v %v", ev, err)
	}
	if !bytes.Equal(b.buf.Bytes[size:2*size], src) {
		t.Fatal("RDMA Write data differs")
	}
	if !bytes.Equal(a.buf.Bytes[2*size:3*size], b.buf.Bytes[2*size:3*size]) {
		t.Fatal("RDMA Read data differs")
	}
	if a.buf.Bytes[16384] != 0 || a.buf.Bytes[16392] != 9 || b.buf.Bytes[32768] != 42 {
		t.Fatalf("atomics: %d %d, target %d", a.buf.Bytes[16384], a.buf.Bytes[16392], b.buf.Bytes[32768])
	}
	if err := ae.ep.Disconnect(true); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*endpoint{ae, be} {
		if c, err := e.waitConn(15 * time.Second); err != nil || c != client.Disconnected {
			t.Fatalf("disconnect: %v %v", c, err)
		}
	}
	t.Logf("%s ↔ %s: streamed, switched, every operation verified (%d MiB written and read)",
		a.ia.Attr().Datapath, b.ia.Attr().Datapath, size>>20)
}

// exampleStream runs softrnic-example --stream, the demo's second part:
// the pair negotiates over its own TCP connection, switches it, and moves
// 16 MiB each way, verified.
func exampleStream(t *testing.T, tp *topology.Pair, dir, sockA, sockB string, port int) {
	t.Helper()
	const size = 16 << 20
	srv := startServer(t, tp.B.Command("timeout", "60", filepath.Join(dir, "softrnic-example"), "server", "--stream",
		"--socket", sockB, "--port", fmt.Sprint(port), "--size", fmt.Sprint(size)), "server: listening")
	cli := tp.A.Command("timeout", "60", filepath.Join(dir, "softrnic-example"), "client", "--stream", "--socket", sockA,
		"--server", fmt.Sprintf("%s:%d", tp.B.Addr.Addr(), port), "--size", fmt.Sprint(size))
	out, err := cli.CombinedOutput()
	if err != nil {
		t.Fatalf("example client: %v\n%s", err, out)
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("example server: %v\n%s", err, srv.out.String())
	}
	for _, want := range []string{"switching this connection to RDMA", "identical to what was written", "disconnected, done"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("example client did not say %q:\n%s", want, out)
		}
	}
	if !strings.Contains(srv.out.String(), "SHA-256 ok") {
		t.Errorf("example server did not verify the Write:\n%s", srv.out.String())
	}
	t.Logf("example --stream:\n%s", out)
}

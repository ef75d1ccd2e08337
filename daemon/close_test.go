package daemon

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/rnic"
)

// Issue 14: a dead client's objects are freed at once, whatever its
// listener is doing. The session's end closes its listeners before it
// destroys the QPs and frees the rest, and on the kernel datapath
// rnic.Listener.Close used to wait for the connections still in MPA
// startup, up to their request timeout (10 s): a peer that had connected
// and not yet sent its Request held the dead client's QPs, LMRs and EVDs
// that long. The session's end is the client's Close here, which the
// daemon cannot tell from a SIGKILL (its socket closes); systest kills
// real processes.
func TestDeadClientsListenerDoesNotHoldItsObjects(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	srv, err := New(Options{Iface: "lo", Socket: sock, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	ia, err := client.Open(context.Background(), client.Options{Socket: sock, Name: "victim"})
	if err != nil {
		t.Fatal(err)
	}
	defer ia.Close()
	pz, err := ia.CreatePZ()
	if err != nil {
		t.Fatal(err)
	}
	buf, err := ia.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	if _, err := pz.RegisterLMR(buf, client.LocalWrite|client.RemoteWrite); err != nil {
		t.Fatal(err)
	}
	cr, err := ia.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.CREvents})
	if err != nil {
		t.Fatal(err)
	}
	port := freeLoopbackPort(t)
	if _, err := ia.CreatePSP(port, cr, false); err != nil {
		t.Fatal(err)
	}
	// A peer connects and says nothing: the listener's handshake waits
	// for its MPA Request.
	silent, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	time.Sleep(100 * time.Millisecond) // the listener has accepted it

	ended := time.Now()
	ia.Close()
	for {
		c := srv.Counts()
		if c["sessions"]+c["pz"]+c["lmr"]+c["evd"]+c["psp"] == 0 {
			break
		}
		if time.Since(ended) > 3*time.Second {
			t.Fatalf("%v after the client went away its objects are still held: %v", time.Since(ended).Round(time.Millisecond), c)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("objects freed %v after the client went away", time.Since(ended).Round(100*time.Microsecond))
	// The port takes a new listener at once.
	ia2, err := client.Open(context.Background(), client.Options{Socket: sock, Name: "next"})
	if err != nil {
		t.Fatal(err)
	}
	defer ia2.Close()
	cr2, err := ia2.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.CREvents})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ia2.CreatePSP(port, cr2, false); err != nil {
		t.Fatalf("the dead client's port: %v", err)
	}
	silent.Close() // the old listener's handshake ends; Close need not wait for it
}

// A connection request the session's poller has not yet made a CR of when
// the session ends is rejected at once: nobody else will answer it, and
// the peer would otherwise wait for the request timeout (10 s). The
// session is built by hand so that the request is surely still queued.
func TestSessionEndRejectsQueuedRequests(t *testing.T) {
	dev := rnic.Open()
	defer dev.Close()
	ln, err := dev.Listen("127.0.0.1:0", rnic.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	cfg := mpa.Config{CRC: true}
	f, err := cfg.Request()
	if err != nil {
		t.Fatal(err)
	}
	wire, _ := f.Append(nil)
	if _, err := peer.Write(wire); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}

	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fds[1])
	fc, err := net.FileConn(os.NewFile(uintptr(fds[0]), "session"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{log: quiet(), dev: dev, sessions: map[*session]struct{}{}}
	s, err := newSession(srv, fc.(*net.UnixConn), 1, &unix.Ucred{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &psp{h: 1, ln: ln}
	s.objects[1] = p
	s.queue(pendingEvent{psp: p, req: req}) // the poller has not run
	start := time.Now()
	s.close()

	_ = peer.SetReadDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, mpa.FrameHeaderLen+mpa.MaxPrivateData)
	n, err := peer.Read(b)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%v after the session ended the peer has no answer to its request", time.Since(start).Round(time.Millisecond))
		}
		t.Fatalf("peer: %v", err)
	}
	reply, _, err := mpa.ParseFrame(b[:n], true)
	if err != nil || !reply.Reject {
		t.Fatalf("peer got %+v %v, want an MPA Reject", reply, err)
	}
}

func freeLoopbackPort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// A session's LMRs map at most maxMapped octets in the daemon: past it a
// registration fails with INSUFFICIENT_RESOURCES, and freeing gives the
// room back.
func TestSessionMappedCap(t *testing.T) {
	defer func(old uint64) { maxMapped = old }(maxMapped)
	maxMapped = 3 << 16
	sock := filepath.Join(t.TempDir(), "d.sock")
	srv, err := New(Options{Iface: "lo", Socket: sock, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	ia, err := client.Open(context.Background(), client.Options{Socket: sock, Name: "greedy"})
	if err != nil {
		t.Fatal(err)
	}
	defer ia.Close()
	pz, err := ia.CreatePZ()
	if err != nil {
		t.Fatal(err)
	}
	var lmrs []*client.LMR
	for i := 0; i < 4; i++ {
		buf, err := ia.Alloc(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Free()
		l, err := pz.RegisterLMR(buf, client.LocalWrite)
		if i < 3 {
			if err != nil {
				t.Fatalf("LMR %d: %v", i, err)
			}
			lmrs = append(lmrs, l)
			continue
		}
		if !errors.Is(err, client.ErrInsufficientResources) {
			t.Fatalf("LMR past the session's cap: %v", err)
		}
		if err := lmrs[0].Free(); err != nil {
			t.Fatal(err)
		}
		if _, err := pz.RegisterLMR(buf, client.LocalWrite); err != nil {
			t.Fatalf("LMR after one was freed: %v", err)
		}
	}
}

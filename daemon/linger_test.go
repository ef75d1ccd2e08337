package daemon

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/mpa"
)

// A peer that answers MPA and then holds its side of the connection open,
// never sending its FIN: what a daemon's close must not wait on.

// silentPeer accepts one connection on ln, answers its MPA Request and
// hands the socket over.
func silentPeer(ln *net.TCPListener) <-chan *net.TCPConn {
	out := make(chan *net.TCPConn, 1)
	go func() {
		c, err := ln.AcceptTCP()
		if err != nil {
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 0, mpa.FrameHeaderLen+mpa.MaxPrivateData)
		for {
			n, err := c.Read(buf[len(buf):cap(buf)])
			if err != nil {
				c.Close()
				return
			}
			buf = buf[:len(buf)+n]
			req, _, err := mpa.ParseFrame(buf, false)
			if errors.Is(err, mpa.ErrShortFrame) {
				continue
			}
			if err != nil {
				c.Close()
				return
			}
			reply, _, err := (&mpa.Config{CRC: true, IRD: 8, ORD: 8}).Accept(&req)
			if err != nil {
				c.Close()
				return
			}
			wire, _ := reply.Append(nil)
			if _, err := c.Write(wire); err != nil {
				c.Close()
				return
			}
			break
		}
		_ = c.SetReadDeadline(time.Time{})
		out <- c
	}()
	return out
}

// tcpState is the kernel's TCP state of c (unix.BPF_TCP_*).
func tcpState(c *net.TCPConn) uint8 {
	var st uint8
	rc, _ := c.SyscallConn()
	_ = rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			st = info.State
		}
	})
	return st
}

type silentSetup struct {
	ia   *client.IA
	lmr  *client.LMR // 1 MiB, for Sends
	ep   *client.EP
	conn *client.EVD // the EP's connection events
	peer *net.TCPConn
	stop func() // the daemon's Close
}

// connectToSilentPeer: a daemon on lo (kernel datapath), an EP of a client
// of it connected to a silentPeer.
func connectToSilentPeer(t *testing.T) silentSetup {
	sock := filepath.Join(t.TempDir(), "d.sock")
	srv, err := New(Options{Iface: "lo", Socket: sock, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	stop := serve(t, srv)
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	peerc := silentPeer(ln)
	ia, pz := openSession(t, sock)
	var evds [3]*client.EVD
	for i, k := range []client.EVDKind{client.DTOEvents, client.DTOEvents, client.ConnectionEvents} {
		if evds[i], err = ia.CreateEVD(client.EVDOptions{Depth: 64, Kind: k}); err != nil {
			t.Fatal(err)
		}
	}
	ep, err := ia.CreateEP(client.EPAttr{PZ: pz, RecvEVD: evds[0], RequestEVD: evds[1], ConnectEVD: evds[2], SQDepth: 32, RQDepth: 16, IRD: 8, ORD: 8})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := ia.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	lmr, err := pz.RegisterLMR(buf, client.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ep.Connect(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ev, err := evds[2].Wait(ctx); err != nil || ev.Conn != client.Established {
		t.Fatalf("connect: %+v %v", ev, err)
	}
	var peer *net.TCPConn
	select {
	case peer = <-peerc:
	case <-time.After(5 * time.Second):
		t.Fatal("the peer got no connection")
	}
	t.Cleanup(func() { peer.Close() })
	return silentSetup{ia: ia, lmr: lmr, ep: ep, conn: evds[2], peer: peer, stop: stop}
}

// readToFIN reads the peer's socket up to our FIN.
func readToFIN(t *testing.T, peer *net.TCPConn) {
	t.Helper()
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, peer); err != nil {
		t.Fatalf("the peer waiting for our FIN: %v", err)
	}
	_ = peer.SetReadDeadline(time.Time{})
}

// rdma_disconnect then rdma_destroy_qp before the peer's FIN (perftest,
// rping): the free finishes the close in order. It was an abort, a reset
// after our FIN, which ends the peer's connection broken.
func TestFreeDuringGracefulDisconnectIsNoReset(t *testing.T) {
	s := connectToSilentPeer(t)
	if err := s.ep.Disconnect(true); err != nil {
		t.Fatal(err)
	}
	readToFIN(t, s.peer)
	if err := s.ep.Free(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a reset would have come by now
	if st := tcpState(s.peer); st != unix.BPF_TCP_CLOSE_WAIT {
		t.Fatalf("the peer's TCP state after the free is %d, want CLOSE_WAIT (%d): our FIN, and no reset", st, unix.BPF_TCP_CLOSE_WAIT)
	}
	// The peer's FIN ends it in order: our side's kernel answers it,
	// with no reset (one would leave an error on the peer's socket).
	if err := s.peer.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for tcpState(s.peer) != unix.BPF_TCP_CLOSE {
		if time.Now().After(deadline) {
			t.Fatalf("the peer's TCP state 3 s after its FIN is %d, want CLOSE", tcpState(s.peer))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := soError(s.peer); err != nil {
		t.Fatalf("the peer's connection ended with %v, want in order", err)
	}
}

// soError is the pending error of c's socket (SO_ERROR), nil if none.
func soError(c *net.TCPConn) error {
	var serr error
	rc, _ := c.SyscallConn()
	_ = rc.Control(func(fd uintptr) {
		if e, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR); err != nil {
			serr = err
		} else if e != 0 {
			serr = unix.Errno(e)
		}
	})
	return serr
}

// SIGTERM ends the daemon within 2 s whatever its peers do (server.go,
// shutdownGrace): a peer that never answers our FIN does not hold it for
// the close timeout.
func TestShutdownDoesNotWaitForASilentPeer(t *testing.T) {
	s := connectToSilentPeer(t)
	start := time.Now()
	s.stop()
	if took := time.Since(start); took > 2*time.Second+time.Second/2 {
		t.Fatalf("the daemon's Close with a peer that never sends its FIN took %v, want about shutdownGrace", took.Round(time.Millisecond))
	}
}

// An abrupt disconnect while a graceful one waits for the peer's FIN is
// the consumer's abort: the connection is reset at once, and the EP's
// reset after it does not wait for the peer either.
func TestAbruptDisconnectAfterAGracefulOneResets(t *testing.T) {
	s := connectToSilentPeer(t)
	if err := s.ep.Disconnect(true); err != nil {
		t.Fatal(err)
	}
	readToFIN(t, s.peer)
	if err := s.ep.Disconnect(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ev, err := s.conn.Wait(ctx); err != nil || ev.Conn != client.Disconnected {
		t.Fatalf("after the abrupt disconnect: %+v %v, want DISCONNECTED", ev, err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for tcpState(s.peer) != unix.BPF_TCP_CLOSE {
		if time.Now().After(deadline) {
			t.Fatalf("the peer's TCP state 3 s after the abrupt disconnect is %d: no reset", tcpState(s.peer))
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	if err := s.ep.Reset(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("the EP's reset took %v", took.Round(time.Millisecond))
	}
}

// A peer that sends its FIN and stops reading while our Sends fill the
// socket: the connection ends (DISCONNECTED) with our octets still
// waiting for room, which the peer never makes. Neither the EP's free nor
// the daemon's Close may wait for them for ever.
func TestFreeAfterThePeerStoppedReadingIsBounded(t *testing.T) {
	for _, how := range []string{"free", "shutdown"} {
		t.Run(how, func(t *testing.T) {
			s := connectToSilentPeer(t)
			for i := range 24 {
				if err := s.ep.PostSend(uint64(i), []client.Segment{{LMR: s.lmr, Length: 1 << 20}}, 0); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
			}
			// the socket buffers fill (the peer reads nothing)
			deadline := time.Now().Add(5 * time.Second)
			for unread(s.peer) < 1<<20 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if err := s.peer.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for {
				ev, err := s.conn.Wait(ctx)
				if err != nil {
					t.Fatalf("no end of the connection after the peer's FIN: %v", err)
				}
				if ev.Conn == client.Disconnected || ev.Conn == client.Broken {
					break
				}
			}
			done := make(chan error, 1)
			go func() {
				if how == "free" {
					done <- s.ep.Free()
				} else {
					s.stop()
					done <- nil
				}
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(8 * time.Second):
				_ = s.peer.SetLinger(0)
				s.peer.Close() // lets it go, so that the test ends
				<-done
				t.Fatalf("the %s waited more than 8 s for a peer that reads nothing", how)
			}
		})
	}
}

// unread is how many octets wait in c's receive queue.
func unread(c *net.TCPConn) int {
	n := 0
	rc, _ := c.SyscallConn()
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n
}

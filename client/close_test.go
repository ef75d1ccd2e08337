package client_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/internal/testenv"
)

// Closing the IA wakes an application sleeping in Wait on one of its EVDs
// with ErrClosed; it does not sleep on to its deadline (or forever).
func TestCloseWakesWaiters(t *testing.T) {
	sock, _ := startDaemon(t)
	ia, err := client.Open(context.Background(), client.Options{Socket: sock, Name: "closing"})
	if err != nil {
		t.Fatal(err)
	}
	evd, err := ia.CreateEVD(client.EVDOptions{Depth: 16, Kind: client.DTOEvents})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := evd.Wait(context.Background())
		waited <- err
	}()
	time.Sleep(50 * time.Millisecond)
	ia.Close()
	select {
	case err := <-waited:
		if !errors.Is(err, client.ErrClosed) {
			t.Fatalf("Wait: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait still sleeps after Close")
	}
}

// A request that cannot be sent for a reason of its own (here the memory
// of a Buffer already freed: the descriptor passed is closed) fails alone:
// the IA is not taken for one whose daemon went away, and the next request
// is served.
func TestSendFailureIsNotTheDaemonGone(t *testing.T) {
	sock, _ := startDaemon(t)
	ia, err := client.Open(context.Background(), client.Options{Socket: sock, Name: "ebadf"})
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
	buf.Free()
	if _, err := pz.RegisterLMR(buf, client.LocalWrite); err == nil {
		t.Fatal("RegisterLMR of a freed Buffer succeeded")
	} else if errors.Is(err, client.ErrDaemonGone) {
		t.Fatalf("RegisterLMR of a freed Buffer: %v, the daemon taken for gone", err)
	}
	if ia.Gone() {
		t.Fatal("the IA is taken for gone after a request of its own failed")
	}
	if _, err := ia.CreatePZ(); err != nil {
		t.Fatalf("the next request: %v", err)
	}
}

// A daemon whose backlog is full is tried again until the context ends,
// not given up on at the first EAGAIN (the C library's blocking connect
// waits for room too): here room comes, and the connection made then meets
// a peer that hangs up, which is what Open reports.
func TestOpenWaitsForRoomInTheBacklog(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "full.sock")
	full := testenv.FullSocket(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opened := make(chan error, 1)
	go func() {
		ia, err := client.Open(ctx, client.Options{Socket: sock, Name: "waiting"})
		if err == nil {
			ia.Close()
		}
		opened <- err
	}()
	time.Sleep(100 * time.Millisecond)
	var err error
	for done := false; !done; {
		full.Drain()
		select {
		case err = <-opened:
			done = true
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err == nil || errors.Is(err, syscall.EAGAIN) || !errors.Is(err, client.ErrDaemonGone) {
		t.Fatalf("Open: %v, want the hang-up of the peer it connected to once there was room", err)
	}
	// and with no room ever, the context's end, said
	sock2 := filepath.Join(t.TempDir(), "full2.sock")
	testenv.FullSocket(t, sock2)
	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if _, err := client.Open(short, client.Options{Socket: sock2}); err == nil || !strings.Contains(err.Error(), "backlog stayed full") {
		t.Fatalf("Open of a socket whose backlog stays full: %v", err)
	}
}

// Open's context bounds its Hello too: whatever holds the socket may
// accept and never answer (a wedged daemon, or not softrnicd at all).
func TestOpenOfASilentSocketEndsWithItsContext(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "silent.sock")
	ln, err := net.Listen("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			held <- c // kept open, never answered
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	opened := make(chan error, 1)
	go func() {
		ia, err := client.Open(ctx, client.Options{Socket: sock})
		if err == nil {
			ia.Close()
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer to Hello") {
			t.Fatalf("Open of a socket that never answers: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Open of a socket that never answers still waits 10 s after its context ended")
	}
	select {
	case c := <-held:
		c.Close()
	default:
	}
}

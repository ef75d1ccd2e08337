package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
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

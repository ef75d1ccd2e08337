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

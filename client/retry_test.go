package client_test

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
)

// A connect told to retry while the peer's host refuses it (nothing listens
// on the port yet) connects once the listener comes, 300 ms later; a plain
// connect to a port nobody listens on fails at once, NON_PEER_REJECTED.
func TestConnectRetriesRefused(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "server"), newApp(t, sock, "client")

	plain := cli.ep(t)
	began := time.Now()
	must(t, plain.Connect(addr(freePort(t)), nil, 10*time.Second))
	if ev := wait(t, cli.conn); ev.Conn != client.NonPeerRejected {
		t.Fatalf("plain connect to nobody: %v", ev.Conn)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Errorf("plain connect to nobody took %v to fail", d)
	}

	port := freePort(t)
	sep, cep := server.ep(t), cli.ep(t)
	must(t, cep.ConnectRetrying(addr(port), []byte("early"), 10*time.Second, 5*time.Second))
	time.Sleep(300 * time.Millisecond)
	psp, err := server.ia.CreatePSP(port, server.cr, false)
	must(t, err)
	defer psp.Free()
	ev := wait(t, server.cr)
	must(t, ev.CR.Accept(sep, nil))
	for _, a := range []*app{server, cli} {
		if ev := wait(t, a.conn); ev.Conn != client.Established {
			t.Fatalf("connect retried until the listener came: %v", ev.Conn)
		}
	}
}

package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

// Benchmarks through the daemon: the application posts into shared rings
// and reaps completions from them; compare with the engine-only figures of
// package rnic (make bench runs both).

type benchPair struct {
	cli, srv *endpoint
}

func newBenchPair(b *testing.B) *benchPair {
	socket, stop := exampleDaemon()
	b.Cleanup(stop)
	addr := examplePort()
	var port uint16
	fmt.Sscanf(addr[len("127.0.0.1:"):], "%d", &port)
	p := &benchPair{srv: newBenchEndpoint(b, socket), cli: newBenchEndpoint(b, socket)}
	if _, err := p.srv.ia.CreatePSP(port, p.srv.requests, false); err != nil {
		b.Fatal(err)
	}
	if err := p.cli.ep.Connect(addr, nil, 5*time.Second); err != nil {
		b.Fatal(err)
	}
	ev, err := p.srv.requests.Wait(p.srv.waitCtx)
	if err != nil {
		b.Fatal(err)
	}
	if err := ev.CR.Accept(p.srv.ep, nil); err != nil {
		b.Fatal(err)
	}
	if ev, err := p.cli.conn.Wait(p.cli.waitCtx); err != nil || ev.Conn != client.Established {
		b.Fatal(ev.Conn, err)
	}
	b.Cleanup(func() { p.cli.close(); p.srv.close() })
	return p
}

func newBenchEndpoint(b *testing.B, socket string) *endpoint {
	e := &endpoint{}
	e.waitCtx, e.cancel = context.WithTimeout(context.Background(), 10*time.Minute)
	var err error
	if e.ia, err = client.Open(e.waitCtx, client.Options{Socket: socket}); err != nil {
		b.Fatal(err)
	}
	pz, _ := e.ia.CreatePZ()
	e.buf, _ = e.ia.Alloc(8 << 20)
	e.lmr, _ = pz.RegisterLMR(e.buf, client.LocalWrite|client.RemoteWrite|client.RemoteRead)
	e.dto, _ = e.ia.CreateEVD(client.EVDOptions{Depth: 1024, Kind: client.DTOEvents})
	e.conn, _ = e.ia.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.ConnectionEvents})
	e.requests, _ = e.ia.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.CREvents})
	e.ep, err = e.ia.CreateEP(client.EPAttr{PZ: pz, RecvEVD: e.dto, RequestEVD: e.dto, ConnectEVD: e.conn, SQDepth: 256, RQDepth: 64, IRD: 32, ORD: 32})
	if err != nil {
		b.Fatal(err)
	}
	return e
}

func (e *endpoint) reap(b *testing.B, n int) {
	for ; n > 0; n-- {
		ev, err := e.dto.Wait(e.waitCtx)
		if err != nil || ev.Status != completion.Success {
			b.Fatalf("%+v %v", ev, err)
		}
	}
}

var daemonSizes = []int{64, 4096, 65536, 1 << 20}

func BenchmarkDaemonWriteBW(b *testing.B) { benchDaemonBW(b, true) }
func BenchmarkDaemonReadBW(b *testing.B)  { benchDaemonBW(b, false) }

func benchDaemonBW(b *testing.B, write bool) {
	p := newBenchPair(b)
	remote := client.RemoteBuffer{Context: p.srv.lmr.Context, Address: p.srv.lmr.Address(0)}
	for _, size := range daemonSizes {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			b.SetBytes(int64(size))
			const depth, every = 128, 8
			outstanding := 0
			for i := 0; i < b.N; i++ {
				flags := client.Flags(0)
				if i%every == every-1 || i == b.N-1 || !write {
					flags = client.Signaled
					outstanding++
				}
				seg := client.Segment{LMR: p.cli.lmr, Offset: uint64(i%4) * uint64(size), Length: uint32(size)}
				var err error
				if write {
					err = p.cli.ep.PostWrite(uint64(i), []client.Segment{seg}, remote, flags)
				} else {
					err = p.cli.ep.PostRead(uint64(i), seg, remote, flags)
				}
				if err != nil {
					b.Fatal(err)
				}
				limit := depth / every
				if !write {
					limit = 32
				}
				for outstanding > limit {
					p.cli.reap(b, 1)
					outstanding--
				}
			}
			p.cli.reap(b, outstanding)
		})
	}
}

// BenchmarkDaemonPostToCompletion: one signalled 8-byte RDMA Write at a
// time, from post to its completion in the EVD: the cost of the shared
// rings, the daemon's poller and the notification path.
func BenchmarkDaemonPostToCompletion(b *testing.B) {
	p := newBenchPair(b)
	remote := client.RemoteBuffer{Context: p.srv.lmr.Context, Address: p.srv.lmr.Address(0)}
	seg := []client.Segment{{LMR: p.cli.lmr, Length: 8}}
	for i := 0; i < b.N; i++ {
		if err := p.cli.ep.PostWrite(uint64(i), seg, remote, client.Signaled); err != nil {
			b.Fatal(err)
		}
		p.cli.reap(b, 1)
	}
}

// BenchmarkDaemonReadLatency: one 8-byte RDMA Read at a time, a round trip.
func BenchmarkDaemonReadLatency(b *testing.B) {
	p := newBenchPair(b)
	remote := client.RemoteBuffer{Context: p.srv.lmr.Context, Address: p.srv.lmr.Address(0)}
	seg := client.Segment{LMR: p.cli.lmr, Length: 8}
	for i := 0; i < b.N; i++ {
		if err := p.cli.ep.PostRead(uint64(i), seg, remote, client.Signaled); err != nil {
			b.Fatal(err)
		}
		p.cli.reap(b, 1)
	}
}

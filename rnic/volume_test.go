package rnic

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"sync"
	"testing"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/qp"
)

// volume is what each operation moves: 1 GiB, or 128 MiB under the race
// detector, which slows the datapath tenfold (make test runs both builds).
func volume() int {
	if testenv.Race {
		return 128 << 20
	}
	return 1 << 30
}

const (
	chunk  = 1 << 20
	window = 64 << 20 // the region each round fills
)

// stream produces the same pseudo-random octets on both ends.
type patternStream struct{ seed uint64 }

func (s *patternStream) fill(b []byte) {
	fillRand(b, s.seed)
	s.seed++
}

func TestVolumeWriteReadSend(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping 3 GiB of traffic")
	}
	srv, cli := newHost(t), newHost(t)
	sbuf := srv.mr(window, qp.LocalWrite|qp.RemoteWrite|qp.RemoteRead)
	cbuf := cli.mr(window, qp.LocalWrite)
	s, c := pair(t, srv, cli, QPAttr{SQDepth: 128, RQDepth: 128}, QPAttr{SQDepth: 128, RQDepth: 128}, nil)
	total := volume()

	t.Run("write", func(t *testing.T) {
		src, dst := sha256.New(), sha256.New()
		gen := patternStream{seed: 100}
		for done := 0; done < total; done += window {
			gen.fill(cbuf.Buf)
			src.Write(cbuf.Buf)
			n := window / chunk
			for i := 0; i < n; i++ {
				flags := qp.Flags(0)
				if i == n-1 {
					flags = qp.Signaled
				}
				must(t, c.PostSend(&qp.SendWR{ID: uint64(i), Op: qp.OpWrite, Flags: flags,
					SGL:        []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base + uint64(i*chunk), Length: chunk}},
					RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base + uint64(i*chunk)}))
			}
			checkOK(t, wait(t, cli.scq, 1))
			// A Send after the Writes: once it arrives, the Writes
			// are placed (RFC 5040 ordering).
			syncSend(t, s, c, srv, cli)
			dst.Write(sbuf.Buf)
		}
		sameDigest(t, "write", src, dst)
	})

	t.Run("read", func(t *testing.T) {
		src, dst := sha256.New(), sha256.New()
		gen := patternStream{seed: 200}
		for done := 0; done < total; done += window {
			gen.fill(sbuf.Buf)
			src.Write(sbuf.Buf)
			n := window / chunk
			for i := 0; i < n; i++ {
				must(t, c.PostSend(&qp.SendWR{ID: uint64(i), Op: qp.OpRead, Flags: qp.Signaled,
					SGL:        []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base + uint64(i*chunk), Length: chunk}},
					RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base + uint64(i*chunk)}))
			}
			checkOK(t, wait(t, cli.scq, n))
			dst.Write(cbuf.Buf)
		}
		sameDigest(t, "read", src, dst)
	})

	t.Run("send", func(t *testing.T) {
		src, dst := sha256.New(), sha256.New()
		gen := patternStream{seed: 300}
		for done := 0; done < total; done += window {
			gen.fill(cbuf.Buf)
			src.Write(cbuf.Buf)
			n := window / chunk
			for i := 0; i < n; i++ {
				must(t, s.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{LKey: sbuf.STag, Addr: sbuf.Base + uint64(i*chunk), Length: chunk}}}))
			}
			for i := 0; i < n; i++ {
				must(t, c.PostSend(&qp.SendWR{ID: uint64(i), Op: qp.OpSend, Flags: qp.Signaled,
					SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base + uint64(i*chunk), Length: chunk}}}))
			}
			checkOK(t, wait(t, cli.scq, n))
			rc := wait(t, srv.rcq, n)
			for i, cpl := range rc {
				if cpl.ID != uint64(i) || cpl.ByteLen != chunk {
					t.Fatalf("receive %d: %+v", i, cpl)
				}
			}
			dst.Write(sbuf.Buf)
		}
		sameDigest(t, "send", src, dst)
	})
}

// syncSend sends an empty message from client to server and waits for it.
func syncSend(t *testing.T, s, c *QP, srv, cli *host) {
	t.Helper()
	must(t, s.PostRecv(&qp.RecvWR{ID: 999}))
	must(t, c.PostSend(&qp.SendWR{ID: 999, Op: qp.OpSend, Flags: qp.Signaled}))
	checkOK(t, wait(t, cli.scq, 1))
	checkOK(t, wait(t, srv.rcq, 1))
}

func checkOK(t testing.TB, cs []completion.Completion) {
	t.Helper()
	for _, c := range cs {
		if c.Status != completion.Success {
			t.Fatalf("completion %+v", c)
		}
	}
}

func sameDigest(t *testing.T, what string, a, b hash.Hash) {
	t.Helper()
	da, db := a.Sum(nil), b.Sum(nil)
	if !bytes.Equal(da, db) {
		t.Fatalf("%s: SHA-256 %x sent, %x arrived", what, da, db)
	}
	t.Logf("%s: %d MiB, SHA-256 %x on both ends", what, volume()>>20, da[:8])
}

// TestThousandQPs connects 1,000 QP pairs at once and moves data on all of
// them.
func TestThousandQPs(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping 1,000 connections")
	}
	const n = 1000
	srv, cli := newHost(t), newHost(t)
	ln, err := srv.dev.Listen("127.0.0.1:0", ListenOptions{Backlog: n})
	must(t, err)
	defer ln.Close()
	sbuf := srv.mr(n*64, qp.LocalWrite|qp.RemoteWrite)
	cbuf := cli.mr(n*64, qp.LocalWrite)
	for i := 0; i < n; i++ {
		copy(cbuf.Buf[i*64:], fmt.Sprintf("message from client QP %d", i))
	}
	servers := make([]*QP, n)
	clients := make([]*QP, n)
	accepted := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			cr, err := ln.Accept(context.Background())
			if err != nil {
				accepted <- err
				return
			}
			var idx int
			fmt.Sscanf(string(cr.PrivateData), "%d", &idx)
			q := srv.qp(QPAttr{SQDepth: 4, RQDepth: 4, IRD: 1, ORD: 1})
			servers[idx] = q
			must(t, q.PostRecv(&qp.RecvWR{ID: uint64(idx), SGL: []qp.SGE{{LKey: sbuf.STag, Addr: sbuf.Base + uint64(idx*64), Length: 32}}}))
			if err := cr.Accept(q, nil); err != nil {
				accepted <- err
				return
			}
		}
		accepted <- nil
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		clients[i] = cli.qp(QPAttr{SQDepth: 4, RQDepth: 4, IRD: 1, ORD: 1})
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if _, err := clients[i].Connect(context.Background(), ln.Addr().String(), ConnectOptions{PrivateData: []byte(fmt.Sprint(i))}); err != nil {
				errs <- err
			}
		}(i)
		if i%100 == 99 {
			wg.Wait() // connect in waves; the accept queue is bounded
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	must(t, <-accepted)
	// Every client writes into its server's slot, then sends: the Send's
	// arrival means the Write is placed (RFC 5040 §5.5 ordering).
	for i, c := range clients {
		must(t, c.PostSend(&qp.SendWR{ID: uint64(n + i), Op: qp.OpWrite, Flags: qp.Signaled,
			SGL:        []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base + uint64(i*64), Length: 32}},
			RemoteSTag: sbuf.STag, RemoteTO: sbuf.Base + uint64(i*64+32)}))
		must(t, c.PostSend(&qp.SendWR{ID: uint64(i), Op: qp.OpSend, Flags: qp.Signaled,
			SGL: []qp.SGE{{LKey: cbuf.STag, Addr: cbuf.Base + uint64(i*64), Length: 32}}}))
	}
	checkOK(t, wait(t, cli.scq, 2*n))
	rc := wait(t, srv.rcq, n)
	checkOK(t, rc)
	for i := 0; i < n; i++ {
		slot := sbuf.Buf[i*64 : i*64+64]
		if !bytes.Equal(slot[:32], cbuf.Buf[i*64:i*64+32]) || !bytes.Equal(slot[32:], cbuf.Buf[i*64:i*64+32]) {
			t.Fatalf("QP %d: %q", i, slot)
		}
	}
	for i := range clients {
		clients[i].Destroy()
		servers[i].Destroy()
	}
}

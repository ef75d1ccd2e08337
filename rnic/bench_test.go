package rnic

import (
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/qp"
)

// Benchmarks over loopback TCP, each beside the plain kernel-TCP figure for
// the same message size measured in the same run (BenchmarkTCPStream,
// BenchmarkTCPPingPong). Run them with `make bench`.

var benchSizes = []int{64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20}

const benchDepth = 64

type benchPair struct {
	srv, cli   *host
	s, c       *QP
	sbuf, cbuf *MR
}

func newBenchPair(b *testing.B, noCRC bool) *benchPair {
	p := &benchPair{srv: newHost(b), cli: newHost(b)}
	p.sbuf = p.srv.mr(8<<20, qp.LocalWrite|qp.RemoteWrite|qp.RemoteRead)
	p.cbuf = p.cli.mr(8<<20, qp.LocalWrite|qp.RemoteWrite|qp.RemoteRead)
	attr := QPAttr{SQDepth: 2 * benchDepth, RQDepth: 2 * benchDepth, IRD: 32, ORD: 32, NoCRC: noCRC}
	p.s, p.c = pair(b, p.srv, p.cli, attr, attr, nil)
	b.Cleanup(func() { p.c.Destroy(); p.s.Destroy() })
	return p
}

// spin takes n completions from cq, sleeping on its notification when it is
// empty. (Busy-polling with runtime.Gosched starves Go's network poller on
// a 2-core machine: the engine's sockets are then only polled by sysmon.)
func spin(b *testing.B, cq *completion.CQ, n int) {
	var buf [64]completion.Completion
	for n > 0 {
		k := cq.Poll(buf[:min(n, len(buf))])
		if k == 0 {
			cq.Arm(false)
			if k = cq.Poll(buf[:min(n, len(buf))]); k == 0 {
				<-cq.Notify()
				continue
			}
		}
		for _, c := range buf[:k] {
			if c.Status != completion.Success {
				b.Fatalf("completion %+v", c)
			}
		}
		n -= k
	}
}

func crcName(noCRC bool) string {
	if noCRC {
		return "crc=off"
	}
	return "crc=on"
}

func BenchmarkWriteBW(b *testing.B) { benchBW(b, qp.OpWrite) }
func BenchmarkReadBW(b *testing.B)  { benchBW(b, qp.OpRead) }

// benchBW keeps benchDepth requests in flight (ORD for Reads) and signals
// every eighth; a final Send after Writes proves they were placed.
func benchBW(b *testing.B, op qp.SendOp) {
	for _, noCRC := range []bool{false, true} {
		p := newBenchPair(b, noCRC)
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("%s/%d", crcName(noCRC), size), func(b *testing.B) {
				b.SetBytes(int64(size))
				depth := benchDepth
				if op == qp.OpRead {
					depth = 32 // ORD
				}
				const every = 8
				outstanding := 0
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					off := uint64(i%8) * uint64(size)
					wr := qp.SendWR{Op: op, SGL: []qp.SGE{{LKey: p.cbuf.STag, Addr: p.cbuf.Base + off, Length: uint32(size)}},
						RemoteSTag: p.sbuf.STag, RemoteTO: p.sbuf.Base + off}
					if i%every == every-1 || i == b.N-1 {
						wr.Flags = qp.Signaled
						outstanding++
					}
					for {
						err := p.c.PostSend(&wr)
						if err == nil {
							break
						}
						spin(b, p.cli.scq, 1)
						outstanding--
					}
					for outstanding*every > depth {
						spin(b, p.cli.scq, 1)
						outstanding--
					}
				}
				spin(b, p.cli.scq, outstanding)
				if op == qp.OpWrite {
					must(b, p.s.PostRecv(&qp.RecvWR{}))
					must(b, p.c.PostSend(&qp.SendWR{Op: qp.OpSend, Flags: qp.Signaled}))
					spin(b, p.cli.scq, 1)
					spin(b, p.srv.rcq, 1)
				}
			})
		}
	}
}

// BenchmarkWriteLatency: 8-byte RDMA Write ping-pong, each Write followed
// by Immediate Data (RFC 7306's Write with Immediate) so that the peer
// learns of it from its CQ. ns/op is one round trip.
func BenchmarkWriteLatency(b *testing.B) {
	for _, noCRC := range []bool{false, true} {
		b.Run(crcName(noCRC), func(b *testing.B) {
			p := newBenchPair(b, noCRC)
			ping := func(from *QP, mine, theirs *MR) {
				must(b, from.PostSend(&qp.SendWR{Op: qp.OpWrite, SGL: []qp.SGE{{LKey: mine.STag, Addr: mine.Base, Length: 8}},
					RemoteSTag: theirs.STag, RemoteTO: theirs.Base}))
				must(b, from.PostSend(&qp.SendWR{Op: qp.OpImmediate}))
			}
			for i := 0; i < benchDepth; i++ {
				must(b, p.s.PostRecv(&qp.RecvWR{}))
				must(b, p.c.PostRecv(&qp.RecvWR{}))
			}
			stop := make(chan struct{})
			echoed := make(chan struct{})
			go func() {
				defer close(echoed)
				for {
					select {
					case <-stop:
						return
					default:
					}
					spin(b, p.srv.rcq, 1)
					_ = p.s.PostRecv(&qp.RecvWR{})
					ping(p.s, p.sbuf, p.cbuf)
				}
			}()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ping(p.c, p.cbuf, p.sbuf)
				spin(b, p.cli.rcq, 1)
				must(b, p.c.PostRecv(&qp.RecvWR{}))
			}
			b.StopTimer()
			close(stop)
			ping(p.c, p.cbuf, p.sbuf) // wake the echo loop to see stop
			<-echoed
		})
	}
}

// BenchmarkReadLatency: one 8-byte RDMA Read at a time; ns/op is one round
// trip.
func BenchmarkReadLatency(b *testing.B) {
	for _, noCRC := range []bool{false, true} {
		b.Run(crcName(noCRC), func(b *testing.B) {
			p := newBenchPair(b, noCRC)
			wr := qp.SendWR{Op: qp.OpRead, Flags: qp.Signaled, SGL: []qp.SGE{{LKey: p.cbuf.STag, Addr: p.cbuf.Base, Length: 8}},
				RemoteSTag: p.sbuf.STag, RemoteTO: p.sbuf.Base}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				must(b, p.c.PostSend(&wr))
				spin(b, p.cli.scq, 1)
			}
		})
	}
}

// tcpPair is a plain loopback TCP connection with Nagle off.
func tcpPair(b *testing.B) (a, c *net.TCPConn) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	must(b, err)
	defer ln.Close()
	done := make(chan *net.TCPConn, 1)
	go func() {
		s, _ := ln.AcceptTCP()
		done <- s
	}()
	c, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	must(b, err)
	a = <-done
	_ = a.SetNoDelay(true)
	_ = c.SetNoDelay(true)
	b.Cleanup(func() { a.Close(); c.Close() })
	return a, c
}

// BenchmarkTCPStream: the kernel-TCP baseline, one writer and one reader,
// messages of each size.
func BenchmarkTCPStream(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			s, c := tcpPair(b)
			b.SetBytes(int64(size))
			total := int64(size) * int64(b.N)
			done := make(chan error, 1)
			go func() {
				_, err := io.CopyN(io.Discard, s, total)
				done <- err
			}()
			msg := make([]byte, size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
			}
			must(b, <-done)
		})
	}
}

// BenchmarkTCPPingPong: the kernel-TCP latency baseline, 1 byte each way;
// ns/op is one round trip.
func BenchmarkTCPPingPong(b *testing.B) {
	s, c := tcpPair(b)
	go func() {
		var one [1]byte
		for {
			if _, err := io.ReadFull(s, one[:]); err != nil {
				return
			}
			if _, err := s.Write(one[:]); err != nil {
				return
			}
		}
	}()
	var one [1]byte
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(one[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, one[:]); err != nil {
			b.Fatal(err)
		}
	}
}

// STag lookups from every poller at once, as tagged segments arrive on all
// queues: no lock, so no cache line shared between the CPUs.
func BenchmarkSTagLookupParallel(b *testing.B) {
	var t stagTable
	var stags []uint32
	for range 4096 {
		m := &qp.MR{}
		if err := t.insert(m); err != nil {
			b.Fatal(err)
		}
		stags = append(stags, m.STag)
	}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if t.Lookup(stags[i&4095]) == nil {
				b.Error("lost") // Fatal must not run off the benchmark's goroutine
				return
			}
			i++
		}
	})
}

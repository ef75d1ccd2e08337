package sim

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"time"
)

// SocketResult is what a kernel socket saw in a patterned transfer.
type SocketResult struct {
	Sent, Recvd uint64
	// EOFAt: when all of the peer's data and its FIN had been read.
	EOFAt    time.Time
	WriteErr error
	// ReadErr is nil when the peer's data ended with EOF.
	ReadErr error
	// Corrupt is the first octet that was not the peer's pattern.
	Corrupt error
}

// RunSocket is the kernel side of a full-duplex transfer against an
// Endpoint: one goroutine writes send octets of pattern seed and
// half-closes; the caller's goroutine reads until EOF, checking pattern
// peerSeed. Then conn is closed. Everything ends by deadline.
func RunSocket(conn *net.TCPConn, seed, peerSeed, send uint64, deadline time.Time) SocketResult {
	var r SocketResult
	_ = conn.SetDeadline(deadline)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		buf := make([]byte, 64<<10)
		for r.Sent < send {
			k := min(uint64(len(buf)), send-r.Sent)
			FillPattern(seed, r.Sent, buf[:k])
			n, err := conn.Write(buf[:k])
			r.Sent += uint64(n)
			if err != nil {
				r.WriteErr = err
				return
			}
		}
		r.WriteErr = conn.CloseWrite()
	}()
	buf := make([]byte, 64<<10)
	want := make([]byte, 64<<10)
	for {
		n, err := conn.Read(buf)
		if n > 0 && r.Corrupt == nil {
			FillPattern(peerSeed, r.Recvd, want[:n])
			if !bytes.Equal(buf[:n], want[:n]) {
				i := 0
				for buf[i] == want[i] {
					i++
				}
				r.Corrupt = fmt.Errorf("octet %d: got %#x, want %#x", r.Recvd+uint64(i), buf[i], want[i])
			}
		}
		r.Recvd += uint64(n)
		if err == io.EOF {
			r.EOFAt = time.Now()
			break
		}
		if err != nil {
			r.ReadErr = err
			break
		}
	}
	<-wrote
	if err := conn.Close(); err != nil && r.ReadErr == nil {
		r.ReadErr = err
	}
	return r
}

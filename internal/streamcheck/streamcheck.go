// Package streamcheck moves a verified stream over a pair of connections,
// for the tests of anything that is a net.Conn.
package streamcheck

import (
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"
)

// Verified writes total octets of a seeded stream to w in random
// sizes, half-closes, and reads them from r in random sizes to EOF: the
// SHA-256 of what was read must be what was written.
func Verified(w, r net.Conn, total int, seed uint64) error {
	errc := make(chan error, 1)
	var sent [32]byte
	go func() {
		rng := rand.New(rand.NewPCG(seed, 1))
		h := sha256.New()
		buf := make([]byte, 512<<10)
		for n := 0; n < total; {
			k := min(1+rng.IntN(len(buf)), total-n)
			for i := 0; i < k; i += 8 {
				v := rng.Uint64()
				for j := 0; j < 8 && i+j < k; j++ {
					buf[i+j] = byte(v >> (8 * j))
				}
			}
			h.Write(buf[:k])
			if _, err := w.Write(buf[:k]); err != nil {
				errc <- fmt.Errorf("write: %w", err)
				return
			}
			n += k
		}
		copy(sent[:], h.Sum(nil))
		errc <- w.(interface{ CloseWrite() error }).CloseWrite()
	}()
	rng := rand.New(rand.NewPCG(seed, 2))
	h := sha256.New()
	buf := make([]byte, 600<<10)
	n := 0
	_ = r.SetReadDeadline(time.Now().Add(5 * time.Minute))
	for {
		k, err := r.Read(buf[:1+rng.IntN(len(buf))])
		h.Write(buf[:k])
		n += k
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read after %d octets: %w", n, err)
		}
	}
	if err := <-errc; err != nil {
		return err
	}
	if n != total {
		return fmt.Errorf("read %d octets, want %d", n, total)
	}
	if got := h.Sum(nil); string(got) != string(sent[:]) {
		return fmt.Errorf("SHA-256 differs: sent %x, read %x", sent, got)
	}
	return nil
}

// EchoServer echoes every connection ln accepts until ln is closed; kind,
// when not nil, is told each connection first (a test checks what it is).
func EchoServer(ln net.Listener, kind func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if kind != nil {
			kind(c)
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// Echo sends a message on c, reads it back from an echo server within
// 10 s, and closes c.
func Echo(c net.Conn) error {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := []byte("by whichever path won")
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if string(got) != string(msg) {
		return fmt.Errorf("echo: %q back for %q", got, msg)
	}
	return nil
}

// Command softrnic-sdp-example is a TCP echo server and client switched to
// SDP by one import: the code calls sockets.Listen and sockets.Dial, and
// sockets is the sdp package here; with
//
//	import sockets "net"
//
// the same program is plain TCP. Between two hosts that run softrnicd the
// octets travel as RDMA messages; against a peer that is plain TCP (or with
// SOFTRNIC_SDP=off) it is TCP, with nothing else changed.
//
//	softrnic-sdp-example server [--socket S] ADDR:PORT
//	softrnic-sdp-example client [--socket S] [--size N] ADDR:PORT
package main

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"time"

	sockets "github.com/softrnic/softrnic/sdp"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "server" && os.Args[1] != "client") {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	socket := fs.String("socket", "", "softrnicd control socket (default: $SOFTRNIC_SOCKET, then the one socket in /run/softrnic)")
	size := fs.Int("size", 64<<20, "client: octets to send and have echoed")
	_ = fs.Parse(os.Args[2:])
	if fs.NArg() != 1 {
		usage()
	}
	if *socket != "" {
		os.Setenv(sockets.EnvSocket, *socket)
	}
	var err error
	if os.Args[1] == "server" {
		err = server(fs.Arg(0))
	} else {
		err = client(fs.Arg(0), *size)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic-sdp-example:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: softrnic-sdp-example server|client [--socket S] [--size N] ADDR:PORT")
	os.Exit(2)
}

// kind names what a connection turned out to be.
func kind(c net.Conn) string {
	if _, ok := c.(*sockets.Conn); ok {
		return "SDP (RDMA)"
	}
	return "TCP"
}

// server echoes every connection's octets back until it half-closes.
func server(addr string) error {
	ln, err := sockets.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("server: listening on %s\n", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			n, err := io.Copy(c, c)
			fmt.Printf("server: %s connection from %s echoed %d octets (%v)\n", kind(c), c.RemoteAddr(), n, errOrDone(err))
			if cw, ok := c.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
		}()
	}
}

func errOrDone(err error) any {
	if err == nil {
		return "done"
	}
	return err
}

// client sends size random octets, reads the echo, and compares SHA-256.
func client(addr string, size int) error {
	c, err := sockets.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("client: %s connection %s -> %s\n", kind(c), c.LocalAddr(), c.RemoteAddr())
	start := time.Now()
	sent := sha256.New()
	errc := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
		buf := make([]byte, 256<<10)
		for n := 0; n < size; {
			k := min(len(buf), size-n)
			for i := range buf[:k] {
				buf[i] = byte(rng.Uint32())
			}
			sent.Write(buf[:k])
			if _, err := c.Write(buf[:k]); err != nil {
				errc <- err
				return
			}
			n += k
		}
		errc <- c.(interface{ CloseWrite() error }).CloseWrite()
	}()
	got := sha256.New()
	n, err := io.Copy(got, c)
	if err != nil {
		return err
	}
	if err := <-errc; err != nil {
		return err
	}
	el := time.Since(start)
	if n != int64(size) || string(got.Sum(nil)) != string(sent.Sum(nil)) {
		return fmt.Errorf("the echo differs: %d of %d octets back", n, size)
	}
	fmt.Printf("client: %d octets there and back in %v (%.2f Gbit/s each way), SHA-256 equal\n",
		size, el.Round(time.Millisecond), float64(size)*8/el.Seconds()/1e9)
	return nil
}

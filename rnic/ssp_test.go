package rnic_test

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/rnic"
)

// TestSSPSocketPassedWhileConnecting: a socket handed over before its
// connect completed has no addresses in its net.TCPConn (net.FileConn
// reads them once). Connected afterwards, it is SOCKET_DOWN when a Request
// comes, not a panic of the daemon (found by review).
func TestSSPSocketPassedWhileConnecting(t *testing.T) {
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "connecting")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	tc := nc.(*net.TCPConn)
	defer tc.Close()
	rc, _ := tc.SyscallConn()
	var cerr error
	_ = rc.Control(func(s uintptr) {
		cerr = unix.Connect(int(s), &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: ln.Addr().(*net.TCPAddr).Port})
	})
	if cerr != nil && !errors.Is(cerr, unix.EINPROGRESS) {
		t.Fatal(cerr)
	}
	peer, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	time.Sleep(10 * time.Millisecond)
	dev := rnic.Open()
	defer dev.Close()
	sp, err := dev.ServeSocket(tc, rnic.SocketPointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Free()
	if _, err := peer.Write(append([]byte("MPA ID Req Frame"), 0x40, 1, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if cr, err := sp.Request(t.Context()); cr != nil || !errors.Is(err, rnic.ErrSocketDown) {
		t.Fatalf("request %v, %v; want ErrSocketDown", cr, err)
	}
}

package client_test

import (
	"bytes"
	"errors"
	"os"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

// Ordinary memory of the process, not a Buffer: an anonymous mapping and a
// slice from make, registered where they are (RegisterMemory moves their
// pages onto the process's registration memfd). A peer's RDMA Write lands
// in them, a Send is gathered from an unaligned piece of one, and after
// Free the memory is private again with what the peer wrote.
func TestRegisterOrdinaryMemory(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "server"), newApp(t, sock, "client")
	sep, cep, _ := connectPair(t, server, cli, nil)

	page := os.Getpagesize()
	anon, err := unix.Mmap(-1, 0, 16*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	must(t, err)
	defer unix.Munmap(anon)
	copy(anon, "kept across registration")
	target, err := server.pz.RegisterBytes(anon, client.LocalWrite|client.RemoteWrite)
	must(t, err)
	if string(anon[:24]) != "kept across registration" {
		t.Fatal("registration changed the memory")
	}

	src := make([]byte, 3*page+123) // Go heap, not page-aligned in general
	for i := range src {
		src[i] = byte(i * 13)
	}
	piece := src[77 : 77+2*page]
	from, err := cli.pz.RegisterBytes(piece, 0)
	must(t, err)
	must(t, cep.PostWrite(1, []client.Segment{{LMR: from, Length: uint32(len(piece))}},
		client.RemoteBuffer{Context: target.Context, Address: target.Address(uint64(page + 5))}, client.Signaled))
	if ev := wait(t, cli.req); ev.Status != completion.Success || ev.Cookie != 1 {
		t.Fatalf("write: %+v", ev)
	}
	// A Send tells the server the Write is there (ordering on the QP).
	must(t, sep.PostRecv(2, []client.Segment{{LMR: server.lmr, Length: 16}}))
	must(t, cep.PostSend(3, []client.Segment{{LMR: from, Length: 16}}, client.Signaled))
	if ev := wait(t, server.recv); ev.Status != completion.Success || ev.Length != 16 {
		t.Fatalf("receive: %+v", ev)
	}
	// The Send holds its LMR until it completes, which may be after the
	// server has it: an LMR with work outstanding is refused Free.
	if ev := wait(t, cli.req); ev.Status != completion.Success || ev.Cookie != 3 {
		t.Fatalf("send: %+v", ev)
	}
	if !bytes.Equal(anon[page+5:page+5+len(piece)], piece) {
		t.Fatal("the RDMA Write did not land in the registered anonymous memory")
	}
	if !bytes.Equal(server.buf.Bytes[:16], piece[:16]) {
		t.Fatal("the Send was not gathered from the registered heap memory")
	}
	must(t, target.Free())
	must(t, from.Free())
	want := append([]byte(nil), piece...)
	if !bytes.Equal(anon[page+5:page+5+len(piece)], want) || string(anon[:24]) != "kept across registration" {
		t.Fatal("contents lost when the registration went")
	}
	anon[0] = 'K' // private and writable again
	runtime.KeepAlive(src)

	// Memory the process does not have is refused, and nothing is left.
	hole, err := unix.Mmap(-1, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	must(t, err)
	addr := uintptr(unsafe.Pointer(&hole[0]))
	must(t, unix.Munmap(hole))
	if _, err := server.pz.RegisterMemory(addr, page, client.LocalWrite); !errors.Is(err, client.ErrInvalidParameter) {
		t.Fatalf("registering unmapped memory: %v", err)
	}
	if _, err := server.pz.RegisterMemory(addr, 0, client.LocalWrite); !errors.Is(err, client.ErrInvalidParameter) {
		t.Fatalf("registering 0 octets: %v", err)
	}
}

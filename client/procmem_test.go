package client_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
)

// heapSink makes what onHeap returns escape to the heap.
var heapSink atomic.Pointer[[]byte]

// onHeap is n octets of the Go heap: memory registered by address must not
// be a slice the compiler keeps on the goroutine's stack, which moves when
// the stack grows.
func onHeap(n int) []byte {
	b := make([]byte, n)
	heapSink.Store(&b)
	return b
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func sentinel(b []byte) {
	for i := range b {
		b[i] = 0xa5
	}
}

func untouched(t *testing.T, what string, b []byte) {
	t.Helper()
	if !bytes.Equal(b, bytes.Repeat([]byte{0xa5}, len(b))) {
		t.Fatalf("%s changed: %x", what, b)
	}
}

// Both applications register ordinary process memory by address, which
// the daemon reaches through /proc/PID/mem: a Send into a 16-octet
// field inside a heap object, an RDMA Write, an RDMA Read and atomics,
// octet for octet, the neighbours of every range untouched. The daemon
// counts the regions as LMRs, Free and the session's end free them.
func TestRegisterProcessMemory(t *testing.T) {
	sock, srv := startDaemon(t)
	server, cli := newApp(t, sock, "server"), newApp(t, sock, "client")
	sep, cep, _ := connectPair(t, server, cli, nil)
	lmrs := srv.Counts()["lmr"]

	// The server's memory: a field of a heap object, a larger unaligned
	// range, and an 8-aligned word for atomics.
	obj := onHeap(64)
	sentinel(obj)
	field, err := server.pz.RegisterProcessMemory(addrOf(obj[13:]), 16, client.LocalWrite)
	must(t, err)
	big := onHeap(9000)
	sentinel(big)
	bigR, err := server.pz.RegisterProcessMemory(addrOf(big[3:]), 8000, client.LocalWrite|client.RemoteWrite|client.RemoteRead)
	must(t, err)
	words := onHeap(64) // 64-octet size class: 8-aligned
	binary.NativeEndian.PutUint64(words[8:], 40)
	wordR, err := server.pz.RegisterProcessMemory(addrOf(words[8:]), 8, client.LocalWrite|client.RemoteAtomic)
	must(t, err)

	// The client's: a source and a sink, unaligned, and results.
	src := onHeap(6000)
	for i := range src {
		src[i] = byte(i*7 + 1)
	}
	srcR, err := cli.pz.RegisterProcessMemory(addrOf(src[1:]), 5000, 0)
	must(t, err)
	sink := onHeap(6000)
	sentinel(sink)
	sinkR, err := cli.pz.RegisterProcessMemory(addrOf(sink[5:]), 4000, client.LocalWrite)
	must(t, err)
	res := onHeap(32)
	sentinel(res)
	resR, err := cli.pz.RegisterProcessMemory(addrOf(res[3:]), 16, client.LocalWrite)
	must(t, err)
	if got := srv.Counts()["lmr"]; got != lmrs+6 {
		t.Fatalf("%d LMRs counted, want %d", got, lmrs+6)
	}

	// Send into the field.
	must(t, sep.PostRecv(1, []client.Segment{{LMR: field, Length: 16}}))
	must(t, cep.PostSend(2, []client.Segment{{LMR: srcR, Offset: 5, Length: 16}}, client.Signaled))
	if ev := wait(t, cli.req); ev.Status != completion.Success || ev.Cookie != 2 {
		t.Fatalf("send: %+v", ev)
	}
	if ev := wait(t, server.recv); ev.Status != completion.Success || ev.Length != 16 {
		t.Fatalf("receive: %+v", ev)
	}
	if !bytes.Equal(obj[13:29], src[6:22]) {
		t.Fatalf("field %x, sent %x", obj[13:29], src[6:22])
	}
	untouched(t, "before the field", obj[:13])
	untouched(t, "after the field", obj[29:])

	// RDMA Write into the larger range, and a Send behind it.
	must(t, cep.PostWrite(3, []client.Segment{{LMR: srcR, Length: 4000}},
		client.RemoteBuffer{Context: bigR.Context, Address: bigR.Address(100)}, 0))
	must(t, sep.PostRecv(4, []client.Segment{{LMR: server.lmr, Length: 16}}))
	must(t, cep.PostSend(5, []client.Segment{{LMR: srcR, Length: 16}}, client.Signaled))
	if ev := wait(t, cli.req); ev.Status != completion.Success || ev.Cookie != 5 {
		t.Fatalf("send after the write: %+v", ev)
	}
	if ev := wait(t, server.recv); ev.Status != completion.Success {
		t.Fatalf("receive after the write: %+v", ev)
	}
	if !bytes.Equal(big[103:4103], src[1:4001]) {
		t.Fatal("the RDMA Write did not land in the process memory")
	}
	untouched(t, "before the write", big[:103])
	untouched(t, "after the write", big[4103:])

	// RDMA Read of it back into the client's sink.
	must(t, cep.PostRead(6, client.Segment{LMR: sinkR, Offset: 10, Length: 3000},
		client.RemoteBuffer{Context: bigR.Context, Address: bigR.Address(100)}, client.Signaled))
	if ev := wait(t, cli.req); ev.Status != completion.Success || ev.Cookie != 6 || ev.Length != 3000 {
		t.Fatalf("read: %+v", ev)
	}
	if !bytes.Equal(sink[15:3015], src[1:3001]) {
		t.Fatal("the RDMA Read brought other octets")
	}
	untouched(t, "before the read", sink[:15])
	untouched(t, "after the read", sink[3015:])

	// Atomics on the word, results into the unaligned range.
	at := client.RemoteBuffer{Context: wordR.Context, Address: wordR.Address(0)}
	must(t, cep.PostFetchAdd(7, client.Segment{LMR: resR, Length: 8}, at, 2, client.Signaled))
	must(t, cep.PostCmpSwap(8, client.Segment{LMR: resR, Offset: 8, Length: 8}, at, 42, 7, client.Signaled))
	for _, id := range []uint64{7, 8} {
		if ev := wait(t, cli.req); ev.Status != completion.Success || ev.Cookie != id {
			t.Fatalf("atomic %d: %+v", id, ev)
		}
	}
	if r0, r1, w := binary.NativeEndian.Uint64(res[3:]), binary.NativeEndian.Uint64(res[11:]), binary.NativeEndian.Uint64(words[8:]); r0 != 40 || r1 != 42 || w != 7 {
		t.Fatalf("results %d %d, word %d; want 40 42 and 7", r0, r1, w)
	}
	untouched(t, "before the results", res[:3])
	untouched(t, "after the results", res[19:])

	for _, l := range []*client.LMR{field, srcR} {
		must(t, l.Free())
	}
	if got := srv.Counts()["lmr"]; got != lmrs+4 {
		t.Fatalf("%d LMRs counted after two were freed, want %d", got, lmrs+4)
	}
	// The session's end frees the rest.
	must(t, sep.Disconnect(false))
	server.ia.Close()
	cli.ia.Close()
	for deadline := time.Now().Add(10 * time.Second); srv.Counts()["lmr"] != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("LMRs still counted after the sessions ended: %v", srv.Counts())
		}
	}
}

// A range the process does not have is refused, naming the address; so are
// bad lengths and rights, and nothing is left registered.
func TestRegisterProcessMemoryRefused(t *testing.T) {
	sock, srv := startDaemon(t)
	a := newApp(t, sock, "a")
	lmrs := srv.Counts()["lmr"]
	page := os.Getpagesize()
	m, err := unix.Mmap(-1, 0, 2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	must(t, err)
	defer unix.MunmapPtr(unsafe.Pointer(&m[0]), uintptr(page))
	hole := addrOf(m[page:])
	must(t, unix.MunmapPtr(unsafe.Pointer(&m[page]), uintptr(page)))

	_, err = a.pz.RegisterProcessMemory(hole, 16, client.LocalWrite)
	if !errors.Is(err, client.ErrInvalidAddress) || !strings.Contains(err.Error(), fmt.Sprintf("%#x", hole)) {
		t.Fatalf("registering unmapped memory: %v", err)
	}
	// The first octet is there, the last is not.
	_, err = a.pz.RegisterProcessMemory(hole-8, 16, client.LocalWrite)
	if !errors.Is(err, client.ErrInvalidAddress) || !strings.Contains(err.Error(), fmt.Sprintf("%#x", hole+7)) {
		t.Fatalf("registering a range that runs into unmapped memory: %v", err)
	}
	// Read-only memory is not registered for writing by anyone (the
	// daemon's /proc/PID/mem would write through the protection), but
	// is for reading.
	ro, err := unix.Mmap(-1, 0, page, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	must(t, err)
	defer unix.Munmap(ro)
	for _, acc := range []client.Access{client.LocalWrite, client.RemoteWrite, client.RemoteAtomic} {
		if _, err := a.pz.RegisterProcessMemory(addrOf(ro[8:]), 16, acc); !errors.Is(err, client.ErrInvalidAddress) {
			t.Fatalf("registering read-only memory with %v: %v", acc, err)
		}
	}
	roR, err := a.pz.RegisterProcessMemory(addrOf(ro[8:]), 16, client.RemoteRead)
	must(t, err)
	must(t, roR.Free())
	ok := addrOf(m)
	for _, c := range []struct {
		name   string
		addr   uintptr
		length int
		access client.Access
	}{
		{"0 octets", ok, 0, 0},
		{"over MaxLMRSize", ok, int(a.ia.Attr().MaxLMRSize) + 1, 0},
		{"wrapping", ^uintptr(0) - 7, 16, 0},
		{"unknown access bits", ok, 16, 0x10},
		{"remote write without local write", ok, 16, client.RemoteWrite},
	} {
		if _, err := a.pz.RegisterProcessMemory(c.addr, c.length, c.access); !errors.Is(err, client.ErrInvalidParameter) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	pz, err := a.ia.CreatePZ()
	must(t, err)
	must(t, pz.Free())
	if _, err := pz.RegisterProcessMemory(ok, 16, 0); !errors.Is(err, client.ErrInvalidHandle) {
		t.Errorf("in a freed PZ: %v", err)
	}
	if got := srv.Counts()["lmr"]; got != lmrs {
		t.Fatalf("%d LMRs after refusals, want %d", got, lmrs)
	}
}

// Memory unmapped after its registration: the Send from it completes with
// a local protection error and the connection ends with a Terminate,
// which both sides see; the daemon goes on.
func TestProcessMemoryUnmappedAfterRegistration(t *testing.T) {
	sock, _ := startDaemon(t)
	server, cli := newApp(t, sock, "server"), newApp(t, sock, "client")
	sep, cep, _ := connectPair(t, server, cli, nil)
	page := os.Getpagesize()
	m, err := unix.Mmap(-1, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	must(t, err)
	l, err := cli.pz.RegisterProcessMemory(addrOf(m), page, 0)
	must(t, err)
	must(t, unix.Munmap(m))
	must(t, sep.PostRecv(1, []client.Segment{{LMR: server.lmr, Length: 64}}))
	must(t, cep.PostSend(2, []client.Segment{{LMR: l, Length: 64}}, 0))
	if ev := wait(t, cli.req); ev.Status != completion.LocalProtectionError || ev.Cookie != 2 {
		t.Fatalf("send from unmapped memory: %+v", ev)
	}
	for _, a := range []*app{cli, server} {
		ev := wait(t, a.conn)
		if ev.Conn != client.Broken || ev.Cause == nil || *ev.Cause != ddp.RDMAPLocalCatastrophic {
			t.Fatalf("connection event: %+v (cause %v)", ev, ev.Cause)
		}
	}
	if ev := wait(t, server.recv); ev.Status != completion.FlushError {
		t.Fatalf("the server's receive: %+v", ev)
	}
	must(t, l.Free())
}

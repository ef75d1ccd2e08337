package qp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/procmem"
	"github.com/softrnic/softrnic/internal/testenv"
)

// Process-backed regions (MR.Proc) over the test's own memory, which
// /proc/PID/mem reaches as it reaches a client's: the regions are
// Go byte slices and mapped pages of this process, each with a guarded
// shadow of its own.

// procSelf is the memory of the test's process, closed at the test's end.
func procSelf(t testing.TB) *procmem.Process {
	t.Helper()
	p, err := procmem.Open(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// regProc registers host, memory of this process, as a process-backed
// region: its tagged offsets are its addresses. The table keeps host, so
// that it is on the heap: a slice the compiler kept on the goroutine's
// stack would move when the stack grows, and the region would name the
// old place.
func (m *memTable) regProc(t testing.TB, pd uint32, pm ProcessMemory, host []byte, access Access) *MR {
	m.mu.Lock()
	m.hosts = append(m.hosts, host)
	m.mu.Unlock()
	return m.regProcAt(t, pd, pm, addrOf(host), len(host), access)
}

func (m *memTable) regProcAt(t testing.TB, pd uint32, pm ProcessMemory, va uint64, n int, access Access) *MR {
	t.Helper()
	shadow := guarded(t, n)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mrs == nil {
		m.mrs = map[uint32]*MR{}
	}
	m.next++
	mr := &MR{STag: m.next<<8 | 0x5a, PD: pd, Access: access, Base: va, Buf: shadow, Proc: pm}
	m.mrs[mr.STag] = mr
	return mr
}

// hole is the address of a page that was mapped and is not any more (its
// neighbours still are, so only a one-page mapping could land in it).
func hole(t testing.TB) uint64 {
	t.Helper()
	page := os.Getpagesize()
	m, err := unix.Mmap(-1, 0, 3*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.MunmapPtr(unsafe.Pointer(&m[0]), uintptr(page))
		_ = unix.MunmapPtr(unsafe.Pointer(&m[2*page]), uintptr(page))
	})
	if err := unix.MunmapPtr(unsafe.Pointer(&m[page]), uintptr(page)); err != nil {
		t.Fatal(err)
	}
	return addrOf(m[page:])
}

// holeAfter is n mapped octets (whole pages) followed by a page that is
// not mapped.
func holeAfter(t testing.TB, n int) []byte {
	t.Helper()
	page := os.Getpagesize()
	n = (n + page - 1) / page * page
	m, err := unix.Mmap(-1, 0, n+2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.MunmapPtr(unsafe.Pointer(&m[0]), uintptr(n))
		_ = unix.MunmapPtr(unsafe.Pointer(&m[n+page]), uintptr(page))
	})
	if err := unix.MunmapPtr(unsafe.Pointer(&m[n]), uintptr(page)); err != nil {
		t.Fatal(err)
	}
	return m[:n:n]
}

// sentinel fills b with a recognisable pattern; untouched checks it.
func sentinel(b []byte) {
	for i := range b {
		b[i] = 0xa5
	}
}

func untouched(t testing.TB, what string, b []byte) {
	t.Helper()
	for i, x := range b {
		if x != 0xa5 {
			t.Fatalf("%s: octet %d changed to %#x", what, i, x)
		}
	}
}

func zero(b []byte) bool { return bytes.Count(b, []byte{0}) == len(b) }

// A Send gathered from an unaligned piece of a Go slice lands in a receive
// whose SGEs are a 16-octet field inside a larger slice, a process-backed
// region and an ordinary one: every octet where it belongs, the field's
// neighbours untouched, and the receiving regions' shadows never used.
func TestProcessSendReceive(t *testing.T) {
	for _, o := range []pairOpts{{crc: true}, {crc: true, markers: true, chunk: 7}, {emss: 536, chunk: 300}} {
		t.Run(fmt.Sprintf("markers=%v/emss=%d/chunk=%d", o.markers, o.emss, o.chunk), func(t *testing.T) {
			pm := procSelf(t)
			a, b := newPair(t, o)
			hostA := make([]byte, 20000)
			fill(hostA, 11)
			src := a.mem.regProc(t, pdA, pm, hostA[3:3+17000], 0)

			hostB := make([]byte, 64)
			sentinel(hostB)
			field := b.mem.regProc(t, pdB, pm, hostB[13:29], LocalWrite)
			big := make([]byte, 10000)
			bigR := b.mem.regProc(t, pdB, pm, big, LocalWrite)
			plain := b.mem.reg(t, pdB, 8000, LocalWrite)
			must(t, b.q.PostRecv(&RecvWR{ID: 10, SGL: []SGE{
				{LKey: field.STag, Addr: field.Base, Length: 16},
				{LKey: bigR.STag, Addr: bigR.Base + 1, Length: 9000},
				{LKey: plain.STag, Addr: plain.Base, Length: 8000}}}))
			must(t, a.q.PostSend(&SendWR{ID: 1, Op: OpSend, Flags: Signaled, SGL: []SGE{{LKey: src.STag, Addr: src.Base, Length: 17000}}}))
			newLink(a, b, o.chunk).pump()
			sc, rc := poll(a.scq), poll(b.rcq)
			if len(sc) != 1 || sc[0].Status != completion.Success || sc[0].ByteLen != 17000 {
				t.Fatalf("send completions %+v", sc)
			}
			if len(rc) != 1 || rc[0].Status != completion.Success || rc[0].ByteLen != 17000 {
				t.Fatalf("recv completions %+v", rc)
			}
			want := hostA[3 : 3+17000]
			mustEqual(t, "field", hostB[13:29], want[:16])
			untouched(t, "before the field", hostB[:13])
			untouched(t, "after the field", hostB[29:])
			mustEqual(t, "process region", big[1:9001], want[16:9016])
			if big[0] != 0 || !zero(big[9001:]) {
				t.Fatal("octets around the receive's SGE changed")
			}
			mustEqual(t, "ordinary region", plain.Buf[:7984], want[9016:])
			if !zero(field.Buf) || !zero(bigR.Buf) {
				t.Fatal("a placement went through the shadow")
			}
			if a.q.State() != RTS || b.q.State() != RTS {
				t.Fatalf("states %v %v", a.q.State(), b.q.State())
			}
		})
	}
}

// RDMA Writes from and into process-backed regions, one of them an
// unaligned 16-octet field, then a Send that says they are there.
func TestProcessWrite(t *testing.T) {
	pm := procSelf(t)
	a, b := newPair(t, pairOpts{crc: true, chunk: 300})
	hostA := make([]byte, 70000)
	fill(hostA, 12)
	src := a.mem.regProc(t, pdA, pm, hostA[1:], 0)
	hostT := make([]byte, 70000)
	target := b.mem.regProc(t, pdB, pm, hostT, LocalWrite|RemoteWrite)
	hostF := make([]byte, 48)
	sentinel(hostF)
	field := b.mem.regProc(t, pdB, pm, hostF[7:23], LocalWrite|RemoteWrite)
	note := b.mem.reg(t, pdB, 16, LocalWrite)
	must(t, b.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{{LKey: note.STag, Addr: note.Base, Length: 16}}}))
	must(t, a.q.PostSend(&SendWR{ID: 1, Op: OpWrite, SGL: []SGE{{LKey: src.STag, Addr: src.Base, Length: 65536}},
		RemoteSTag: target.STag, RemoteTO: target.Base + 100}))
	must(t, a.q.PostSend(&SendWR{ID: 2, Op: OpWrite, SGL: []SGE{{LKey: src.STag, Addr: src.Base + 5, Length: 16}},
		RemoteSTag: field.STag, RemoteTO: field.Base}))
	must(t, a.q.PostSend(&SendWR{ID: 3, Op: OpSend, Flags: Signaled | Inline, InlineData: []byte("done")}))
	newLink(a, b, 300).pump()
	if sc := poll(a.scq); len(sc) != 1 || sc[0].ID != 3 || sc[0].Status != completion.Success {
		t.Fatalf("send completions %+v", sc)
	}
	if rc := poll(b.rcq); len(rc) != 1 || rc[0].ByteLen != 4 {
		t.Fatalf("recv completions %+v", rc)
	}
	mustEqual(t, "written", hostT[100:100+65536], hostA[1:1+65536])
	if !zero(hostT[:100]) || !zero(hostT[100+65536:]) {
		t.Fatal("octets around the written range changed")
	}
	mustEqual(t, "field", hostF[7:23], hostA[6:22])
	untouched(t, "before the field", hostF[:7])
	untouched(t, "after the field", hostF[23:])
}

// RDMA Reads from a process-backed source into a process-backed sink; a
// fenced Send from the sink after the Read carries what the Read brought,
// so the Send's data is read from the process when it goes out, not when
// it is posted.
func TestProcessRead(t *testing.T) {
	for _, size := range []int{1, 16, 1442, 100000, 2*fetchAhead + 1000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			pm := procSelf(t)
			a, b := newPair(t, pairOpts{crc: true, chunk: 1000})
			hostSink := make([]byte, size+6)
			sentinel(hostSink)
			sink := a.mem.regProc(t, pdA, pm, hostSink[3:3+size], LocalWrite)
			hostSrc := make([]byte, size+9)
			fill(hostSrc, 13)
			src := b.mem.regProc(t, pdB, pm, hostSrc[9:], RemoteRead)
			rb := b.mem.reg(t, pdB, size, LocalWrite)
			must(t, b.q.PostRecv(&RecvWR{ID: 7, SGL: []SGE{{LKey: rb.STag, Addr: rb.Base, Length: uint32(size)}}}))
			must(t, a.q.PostSend(&SendWR{ID: 5, Op: OpRead, Flags: Signaled,
				SGL:        []SGE{{LKey: sink.STag, Addr: sink.Base, Length: uint32(size)}},
				RemoteSTag: src.STag, RemoteTO: src.Base}))
			must(t, a.q.PostSend(&SendWR{ID: 6, Op: OpSend, Flags: Signaled | Fence,
				SGL: []SGE{{LKey: sink.STag, Addr: sink.Base, Length: uint32(size)}}}))
			newLink(a, b, 1000).pump()
			sc := poll(a.scq)
			if len(sc) != 2 || sc[0].Status != completion.Success || sc[0].Opcode != completion.OpRead || sc[0].ByteLen != uint32(size) ||
				sc[1].Status != completion.Success {
				t.Fatalf("completions %+v", sc)
			}
			mustEqual(t, "read", hostSink[3:3+size], hostSrc[9:])
			untouched(t, "before the sink", hostSink[:3])
			untouched(t, "after the sink", hostSink[3+size:])
			if rc := poll(b.rcq); len(rc) != 1 || rc[0].ByteLen != uint32(size) {
				t.Fatalf("recv completions %+v", rc)
			}
			mustEqual(t, "fenced send", rb.Buf, hostSrc[9:])
		})
	}
}

// Atomics on a process-backed target, their results into an unaligned
// process-backed sink; then an RDMA Read of the target behind them sees
// their effect.
func TestProcessAtomics(t *testing.T) {
	pm := procSelf(t)
	a, b := newPair(t, pairOpts{crc: true})
	hostRes := make([]byte, 32)
	sentinel(hostRes)
	res := a.mem.regProc(t, pdA, pm, hostRes[3:19], LocalWrite)
	words := make([]uint64, 4) // 8-aligned
	hostTgt := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), 32)
	words[1] = 40
	words[0], words[2] = 0x5555, 0x6666
	tgt := b.mem.regProc(t, pdB, pm, hostTgt, LocalWrite|RemoteAtomic|RemoteRead)
	rd := a.mem.reg(t, pdA, 8, LocalWrite)
	must(t, a.q.PostSend(&SendWR{ID: 1, Op: OpFetchAdd, Flags: Signaled, Add: 2,
		SGL: []SGE{{LKey: res.STag, Addr: res.Base, Length: 8}}, RemoteSTag: tgt.STag, RemoteTO: tgt.Base + 8}))
	must(t, a.q.PostSend(&SendWR{ID: 2, Op: OpCmpSwap, Flags: Signaled, Compare: 42, Swap: 7,
		SGL: []SGE{{LKey: res.STag, Addr: res.Base + 8, Length: 8}}, RemoteSTag: tgt.STag, RemoteTO: tgt.Base + 8}))
	must(t, a.q.PostSend(&SendWR{ID: 3, Op: OpCmpSwap, Flags: Signaled, Compare: 42, Swap: 9,
		SGL: []SGE{{LKey: res.STag, Addr: res.Base, Length: 8}}, RemoteSTag: tgt.STag, RemoteTO: tgt.Base + 8}))
	must(t, a.q.PostSend(&SendWR{ID: 4, Op: OpRead, Flags: Signaled,
		SGL: []SGE{{LKey: rd.STag, Addr: rd.Base, Length: 8}}, RemoteSTag: tgt.STag, RemoteTO: tgt.Base + 8}))
	newLink(a, b, 0).pump()
	sc := poll(a.scq)
	if len(sc) != 4 {
		t.Fatalf("completions %+v", sc)
	}
	for _, c := range sc {
		if c.Status != completion.Success {
			t.Fatalf("completion %+v", c)
		}
	}
	if words[1] != 7 || words[0] != 0x5555 || words[2] != 0x6666 {
		t.Fatalf("target words %#x, want 7 between untouched neighbours", words)
	}
	if r0, r1 := binary.NativeEndian.Uint64(hostRes[3:]), binary.NativeEndian.Uint64(hostRes[11:]); r0 != 7 || r1 != 42 {
		t.Fatalf("results %d %d, want 7 (third) and 42 (second)", r0, r1)
	}
	untouched(t, "before the results", hostRes[:3])
	untouched(t, "after the results", hostRes[19:])
	if got := binary.NativeEndian.Uint64(rd.Buf); got != 7 {
		t.Fatalf("Read behind the atomics saw %d, want 7", got)
	}
}

// Memory that went away after registration (an unmapped page, a process
// that is gone) is never a crash: a local request completes with a local
// protection error and the QP terminates; a peer's placement or request
// is answered with a Terminate.
func TestProcessMemoryGone(t *testing.T) {
	type fixture struct {
		a, b *side
		pm   ProcessMemory
		ok   *MR // a's process-backed region that works
	}
	// The memory of the Write that runs into a hole.
	var partial struct {
		src []byte
		dst *MR
	}
	cases := []struct {
		name string
		// sentBy: the side that sends the Terminate, and its cause.
		sentBy string
		cause  ddp.TerminateError
		post   func(t *testing.T, f fixture)
		// check looks at a's send completions (and b's receives).
		check func(t *testing.T, sc, rc []completion.Completion)
	}{
		{"send from an unmapped page", "a", ddp.RDMAPLocalCatastrophic, func(t *testing.T, f fixture) {
			src := f.a.mem.regProcAt(t, pdA, f.pm, hole(t), 64, 0)
			must(t, f.a.q.PostSend(&SendWR{ID: 1, Op: OpSend, Flags: Signaled, SGL: []SGE{{LKey: f.ok.STag, Addr: f.ok.Base, Length: 8}}}))
			must(t, f.a.q.PostSend(&SendWR{ID: 2, Op: OpSend, SGL: []SGE{{LKey: src.STag, Addr: src.Base, Length: 64}}}))
			must(t, f.a.q.PostSend(&SendWR{ID: 3, Op: OpImmediate, Flags: Signaled}))
		}, func(t *testing.T, sc, rc []completion.Completion) {
			// The Send before completes, the one after flushes.
			if len(sc) != 3 || sc[0].Status != completion.Success || sc[1].ID != 2 || sc[1].Status != completion.LocalProtectionError ||
				!errors.Is(sc[1].Err, ErrProtection) || !errors.Is(sc[1].Err, unix.EFAULT) || sc[2].Status != completion.FlushError {
				t.Fatalf("send completions %+v", sc)
			}
			if len(rc) != 1 || rc[0].Status != completion.Success || rc[0].ByteLen != 8 {
				t.Fatalf("receives %+v: the first Send only", rc)
			}
		}},
		{"write running into an unmapped page", "a", ddp.RDMAPLocalCatastrophic, func(t *testing.T, f fixture) {
			// The first windows go out, the last cannot be read:
			// the peer sees the start of the Write, then the
			// Terminate.
			n := 2*fetchAhead + 4096
			partial.src = holeAfter(t, n)
			fill(partial.src, 16)
			src := f.a.mem.regProcAt(t, pdA, f.pm, addrOf(partial.src), n+100, 0)
			partial.dst = f.b.mem.reg(t, pdB, n+100, LocalWrite|RemoteWrite)
			must(t, f.a.q.PostSend(&SendWR{ID: 1, Op: OpWrite, SGL: []SGE{{LKey: src.STag, Addr: src.Base, Length: uint32(n + 100)}},
				RemoteSTag: partial.dst.STag, RemoteTO: partial.dst.Base}))
		}, func(t *testing.T, sc, rc []completion.Completion) {
			if len(sc) != 1 || sc[0].Status != completion.LocalProtectionError || !errors.Is(sc[0].Err, unix.EFAULT) {
				t.Fatalf("write completions %+v", sc)
			}
			// The FPDU that runs into the window with the hole
			// goes no more than the rest.
			mustEqual(t, "the windows before the hole", partial.dst.Buf[:fetchAhead], partial.src[:fetchAhead])
		}},
		{"write into an unmapped page", "b", ddp.DDPLocalCatastrophic, func(t *testing.T, f fixture) {
			dst := f.b.mem.regProcAt(t, pdB, f.pm, hole(t), 64, LocalWrite|RemoteWrite)
			must(t, f.a.q.PostSend(&SendWR{ID: 1, Op: OpWrite, Flags: Signaled, SGL: []SGE{{LKey: f.ok.STag, Addr: f.ok.Base, Length: 64}},
				RemoteSTag: dst.STag, RemoteTO: dst.Base}))
		}, nil},
		{"send into an unmapped receive", "b", ddp.DDPLocalCatastrophic, func(t *testing.T, f fixture) {
			f.b.q.popRecv() // the fixture's receive
			dst := f.b.mem.regProcAt(t, pdB, f.pm, hole(t), 64, LocalWrite)
			must(t, f.b.q.PostRecv(&RecvWR{ID: 9, SGL: []SGE{{LKey: dst.STag, Addr: dst.Base, Length: 64}}}))
			must(t, f.b.q.PostRecv(&RecvWR{ID: 10, SGL: []SGE{{LKey: dst.STag, Addr: dst.Base, Length: 64}}}))
			must(t, f.a.q.PostSend(&SendWR{ID: 1, Op: OpSend, SGL: []SGE{{LKey: f.ok.STag, Addr: f.ok.Base, Length: 64}}}))
		}, func(t *testing.T, sc, rc []completion.Completion) {
			if len(rc) != 2 || rc[0].ID != 9 || rc[0].Status != completion.LocalProtectionError || !errors.Is(rc[0].Err, unix.EFAULT) ||
				rc[1].Status != completion.FlushError {
				t.Fatalf("receives %+v", rc)
			}
		}},
		{"read from an unmapped source", "b", ddp.RDMAPProtectionUnspecified, func(t *testing.T, f fixture) {
			src := f.b.mem.regProcAt(t, pdB, f.pm, hole(t), 64, RemoteRead)
			must(t, f.a.q.PostSend(&SendWR{ID: 1, Op: OpRead, SGL: []SGE{{LKey: f.ok.STag, Addr: f.ok.Base, Length: 64}},
				RemoteSTag: src.STag, RemoteTO: src.Base}))
		}, func(t *testing.T, sc, rc []completion.Completion) {
			if len(sc) != 1 || sc[0].Status != completion.RemoteAccessError {
				t.Fatalf("read completions %+v", sc)
			}
		}},
		{"read into an unmapped sink", "a", ddp.DDPLocalCatastrophic, func(t *testing.T, f fixture) {
			sink := f.a.mem.regProcAt(t, pdA, f.pm, hole(t), 64, LocalWrite)
			src := f.b.mem.reg(t, pdB, 64, RemoteRead)
			must(t, f.a.q.PostSend(&SendWR{ID: 1, Op: OpRead, SGL: []SGE{{LKey: sink.STag, Addr: sink.Base, Length: 64}},
				RemoteSTag: src.STag, RemoteTO: src.Base}))
		}, func(t *testing.T, sc, rc []completion.Completion) {
			if len(sc) != 1 || sc[0].Status != completion.LocalProtectionError || !errors.Is(sc[0].Err, unix.EFAULT) {
				t.Fatalf("read completions %+v", sc)
			}
		}},
		{"atomic on an unmapped target", "b", ddp.RDMAPProtectionUnspecified, func(t *testing.T, f fixture) {
			tgt := f.b.mem.regProcAt(t, pdB, f.pm, hole(t), 64, LocalWrite|RemoteAtomic)
			must(t, f.a.q.PostSend(&SendWR{ID: 1, Op: OpFetchAdd, Add: 1, SGL: []SGE{{LKey: f.ok.STag, Addr: f.ok.Base, Length: 8}},
				RemoteSTag: tgt.STag, RemoteTO: tgt.Base + 8}))
		}, func(t *testing.T, sc, rc []completion.Completion) {
			if len(sc) != 1 || sc[0].Status != completion.RemoteAccessError {
				t.Fatalf("atomic completions %+v", sc)
			}
		}},
		{"atomic result into an unmapped page", "a", ddp.RDMAPLocalCatastrophic, func(t *testing.T, f fixture) {
			res := f.a.mem.regProcAt(t, pdA, f.pm, hole(t), 64, LocalWrite)
			tgt := f.b.mem.reg(t, pdB, 64, LocalWrite|RemoteAtomic)
			must(t, f.a.q.PostSend(&SendWR{ID: 1, Op: OpFetchAdd, Add: 1, SGL: []SGE{{LKey: res.STag, Addr: res.Base + 3, Length: 8}},
				RemoteSTag: tgt.STag, RemoteTO: tgt.Base + 8}))
		}, func(t *testing.T, sc, rc []completion.Completion) {
			if len(sc) != 1 || sc[0].Status != completion.LocalProtectionError {
				t.Fatalf("atomic completions %+v", sc)
			}
		}},
		{"write from a process that is gone", "a", ddp.RDMAPLocalCatastrophic, func(t *testing.T, f fixture) {
			dead, err := procmem.Open(os.Getpid())
			must(t, err)
			must(t, dead.Close()) // its memory is dead, as at the exit
			src := f.a.mem.regProc(t, pdA, dead, make([]byte, 64), 0)
			dst := f.b.mem.reg(t, pdB, 64, LocalWrite|RemoteWrite)
			must(t, f.a.q.PostSend(&SendWR{ID: 1, Op: OpWrite, SGL: []SGE{{LKey: src.STag, Addr: src.Base, Length: 64}},
				RemoteSTag: dst.STag, RemoteTO: dst.Base}))
		}, func(t *testing.T, sc, rc []completion.Completion) {
			if len(sc) != 1 || sc[0].Status != completion.LocalProtectionError || !errors.Is(sc[0].Err, procmem.ErrExited) {
				t.Fatalf("write completions %+v", sc)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pm := procSelf(t)
			a, b := newPair(t, pairOpts{crc: true, chunk: 100})
			okHost := make([]byte, 64)
			fill(okHost, 14)
			f := fixture{a: a, b: b, pm: pm, ok: a.mem.regProc(t, pdA, pm, okHost, LocalWrite)}
			rb := b.mem.reg(t, pdB, 64, LocalWrite)
			must(t, b.q.PostRecv(&RecvWR{ID: 100, SGL: []SGE{{LKey: rb.STag, Addr: rb.Base, Length: 64}}}))
			c.post(t, f)
			newLink(a, b, 100).pump()
			from, to := b, a
			if c.sentBy == "a" {
				from, to = a, b
			}
			if from.q.State() != Error || to.q.State() != Error {
				t.Fatalf("states %v %v", a.q.State(), b.q.State())
			}
			if len(from.events) != 2 || from.events[0].Kind != TerminateSent || !errors.Is(from.events[0].Err, c.cause) {
				t.Fatalf("events of the side that found the error: %+v, want terminate-sent %v", from.events, c.cause)
			}
			if len(to.events) != 2 || to.events[0].Kind != TerminateReceived || !errors.Is(to.events[0].Err, c.cause) {
				t.Fatalf("events of its peer: %+v, want terminate-received %v", to.events, c.cause)
			}
			if c.check != nil {
				c.check(t, poll(a.scq), poll(b.rcq))
			}
		})
	}
}

// The engine's datapath allocates nothing for process-backed regions
// either: a Write and a Send gathered from the process, placed into it.
func TestProcessDatapathAllocs(t *testing.T) {
	if testenv.Race {
		t.Skip("sync.Pool drops entries on purpose under the race detector")
	}
	pm := procSelf(t)
	a, b := newPair(t, pairOpts{crc: true})
	hostA, hostB := make([]byte, 4096), make([]byte, 4096)
	fill(hostA, 15)
	src := a.mem.regProc(t, pdA, pm, hostA, 0)
	dst := b.mem.regProc(t, pdB, pm, hostB, LocalWrite|RemoteWrite)
	write := &SendWR{Op: OpWrite, SGL: []SGE{{LKey: src.STag, Addr: src.Base, Length: 3000}}, RemoteSTag: dst.STag, RemoteTO: dst.Base + 1}
	send := &SendWR{Op: OpSend, Flags: Signaled, SGL: []SGE{{LKey: src.STag, Addr: src.Base + 7, Length: 100}}}
	recv := &RecvWR{SGL: []SGE{{LKey: dst.STag, Addr: dst.Base + 3500, Length: 100}}}
	buf := make([]byte, 64<<10)
	var out [4]completion.Completion
	round := func() {
		must(t, b.q.PostRecv(recv))
		must(t, a.q.PostSend(write))
		must(t, a.q.PostSend(send))
		n := a.q.Transmit(buf)
		b.q.Receive(buf[:n])
		a.sentTot += uint64(n)
		a.q.Sent(a.sentTot)
		if a.scq.Poll(out[:]) != 1 || b.rcq.Poll(out[:]) != 1 {
			t.Fatal("a round did not complete")
		}
	}
	if n := testing.AllocsPerRun(50, round); n != 0 {
		t.Fatalf("%v allocations per round", n)
	}
	mustEqual(t, "written", hostB[1:3001], hostA[:3000])
	mustEqual(t, "sent", hostB[3500:3600], hostA[7:107])
}

// The shadow of a process-backed region does not keep the data that went
// out: once 16 MiB were written from it and nothing holds it, its pages
// are given back (mincore finds at most the two partial pages at its
// ends), and the next Write from it still carries the process's octets.
func TestProcessShadowTrimmed(t *testing.T) {
	pm := procSelf(t)
	a, b := newPair(t, pairOpts{crc: true, chunk: 65536})
	const size = 16 << 20
	host := make([]byte, size+1)
	fill(host, 21)
	src := a.mem.regProc(t, pdA, pm, host[1:], 0)
	target := b.mem.reg(t, pdB, size, LocalWrite|RemoteWrite)
	resident := func() int {
		page := os.Getpagesize()
		start := int(uintptr(unsafe.Pointer(&src.Buf[0]))) % page
		whole := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(&src.Buf[0]), -start)), (start+len(src.Buf)+page-1)/page*page)
		vec := make([]byte, len(whole)/page)
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&whole[0])), uintptr(len(whole)),
			uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			t.Fatal(e)
		}
		n := 0
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	for round := range 2 {
		must(t, a.q.PostSend(&SendWR{ID: 1, Op: OpWrite, Flags: Signaled, SGL: []SGE{{LKey: src.STag, Addr: src.Base, Length: size}},
			RemoteSTag: target.STag, RemoteTO: target.Base}))
		newLink(a, b, 65536).pump()
		if sc := poll(a.scq); len(sc) != 1 || sc[0].Status != completion.Success {
			t.Fatalf("round %d: completions %+v", round, sc)
		}
		mustEqual(t, "written", target.Buf, host[1:])
		// The trimmer works off the datapath: given time, however busy
		// the machine.
		n := resident()
		for deadline := time.Now().Add(20 * time.Second); n > 2 && time.Now().Before(deadline); n = resident() {
			time.Sleep(10 * time.Millisecond)
		}
		if n > 2 {
			t.Fatalf("round %d: %d pages of the shadow resident after the Write, want at most 2", round, n)
		}
		fill(host, uint64(22+round))
	}
}

// A trim that comes after the region was deregistered leaves the shadow
// alone: its owner may have unmapped it, and the next mapping at the same
// address (another region's shadow, here filled at once) must keep its
// octets.
func TestProcessShadowTrimAfterDeregister(t *testing.T) {
	pm := procSelf(t)
	const size = 8 << 20
	host := make([]byte, size)
	fill(host, 31)
	va := addrOf(host)
	mapShadow := func() []byte {
		b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for round := range 20 {
		// A trimmer "runs" (none is started) until the test runs one
		// itself, once the region is gone: the trim comes late.
		for !trimming.CompareAndSwap(false, true) {
			time.Sleep(time.Millisecond)
		}
		old := &MR{Base: va, Buf: mapShadow(), Proc: pm}
		if !old.hold() {
			t.Fatal("hold")
		}
		must(t, old.fetch(old.Buf))
		old.release() // hands the shadow to the trimmer
		if err := old.Deregister(); err != nil {
			t.Fatal(err)
		}
		must(t, unix.Munmap(old.Buf))
		next := &MR{Base: va, Buf: mapShadow(), Proc: pm}
		if !next.hold() {
			t.Fatal("hold")
		}
		must(t, next.fetch(next.Buf))
		trimmer()
		if !bytes.Equal(next.Buf, host) {
			t.Fatalf("round %d: the next region's shadow lost what it fetched (%d zero octets; same address: %v)", round,
				bytes.Count(next.Buf, []byte{0}), &next.Buf[0] == &old.Buf[0])
		}
		next.release()
		must(t, next.Deregister())
		must(t, unix.Munmap(next.Buf))
	}
	runtime.KeepAlive(host)
}

// Deregister of a region whose fetch is under way is busy at once: it does
// not wait for the fetch, whose read of the process may block (a FUSE
// mapping), while its caller holds the session's lock. (The fetch is
// stood for by its hold and its share of shadowMu.)
func TestDeregisterDuringFetchIsBusy(t *testing.T) {
	m := &MR{Buf: make([]byte, 4096)}
	if !m.hold() {
		t.Fatal("hold")
	}
	m.shadowMu.RLock()
	errc := make(chan error, 1)
	go func() { errc <- m.Deregister() }()
	busyDuringFetch(t, m, errc, "a fetch")
}

// Nor when a trim holds the shadow as Deregister comes, and a fetch starts
// behind it: the fetch's read lock is let in before a waiting writer, so a
// Deregister waiting in Lock waited for the fetch's read after all.
func TestDeregisterBehindATrimAndAFetchIsBusy(t *testing.T) {
	m := &MR{Buf: make([]byte, 4096)}
	m.shadowMu.Lock() // the trim
	errc := make(chan error, 1)
	go func() { errc <- m.Deregister() }()
	time.Sleep(50 * time.Millisecond) // Deregister finds the trim
	if !m.hold() {
		t.Fatal("hold")
	}
	fetching := make(chan struct{})
	go func() {
		m.shadowMu.RLock() // the fetch, behind the trim
		close(fetching)
	}()
	time.Sleep(50 * time.Millisecond)
	m.shadowMu.Unlock() // the trim ends; the fetch reads, stalled
	<-fetching
	busyDuringFetch(t, m, errc, "a fetch that followed a trim")
}

// busyDuringFetch: the Deregister whose result errc has, made while a
// fetch (m held, shadowMu read-locked) is under way, is busy without
// waiting for the fetch; once the fetch ends, Deregister succeeds.
func busyDuringFetch(t *testing.T, m *MR, errc <-chan error, what string) {
	t.Helper()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrBusy) {
			t.Fatalf("Deregister during %s: %v, want ErrBusy", what, err)
		}
	case <-time.After(10 * time.Second):
		m.shadowMu.RUnlock()
		<-errc
		t.Fatalf("Deregister waited for %s", what)
	}
	m.shadowMu.RUnlock()
	m.release()
	if err := m.Deregister(); err != nil {
		t.Fatalf("Deregister after the fetch: %v", err)
	}
}

// Deregister waits out a trim asleep: a trim of a GiB takes about 80 ms,
// and a Deregister that spun on the lock meanwhile held a core of a
// two-core host for all of it.
func TestDeregisterWaitsOutATrimAsleep(t *testing.T) {
	m := &MR{Buf: make([]byte, 4096)}
	m.shadowMu.Lock() // the trim
	go func() {
		time.Sleep(300 * time.Millisecond)
		m.shadowMu.Unlock()
	}()
	type result struct {
		err       error
		cpu, wall time.Duration
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // the thread's own CPU time, below
		defer runtime.UnlockOSThread()
		var r0, r1 unix.Rusage
		_ = unix.Getrusage(unix.RUSAGE_THREAD, &r0)
		start := time.Now()
		err := m.Deregister()
		wall := time.Since(start)
		_ = unix.Getrusage(unix.RUSAGE_THREAD, &r1)
		cpu := time.Duration(r1.Utime.Nano() + r1.Stime.Nano() - r0.Utime.Nano() - r0.Stime.Nano())
		done <- result{err, cpu, wall}
	}()
	r := <-done
	if r.err != nil {
		t.Fatalf("Deregister after the trim: %v", r.err)
	}
	if r.wall < 200*time.Millisecond {
		t.Fatalf("Deregister returned after %v, before the trim ended", r.wall)
	}
	if r.cpu > r.wall/4 {
		t.Fatalf("Deregister used %v of CPU waiting %v for a trim", r.cpu, r.wall)
	}
}

package qp

import (
	"errors"
	"testing"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/mpa"
)

// A hostile peer: FPDUs crafted by hand, framed with the negotiated CRC, fed
// to a connected QP whose memory sits between guard pages.
type hostile struct {
	t  *testing.T
	b  *side
	fr *mpa.Framer
	rb *MR
	w  *MR // remote-writable
	r  *MR // remote-readable
}

func newHostile(t *testing.T, ird int) *hostile {
	_, b := newPair(t, pairOpts{crc: true, ird: ird, ord: ird})
	h := &hostile{t: t, b: b, fr: mpa.NewFramer(true, false)}
	h.rb = b.mem.reg(t, pdB, 64, LocalWrite)
	h.w = b.mem.reg(t, pdB, 4096, RemoteWrite)
	h.r = b.mem.reg(t, pdB, 4096, RemoteRead)
	must(t, b.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{{LKey: h.rb.STag, Addr: h.rb.Base, Length: 64}}}))
	return h
}

func (h *hostile) send(ulpdu ...[]byte) {
	for _, u := range ulpdu {
		h.b.q.Receive(h.fr.Append(nil, u, nil))
	}
}

// terminate returns what the QP sent back, parsed.
func (h *hostile) terminate() ddp.Terminate {
	var buf [4096]byte
	n := h.b.q.Transmit(buf[:])
	h.b.q.Sent(uint64(n))
	ulpdus, err := mpa.NewAssembler(true, false).Feed(buf[:n], nil)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, u := range ulpdus {
		s, err := ddp.ParseSegment(u)
		if err == nil && s.Opcode() == ddp.OpTerminate {
			if !ddp.Terminate(s.Body).IsValid() {
				h.t.Fatalf("our Terminate is malformed: %x", s.Body)
			}
			return ddp.Terminate(s.Body)
		}
	}
	h.t.Fatalf("no Terminate among %d ULPDUs", len(ulpdus))
	return nil
}

func untaggedSeg(op ddp.Opcode, qn uint32, msn ddp.MSN, mo uint32, last bool, body []byte) []byte {
	b := make([]byte, ddp.UntaggedHeaderLen, ddp.UntaggedHeaderLen+len(body))
	ddp.Untagged(b).Encode(&ddp.UntaggedFields{Last: last, Opcode: op, QN: qn, MSN: msn, MO: mo})
	return append(b, body...)
}

func taggedSeg(op ddp.Opcode, stag uint32, to uint64, body []byte) []byte {
	b := make([]byte, ddp.TaggedHeaderLen, ddp.TaggedHeaderLen+len(body))
	ddp.Tagged(b).Encode(&ddp.TaggedFields{Last: true, Opcode: op, STag: stag, TO: to})
	return append(b, body...)
}

func readReq(msn ddp.MSN, src *MR, size uint32) []byte {
	body := make([]byte, ddp.ReadRequestLen)
	ddp.ReadRequest(body).Encode(&ddp.ReadRequestFields{SinkSTag: 0x100, SinkTO: 0, Size: size, SrcSTag: src.STag, SrcTO: src.Base})
	return untaggedSeg(ddp.OpReadRequest, 1, msn, 0, true, body)
}

func TestHostilePeer(t *testing.T) {
	cases := []struct {
		name  string
		ird   int
		cause ddp.TerminateError
		segs  func(h *hostile) [][]byte
		// the terminated DDP header and Read Request go back with it
		wantDDP, wantRDMAP bool
	}{
		{"DDP version 0", 4, ddp.DDPUntaggedBadVersion, func(h *hostile) [][]byte {
			s := untaggedSeg(ddp.OpSend, 0, 1, 0, true, []byte("x"))
			s[0] &^= 3
			return [][]byte{s}
		}, true, false},
		{"DDP version 2 tagged", 4, ddp.DDPTaggedBadVersion, func(h *hostile) [][]byte {
			s := taggedSeg(ddp.OpWrite, h.w.STag, h.w.Base, []byte("x"))
			s[0] = s[0]&^3 | 2
			return [][]byte{s}
		}, true, false},
		{"RDMAP version 0", 4, ddp.RDMAPInvalidVersion, func(h *hostile) [][]byte {
			s := untaggedSeg(ddp.OpSend, 0, 1, 0, true, []byte("x"))
			s[1] &^= 0xc0
			return [][]byte{s}
		}, true, false},
		{"reserved opcode", 4, ddp.RDMAPUnexpectedOpcode, func(h *hostile) [][]byte {
			return [][]byte{untaggedSeg(ddp.Opcode(0xd), 0, 1, 0, true, nil)}
		}, true, false},
		{"Send on QN 7", 4, ddp.DDPUntaggedInvalidQN, func(h *hostile) [][]byte {
			return [][]byte{untaggedSeg(ddp.OpSend, 7, 1, 0, true, []byte("x"))}
		}, true, false},
		{"Send with MSN 5", 4, ddp.DDPUntaggedMSNRange, func(h *hostile) [][]byte {
			return [][]byte{untaggedSeg(ddp.OpSend, 0, 5, 0, true, []byte("x"))}
		}, true, false},
		{"Send with a gap in MO", 4, ddp.DDPUntaggedInvalidMO, func(h *hostile) [][]byte {
			return [][]byte{untaggedSeg(ddp.OpSend, 0, 1, 0, false, []byte("ab")), untaggedSeg(ddp.OpSend, 0, 1, 3, true, []byte("c"))}
		}, true, false},
		{"Read Requests beyond IRD", 2, ddp.RDMAPCatastrophicLocalStream, func(h *hostile) [][]byte {
			return [][]byte{readReq(1, h.r, 8), readReq(2, h.r, 8), readReq(3, h.r, 8)}
		}, true, false},
		{"Read Request with bad source", 4, ddp.RDMAPBaseOrBounds, func(h *hostile) [][]byte {
			return [][]byte{readReq(1, h.r, 4097)}
		}, true, true},
		{"Read Request not last", 4, ddp.DDPUntaggedInvalidMO, func(h *hostile) [][]byte {
			s := readReq(1, h.r, 8)
			s[0] &^= 0x40
			return [][]byte{s}
		}, true, false},
		{"Read Request too short", 4, ddp.RDMAPOperationUnspecified, func(h *hostile) [][]byte {
			s := readReq(1, h.r, 8)
			return [][]byte{s[:len(s)-1]}
		}, true, false},
		{"Read Response nobody asked for", 4, ddp.RDMAPUnexpectedOpcode, func(h *hostile) [][]byte {
			return [][]byte{taggedSeg(ddp.OpReadResponse, h.w.STag, h.w.Base, []byte("x"))}
		}, true, false},
		{"Atomic Response nobody asked for", 4, ddp.DDPUntaggedMSNRange, func(h *hostile) [][]byte {
			return [][]byte{untaggedSeg(ddp.OpAtomicResponse, 3, 1, 0, true, make([]byte, ddp.AtomicResponseLen))}
		}, true, false},
		{"misaligned atomic", 4, ddp.RDMAPCatastrophicLocalStream, func(h *hostile) [][]byte {
			body := make([]byte, ddp.AtomicRequestLen)
			ddp.AtomicRequest(body).Encode(&ddp.AtomicRequestFields{Op: ddp.AtomicFetchAdd, RemoteSTag: h.w.STag, RemoteTO: h.w.Base + 4})
			return [][]byte{untaggedSeg(ddp.OpAtomicRequest, 1, 1, 0, true, body)}
		}, true, false},
		{"ULPDU shorter than its header", 4, ddp.DDPLocalCatastrophic, func(h *hostile) [][]byte {
			return [][]byte{untaggedSeg(ddp.OpSend, 0, 1, 0, true, nil)[:10]}
		}, false, false},
		{"Write one octet past the end", 4, ddp.DDPTaggedBaseOrBounds, func(h *hostile) [][]byte {
			return [][]byte{taggedSeg(ddp.OpWrite, h.w.STag, h.w.Base+4096, []byte("x"))}
		}, true, false},
		{"Write with TO wrapping", 4, ddp.DDPTaggedTOWrap, func(h *hostile) [][]byte {
			return [][]byte{taggedSeg(ddp.OpWrite, h.w.STag, ^uint64(0), []byte("xy"))}
		}, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHostile(t, c.ird)
			h.send(c.segs(h)...)
			if h.b.q.State() != Terminate {
				t.Fatalf("state %v after the fault", h.b.q.State())
			}
			tm := h.terminate()
			if tm.Cause() != c.cause {
				t.Fatalf("Terminate cause %v, want %v", tm.Cause(), c.cause)
			}
			if tm.HasDDPHeader() != c.wantDDP || tm.HasRDMAPHeader() != c.wantRDMAP {
				t.Fatalf("headers: DDP %v RDMAP %v, want %v %v", tm.HasDDPHeader(), tm.HasRDMAPHeader(), c.wantDDP, c.wantRDMAP)
			}
			if h.b.q.State() != Error {
				t.Fatalf("state %v after the Terminate went out", h.b.q.State())
			}
			for _, x := range h.w.Buf {
				if x != 0 {
					t.Fatal("a faulty segment wrote into memory")
				}
			}
			if rc := poll(h.b.rcq); len(rc) != 1 || rc[0].Status != completion.FlushError {
				t.Fatalf("receive completions %+v", rc)
			}
			if ev := h.b.events; len(ev) != 2 || !errors.Is(ev[0].Err, c.cause) {
				t.Fatalf("events %+v", ev)
			}
		})
	}
}

// FuzzReceive feeds arbitrary octets, after a valid MPA exchange, to a QP
// with posted receives and registered regions between guard pages. It must
// never panic or write outside a region, and it ends either still running
// or having decided one Terminate.
func FuzzReceive(f *testing.F) {
	fr := mpa.NewFramer(true, false)
	w := taggedSeg(ddp.OpWrite, 0x15a, 0x10000, []byte("hello"))
	f.Add(fr.Append(nil, w, nil), false)
	f.Add(fr.Append(nil, untaggedSeg(ddp.OpSend, 0, 1, 0, true, []byte("hi")), nil), false)
	body := make([]byte, ddp.ReadRequestLen)
	ddp.ReadRequest(body).Encode(&ddp.ReadRequestFields{SinkSTag: 1, Size: 16, SrcSTag: 0x25a, SrcTO: 0x10000})
	f.Add(fr.Append(nil, untaggedSeg(ddp.OpReadRequest, 1, 1, 0, true, body), nil), false)
	f.Add([]byte{0, 4, 0x41, 0x43, 0, 0, 0, 0, 0, 0}, true)
	f.Fuzz(func(t *testing.T, data []byte, noCRC bool) {
		a, b := newPair(t, pairOpts{crc: !noCRC, ird: 2, ord: 2})
		_ = a
		rb := b.mem.reg(t, pdB, 64, LocalWrite)  // 0x15a
		_ = b.mem.reg(t, pdB, 64, RemoteRead)    // 0x25a
		_ = b.mem.reg(t, pdB, 64, RemoteAtomic)  // 0x35a
		_ = b.mem.reg(t, pdB, 64, RemoteWrite)   // 0x45a
		_ = b.mem.reg(t, pdB+1, 64, RemoteWrite) // 0x55a, other PD
		rb.Access |= RemoteWrite
		for i := 0; i < 2; i++ {
			must(t, b.q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{{LKey: rb.STag, Addr: rb.Base, Length: 32}, {LKey: rb.STag, Addr: rb.Base + 32, Length: 32}}}))
		}
		for len(data) > 0 {
			k := min(len(data), 1+int(data[0])%37)
			b.q.Receive(data[:k])
			data = data[k:]
		}
		var buf [1 << 16]byte
		n := b.q.Transmit(buf[:])
		b.q.Sent(uint64(n))
		if st := b.q.State(); st != RTS && st != Error {
			t.Fatalf("state %v after transmitting", st)
		}
	})
}

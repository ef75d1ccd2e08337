package ddp

import (
	"bytes"
	"testing"
)

// FuzzParseSegment: any bytes from a peer either parse into views that stay
// inside the input and re-encode to the same header, or give a named
// TerminateError; never a panic.
func FuzzParseSegment(f *testing.F) {
	w := make([]byte, TaggedHeaderLen+4)
	Tagged(w).Encode(&TaggedFields{Last: true, Opcode: OpWrite, STag: 0x100, TO: 8})
	f.Add(w)
	for _, op := range []Opcode{OpSend, OpReadRequest, OpTerminate, OpAtomicRequest, OpAtomicResponse, OpImmediateData} {
		info := op.Info()
		b := make([]byte, UntaggedHeaderLen+info.BodyLen+3)
		Untagged(b).Encode(&UntaggedFields{Last: true, Opcode: op, QN: info.QN, MSN: 1})
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x41})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSegment(b)
		if err != nil {
			te, ok := err.(TerminateError)
			if !ok {
				t.Fatalf("error %T is not a TerminateError", err)
			}
			_ = te.Error()
			return
		}
		h := s.Header
		if len(h)+len(s.Body)+len(s.Payload) != len(b) {
			t.Fatalf("views cover %d of %d bytes", len(h)+len(s.Body)+len(s.Payload), len(b))
		}
		// Re-encoding the decoded fields gives the same header, but for
		// the reserved bits, which receivers ignore.
		re := make([]byte, len(h))
		if h.Tagged() {
			tg := Tagged(h)
			Tagged(re).Encode(&TaggedFields{Last: h.Last(), Opcode: h.Opcode(), STag: tg.STag(), TO: tg.TO()})
		} else {
			u := Untagged(h)
			Untagged(re).Encode(&UntaggedFields{Last: h.Last(), Opcode: h.Opcode(), InvalidateSTag: u.InvalidateSTag(), QN: u.QN(), MSN: u.MSN(), MO: u.MO()})
		}
		masked := bytes.Clone(h)
		masked[0] &^= maskDDPRsvd
		masked[1] &^= maskRDMARsv
		if !bytes.Equal(re, masked) {
			t.Fatalf("re-encode:\n got %x\nwant %x", re, masked)
		}
		if s.Opcode() == OpTerminate {
			tm := Terminate(s.Body)
			if tm.IsValid() {
				_ = tm.Cause()
				_ = tm.SegmentLen()
				_ = tm.DDPHeader()
				_ = tm.RDMAPHeader()
			}
		}
	})
}

// FuzzTerminate: a Terminate body from a peer is only read after IsValid, and
// then every accessor stays in bounds and Encode of its fields reproduces it.
func FuzzTerminate(f *testing.F) {
	f.Add([]byte{0x20, 0x02, 0, 0})
	hdr := make([]byte, UntaggedHeaderLen)
	Untagged(hdr).Encode(&UntaggedFields{Opcode: OpReadRequest, QN: 1})
	ok := TerminateFields{Error: RDMAPBaseOrBounds, SegmentLenValid: true, SegmentLen: 46, DDPHeader: hdr, RDMAPHeader: make([]byte, ReadRequestLen)}
	b := make([]byte, ok.Len())
	Terminate(b).Encode(&ok)
	f.Add(b)
	f.Add(b[:10])
	f.Fuzz(func(t *testing.T, b []byte) {
		tm := Terminate(b)
		if !tm.IsValid() {
			return
		}
		fields := TerminateFields{
			Error:           tm.Cause(),
			SegmentLenValid: tm.SegmentLenValid(),
			SegmentLen:      tm.SegmentLen(),
		}
		if h := tm.DDPHeader(); h != nil {
			fields.DDPHeader = h
		}
		if r := tm.RDMAPHeader(); r != nil {
			fields.RDMAPHeader = r
		}
		out := make([]byte, fields.Len())
		Terminate(out).Encode(&fields)
		want := bytes.Clone(b[:len(out)])
		want[2] &^= termMaskReserved >> 8
		want[3] = 0
		if !tm.SegmentLenValid() && tm.HasDDPHeader() {
			want[4], want[5] = 0, 0 // not valid without M: encoded as zero
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("re-encode:\n got %x\nwant %x", out, want)
		}
	})
}

package ddp

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Vectors worked out by hand from the figures of RFC 5040 §4 and RFC 5041 §4:
// control byte T|L|Rsvd|DV, RDMAP byte RV|Rsv|Opcode, then big-endian fields.
func TestTaggedVector(t *testing.T) {
	want := unhex(t, "c1 40 12345678 0102030405060708") // T=1 L=1 DV=1; RV=1 Write
	got := make([]byte, TaggedHeaderLen)
	Tagged(got).Encode(&TaggedFields{Last: true, Opcode: OpWrite, STag: 0x12345678, TO: 0x0102030405060708})
	if !bytes.Equal(got, want) {
		t.Fatalf("encode:\n got %x\nwant %x", got, want)
	}
	h := Header(want)
	if !h.IsValid() || !h.Tagged() || !h.Last() || h.DDPVersion() != 1 || h.RDMAPVersion() != 1 || h.Opcode() != OpWrite {
		t.Fatalf("decode control: %+v", h)
	}
	tg := Tagged(want)
	if tg.STag() != 0x12345678 || tg.TO() != 0x0102030405060708 {
		t.Fatalf("decode: stag %#x to %#x", tg.STag(), tg.TO())
	}

	// Read Response, not last.
	want = unhex(t, "81 42 00000100 ffffffffffffff00")
	Tagged(got).Encode(&TaggedFields{Opcode: OpReadResponse, STag: 0x100, TO: 0xffffffffffffff00})
	if !bytes.Equal(got, want) {
		t.Fatalf("read response:\n got %x\nwant %x", got, want)
	}
}

func TestUntaggedVector(t *testing.T) {
	cases := []struct {
		f    UntaggedFields
		want string
	}{
		{UntaggedFields{Last: true, Opcode: OpSend, QN: 0, MSN: 1, MO: 0},
			"41 43 00000000 00000000 00000001 00000000"},
		{UntaggedFields{Last: false, Opcode: OpSendSEInvalidate, InvalidateSTag: 0xaabbccdd, QN: 0, MSN: 0xffffffff, MO: 1442},
			"01 46 aabbccdd 00000000 ffffffff 000005a2"},
		{UntaggedFields{Last: true, Opcode: OpReadRequest, QN: 1, MSN: 7},
			"41 41 00000000 00000001 00000007 00000000"},
		{UntaggedFields{Last: true, Opcode: OpTerminate, QN: 2, MSN: 1},
			"41 47 00000000 00000002 00000001 00000000"},
		{UntaggedFields{Last: true, Opcode: OpAtomicResponse, QN: 3, MSN: 2},
			"41 4b 00000000 00000003 00000002 00000000"},
	}
	for _, c := range cases {
		want := unhex(t, c.want)
		got := make([]byte, UntaggedHeaderLen)
		Untagged(got).Encode(&c.f)
		if !bytes.Equal(got, want) {
			t.Errorf("%v:\n got %x\nwant %x", c.f.Opcode, got, want)
			continue
		}
		u := Untagged(got)
		if !u.IsValid() || u.Header().Last() != c.f.Last || u.Header().Opcode() != c.f.Opcode ||
			u.InvalidateSTag() != c.f.InvalidateSTag || u.QN() != c.f.QN || u.MSN() != c.f.MSN || u.MO() != c.f.MO {
			t.Errorf("%v: decode mismatch", c.f.Opcode)
		}
	}
}

func TestReadRequestVector(t *testing.T) {
	f := ReadRequestFields{SinkSTag: 0x01020304, SinkTO: 0x1112131415161718, Size: 0x10000, SrcSTag: 0xa1a2a3a4, SrcTO: 0xb1b2b3b4b5b6b7b8}
	want := unhex(t, "01020304 1112131415161718 00010000 a1a2a3a4 b1b2b3b4b5b6b7b8")
	got := make([]byte, ReadRequestLen)
	ReadRequest(got).Encode(&f)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %x\nwant %x", got, want)
	}
	if !ReadRequest(got).IsValid() || ReadRequest(got).Fields() != f {
		t.Fatalf("round trip: %+v", ReadRequest(got).Fields())
	}
	if ReadRequest(got[:27]).IsValid() {
		t.Fatal("27 bytes valid")
	}
}

func TestAtomicVectors(t *testing.T) {
	f := AtomicRequestFields{Op: AtomicCmpSwap, RequestID: 9, RemoteSTag: 0x4242, RemoteTO: 0x1000,
		AddSwapData: 5, AddSwapMask: ^uint64(0), CompareData: 3, CompareMask: ^uint64(0)}
	want := unhex(t, "00000002 00000009 00004242 0000000000001000 0000000000000005 ffffffffffffffff 0000000000000003 ffffffffffffffff")
	got := make([]byte, AtomicRequestLen)
	AtomicRequest(got).Encode(&f)
	if !bytes.Equal(got, want) {
		t.Fatalf("request:\n got %x\nwant %x", got, want)
	}
	if AtomicRequest(got).Fields() != f || AtomicRequest(got).Reserved() != 0 {
		t.Fatalf("request round trip: %+v", AtomicRequest(got).Fields())
	}
	resp := make([]byte, AtomicResponseLen)
	AtomicResponse(resp).Encode(9, 0x0123456789abcdef)
	if w := unhex(t, "00000009 0123456789abcdef"); !bytes.Equal(resp, w) {
		t.Fatalf("response: got %x want %x", resp, w)
	}
	if r := AtomicResponse(resp); r.RequestID() != 9 || r.Value() != 0x0123456789abcdef {
		t.Fatal("response decode")
	}
	imm := ImmediateData(unhex(t, "0102030405060708"))
	if !imm.IsValid() || imm.Data() != [8]byte{1, 2, 3, 4, 5, 6, 7, 8} {
		t.Fatal("immediate data")
	}
}

func TestTerminateVector(t *testing.T) {
	// A DDP tagged-buffer "invalid STag" for a failed Write segment of 1000
	// bytes: Layer 1, EType 1, code 0; M and D set.
	failed := make([]byte, TaggedHeaderLen)
	Tagged(failed).Encode(&TaggedFields{Opcode: OpWrite, STag: 0xdeadbe01, TO: 64})
	f := TerminateFields{Error: DDPTaggedInvalidSTag, SegmentLenValid: true, SegmentLen: 1000, DDPHeader: failed}
	want := unhex(t, "11 00 c0 00 03e8 81 40 deadbe01 0000000000000040")
	got := make([]byte, f.Len())
	if n := Terminate(got).Encode(&f); n != len(want) {
		t.Fatalf("length %d, want %d", n, len(want))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %x\nwant %x", got, want)
	}
	tm := Terminate(got)
	if !tm.IsValid() || tm.Cause() != DDPTaggedInvalidSTag || !tm.SegmentLenValid() || tm.SegmentLen() != 1000 ||
		!bytes.Equal(tm.DDPHeader(), failed) || tm.RDMAPHeader() != nil || tm.HasRDMAPHeader() {
		t.Fatal("decode mismatch")
	}

	// RDMAP remote protection error on a Read Request: D and R, no M.
	rr := make([]byte, UntaggedHeaderLen)
	Untagged(rr).Encode(&UntaggedFields{Last: true, Opcode: OpReadRequest, QN: 1, MSN: 3})
	body := make([]byte, ReadRequestLen)
	ReadRequest(body).Encode(&ReadRequestFields{SinkSTag: 1, Size: 8, SrcSTag: 2})
	f = TerminateFields{Error: RDMAPAccessRights, DDPHeader: rr, RDMAPHeader: body}
	got = make([]byte, f.Len())
	Terminate(got).Encode(&f)
	want = append(append(unhex(t, "01 02 60 00 0000"), rr...), body...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %x\nwant %x", got, want)
	}
	tm = Terminate(got)
	if !tm.IsValid() || tm.Cause() != RDMAPAccessRights || tm.SegmentLenValid() ||
		!bytes.Equal(tm.RDMAPHeader(), body) || tm.RDMAPHeader().SrcSTag() != 2 {
		t.Fatal("decode mismatch with R")
	}

	// LLP errors carry no headers: the body is the control word alone.
	f = TerminateFields{Error: LLPCRC}
	got = make([]byte, f.Len())
	Terminate(got).Encode(&f)
	if w := unhex(t, "20 02 00 00"); !bytes.Equal(got, w) {
		t.Fatalf("LLP CRC: got %x want %x", got, w)
	}
	if Terminate(got[:3]).IsValid() {
		t.Fatal("3-byte terminate valid")
	}
	// D announced but the header is missing.
	if Terminate(unhex(t, "11 00 40 00 0000 80")).IsValid() {
		t.Fatal("truncated terminated header valid")
	}
}

func TestTerminateErrorNames(t *testing.T) {
	seen := map[TerminateError]bool{}
	for _, e := range TerminateErrors {
		if seen[e] {
			t.Errorf("%v listed twice", e)
		}
		seen[e] = true
		if strings.Contains(e.Error(), "error type") {
			t.Errorf("%+v has no name", e)
		}
		var te TerminateError
		if !errors.As(error(e), &te) || te != e {
			t.Errorf("%v not usable with errors.As", e)
		}
	}
	if len(seen) != 33 {
		t.Errorf("%d named errors, want 33 (RFC 5040: 14, RFC 5041: 12, RFC 5044+6581: 7)", len(seen))
	}
	if got := (TerminateError{LayerRDMAP, 0, 0x42}).Error(); !strings.Contains(got, "catastrophic") {
		t.Errorf("RDMAP local catastrophic with any code: %q", got)
	}
}

func TestOpcodeTable(t *testing.T) {
	for op := Opcode(0); op < 16; op++ {
		info := op.Info()
		if info.Name == "" {
			t.Errorf("opcode %d has no name", op)
		}
		if !info.Defined {
			continue
		}
		if info.Tagged != (op == OpWrite || op == OpReadResponse) {
			t.Errorf("%v: tagged %v", op, info.Tagged)
		}
	}
	if OpAtomicRequest.Info().QN != 1 || OpAtomicResponse.Info().QN != 3 || OpImmediateData.Info().QN != 0 {
		t.Error("RFC 7306 queue numbers")
	}
	if OpReadRequest.Info().HeaderLen()+OpReadRequest.Info().BodyLen != 46 {
		t.Error("Read Request segment is 46 bytes")
	}
}

func TestParseSegment(t *testing.T) {
	send := make([]byte, UntaggedHeaderLen+5)
	Untagged(send).Encode(&UntaggedFields{Last: true, Opcode: OpSend, MSN: 1})
	copy(send[UntaggedHeaderLen:], "hello")
	s, err := ParseSegment(send)
	if err != nil || string(s.Payload) != "hello" || s.Opcode() != OpSend || s.Body != nil {
		t.Fatalf("send: %+v %v", s, err)
	}

	mod := func(f func(b []byte)) []byte {
		b := bytes.Clone(send)
		f(b)
		return b
	}
	rr := make([]byte, UntaggedHeaderLen+ReadRequestLen)
	Untagged(rr).Encode(&UntaggedFields{Last: true, Opcode: OpReadRequest, QN: 1, MSN: 1})
	if s, err := ParseSegment(rr); err != nil || len(s.Body) != ReadRequestLen {
		t.Fatalf("read request: %v", err)
	}
	cases := []struct {
		name string
		b    []byte
		want TerminateError
	}{
		{"short", send[:10], DDPLocalCatastrophic},
		{"ddp version 0 untagged", mod(func(b []byte) { b[0] &^= 3 }), DDPUntaggedBadVersion},
		{"ddp version 2 tagged", func() []byte {
			b := make([]byte, TaggedHeaderLen)
			Tagged(b).Encode(&TaggedFields{Opcode: OpWrite})
			b[0] = b[0]&^3 | 2
			return b
		}(), DDPTaggedBadVersion},
		{"rdmap version 0", mod(func(b []byte) { b[1] &^= 0xc0 }), RDMAPInvalidVersion},
		{"reserved opcode", mod(func(b []byte) { b[1] = b[1]&0xf0 | 0xc }), RDMAPUnexpectedOpcode},
		{"write opcode untagged", mod(func(b []byte) { b[1] = b[1]&0xf0 | byte(OpWrite) }), RDMAPUnexpectedOpcode},
		{"send on QN 7", mod(func(b []byte) { b[9] = 7 }), DDPUntaggedInvalidQN},
		{"read request too short", rr[:len(rr)-1], RDMAPOperationUnspecified},
		{"read request too long", append(bytes.Clone(rr), 0), RDMAPOperationUnspecified},
	}
	for _, c := range cases {
		_, err := ParseSegment(c.b)
		var te TerminateError
		if !errors.As(err, &te) || te != c.want {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

func TestMSNWraps(t *testing.T) {
	if !MSN(0xffffffff).LessThan(0) || MSN(0).LessThan(0xffffffff) || MSN(5).LessThan(5) {
		t.Error("LessThan across the wrap")
	}
	if !MSN(1).InWindow(0xfffffffe, 4) || MSN(2).InWindow(0xfffffffe, 4) {
		t.Error("InWindow across the wrap")
	}
}

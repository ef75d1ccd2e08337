package sdp

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

// The encodings against octets written out by hand from Annex A4's
// layout, and back.
func TestWire(t *testing.T) {
	h := BSDH{MID: MIDData, Flags: FlagOOBPending, Bufs: 0x1234, Len: 20, MSeq: 0x01020304, MSeqAck: 0x0a0b0c0d}
	b := make([]byte, 20)
	h.Put(b)
	want := []byte{0xff, 0x02, 0x12, 0x34, 0, 0, 0, 20, 1, 2, 3, 4, 0x0a, 0x0b, 0x0c, 0x0d}
	if !bytes.Equal(b[:16], want) {
		t.Fatalf("BSDH % x, want % x", b[:16], want)
	}
	if got, err := ParseBSDH(b); err != nil || got != h {
		t.Fatalf("ParseBSDH: %+v %v", got, err)
	}

	hello := Hello{BSDH: BSDH{Bufs: 16}, Version: Version, IPVersion: 4, MaxAdverts: 1, DesRemRcvSz: 65536, LocalRcvSz: 32768,
		LocalPort: 7000, Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2")}
	hb := hello.Marshal()
	if len(hb) != 92 || hb[0] != 0 || hb[16] != 0x22 || hb[17] != 0x40 || hb[19] != 1 ||
		!bytes.Equal(hb[20:24], []byte{0, 1, 0, 0}) || !bytes.Equal(hb[24:28], []byte{0, 0, 0x80, 0}) ||
		!bytes.Equal(hb[28:30], []byte{0x1b, 0x58}) || !bytes.Equal(hb[44:48], []byte{192, 0, 2, 1}) ||
		!bytes.Equal(hb[60:64], []byte{192, 0, 2, 2}) {
		t.Fatalf("Hello % x", hb)
	}
	got, err := ParseHello(append(hb, 0, 0)) // padded private data
	hello.MID, hello.Len = MIDHello, HelloLen
	if err != nil || got != hello {
		t.Fatalf("ParseHello: %+v %v, want %+v", got, err, hello)
	}
	ack := HelloAck{BSDH: BSDH{Bufs: 16}, Version: Version, MaxAdverts: 1, ActRcvSz: 65536}
	ab := ack.Marshal()
	if len(ab) != 196 || ab[0] != 1 || !bytes.Equal(ab[20:24], []byte{0, 1, 0, 0}) {
		t.Fatalf("HelloAck % x", ab[:24])
	}
	gotAck, err := ParseHelloAck(ab)
	ack.MID, ack.Len = MIDHelloAck, HelloAckLen
	if err != nil || gotAck != ack {
		t.Fatalf("ParseHelloAck: %+v %v", gotAck, err)
	}

	var x [16]byte
	SrcAvail{Len: 1 << 20, STag: 0x11223344, VA: 0x1000}.Put(x[:])
	msg := append(make([]byte, 16), x[:]...)
	if sa := ParseSrcAvail(msg); sa != (SrcAvail{Len: 1 << 20, STag: 0x11223344, VA: 0x1000}) {
		t.Fatalf("SrcAvail %+v", sa)
	}

	sink := make([]byte, 16+20)
	copy(sink[16:], []byte{0, 0, 0x10, 0, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 1})
	if sa := ParseSinkAvail(sink); sa != (SinkAvail{Len: 4096, STag: 0xaabbccdd, VA: 0x2000, NonDisc: 1}) {
		t.Fatalf("SinkAvail %+v", sa)
	}
	if n := ParseLen(append(make([]byte, 16), 0, 0, 1, 0)); n != 256 {
		t.Fatalf("RdmaRdCompl's length %d", n)
	}

	for name, bad := range map[string][]byte{
		"short":           b[:15],
		"Len lies":        append(append([]byte{}, b...), 0),
		"unknown MID":     func() []byte { c := append([]byte{}, b...); c[0] = 0x42; return c }(),
		"SrcAvail header": func() []byte { c := make([]byte, 20); BSDH{MID: MIDSrcAvail, Len: 20}.Put(c); return c }(),
	} {
		if _, err := ParseBSDH(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := ParseHello(ab); err == nil {
		t.Error("a HelloAck parsed as a Hello")
	}
}

// Whatever the octets, parsing returns an error or a header that says the
// message's own length.
func FuzzParseBSDH(f *testing.F) {
	f.Add((&Hello{}).Marshal())
	f.Add((&HelloAck{}).Marshal())
	f.Add([]byte{0xff, 0, 0, 16, 0, 0, 0, 16, 0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseBSDH(b)
		if err == nil && int(h.Len) != len(b) {
			t.Fatalf("Len %d of %d octets accepted", h.Len, len(b))
		}
		if hello, err := ParseHello(b); err == nil && hello.MID != MIDHello {
			t.Fatalf("a %v parsed as a Hello", hello.MID)
		}
		_, _ = ParseHelloAck(b)
	})
}

func TestPolicy(t *testing.T) {
	p := &Policy{Allow: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		Deny: []netip.Prefix{netip.MustParsePrefix("192.0.2.9/32")}, Ports: []uint16{7000}}
	for ap, want := range map[string]bool{
		"192.0.2.1:7000":    true,
		"192.0.2.9:7000":    false, // denied
		"198.51.100.1:7000": false, // not allowed
		"192.0.2.1:7001":    false, // not a port offloaded
	} {
		if got := p.Offload(netip.MustParseAddrPort(ap)); got != want {
			t.Errorf("%s: %v, want %v", ap, got, want)
		}
	}
	var none *Policy
	if !none.Offload(netip.MustParseAddrPort("203.0.113.1:1")) {
		t.Error("no policy refused")
	}
}

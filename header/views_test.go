package header

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
)

// unhex decodes a hex dump, ignoring spaces and newlines.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEthernetRoundTrip(t *testing.T) {
	f := EthernetFields{
		Dst:  [6]byte{0x02, 0xfc, 0, 0, 0, 1},
		Src:  [6]byte{0x66, 0xf4, 0x5d, 0x0a, 0x26, 0x15},
		Type: EtherTypeIPv6,
	}
	b := make([]byte, EthernetLen+2)
	e := Ethernet(b)
	e.Encode(&f)
	if want := unhex(t, "02fc00000001 66f45d0a2615 86dd 0000"); !bytes.Equal(b, want) {
		t.Fatalf("encoded % x, want % x", b, want)
	}
	if !e.IsValid() || e.Dst() != f.Dst || e.Src() != f.Src || e.Type() != f.Type || len(e.Payload()) != 2 {
		t.Fatalf("decoded %x %x %#x", e.Dst(), e.Src(), e.Type())
	}
	if Ethernet(b[:EthernetLen-1]).IsValid() {
		t.Error("13-octet frame is valid")
	}
}

func TestIPv4Vector(t *testing.T) {
	// The header of a UDP datagram with checksum 0xb861, the worked example
	// of Wikipedia's "Internet checksum" article.
	b := unhex(t, "4500 0073 0000 4000 4011 b861 c0a8 0001 c0a8 00c7")
	b = append(b, make([]byte, 0x73-20)...)
	ip := IPv4(b)
	if !ip.IsValid(len(b)) || !ip.IsChecksumValid() {
		t.Fatalf("valid %v checksum valid %v", ip.IsValid(len(b)), ip.IsChecksumValid())
	}
	var got [IPv4MinLen]byte
	IPv4(got[:]).Encode(&IPv4Fields{
		TotalLen: 0x73, DontFragment: true, TTL: 64, Protocol: 17,
		Src: netip.MustParseAddr("192.168.0.1"), Dst: netip.MustParseAddr("192.168.0.199"),
	})
	if !bytes.Equal(got[:], b[:IPv4MinLen]) {
		t.Fatalf("Encode % x\nwant      % x", got, b[:IPv4MinLen])
	}
}

func TestIPv4RoundTrip(t *testing.T) {
	f := IPv4Fields{
		TOS: 0x02, TotalLen: 28, ID: 0xbeef, DontFragment: true, TTL: 17, Protocol: IPProtocolTCP,
		Src: netip.MustParseAddr("10.1.2.3"), Dst: netip.MustParseAddr("10.255.0.9"),
	}
	b := make([]byte, 60) // 28 of datagram, 32 of padding
	ip := IPv4(b)
	ip.Encode(&f)
	copy(b[20:], "payload!")
	if !ip.IsValid(len(b)) || !ip.IsChecksumValid() {
		t.Fatal("encoded header not valid")
	}
	got := IPv4Fields{ip.TOS(), uint16(ip.TotalLen()), ip.ID(), ip.DontFragment(), ip.TTL(), ip.Protocol(), ip.Src(), ip.Dst()}
	if got != f {
		t.Fatalf("decoded %+v, want %+v", got, f)
	}
	if ip.Version() != 4 || ip.HeaderLen() != 20 || len(ip.Options()) != 0 || string(ip.Payload()) != "payload!" ||
		ip.MoreFragments() || ip.FragmentOffset() != 0 || ip.IsFragment() {
		t.Fatalf("version %d hl %d payload %q", ip.Version(), ip.HeaderLen(), ip.Payload())
	}
	// A change to a field breaks the checksum until SetChecksum.
	b[8]--
	if ip.IsChecksumValid() {
		t.Fatal("checksum valid after TTL change")
	}
	ip.SetChecksum()
	if !ip.IsChecksumValid() {
		t.Fatal("SetChecksum")
	}
	// Fragment fields: MF and offset 185*8.
	b[6], b[7] = 0x20, 0xb9
	if !ip.MoreFragments() || ip.DontFragment() || ip.FragmentOffset() != 1480 || !ip.IsFragment() {
		t.Fatalf("MF %v DF %v offset %d", ip.MoreFragments(), ip.DontFragment(), ip.FragmentOffset())
	}
}

func TestIPv4IsValid(t *testing.T) {
	good := func() []byte {
		b := make([]byte, 40)
		IPv4(b).Encode(&IPv4Fields{TotalLen: 40, Protocol: IPProtocolTCP,
			Src: netip.MustParseAddr("1.2.3.4"), Dst: netip.MustParseAddr("5.6.7.8")})
		return b
	}
	for _, tc := range []struct {
		name string
		edit func([]byte) []byte
		n    int // octets received; 0 means len(b)
		ok   bool
	}{
		{"good", func(b []byte) []byte { return b }, 0, true},
		{"padded", func(b []byte) []byte { return append(b, 0, 0, 0) }, 0, true},
		{"short", func(b []byte) []byte { return b[:19] }, 0, false},
		{"version 6", func(b []byte) []byte { b[0] = 0x65; return b }, 0, false},
		{"IHL 4", func(b []byte) []byte { b[0] = 0x44; return b }, 0, false},
		{"IHL 6", func(b []byte) []byte { b[0] = 0x46; return b }, 0, true},
		{"IHL past total", func(b []byte) []byte { b[0] = 0x4f; return b }, 0, false},
		{"total below header", func(b []byte) []byte { b[3] = 19; return b }, 0, false},
		{"total past received", func(b []byte) []byte { return b }, 39, false},
		{"total past slice", func(b []byte) []byte { return b[:39] }, 40, false},
	} {
		b := tc.edit(good())
		n := tc.n
		if n == 0 {
			n = len(b)
		}
		if got := IPv4(b).IsValid(n); got != tc.ok {
			t.Errorf("%s: IsValid = %v, want %v", tc.name, got, tc.ok)
		}
	}
}

func TestIPv6RoundTrip(t *testing.T) {
	f := IPv6Fields{
		TrafficClass: 0xb8, FlowLabel: 0xabcde, PayloadLen: 4, NextHeader: IPProtocolTCP, HopLimit: 255,
		Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("fe80::2"),
	}
	b := make([]byte, IPv6Len+6)
	ip := IPv6(b)
	ip.Encode(&f)
	copy(b[IPv6Len:], "abcdef")
	want := unhex(t, `6b8abcde 0004 06 ff
		20010db8000000000000000000000001 fe800000000000000000000000000002 616263646566`)
	if !bytes.Equal(b, want) {
		t.Fatalf("encoded % x\nwant    % x", b, want)
	}
	got := IPv6Fields{ip.TrafficClass(), ip.FlowLabel(), uint16(ip.PayloadLen()), ip.NextHeader(), ip.HopLimit(), ip.Src(), ip.Dst()}
	if !ip.IsValid(len(b)) || got != f || string(ip.Payload()) != "abcd" {
		t.Fatalf("decoded %+v payload %q", got, ip.Payload())
	}
	if ip.IsValid(IPv6Len+3) || IPv6(b[:IPv6Len+3]).IsValid(len(b)) || IPv6(b[:39]).IsValid(39) {
		t.Error("truncated packet valid")
	}
	b[0] = 0x4b
	if ip.IsValid(len(b)) {
		t.Error("version 4 valid as IPv6")
	}
}

func TestTCPRoundTrip(t *testing.T) {
	f := TCPFields{
		SrcPort: 33410, DstPort: 9, Seq: 0xfffffff0, Ack: 0x01020304,
		Flags: TCPFlagACK | TCPFlagPSH | TCPFlagURG, Window: 502, Urgent: 3, OptionsLen: 12,
	}
	b := make([]byte, TCPMinLen+12+5)
	seg := TCP(b)
	seg.Encode(&f)
	o := TCPOptions{HasTimestamp: true, TSVal: 7, TSEcr: 8}
	if n := EncodeTCPOptions(seg[TCPMinLen:], &o); n != f.OptionsLen {
		t.Fatalf("options length %d", n)
	}
	copy(b[TCPMinLen+12:], "hello")
	src, dst := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	seg.SetChecksum(src, dst)
	if !seg.IsValid(len(b)) || !seg.IsChecksumValid(src, dst) {
		t.Fatal("encoded segment not valid")
	}
	got := TCPFields{seg.SrcPort(), seg.DstPort(), seg.Seq(), seg.Ack(), seg.Flags(), seg.Window(),
		seg.UrgentPointer(), seg.DataOffset() - TCPMinLen}
	if got != f {
		t.Fatalf("decoded %+v, want %+v", got, f)
	}
	var po TCPOptions
	if !ParseTCPOptions(seg.Options(), &po) || po != o || string(seg.Payload()) != "hello" {
		t.Fatalf("options %+v payload %q", po, seg.Payload())
	}
	if seg.IsChecksumValid(src, netip.MustParseAddr("192.0.2.3")) {
		t.Error("checksum valid with another destination")
	}
	b[len(b)-1] ^= 1
	if seg.IsChecksumValid(src, dst) {
		t.Error("checksum valid with a payload bit flipped")
	}
	// The same segment over IPv6.
	src6, dst6 := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	seg.SetChecksum(src6, dst6)
	if !seg.IsChecksumValid(src6, dst6) {
		t.Error("IPv6 checksum")
	}
}

func TestTCPIsValid(t *testing.T) {
	b := make([]byte, 32)
	TCP(b).Encode(&TCPFields{OptionsLen: 12})
	if !TCP(b).IsValid(32) || TCP(b).IsValid(31) || TCP(b[:31]).IsValid(32) || TCP(b[:19]).IsValid(19) {
		t.Error("data offset 32")
	}
	b[12] = 4 << 4
	if TCP(b).IsValid(32) {
		t.Error("data offset 16 valid")
	}
}

func TestTCPEncodePanicsOnBadOptionsLen(t *testing.T) {
	for _, n := range []int{-4, 2, 44} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("OptionsLen %d: no panic", n)
				}
			}()
			TCP(make([]byte, 64)).Encode(&TCPFields{OptionsLen: n})
		}()
	}
}

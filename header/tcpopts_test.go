package header

import (
	"bytes"
	"net/netip"
	"testing"
)

// linuxSYNOptions is the option list of a SYN from Linux 6.18 on loopback
// (tcp_options_write): MSS 65495, SACK-permitted packed before timestamps
// (TSval 2089268761, TSecr 0), NOP, window scale 10.
const linuxSYNOptions = "0204ffd7 0402080a 7c87b619 00000000 0103030a"

func TestParseLinuxSYNOptions(t *testing.T) {
	var o TCPOptions
	if !ParseTCPOptions(unhex(t, linuxSYNOptions), &o) {
		t.Fatal("Linux SYN options malformed")
	}
	want := TCPOptions{MSS: 65495, HasMSS: true, WindowScale: 10, HasWindowScale: true,
		SACKPermitted: true, HasTimestamp: true, TSVal: 2089268761}
	if o != want {
		t.Fatalf("parsed %+v\nwant   %+v", o, want)
	}
}

func TestEncodeTCPOptionsLayout(t *testing.T) {
	blocks := [MaxSACKBlocks]SACKBlock{{1, 2}, {3, 4}, {5, 6}, {7, 8}}
	for _, tc := range []struct {
		name string
		o    TCPOptions
		want string
	}{
		{"none", TCPOptions{}, ""},
		{"Linux SYN", TCPOptions{MSS: 65495, HasMSS: true, WindowScale: 10, HasWindowScale: true,
			SACKPermitted: true, HasTimestamp: true, TSVal: 2089268761}, linuxSYNOptions},
		{"SYN without SACK", TCPOptions{MSS: 1460, HasMSS: true, WindowScale: 7, HasWindowScale: true,
			HasTimestamp: true, TSVal: 1, TSEcr: 2}, "020405b4 0101080a 00000001 00000002 01030307"},
		{"SYN without timestamps", TCPOptions{MSS: 1460, HasMSS: true, WindowScale: 7, HasWindowScale: true,
			SACKPermitted: true}, "020405b4 01010402 01030307"},
		{"MSS only", TCPOptions{MSS: 536, HasMSS: true}, "02040218"},
		{"timestamps", TCPOptions{HasTimestamp: true, TSVal: 0x01020304, TSEcr: 0xa0b0c0d0},
			"0101080a 01020304 a0b0c0d0"},
		{"timestamps and 3 of 4 blocks", TCPOptions{HasTimestamp: true, TSVal: 9, TSEcr: 10, SACK: blocks, NumSACK: 4},
			"0101080a 00000009 0000000a 0101051a 00000001 00000002 00000003 00000004 00000005 00000006"},
		{"4 blocks", TCPOptions{SACK: blocks, NumSACK: 4},
			"01010522 00000001 00000002 00000003 00000004 00000005 00000006 00000007 00000008"},
		{"1 block", TCPOptions{SACK: blocks, NumSACK: 1}, "0101050a 00000001 00000002"},
		{"every option, 2 blocks fit", TCPOptions{MSS: 1460, HasMSS: true, WindowScale: 7, HasWindowScale: true,
			SACKPermitted: true, HasTimestamp: true, TSVal: 1, SACK: blocks, NumSACK: 4},
			"020405b4 0402080a 00000001 00000000 01030307 01010512 00000001 00000002 00000003 00000004"},
		{"negative NumSACK", TCPOptions{SACK: blocks, NumSACK: -1}, ""},
	} {
		want := unhex(t, tc.want)
		if n := TCPOptionsLen(&tc.o); n != len(want) {
			t.Errorf("%s: TCPOptionsLen = %d, want %d", tc.name, n, len(want))
		}
		buf := bytes.Repeat([]byte{0xee}, TCPMaxOptionsLen)
		n := EncodeTCPOptions(buf, &tc.o)
		if !bytes.Equal(buf[:n], want) {
			t.Errorf("%s: wrote % x\nwant  % x", tc.name, buf[:n], want)
		}
		if n%4 != 0 || !bytes.Equal(buf[n:], bytes.Repeat([]byte{0xee}, TCPMaxOptionsLen-n)) {
			t.Errorf("%s: wrote %d octets or past them", tc.name, n)
		}
	}
}

func TestParseTCPOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		ok   bool
		want TCPOptions
	}{
		{"empty", "", true, TCPOptions{}},
		{"NOPs", "01010101", true, TCPOptions{}},
		{"EOL ends the list", "00 0204", true, TCPOptions{}},
		{"option then EOL padding", "020405b4 03030e00", true, TCPOptions{MSS: 1460, HasMSS: true, WindowScale: 14, HasWindowScale: true}},
		{"window scale above 14", "030315", true, TCPOptions{WindowScale: 14, HasWindowScale: true}},
		{"unknown kind skipped", "1e0401020204ffff", true, TCPOptions{MSS: 0xffff, HasMSS: true}},
		{"unknown kind of length 2", "fe02 0402", true, TCPOptions{SACKPermitted: true}},
		{"later copy wins", "02040100 02040200", true, TCPOptions{MSS: 0x200, HasMSS: true}},
		{"SACK 2 blocks", "0101 0512 00000001 00000002 00000003 00000004", true,
			TCPOptions{SACK: [4]SACKBlock{{1, 2}, {3, 4}}, NumSACK: 2}},

		{"length 0", "0200", false, TCPOptions{}},
		{"length 1", "1e01", false, TCPOptions{}},
		{"unknown kind length 0", "0101fe00", false, TCPOptions{}},
		{"no length octet", "02", false, TCPOptions{}},
		{"no length octet after NOP", "0101 08", false, TCPOptions{}},
		{"overrun", "020405", false, TCPOptions{}},
		{"unknown kind overrun", "1e0a0000", false, TCPOptions{}},
		{"MSS length 3", "020305", false, TCPOptions{}},
		{"MSS length 6", "02060000ffff", false, TCPOptions{}},
		{"window scale length 4", "03040700", false, TCPOptions{}},
		{"SACK-permitted length 3", "040300", false, TCPOptions{}},
		{"timestamps length 8", "0808 00000001 0000", false, TCPOptions{}},
		{"SACK without blocks", "0502", false, TCPOptions{}},
		{"SACK half block", "0506 00000001", false, TCPOptions{}},
		{"SACK 5 blocks", "052a" + "0000000100000002" + "0000000100000002" + "0000000100000002" +
			"0000000100000002" + "0000000100000002", false, TCPOptions{}},
	} {
		var o TCPOptions
		ok := ParseTCPOptions(unhex(t, tc.in), &o)
		if ok != tc.ok {
			t.Errorf("%s: ok = %v, want %v", tc.name, ok, tc.ok)
		}
		if ok && o != tc.want {
			t.Errorf("%s: parsed %+v\nwant %+v", tc.name, o, tc.want)
		}
	}
	// A reused TCPOptions is cleared first.
	o := TCPOptions{HasMSS: true, NumSACK: 3}
	if !ParseTCPOptions(nil, &o) || o != (TCPOptions{}) {
		t.Errorf("not cleared: %+v", o)
	}
}

// wantAfterRoundTrip is what ParseTCPOptions gives back for the list
// EncodeTCPOptions writes for o: only what was present, the shift capped at
// 14, the SACK blocks that fit.
func wantAfterRoundTrip(o *TCPOptions) TCPOptions {
	var w TCPOptions
	if o.HasMSS {
		w.MSS, w.HasMSS = o.MSS, true
	}
	if o.HasWindowScale {
		w.WindowScale, w.HasWindowScale = min(o.WindowScale, MaxWindowScale), true
	}
	w.SACKPermitted = o.SACKPermitted
	if o.HasTimestamp {
		w.HasTimestamp, w.TSVal, w.TSEcr = true, o.TSVal, o.TSEcr
	}
	_, w.NumSACK = tcpOptionsLayout(o)
	copy(w.SACK[:], o.SACK[:w.NumSACK])
	return w
}

func TestTCPOptionsRoundTrip(t *testing.T) {
	for mask := range 1 << 6 {
		for numSACK := range MaxSACKBlocks + 1 {
			o := TCPOptions{
				MSS: 8960, HasMSS: mask&1 != 0, WindowScale: 9, HasWindowScale: mask&2 != 0,
				SACKPermitted: mask&4 != 0, HasTimestamp: mask&8 != 0, TSVal: 0xdeadbeef, TSEcr: 0x12345678,
				SACK:    [4]SACKBlock{{10, 20}, {30, 40}, {0xfffffff0, 0x10}, {50, 60}},
				NumSACK: numSACK,
			}
			var buf [TCPMaxOptionsLen]byte
			n := EncodeTCPOptions(buf[:], &o)
			var got TCPOptions
			if !ParseTCPOptions(buf[:n], &got) {
				t.Fatalf("%+v: encoded % x does not parse", o, buf[:n])
			}
			if want := wantAfterRoundTrip(&o); got != want {
				t.Fatalf("parsed %+v\nwant   %+v", got, want)
			}
		}
	}
}

func TestNoAllocs(t *testing.T) {
	o := TCPOptions{MSS: 1460, HasMSS: true, WindowScale: 7, HasWindowScale: true, SACKPermitted: true,
		HasTimestamp: true, TSVal: 1, SACK: [4]SACKBlock{{1, 2}}, NumSACK: 1}
	var opts [TCPMaxOptionsLen]byte
	var p TCPOptions
	frame := make([]byte, EthernetLen+IPv6Len+TCPMinLen+TCPMaxOptionsLen+100)
	src4, dst4 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	src6, dst6 := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	allocs := testing.AllocsPerRun(100, func() {
		n := EncodeTCPOptions(opts[:], &o)
		ParseTCPOptions(opts[:n], &p)

		e := Ethernet(frame)
		e.Encode(&EthernetFields{Type: EtherTypeIPv4})
		ip4 := IPv4(e.Payload())
		ip4.Encode(&IPv4Fields{TotalLen: uint16(len(ip4)), TTL: 64, Protocol: IPProtocolTCP, Src: src4, Dst: dst4})
		seg := TCP(ip4.Payload())
		seg.Encode(&TCPFields{Flags: TCPFlagACK, OptionsLen: n})
		seg.SetChecksum(ip4.Src(), ip4.Dst())
		if !e.IsValid() || !ip4.IsValid(len(ip4)) || !ip4.IsChecksumValid() ||
			!seg.IsValid(len(seg)) || !seg.IsChecksumValid(ip4.Src(), ip4.Dst()) {
			t.Fatal("IPv4 frame not valid")
		}

		ip6 := IPv6(e.Payload())
		ip6.Encode(&IPv6Fields{PayloadLen: uint16(len(ip6) - IPv6Len), NextHeader: IPProtocolTCP, Src: src6, Dst: dst6})
		seg = TCP(ip6.Payload())
		seg.Encode(&TCPFields{Flags: TCPFlagACK})
		seg.SetChecksum(ip6.Src(), ip6.Dst())
		if !ip6.IsValid(len(ip6)) || !seg.IsChecksumValid(ip6.Src(), ip6.Dst()) {
			t.Fatal("IPv6 frame not valid")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per encode and parse", allocs)
	}
}

func BenchmarkParseTCPOptions(b *testing.B) {
	for _, bc := range []struct {
		name string
		o    TCPOptions
	}{
		{"SYN", TCPOptions{MSS: 1460, HasMSS: true, WindowScale: 7, HasWindowScale: true, SACKPermitted: true,
			HasTimestamp: true, TSVal: 1}},
		{"TS+3SACK", TCPOptions{HasTimestamp: true, TSVal: 1, TSEcr: 2,
			SACK: [4]SACKBlock{{1, 2}, {3, 4}, {5, 6}}, NumSACK: 3}},
	} {
		var buf [TCPMaxOptionsLen]byte
		n := EncodeTCPOptions(buf[:], &bc.o)
		b.Run(bc.name, func(b *testing.B) {
			var o TCPOptions
			for b.Loop() {
				if !ParseTCPOptions(buf[:n], &o) {
					b.Fatal("malformed")
				}
			}
		})
	}
}

func BenchmarkEncodeTCPOptions(b *testing.B) {
	o := TCPOptions{HasTimestamp: true, TSVal: 1, TSEcr: 2, SACK: [4]SACKBlock{{1, 2}, {3, 4}}, NumSACK: 2}
	var buf [TCPMaxOptionsLen]byte
	for b.Loop() {
		EncodeTCPOptions(buf[:], &o)
	}
}

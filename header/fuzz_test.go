package header

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// FuzzParseTCPOptions feeds arbitrary option lists to the parser, which must
// not panic, and turns the same bytes into a TCPOptions for the encoder,
// whose output must parse back to the values it was given.
func FuzzParseTCPOptions(f *testing.F) {
	f.Add(unhex(f, linuxSYNOptions))
	f.Add(unhex(f, "0101080a 00000009 0000000a 0101051a 00000001 00000002 00000003 00000004 00000005 00000006"))
	f.Add(unhex(f, "020405b4 01010402 01030307"))
	f.Add([]byte{0x02, 0x00})
	f.Add([]byte{0x1e, 0x01})
	f.Add([]byte{0x05, 0xff, 0x00})
	f.Add(make([]byte, 48))
	f.Fuzz(func(t *testing.T, b []byte) {
		var o TCPOptions
		ParseTCPOptions(b, &o)

		// The same bytes as values to encode.
		var buf [48]byte
		copy(buf[:], b)
		flags := buf[0]
		in := TCPOptions{
			MSS: binary.BigEndian.Uint16(buf[1:]), HasMSS: flags&1 != 0,
			WindowScale: buf[3], HasWindowScale: flags&2 != 0,
			SACKPermitted: flags&4 != 0,
			HasTimestamp:  flags&8 != 0, TSVal: binary.BigEndian.Uint32(buf[4:]), TSEcr: binary.BigEndian.Uint32(buf[8:]),
			NumSACK: int(int8(buf[12])),
		}
		for i := range in.SACK {
			in.SACK[i] = SACKBlock{binary.BigEndian.Uint32(buf[16+8*i:]), binary.BigEndian.Uint32(buf[20+8*i:])}
		}
		var enc [TCPMaxOptionsLen]byte
		n := EncodeTCPOptions(enc[:], &in)
		if n != TCPOptionsLen(&in) || n%4 != 0 || n > TCPMaxOptionsLen {
			t.Fatalf("EncodeTCPOptions wrote %d octets, TCPOptionsLen says %d", n, TCPOptionsLen(&in))
		}
		var out TCPOptions
		if !ParseTCPOptions(enc[:n], &out) {
			t.Fatalf("encoded % x does not parse", enc[:n])
		}
		if want := wantAfterRoundTrip(&in); out != want {
			t.Fatalf("round trip of %+v\ngave %+v\nwant %+v", in, out, want)
		}
	})
}

// FuzzTCPIPv4 runs the views over arbitrary bytes as an Ethernet frame: once
// IsValid has said yes, no accessor may panic.
func FuzzTCPIPv4(f *testing.F) {
	f.Add(unhex(f, linuxSYNFrame))
	f.Add(unhex(f, linuxRSTFrame))
	f.Add(unhex(f, "000000000000 000000000000 0800 4f00 0014"))
	f.Add(unhex(f, "000000000000 000000000000 86dd 6000000000140640"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e := Ethernet(b)
		if !e.IsValid() {
			return
		}
		_, _, _ = e.Dst(), e.Src(), e.Type()
		var src, dst netip.Addr
		var l4 []byte
		if ip := IPv6(e.Payload()); ip.IsValid(len(ip)) {
			_, _, _, _ = ip.TrafficClass(), ip.FlowLabel(), ip.NextHeader(), ip.HopLimit()
			src, dst, l4 = ip.Src(), ip.Dst(), ip.Payload()
		} else if ip := IPv4(e.Payload()); ip.IsValid(len(ip)) {
			_, _, _, _, _ = ip.Version(), ip.TOS(), ip.ID(), ip.TTL(), ip.Protocol()
			_, _, _, _ = ip.DontFragment(), ip.MoreFragments(), ip.FragmentOffset(), ip.IsFragment()
			_, _, _ = ip.Checksum(), ip.IsChecksumValid(), ip.Options()
			src, dst, l4 = ip.Src(), ip.Dst(), ip.Payload()
			if len(l4) != ip.TotalLen()-ip.HeaderLen() {
				t.Fatalf("payload of %d octets, total %d, header %d", len(l4), ip.TotalLen(), ip.HeaderLen())
			}
		} else {
			return
		}
		seg := TCP(l4)
		if !seg.IsValid(len(seg)) {
			return
		}
		_, _, _, _, _ = seg.SrcPort(), seg.DstPort(), seg.Seq(), seg.Ack(), seg.Flags()
		_, _, _ = seg.Window(), seg.Checksum(), seg.UrgentPointer()
		if len(seg.Options())+len(seg.Payload())+TCPMinLen != len(seg) {
			t.Fatalf("options %d + payload %d of a %d-octet segment", len(seg.Options()), len(seg.Payload()), len(seg))
		}
		var o TCPOptions
		ParseTCPOptions(seg.Options(), &o)
		if seg.IsChecksumValid(src, dst) {
			seg.SetChecksum(src, dst)
			if !seg.IsChecksumValid(src, dst) {
				t.Fatal("SetChecksum broke a valid checksum")
			}
		}
	})
}

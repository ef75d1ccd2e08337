package header

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/testenv"
)

// linuxSYNFrame is a SYN that Linux 6.18 sent on loopback (captured with
// tcpdump: 127.0.0.1:33410 to port 9). Loopback leaves the TCP checksum to
// "hardware", so the capture held only the pseudo-header sum, 0xfe30; the
// full checksum, 0x760e, is the one tcpdump computed. That it equals the IP
// header checksum is a coincidence of these addresses and lengths.
const linuxSYNFrame = `
	000000000000 000000000000 0800
	4500 003c c6ab 4000 4006 760e 7f000001 7f000001
	8282 0009 17f10cd3 00000000 a002 ffd7 760e 0000
	0204ffd7 0402080a 7c87b619 00000000 0103030a`

// linuxRSTFrame is the reset Linux answered it with, checksums as captured.
const linuxRSTFrame = `
	000000000000 000000000000 0800
	4500 0028 0000 4000 4006 3cce 7f000001 7f000001
	0009 8282 00000000 17f10cd4 5014 0000 0a7e 0000`

var linuxSYNAddr = netip.MustParseAddr("127.0.0.1")

// testSegment is one TCP segment in an Ethernet frame, for building frames
// with the encoders under test.
type testSegment struct {
	srcMAC   [6]byte
	dstMAC   [6]byte
	src, dst netip.Addr
	ipID     uint16
	tcp      TCPFields
	opts     TCPOptions
	payload  []byte
}

// frame encodes s: Ethernet, IPv4 (DF, TTL 64) or IPv6
// (hop limit 64) after the family of s.src, TCP with options and payload,
// and both checksums.
func (s *testSegment) frame() []byte {
	f := s.tcp
	f.OptionsLen = TCPOptionsLen(&s.opts)
	tcpLen := TCPMinLen + f.OptionsLen + len(s.payload)
	ipLen, etherType := IPv6Len, uint16(EtherTypeIPv6)
	if s.src.Is4() {
		ipLen, etherType = IPv4MinLen, EtherTypeIPv4
	}
	b := make([]byte, EthernetLen+ipLen+tcpLen)
	Ethernet(b).Encode(&EthernetFields{Dst: s.dstMAC, Src: s.srcMAC, Type: etherType})
	if s.src.Is4() {
		IPv4(b[EthernetLen:]).Encode(&IPv4Fields{TotalLen: uint16(ipLen + tcpLen), ID: s.ipID,
			DontFragment: true, TTL: 64, Protocol: IPProtocolTCP, Src: s.src, Dst: s.dst})
	} else {
		IPv6(b[EthernetLen:]).Encode(&IPv6Fields{PayloadLen: uint16(tcpLen), NextHeader: IPProtocolTCP,
			HopLimit: 64, Src: s.src, Dst: s.dst})
	}
	t := TCP(b[EthernetLen+ipLen:])
	t.Encode(&f)
	EncodeTCPOptions(t[TCPMinLen:], &s.opts)
	copy(t[TCPMinLen+f.OptionsLen:], s.payload)
	t.SetChecksum(s.src, s.dst)
	return b
}

var linuxSYN = testSegment{
	src: linuxSYNAddr, dst: linuxSYNAddr, ipID: 0xc6ab,
	tcp: TCPFields{SrcPort: 33410, DstPort: 9, Seq: 0x17f10cd3, Flags: TCPFlagSYN, Window: 65495},
	opts: TCPOptions{MSS: 65495, HasMSS: true, SACKPermitted: true, HasTimestamp: true, TSVal: 2089268761,
		WindowScale: 10, HasWindowScale: true},
}

var linuxRST = testSegment{
	src: linuxSYNAddr, dst: linuxSYNAddr,
	tcp: TCPFields{SrcPort: 9, DstPort: 33410, Ack: 0x17f10cd4, Flags: TCPFlagRST | TCPFlagACK},
}

func TestEncodeLinuxFrames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		seg   *testSegment
		frame string
	}{
		{"SYN", &linuxSYN, linuxSYNFrame},
		{"RST", &linuxRST, linuxRSTFrame},
	} {
		want := unhex(t, tc.frame)
		if got := tc.seg.frame(); !bytes.Equal(got, want) {
			t.Errorf("%s: encoded\n% x\nwant\n% x", tc.name, got, want)
		}
	}
}

func TestDecodeLinuxSYN(t *testing.T) {
	b := unhex(t, linuxSYNFrame)
	e := Ethernet(b)
	if !e.IsValid() || e.Type() != EtherTypeIPv4 {
		t.Fatalf("Ethernet type %#x", e.Type())
	}
	ip := IPv4(e.Payload())
	if !ip.IsValid(len(ip)) || !ip.IsChecksumValid() {
		t.Fatal("IPv4 header not valid")
	}
	if ip.TotalLen() != 60 || ip.ID() != 0xc6ab || !ip.DontFragment() || ip.IsFragment() || ip.TTL() != 64 ||
		ip.Protocol() != IPProtocolTCP || ip.Src() != linuxSYNAddr || ip.Dst() != linuxSYNAddr {
		t.Fatalf("IPv4 fields: len %d id %#x ttl %d proto %d %v > %v",
			ip.TotalLen(), ip.ID(), ip.TTL(), ip.Protocol(), ip.Src(), ip.Dst())
	}
	seg := TCP(ip.Payload())
	if !seg.IsValid(len(seg)) || !seg.IsChecksumValid(ip.Src(), ip.Dst()) {
		t.Fatal("TCP segment not valid")
	}
	got := TCPFields{seg.SrcPort(), seg.DstPort(), seg.Seq(), seg.Ack(), seg.Flags(), seg.Window(),
		seg.UrgentPointer(), len(seg.Options())}
	want := linuxSYN.tcp
	want.OptionsLen = 20
	if got != want || len(seg.Payload()) != 0 || seg.Checksum() != 0x760e {
		t.Fatalf("TCP fields %+v, want %+v", got, want)
	}
	var o TCPOptions
	if !ParseTCPOptions(seg.Options(), &o) || o != linuxSYN.opts {
		t.Fatalf("options %+v, want %+v", o, linuxSYN.opts)
	}
	// The checksum loopback left in the capture is the pseudo-header sum.
	if ps := PseudoHeaderChecksum(IPProtocolTCP, ip.Src(), ip.Dst(), uint16(len(seg))); ps != 0xfe30 {
		t.Errorf("pseudo-header sum %#04x, want 0xfe30", ps)
	}
}

// writePcap writes frames as a classic pcap file of Ethernet frames
// (microsecond timestamps, one per frame).
func writePcap(t *testing.T, path string, frames [][]byte) {
	t.Helper()
	b := binary.LittleEndian.AppendUint32(nil, 0xa1b2c3d4) // magic
	b = binary.LittleEndian.AppendUint16(b, 2)             // version 2.4
	b = binary.LittleEndian.AppendUint16(b, 4)
	b = binary.LittleEndian.AppendUint64(b, 0)      // thiszone, sigfigs
	b = binary.LittleEndian.AppendUint32(b, 262144) // snaplen
	b = binary.LittleEndian.AppendUint32(b, 1)      // LINKTYPE_ETHERNET
	for i, f := range frames {
		b = binary.LittleEndian.AppendUint32(b, 1)         // seconds
		b = binary.LittleEndian.AppendUint32(b, uint32(i)) // microseconds
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestTSharkDecodesEncodedFrames has Wireshark's dissectors, an independent
// implementation, verify the checksums of frames built by the encoders and
// read back the option values they were given.
func TestTSharkDecodesEncodedFrames(t *testing.T) {
	tshark := testenv.RequireTool(t, "tshark")
	a4, b4 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.2")
	a6, b6 := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8:ffff::2")
	sack := [MaxSACKBlocks]SACKBlock{{1001, 2001}, {3001, 4001}, {5001, 6001}, {7001, 8001}}
	segs := []testSegment{
		linuxSYN,
		{src: b4, dst: a4, ipID: 1, tcp: TCPFields{SrcPort: 4791, DstPort: 40000, Seq: 77, Ack: 0x17f10cd4,
			Flags: TCPFlagSYN | TCPFlagACK, Window: 65160},
			opts: TCPOptions{MSS: 1460, HasMSS: true, SACKPermitted: true, HasTimestamp: true,
				TSVal: 123456, TSEcr: 2089268761, WindowScale: 7, HasWindowScale: true}},
		// Timestamps leave room for 3 of the 4 blocks; an odd-length payload.
		{src: a4, dst: b4, ipID: 2, tcp: TCPFields{SrcPort: 40000, DstPort: 4791, Seq: 0xfffffffe, Ack: 1001,
			Flags: TCPFlagACK | TCPFlagPSH, Window: 502},
			opts:    TCPOptions{HasTimestamp: true, TSVal: 0xfffffff0, TSEcr: 7, SACK: sack, NumSACK: 4},
			payload: []byte("hello")},
		{src: a4, dst: b4, ipID: 3, tcp: TCPFields{SrcPort: 40000, DstPort: 4791, Seq: 3, Ack: 1001,
			Flags: TCPFlagACK, Window: 1},
			opts: TCPOptions{SACK: sack, NumSACK: 4}, payload: []byte{0xff}},
		{src: a6, dst: b6, tcp: TCPFields{SrcPort: 50000, DstPort: 4791, Seq: 1, Flags: TCPFlagSYN, Window: 64800},
			opts: TCPOptions{MSS: 1440, HasMSS: true, SACKPermitted: true, WindowScale: 14, HasWindowScale: true}},
	}
	var frames [][]byte
	for i := range segs {
		frames = append(frames, segs[i].frame())
	}
	// A control: the Linux SYN with its TCP checksum off by one.
	bad := segs[0].frame()
	bad[EthernetLen+IPv4MinLen+tcpChecksum]++
	frames = append(frames, bad)
	path := filepath.Join(t.TempDir(), "frames.pcap")
	writePcap(t, path, frames)

	fields := []string{"tcp.checksum.status", "ip.checksum.status", "tcp.seq_raw", "tcp.ack_raw", "tcp.len",
		"tcp.options.mss_val", "tcp.options.sack_perm", "tcp.options.wscale.shift",
		"tcp.options.timestamp.tsval", "tcp.options.timestamp.tsecr", "tcp.options.sack_le", "tcp.options.sack_re"}
	args := []string{"-r", path, "-n", "-o", "tcp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE",
		"-o", "tcp.relative_sequence_numbers:FALSE", "-o", "tcp.analyze_sequence_numbers:FALSE",
		"-T", "fields", "-E", "separator=|", "-E", "occurrence=a", "-E", "aggregator=,"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(tshark, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.Bytes())
	}
	want := []string{
		// Status 1 is a good checksum; sack_perm shows the option's octets.
		"1|1|401673427|0|0|65495|0402|10|2089268761|0||",
		"1|1|77|401673428|0|1460|0402|7|123456|2089268761||",
		"1|1|4294967294|1001|5||||4294967280|7|1001,3001,5001|2001,4001,6001",
		"1|1|3|1001|1||||||1001,3001,5001,7001|2001,4001,6001,8001",
		"1||1|0|0|1440|0402|14||||",
		"0|1|401673427|0|0|65495|0402|10|2089268761|0||",
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(got) != len(want) {
		t.Fatalf("tshark printed %d lines, want %d:\n%s", len(got), len(want), out)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("frame %d: tshark says\n%s\nwant\n%s", i+1, got[i], want[i])
		}
	}
	t.Logf("tshark fields %v:\n%s", fields, out)
}

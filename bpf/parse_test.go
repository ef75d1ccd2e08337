package bpf

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/softrnic/softrnic/internal/testenv"
)

// Frames for the parser, built field by field. Checksums stay zero: the
// program does not read them.

var (
	local  = netip.MustParseAddrPort("192.0.2.2:4791")
	remote = netip.MustParseAddrPort("192.0.2.1:50000")
)

const (
	flagSYN = 0x02
	flagACK = 0x10
)

// ether returns an Ethernet header with the given EtherTypes: all but the
// last are VLAN TPIDs, each followed by a TCI.
func ether(types ...uint16) []byte {
	b := make([]byte, 12, 64) // destination, source
	for i, t := range types {
		b = binary.BigEndian.AppendUint16(b, t)
		if i < len(types)-1 {
			b = binary.BigEndian.AppendUint16(b, 100) // TCI: VLAN 100
		}
	}
	return b
}

// ipv4 returns an IPv4 header from remote to local with optLen bytes of
// options (a multiple of 4), protocol proto and the flags/fragment word frag.
func ipv4(optLen int, proto byte, frag uint16) []byte {
	b := make([]byte, 20+optLen)
	b[0] = 0x40 | byte((20+optLen)/4)
	b[8] = 64
	b[9] = proto
	binary.BigEndian.PutUint16(b[6:], frag)
	ra, la := remote.Addr().As4(), local.Addr().As4()
	copy(b[12:], ra[:])
	copy(b[16:], la[:])
	for i := 20; i < len(b); i++ {
		b[i] = 1 // NOP options
	}
	return b
}

// tcp returns a TCP header from remote to local with the given flags.
func tcp(flags byte) []byte {
	b := make([]byte, 20)
	binary.BigEndian.PutUint16(b[0:], remote.Port())
	binary.BigEndian.PutUint16(b[2:], local.Port())
	b[12] = 5 << 4
	b[13] = flags
	return b
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	// The kernel's test run wants at least an Ethernet header; pad short
	// frames as a NIC would, without changing what the headers say.
	for len(b) < 60 {
		b = append(b, 0)
	}
	return b
}

// TestParse runs the program on crafted frames (BPF_PROG_TEST_RUN, no
// interface) and checks which counter each one lands in. With no socket in
// the map every frame must come back XDP_PASS.
func TestParse(t *testing.T) {
	testenv.RequireRoot(t)
	s, err := load(0, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.AddListen(local.Port()); err != nil {
		t.Fatal(err)
	}
	other := netip.AddrPortFrom(remote.Addr(), 50001)
	if err := s.AddFlow(Flow{Local: local, Remote: other}); err != nil {
		t.Fatal(err)
	}

	const (
		ipProto   = 0x0800
		ipv6Proto = 0x86DD
		arpProto  = 0x0806
		dot1Q     = 0x8100
		dot1AD    = 0x88A8
		tcpProto  = 6
		udpProto  = 17
		df        = 0x4000
		mf        = 0x2000
	)
	flowSeg := tcp(flagACK)
	binary.BigEndian.PutUint16(flowSeg[0:], other.Port())

	// truncated IPv4 header: 19 bytes, and the frame is padded with zeros
	// after it — so build it on a frame exactly the minimum length.
	shortIP := append(ether(ipProto), ipv4(0, tcpProto, df)[:19]...)

	badVersion := ipv4(0, tcpProto, df)
	badVersion[0] = 0x65
	shortIHL := ipv4(0, tcpProto, df)
	shortIHL[0] = 0x44

	cases := []struct {
		name  string
		frame []byte
		want  func(*Stats) *uint64
	}{
		{"arp", cat(ether(arpProto), make([]byte, 28)), func(s *Stats) *uint64 { return &s.PassedNotIP }},
		{"ipv6", cat(ether(ipv6Proto), make([]byte, 40)), func(s *Stats) *uint64 { return &s.PassedNotIP }},
		{"udp", cat(ether(ipProto), ipv4(0, udpProto, df), make([]byte, 8)), func(s *Stats) *uint64 { return &s.PassedNotTCP }},
		{"syn-listen", cat(ether(ipProto), ipv4(0, tcpProto, df), tcp(flagSYN)), func(s *Stats) *uint64 { return &s.SteeredListen }},
		{"synack-listen", cat(ether(ipProto), ipv4(0, tcpProto, df), tcp(flagSYN|flagACK)), func(s *Stats) *uint64 { return &s.PassedNoMatch }},
		{"ack-listen", cat(ether(ipProto), ipv4(0, tcpProto, df), tcp(flagACK)), func(s *Stats) *uint64 { return &s.PassedNoMatch }},
		{"flow", cat(ether(ipProto), ipv4(0, tcpProto, df), flowSeg), func(s *Stats) *uint64 { return &s.SteeredFlow }},
		{"ip-options", cat(ether(ipProto), ipv4(12, tcpProto, df), tcp(flagSYN)), func(s *Stats) *uint64 { return &s.SteeredListen }},
		{"max-ip-options", cat(ether(ipProto), ipv4(40, tcpProto, df), tcp(flagSYN)), func(s *Stats) *uint64 { return &s.SteeredListen }},
		{"vlan", cat(ether(dot1Q, ipProto), ipv4(0, tcpProto, df), tcp(flagSYN)), func(s *Stats) *uint64 { return &s.SteeredListen }},
		{"qinq", cat(ether(dot1AD, dot1Q, ipProto), ipv4(0, tcpProto, df), flowSeg), func(s *Stats) *uint64 { return &s.SteeredFlow }},
		{"three-tags", cat(ether(dot1AD, dot1Q, dot1Q, ipProto), ipv4(0, tcpProto, df), tcp(flagSYN)), func(s *Stats) *uint64 { return &s.PassedNotIP }},
		{"first-fragment", cat(ether(ipProto), ipv4(0, tcpProto, mf), tcp(flagSYN)), func(s *Stats) *uint64 { return &s.PassedFragment }},
		{"later-fragment", cat(ether(ipProto), ipv4(0, tcpProto, 185), tcp(flagSYN)), func(s *Stats) *uint64 { return &s.PassedFragment }},
		{"short-ip", shortIP, func(s *Stats) *uint64 { return &s.PassedMalformed }},
		{"short-vlan", ether(dot1Q, ipProto)[:16], func(s *Stats) *uint64 { return &s.PassedMalformed }},
		{"ip-version", cat(ether(ipProto), badVersion, tcp(flagSYN)), func(s *Stats) *uint64 { return &s.PassedMalformed }},
		{"ihl-below-5", cat(ether(ipProto), shortIHL, tcp(flagSYN)), func(s *Stats) *uint64 { return &s.PassedMalformed }},
		{"short-tcp", append(ether(ipProto), append(ipv4(40, tcpProto, df), tcp(flagSYN)[:19]...)...), func(s *Stats) *uint64 { return &s.PassedMalformed }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := stats(t, s)
			ret, err := s.objs.XdpSteer.Run(&ebpf.RunOptions{Data: c.frame})
			if err != nil {
				t.Fatalf("test run on %d bytes: %v", len(c.frame), err)
			}
			if ret != 2 { // XDP_PASS: no socket to redirect to
				t.Errorf("returned %d, want XDP_PASS (2)", ret)
			}
			got := sub(stats(t, s), before)
			var want Stats
			*c.want(&want) = 1
			if want.SteeredFlow+want.SteeredListen > 0 {
				want.RedirectFailed = 1
			}
			if got != want {
				t.Errorf("counters moved %+v, want %+v", got, want)
			}
		})
	}
}

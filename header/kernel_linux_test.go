//go:build linux

package header

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/topology"
)

// The tests in this file hold the views up against the running kernel, in
// two network namespaces joined by a veth pair with transmit offloads off, so
// every checksum the kernel writes is complete. They need root.

// packetSocket is a packet socket (packet(7)) on the veth end of one host:
// it sees every frame the host sends and receives there, and sends frames as
// they are written.
type packetSocket struct {
	fd int
}

func openPacketSocket(t *testing.T, h topology.Host) *packetSocket {
	t.Helper()
	ethPAll := htons(unix.ETH_P_ALL)
	p := &packetSocket{fd: -1}
	err := h.Do(func() error {
		ifc, err := net.InterfaceByName(h.Link)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(ethPAll))
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		p.fd = fd
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: ethPAll, Ifindex: ifc.Index}); err != nil {
			return err
		}
		tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	if p.fd >= 0 {
		t.Cleanup(func() { unix.Close(p.fd) })
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// next returns the next TCP over IPv4 frame, in either direction, for which
// keep returns true, or fails the test after two seconds.
func (p *packetSocket) next(t *testing.T, what string, keep func(ip IPv4, seg TCP, out bool) bool) []byte {
	t.Helper()
	buf := make([]byte, 1<<16)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		n, from, err := unix.Recvfrom(p.fd, buf, 0)
		if err != nil {
			continue // receive timeout
		}
		f := Ethernet(buf[:n])
		if !f.IsValid() || f.Type() != EtherTypeIPv4 {
			continue
		}
		ip := IPv4(f.Payload())
		if !ip.IsValid(len(ip)) || ip.Protocol() != IPProtocolTCP {
			continue
		}
		seg := TCP(ip.Payload())
		out := from.(*unix.SockaddrLinklayer).Pkttype == unix.PACKET_OUTGOING
		if seg.IsValid(len(seg)) && keep(ip, seg, out) {
			return bytes.Clone(f)
		}
	}
	t.Fatalf("no %s captured", what)
	return nil
}

func (p *packetSocket) send(t *testing.T, frame []byte) {
	t.Helper()
	if _, err := unix.Write(p.fd, frame); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// decodeFrame checks a captured frame with the views and returns its TCP
// segment and options.
func decodeFrame(t *testing.T, f []byte) (IPv4, TCP, TCPOptions) {
	t.Helper()
	ip := IPv4(Ethernet(f).Payload())
	seg := TCP(ip.Payload())
	var o TCPOptions
	switch {
	case !ip.IsChecksumValid():
		t.Errorf("IPv4 checksum of\n% x", f)
	case !seg.IsChecksumValid(ip.Src(), ip.Dst()):
		t.Errorf("TCP checksum of\n% x", f)
	case !ParseTCPOptions(seg.Options(), &o):
		t.Errorf("malformed options % x", seg.Options())
	}
	return ip, seg, o
}

// rebuild encodes again, with the encoders, the frame the views decode from
// f, and checks that every octet is the kernel's.
func rebuild(t *testing.T, f []byte) {
	t.Helper()
	e := Ethernet(f)
	ip, seg, o := decodeFrame(t, f)
	if len(ip.Options()) != 0 || ip.IsFragment() {
		t.Fatalf("IP options or fragment in\n% x", f)
	}
	s := testSegment{
		srcMAC: e.Src(), dstMAC: e.Dst(), src: ip.Src(), dst: ip.Dst(), ipID: ip.ID(),
		tcp: TCPFields{SrcPort: seg.SrcPort(), DstPort: seg.DstPort(), Seq: seg.Seq(), Ack: seg.Ack(),
			Flags: seg.Flags(), Window: seg.Window(), Urgent: seg.UrgentPointer()},
		opts: o, payload: seg.Payload(),
	}
	if ip.TOS() != 0 || !ip.DontFragment() || ip.TTL() != 64 {
		t.Fatalf("TOS %#x DF %v TTL %d: testSegment cannot rebuild them", ip.TOS(), ip.DontFragment(), ip.TTL())
	}
	if g := s.frame(); !bytes.Equal(g, f) {
		t.Errorf("rebuilt\n% x\nkernel sent\n% x", g, f)
	}
	t.Logf("flags %#02x options % x", seg.Flags(), seg.Options())
}

// sysctl sets TCP sysctls in a host's namespace.
func sysctl(t *testing.T, h topology.Host, kv ...string) {
	t.Helper()
	if out, err := h.Command("sysctl", append([]string{"-qw"}, kv...)...).CombinedOutput(); err != nil {
		t.Fatalf("sysctl %v: %v: %s", kv, err, out)
	}
}

func listen(t *testing.T, h topology.Host) *net.TCPListener {
	t.Helper()
	ln, err := h.ListenTCP(netip.AddrPortFrom(h.Addr.Addr(), 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// TestKernelSegmentLayout captures the SYN, SYN-ACK and a data segment of a
// kernel connection under each combination of the option sysctls, decodes
// them with the views and rebuilds them with the encoders: every octet must
// match, so the option layout EncodeTCPOptions shares with Linux is checked
// against the running kernel.
func TestKernelSegmentLayout(t *testing.T) {
	p := topology.NewTest(t, topology.Options{})
	ps := openPacketSocket(t, p.A)
	for _, v := range []struct{ ts, sack, ws bool }{
		{true, true, true}, {false, true, true}, {true, false, true}, {false, false, false},
	} {
		t.Run(fmt.Sprintf("ts=%v,sack=%v,ws=%v", v.ts, v.sack, v.ws), func(t *testing.T) {
			b := func(on bool) string { return map[bool]string{false: "0", true: "1"}[on] }
			for _, h := range []topology.Host{p.A, p.B} {
				sysctl(t, h, "net.ipv4.tcp_timestamps="+b(v.ts), "net.ipv4.tcp_sack="+b(v.sack),
					"net.ipv4.tcp_window_scaling="+b(v.ws))
			}
			ln := listen(t, p.B)
			port := uint16(ln.Addr().(*net.TCPAddr).Port)
			c, err := p.A.DialTCP(ln.Addr().(*net.TCPAddr).AddrPort(), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("iWARP")); err != nil {
				t.Fatal(err)
			}
			for _, w := range []struct {
				name  string
				flags uint8
				out   bool
			}{
				{"SYN", TCPFlagSYN, true},
				{"SYN-ACK", TCPFlagSYN | TCPFlagACK, false},
				{"data", TCPFlagPSH | TCPFlagACK, true},
			} {
				f := ps.next(t, w.name, func(ip IPv4, seg TCP, out bool) bool {
					return out == w.out && seg.Flags() == w.flags && (seg.DstPort() == port || seg.SrcPort() == port)
				})
				rebuild(t, f)
				_, _, o := decodeFrame(t, f)
				syn := w.flags&TCPFlagSYN != 0
				if o.HasTimestamp != v.ts || o.HasMSS != syn || o.SACKPermitted != (syn && v.sack) ||
					o.HasWindowScale != (syn && v.ws) || o.NumSACK != 0 {
					t.Errorf("%s options %+v", w.name, o)
				}
			}
		})
	}
}

// TestKernelAcceptsEncodedSegments speaks TCP to a kernel listener from a
// packet socket with segments the encoders build, for an address the other
// host does not own: the kernel must drop a segment with a bad checksum,
// complete the handshake with good ones, and answer out-of-order data with
// SACK blocks the parser reads and the encoder writes again octet for octet.
func TestKernelAcceptsEncodedSegments(t *testing.T) {
	p := topology.NewTest(t, topology.Options{})
	// Have B check checksums in software, whatever veth claims for them.
	if out, err := p.B.Command("ethtool", "-K", p.B.Link, "rx", "off").CombinedOutput(); err != nil {
		t.Fatalf("ethtool: %v: %s", err, out)
	}
	for _, h := range []topology.Host{p.A, p.B} {
		sysctl(t, h, "net.ipv4.tcp_timestamps=1", "net.ipv4.tcp_sack=1", "net.ipv4.tcp_window_scaling=1")
	}
	macA, macB := linkMAC(t, p.A), linkMAC(t, p.B)
	ghost := netip.MustParseAddr("192.0.2.3") // answered by our packet socket in A
	if out, err := run(p.B, "ip", "neigh", "replace", ghost.String(), "lladdr", net.HardwareAddr(macA[:]).String(),
		"dev", p.B.Link, "nud", "permanent"); err != nil {
		t.Fatalf("ip neigh: %v: %s", err, out)
	}
	ps := openPacketSocket(t, p.A)
	ln := listen(t, p.B)
	srv := p.B.Addr.Addr()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	const ourPort = 40000
	iss := uint32(0xfffffff0) // the sequence space wraps during the test
	seg := func(seq, ack uint32, flags uint8, o TCPOptions, payload []byte) []byte {
		s := testSegment{srcMAC: macA, dstMAC: macB, src: ghost, dst: srv,
			tcp:  TCPFields{SrcPort: ourPort, DstPort: port, Seq: seq, Ack: ack, Flags: flags, Window: 65535},
			opts: o, payload: payload}
		return s.frame()
	}
	fromServer := func(what string, flags uint8) []byte {
		return ps.next(t, what, func(ip IPv4, s TCP, out bool) bool {
			return !out && ip.Dst() == ghost && s.DstPort() == ourPort && s.Flags() == flags
		})
	}

	synOpts := TCPOptions{MSS: 1460, HasMSS: true, SACKPermitted: true, HasTimestamp: true, TSVal: 1000,
		WindowScale: 7, HasWindowScale: true}
	bad := seg(iss, 0, TCPFlagSYN, synOpts, nil)
	bad[len(bad)-1] ^= 0x80 // the last octet of the options: window scale 10 becomes 138
	before := tcpInCsumErrors(t, p.B)
	ps.send(t, bad)
	for deadline := time.Now().Add(2 * time.Second); tcpInCsumErrors(t, p.B) == before; {
		if time.Now().After(deadline) {
			t.Fatal("kernel did not count the SYN with a bad checksum in TcpInCsumErrors")
		}
		time.Sleep(10 * time.Millisecond)
	}

	ps.send(t, seg(iss, 0, TCPFlagSYN, synOpts, nil))
	f := fromServer("SYN-ACK", TCPFlagSYN|TCPFlagACK)
	rebuild(t, f)
	_, synAck, o := decodeFrame(t, f)
	if synAck.Ack() != iss+1 || !o.HasMSS || !o.SACKPermitted || !o.HasWindowScale || !o.HasTimestamp ||
		o.TSEcr != synOpts.TSVal {
		t.Fatalf("SYN-ACK ack %#x options %+v", synAck.Ack(), o)
	}
	rcvNxt, peerTS := synAck.Seq()+1, o.TSVal
	ts := func(val uint32) TCPOptions { return TCPOptions{HasTimestamp: true, TSVal: val, TSEcr: peerTS} }
	ps.send(t, seg(iss+1, rcvNxt, TCPFlagACK, ts(1001), nil))
	_ = ln.SetDeadline(time.Now().Add(2 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("kernel did not complete the handshake: %v", err)
	}
	defer c.Close()

	// Two out-of-order segments, 100 octets each, leaving holes at iss+1
	// and iss+201: each is answered at once with a duplicate ACK whose SACK
	// blocks list the most recent first (RFC 2018 §4).
	data := bytes.Repeat([]byte{0xa5}, 100)
	for i, want := range [][]SACKBlock{
		{{iss + 101, iss + 201}},
		{{iss + 301, iss + 401}, {iss + 101, iss + 201}},
	} {
		ps.send(t, seg(iss+101+uint32(i)*200, rcvNxt, TCPFlagACK|TCPFlagPSH, ts(1002+uint32(i)), data))
		f := fromServer("duplicate ACK", TCPFlagACK)
		rebuild(t, f)
		_, a, o := decodeFrame(t, f)
		if a.Ack() != iss+1 || !o.HasTimestamp || !slices.Equal(o.SACK[:o.NumSACK], want) {
			t.Fatalf("ACK %#x options %+v, want SACK %v", a.Ack(), o, want)
		}
	}
}

func linkMAC(t *testing.T, h topology.Host) [6]byte {
	t.Helper()
	ifc, err := h.Interface()
	if err != nil {
		t.Fatal(err)
	}
	return [6]byte(ifc.HardwareAddr)
}

func run(h topology.Host, name string, args ...string) ([]byte, error) {
	return h.Command(name, args...).CombinedOutput()
}

// tcpInCsumErrors reads the TCP InCsumErrors counter of a host's namespace
// from /proc/net/snmp: a "Tcp:" line of names, then one of values.
func tcpInCsumErrors(t *testing.T, h topology.Host) int {
	t.Helper()
	out, err := run(h, "cat", "/proc/net/snmp")
	if err != nil {
		t.Fatalf("/proc/net/snmp: %v: %s", err, out)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "InCsumErrors" && i < len(f) {
				v, err := strconv.Atoi(f[i])
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
		}
	}
	t.Fatalf("no Tcp InCsumErrors in\n%s", out)
	return 0
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

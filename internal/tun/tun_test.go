package tun_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/internal/tun"
)

// The tests below prove the plumbing of topology.TunPeer with real kernel
// traffic and no TCP engine: the test itself plays the engine, reading
// packets from the TUN device and writing hand-built answers.

// TestPingThroughTun: a kernel ping from Peer reaches the Device as ICMP echo
// requests, and hand-made replies written to it reach ping.
func TestPingThroughTun(t *testing.T) {
	tp := topology.NewTunPeer(t, topology.TunPeerOptions{})
	testenv.RequireTool(t, "ping")

	p := startPing(t, tp.Peer, tp.EngineAddr)
	n := answerPings(t, tp, p.done)
	<-p.done
	if p.err != nil {
		t.Fatalf("ping: %v\n%s", p.err, p.out.String())
	}
	if n != 3 {
		t.Errorf("answered %d echo requests, want 3", n)
	}
	if !strings.Contains(p.out.String(), " 3 received") {
		t.Errorf("ping did not get 3 replies:\n%s", p.out.String())
	}
	checkCloses(t, tp)
}

// TestKernelTCPSynRefused: a kernel TCP client in Peer sends its SYN into the
// Device; a hand-built RST|ACK written back makes connect fail with
// ECONNREFUSED.
func TestKernelTCPSynRefused(t *testing.T) {
	tp := topology.NewTunPeer(t, topology.TunPeerOptions{})
	const port = 7000

	dialed := make(chan error, 1)
	go func() {
		c, err := tp.Peer.DialTCP(netip.AddrPortFrom(tp.EngineAddr, port), 10*time.Second)
		if err == nil {
			c.Close()
			err = errors.New("connected")
		}
		dialed <- err
	}()

	buf := make([]byte, 2048)
	var syn []byte
	deadline := time.Now().Add(10 * time.Second)
	if err := tp.Dev.SetReadDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	for i := 0; syn == nil; i++ {
		if i == 100 {
			t.Fatal("100 packets and no SYN")
		}
		n, err := tp.Dev.ReadPacket(buf)
		if err != nil {
			t.Fatalf("waiting for the SYN: %v", err)
		}
		pkt := buf[:n]
		// Only the port here: a SYN with a bad data offset must fail below,
		// not be skipped, so IsValid comes after.
		if ip, ok := parseIPv4(t, pkt); ok && ip.proto == header.IPProtocolTCP &&
			len(ip.payload) >= header.TCPMinLen && header.TCP(ip.payload).DstPort() == port {
			syn = pkt
		}
	}

	ip, _ := parseIPv4(t, syn)
	if ip.src != tp.PeerAddr || ip.dst != tp.EngineAddr {
		t.Errorf("SYN %v -> %v, want %v -> %v", ip.src, ip.dst, tp.PeerAddr, tp.EngineAddr)
	}
	seg := header.TCP(ip.payload)
	if !seg.IsValid(len(seg)) {
		t.Fatalf("TCP data offset %d in a %d-byte segment", seg.DataOffset(), len(seg))
	}
	if flags := seg.Flags(); flags != header.TCPFlagSYN {
		t.Errorf("TCP flags %#02x, want SYN only", flags)
	}
	if n := len(seg.Payload()); n != 0 {
		t.Errorf("SYN carries %d bytes of data", n)
	}
	if !seg.IsChecksumValid(ip.src, ip.dst) {
		t.Errorf("TCP checksum does not verify (field %#04x)", seg.Checksum())
	}

	// RFC 9293 §3.10.7.1: a segment without ACK to a CLOSED port is
	// answered <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>; the SYN counts 1.
	rstAck := header.TCP(make([]byte, header.TCPMinLen))
	rstAck.Encode(&header.TCPFields{
		SrcPort: seg.DstPort(), // the one dialed
		DstPort: seg.SrcPort(), // the client's
		Ack:     seg.Seq() + 1,
		Flags:   header.TCPFlagRST | header.TCPFlagACK,
	})
	rstAck.SetChecksum(ip.dst, ip.src)
	if err := tp.Dev.WritePacket(buildIPv4(ip.dst, ip.src, header.IPProtocolTCP, rstAck)); err != nil {
		t.Fatal(err)
	}

	select {
	case err := <-dialed:
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial: %v, want connection refused", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("dial did not return within 15 s")
	}
	checkCloses(t, tp)
}

// non-blocking.
func TestCloseUnblocksRead(t *testing.T) {
	tp := topology.NewTunPeer(t, topology.TunPeerOptions{MTU: 9000, TxQueueLen: 64})
	dev := tp.Dev

	out, err := tp.Engine.Command("ip", "link", "show", dev.Name()).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show: %v: %s", err, out)
	}
	for _, want := range []string{"mtu 9000", "qlen 64", "POINTOPOINT", ",UP"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("%s lacks %q:\n%s", dev.Name(), want, out)
		}
	}
	if fl, err := unix.FcntlInt(uintptr(dev.Fd()), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
		t.Errorf("descriptor not non-blocking: flags %#x, %v", fl, err)
	}

	buf := make([]byte, 9000)
	if err := dev.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := dev.ReadPacket(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read past deadline: %v, want %v", err, os.ErrDeadlineExceeded)
	} else if d := time.Since(start); d > 5*time.Second {
		t.Errorf("deadline of 50 ms took %v", d)
	}
	if err := dev.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}

	read := make(chan error, 1)
	go func() {
		_, err := dev.ReadPacket(buf)
		read <- err
	}()
	select {
	case err := <-read:
		t.Fatalf("read returned before Close: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-read:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("pending read after Close: %v, want %v", err, os.ErrClosed)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock ReadPacket within 5 s")
	}
	if err := dev.WritePacket(make([]byte, 20)); !errors.Is(err, os.ErrClosed) {
		t.Errorf("write after Close: %v, want %v", err, os.ErrClosed)
	}
	// The interface went with the descriptor.
	if out, err := tp.Engine.Command("ip", "link", "show", dev.Name()).CombinedOutput(); err == nil {
		t.Errorf("%s survived Close:\n%s", dev.Name(), out)
	}
	checkCloses(t, tp)
}

// TestReadPacketTruncates: a packet longer than the buffer fills it and is
// reported, not silently cut.
func TestReadPacketTruncates(t *testing.T) {
	tp := topology.NewTunPeer(t, topology.TunPeerOptions{})
	testenv.RequireTool(t, "ping")
	p := startPing(t, tp.Peer, tp.EngineAddr)
	if err := tp.Dev.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 40) // the echo request is 84 bytes
	n, err := tp.Dev.ReadPacket(buf)
	if !errors.Is(err, tun.ErrTruncated) || n != len(buf) {
		t.Errorf("ReadPacket of 84 bytes into %d: %d, %v; want %d, %v", len(buf), n, err, len(buf), tun.ErrTruncated)
	}
	if n >= 20 {
		if ip, ok := parseIPv4(t, buf[:n]); !ok || ip.totalLen != 84 {
			t.Errorf("truncated packet: not the 84-byte echo request: % x", buf[:n])
		}
	}
	<-p.done
}

func TestOpenRejectsLongName(t *testing.T) {
	if _, err := tun.Open(strings.Repeat("x", unix.IFNAMSIZ)); err == nil {
		t.Error("a name of IFNAMSIZ bytes was accepted")
	}
}

// checkCloses closes the topology as the test cleanup would and checks that
// the namespaces are gone, the Device is closed and a second Close is quiet.
func checkCloses(t *testing.T, tp *topology.TunPeer) {
	t.Helper()
	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{tp.Peer.Namespace, tp.Engine.Namespace} {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			t.Errorf("namespace %s survived Close", ns)
		}
	}
	if _, err := tp.Dev.ReadPacket(make([]byte, 1)); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Device after Close: %v, want %v", err, os.ErrClosed)
	}
	if err := tp.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// pingRun is a ping process in a namespace; done closes when it has exited
// (or was killed after 15 s), after which err and out are final.
type pingRun struct {
	done chan struct{}
	out  bytes.Buffer
	err  error
}

func startPing(t *testing.T, h topology.Host, dst netip.Addr) *pingRun {
	t.Helper()
	r := &pingRun{done: make(chan struct{})}
	cmd := h.Command("ping", "-n", "-c", "3", "-W", "1", "-i", "0.2", dst.String())
	cmd.Stdout, cmd.Stderr = &r.out, &r.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		// `ip netns exec` execs ping in its own process: killing it kills ping.
		kill := time.AfterFunc(15*time.Second, func() { _ = cmd.Process.Kill() })
		r.err = cmd.Wait()
		kill.Stop()
		close(r.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-r.done
	})
	return r
}

// answerPings plays the engine for ICMP: it reads the Device until done is
// closed, checks each echo request to tp.EngineAddr and writes back a
// hand-built echo reply. It returns how many requests it answered. Other
// packets fail the test.
func answerPings(t *testing.T, tp *topology.TunPeer, done <-chan struct{}) int {
	t.Helper()
	buf := make([]byte, 2048)
	answered := 0
	for start := time.Now(); time.Since(start) < 20*time.Second; {
		if err := tp.Dev.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		n, err := tp.Dev.ReadPacket(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			select {
			case <-done:
				return answered
			default:
				continue
			}
		}
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		ip, ok := parseIPv4(t, buf[:n])
		if !ok {
			t.Fatalf("not an IPv4 packet: % x", buf[:n])
		}
		if ip.src != tp.PeerAddr || ip.dst != tp.EngineAddr {
			t.Errorf("packet %v -> %v, want %v -> %v", ip.src, ip.dst, tp.PeerAddr, tp.EngineAddr)
		}
		icmp := ip.payload
		if ip.proto != syscall.IPPROTO_ICMP || len(icmp) < 8 || icmp[0] != 8 || icmp[1] != 0 {
			t.Fatalf("not an ICMP echo request: % x", buf[:n])
		}
		if icmpChecksum(icmp) != 0 {
			t.Errorf("ICMP checksum does not verify: % x", icmp)
		}
		reply := bytes.Clone(icmp)
		reply[0] = 0 // echo reply; code, identifier, sequence and data stay
		binary.BigEndian.PutUint16(reply[2:], 0)
		binary.BigEndian.PutUint16(reply[2:], icmpChecksum(reply))
		if err := tp.Dev.WritePacket(buildIPv4(ip.dst, ip.src, syscall.IPPROTO_ICMP, reply)); err != nil {
			t.Fatalf("write reply: %v", err)
		}
		answered++
	}
	t.Fatal("ping still running after 20 s")
	return answered
}

type ipv4 struct {
	src, dst netip.Addr
	proto    uint8
	totalLen int
	payload  []byte // up to the total length, or what there is of it
}

// parseIPv4 returns the fields of an IPv4 packet, or false if pkt is not one;
// it reports a header whose checksum does not verify. A packet cut short
// (ReadPacket truncates) still parses: payload is what there is of it.
func parseIPv4(t *testing.T, pkt []byte) (ipv4, bool) {
	t.Helper()
	ip := header.IPv4(pkt)
	if len(pkt) < header.IPv4MinLen || ip.Version() != 4 || ip.HeaderLen() < header.IPv4MinLen || ip.HeaderLen() > len(pkt) {
		return ipv4{}, false
	}
	if !ip.IsChecksumValid() {
		t.Errorf("IPv4 header checksum does not verify: % x", pkt[:ip.HeaderLen()])
	}
	end := min(ip.TotalLen(), len(pkt))
	if end < ip.HeaderLen() {
		return ipv4{}, false
	}
	return ipv4{src: ip.Src(), dst: ip.Dst(), proto: ip.Protocol(), totalLen: ip.TotalLen(), payload: pkt[ip.HeaderLen():end]}, true
}

// buildIPv4 wraps payload in a 20-byte IPv4 header with TTL 64 and DF.
func buildIPv4(src, dst netip.Addr, proto uint8, payload []byte) []byte {
	pkt := make([]byte, header.IPv4MinLen+len(payload))
	header.IPv4(pkt).Encode(&header.IPv4Fields{TotalLen: uint16(len(pkt)), DontFragment: true, TTL: 64, Protocol: proto, Src: src, Dst: dst})
	copy(pkt[header.IPv4MinLen:], payload)
	return pkt
}

// icmpChecksum is the ICMP checksum of b (RFC 792): 0 over a message whose
// checksum verifies.
func icmpChecksum(b []byte) uint16 { return ^header.Checksum(b, 0) }

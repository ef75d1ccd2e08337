package xsk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
)

// The tests below run AF_XDP over a veth pair between two namespaces made by
// package topology: A holds the XDP program and the sockets, B the kernel
// UDP sockets that talk to them.

const (
	ipProtoUDP = 17
	udpLen     = 8
	rxPort     = 9000 // B sends to A:rxPort, received on the XSK
	txPort     = 9001 // the XSK sends to B:txPort
	xskPort    = 9002 // the XSK's source port
)

// vethXSK is a topology with the XDP program attached to A's veth end.
type vethXSK struct {
	p          *topology.Pair
	xsks       *ebpf.Map
	ifindexA   int
	macA, macB [6]byte
}

// newXSKProgram builds the steering program of the tests without C:
//
//	return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
func newXSKProgram(t testing.TB) (*ebpf.Map, *ebpf.Program) {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "xsks", Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: 64,
	})
	if err != nil {
		t.Fatalf("create XSKMAP: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	const (
		xdpMDRxQueueIndex = 16 // offsetof(struct xdp_md, rx_queue_index)
		xdpPass           = 2
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "xsk_redirect",
		Type:    ebpf.XDP,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R2, asm.R1, xdpMDRxQueueIndex, asm.Word),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Imm(asm.R3, xdpPass), // the action when the queue has no socket
			asm.FnRedirectMap.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatalf("load XDP program: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	return m, prog
}

// errAttach marks a failure to attach the XDP program, so that a test can
// tell an unsupported mode from other failures.
var errAttach = errors.New("attach XDP")

func newVethXSK(t testing.TB, opts topology.Options, mode link.XDPAttachFlags) (*vethXSK, error) {
	t.Helper()
	p := topology.NewTest(t, opts)
	m, prog := newXSKProgram(t)
	v := &vethXSK{p: p, xsks: m}
	err := p.A.Do(func() error {
		ifi, err := net.InterfaceByName(p.A.Link)
		if err != nil {
			return err
		}
		v.ifindexA = ifi.Index
		v.macA = [6]byte(ifi.HardwareAddr)
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifi.Index, Flags: mode})
		if err != nil {
			return fmt.Errorf("%w: %w", errAttach, err)
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})
	if err != nil {
		return nil, err
	}
	ifiB, err := p.B.Interface()
	if err != nil {
		t.Fatal(err)
	}
	v.macB = [6]byte(ifiB.HardwareAddr)
	// Every frame of queue 0 goes to the socket, ARP replies included, so
	// B learns A's address statically.
	staticNeighbour(t, p.B, p.A.Addr.Addr(), v.macA)
	return v, nil
}

// staticNeighbour makes h reach addr at mac without ARP.
func staticNeighbour(t testing.TB, h topology.Host, addr netip.Addr, mac [6]byte) {
	t.Helper()
	if out, err := h.Command("ip", "neigh", "replace", addr.String(),
		"lladdr", net.HardwareAddr(mac[:]).String(), "dev", h.Link, "nud", "permanent").CombinedOutput(); err != nil {
		t.Fatalf("ip neigh: %v: %s", err, out)
	}
}

// socketB makes a socket on B's end, closed when the test ends.
func (v *vethXSK) socketB(t testing.TB, u *UMEM, opts SocketOptions) *Socket {
	t.Helper()
	var s *Socket
	if err := v.p.B.Do(func() error {
		ifi, err := net.InterfaceByName(v.p.B.Link)
		if err != nil {
			return err
		}
		opts.Ifindex = ifi.Index
		s, err = NewSocket(u, opts)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// socket makes a socket inside A, puts it into the XSKMAP at its queue when
// register is set, and closes it when the test ends.
func (v *vethXSK) socket(t testing.TB, u *UMEM, opts SocketOptions, register bool) (*Socket, error) {
	t.Helper()
	var s *Socket
	err := v.p.A.Do(func() error {
		var err error
		s, err = NewSocket(u, opts)
		return err
	})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close socket: %v", err)
		}
	})
	if register {
		if err := v.xsks.Put(opts.QueueID, uint32(s.FD())); err != nil {
			t.Fatalf("XSKMAP put queue %d: %v", opts.QueueID, err)
		}
	}
	return s, nil
}

func newTestUMEM(t testing.TB, frames uint32) *UMEM {
	t.Helper()
	u, err := NewUMEM(UMEMOptions{FrameCount: frames})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := u.Close(); err != nil {
			t.Errorf("close umem: %v", err)
		}
	})
	return u
}

// sendFromB sends each payload as one datagram from B to A:rxPort, from
// ports source ports in turn (0: one socket).
func (v *vethXSK) sendFromB(t testing.TB, payloads [][]byte, ports int) {
	t.Helper()
	ports = max(ports, 1)
	err := v.p.B.Do(func() error {
		dst := &net.UDPAddr{IP: v.p.A.Addr.Addr().AsSlice(), Port: rxPort}
		conns := make([]*net.UDPConn, ports)
		for i := range conns {
			c, err := net.DialUDP("udp4", nil, dst)
			if err != nil {
				return err
			}
			defer c.Close()
			conns[i] = c
		}
		for i, p := range payloads {
			if _, err := conns[i%ports].Write(p); err != nil {
				return fmt.Errorf("send datagram %d: %w", i, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// udpPayload returns the payload of a frame that is a well-formed IPv4 UDP
// datagram from src to dst:port, with every checksum verified.
func udpPayload(frame []byte, src, dst netip.Addr, port uint16) ([]byte, error) {
	e := header.Ethernet(frame)
	if !e.IsValid() || e.Type() != header.EtherTypeIPv4 {
		return nil, nil
	}
	ip := header.IPv4(e.Payload())
	if !ip.IsValid(len(ip)) || ip.Protocol() != ipProtoUDP {
		return nil, nil
	}
	u := ip.Payload()
	if len(u) < udpLen || binary.BigEndian.Uint16(u[2:]) != port {
		return nil, nil
	}
	if !ip.IsChecksumValid() {
		return nil, errors.New("bad IPv4 header checksum")
	}
	if ip.Src() != src || ip.Dst() != dst {
		return nil, fmt.Errorf("datagram %v → %v, want %v → %v", ip.Src(), ip.Dst(), src, dst)
	}
	if int(binary.BigEndian.Uint16(u[4:])) != len(u) {
		return nil, fmt.Errorf("UDP length %d in a %d-byte datagram", binary.BigEndian.Uint16(u[4:]), len(u))
	}
	if binary.BigEndian.Uint16(u[6:]) != 0 &&
		header.Checksum(u, header.PseudoHeaderChecksum(ipProtoUDP, src, dst, uint16(len(u)))) != 0xffff {
		return nil, errors.New("bad UDP checksum")
	}
	return u[udpLen:], nil
}

// buildUDP writes an Ethernet, IPv4 and UDP frame carrying payload into buf
// and returns its length.
func buildUDP(buf []byte, srcMAC, dstMAC [6]byte, src, dst netip.Addr, sport, dport, id uint16, payload []byte) int {
	header.Ethernet(buf).Encode(&header.EthernetFields{Dst: dstMAC, Src: srcMAC, Type: header.EtherTypeIPv4})
	n := udpLen + len(payload)
	header.IPv4(buf[header.EthernetLen:]).Encode(&header.IPv4Fields{
		TotalLen: uint16(header.IPv4MinLen + n), ID: id, DontFragment: true, TTL: 64,
		Protocol: ipProtoUDP, Src: src, Dst: dst,
	})
	u := buf[header.EthernetLen+header.IPv4MinLen:][:n]
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(n))
	binary.BigEndian.PutUint16(u[6:], 0)
	copy(u[udpLen:], payload)
	sum := ^header.Checksum(u, header.PseudoHeaderChecksum(ipProtoUDP, src, dst, uint16(n)))
	if sum == 0 {
		sum = 0xffff // RFC 768: zero means "no checksum"
	}
	binary.BigEndian.PutUint16(u[6:], sum)
	return header.EthernetLen + header.IPv4MinLen + n
}

// receiver drains RX rings into a list of payloads for rxPort and gives the
// frames back to the fill ring.
type receiver struct {
	v     *vethXSK
	fl    *FreeList
	other int // frames that were not for rxPort
}

// drain takes what s's RX ring holds now.
func (r *receiver) drain(s *Socket) ([][]byte, error) {
	var got [][]byte
	rx := s.RX()
	idx, n := rx.Peek(rx.Size())
	for i := uint32(0); i < n; i++ {
		d := rx.Get(idx + i)
		p, err := udpPayload(s.UMEM().Packet(d), r.v.p.B.Addr.Addr(), r.v.p.A.Addr.Addr(), rxPort)
		if err != nil {
			return nil, err
		}
		if p == nil {
			r.other++
		} else {
			got = append(got, bytes.Clone(p))
		}
		r.fl.Free(d.Addr)
	}
	rx.Release(n)
	if n > 0 {
		s.Fill().Refill(r.fl, n)
		if s.Fill().NeedWakeup() {
			if err := s.KickFill(); err != nil {
				return nil, err
			}
		}
	}
	return got, nil
}

// collect drains the sockets until want payloads arrived or the deadline.
func (r *receiver) collect(t testing.TB, want int, timeout time.Duration, socks ...*Socket) (all [][]byte, per []int) {
	t.Helper()
	per = make([]int, len(socks))
	deadline := time.Now().Add(timeout)
	for len(all) < want && time.Now().Before(deadline) {
		for i, s := range socks {
			if len(socks) == 1 {
				if _, err := s.Poll(50 * time.Millisecond); err != nil {
					t.Fatal(err)
				}
			}
			got, err := r.drain(s)
			if err != nil {
				t.Fatal(err)
			}
			per[i] += len(got)
			all = append(all, got...)
		}
		if len(socks) > 1 {
			time.Sleep(time.Millisecond)
		}
	}
	return all, per
}

func testPayloads(prefix string, n int) [][]byte {
	ps := make([][]byte, n)
	for i := range ps {
		ps[i] = fmt.Appendf(nil, "%s %04d %s", prefix, i, bytes.Repeat([]byte{byte(i)}, i%200))
	}
	return ps
}

// transmit sends each payload from s to B:txPort: it puts on the TX ring as
// many frames as fit, kicks when the ring asks for it, drains the completion
// ring, and repeats until every frame came back, checking that the frames
// returned are the ones sent. It reports whether the TX ring ever asked for
// a wakeup.
func (v *vethXSK) transmit(t testing.TB, s *Socket, fl *FreeList, payloads [][]byte) (neededWakeup bool) {
	t.Helper()
	u := s.UMEM()
	inFlight := map[uint64]bool{}
	tx, cq := s.TX(), s.Completion()
	next := 0
	deadline := time.Now().Add(5 * time.Second)
	for (next < len(payloads) || len(inFlight) > 0) && time.Now().Before(deadline) {
		idx, n := tx.Reserve(uint32(min(len(payloads)-next, fl.Len())))
		for j := uint32(0); j < n; j++ {
			addr, _ := fl.Alloc()
			l := buildUDP(u.Frame(addr), v.macA, v.macB, v.p.A.Addr.Addr(), v.p.B.Addr.Addr(),
				xskPort, txPort, uint16(next), payloads[next])
			tx.Set(idx+j, Desc{Addr: addr, Len: uint32(l)})
			inFlight[addr] = true
			next++
		}
		tx.Submit(n)
		if tx.NeedWakeup() {
			neededWakeup = true
			if err := s.Kick(); err != nil {
				t.Fatal(err)
			}
		}
		idx, n = cq.Peek(cq.Size())
		for j := uint32(0); j < n; j++ {
			a := cq.Get(idx + j)
			if !inFlight[a] {
				t.Fatalf("completion of frame %#x that was not sent (or twice)", a)
			}
			delete(inFlight, a)
			fl.Free(a)
		}
		cq.Release(n)
		if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if next < len(payloads) || len(inFlight) > 0 {
		t.Fatalf("sent %d of %d frames, %d never completed", next, len(payloads), len(inFlight))
	}
	return neededWakeup
}

// listenB opens a UDP socket on B:txPort.
func (v *vethXSK) listenB(t testing.TB) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := v.p.B.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: v.p.B.Addr.Addr().AsSlice(), Port: txPort})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// expectAtB reads len(want) datagrams on c and checks them, in order.
func expectAtB(t testing.TB, c *net.UDPConn, want [][]byte) {
	t.Helper()
	buf := make([]byte, 2048)
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		n, from, err := c.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("B received %d of %d datagrams: %v", i, len(want), err)
		}
		if from.Port != xskPort || !bytes.Equal(buf[:n], w) {
			t.Fatalf("datagram %d from %v: %q, want %q from port %d", i, from, buf[:n], w, xskPort)
		}
	}
}

func checkInOrder(t testing.TB, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("received %d datagrams, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("datagram %d = %q, want %q", i, got[i], want[i])
		}
	}
}

// TestVethRXTX receives UDP datagrams sent by B's kernel on the XSK with
// their exact payloads, and sends hand-built frames from the XSK that B's
// kernel delivers to a UDP socket, with the XDP program attached in generic
// (skb) mode and in native (driver) mode.
func TestVethRXTX(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode link.XDPAttachFlags
	}{{"generic", link.XDPGenericMode}, {"native", link.XDPDriverMode}} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := newVethXSK(t, topology.Options{}, tc.mode)
			if errors.Is(err, errAttach) && tc.mode == link.XDPDriverMode {
				testenv.Unmet(t, "native XDP on veth unavailable on this kernel: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			u := newTestUMEM(t, 1024)
			s, err := v.socket(t, u, SocketOptions{
				Ifindex: v.ifindexA, RXSize: 256, TXSize: 64, FillSize: 512, CompletionSize: 64,
			}, true)
			if err != nil {
				t.Fatal(err)
			}
			if s.Mode() != ModeCopy {
				t.Errorf("mode %v on veth, want copy", s.Mode())
			}
			t.Logf("socket fd %d on ifindex %d queue %d: mode auto gave %v", s.FD(), s.Ifindex(), s.QueueID(), s.Mode())
			fl := NewFreeList(u.FrameSize(), 0, u.FrameCount())
			if n := s.Fill().Refill(fl, 512); n != 512 {
				t.Fatalf("filled %d", n)
			}
			t.Logf("need_wakeup after bind: fill %v, tx %v", s.Fill().NeedWakeup(), s.TX().NeedWakeup())
			if err := s.KickFill(); err != nil { // harmless when not needed
				t.Fatal(err)
			}
			if ok, err := s.Poll(0); ok || err != nil {
				t.Fatalf("Poll of an idle socket = %v, %v", ok, err)
			}

			// RX: the payloads, in order, through both ring batches.
			want := testPayloads("to-xsk", 200)
			for _, batch := range [][][]byte{want[:100], want[100:]} {
				v.sendFromB(t, batch, 1)
			}
			r := &receiver{v: v, fl: fl}
			got, _ := r.collect(t, len(want), 5*time.Second, s)
			checkInOrder(t, got, want)
			t.Logf("received %d datagrams (and %d other frames)", len(got), r.other)

			// TX: 100 frames, more than one copy-mode kick sends.
			c := v.listenB(t)
			out := testPayloads("from-xsk", 100)
			if !v.transmit(t, s, fl, out) {
				t.Error("TX ring did not ask for a wakeup in copy mode with need_wakeup")
			}
			expectAtB(t, c, out)
			if fl.Len() != fl.Cap()-512 {
				t.Errorf("free frames %d, want %d: frames leaked", fl.Len(), fl.Cap()-512)
			}

			st, err := s.Statistics()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("statistics: %+v", st)
			if st.RXInvalidDescs != 0 || st.TXInvalidDescs != 0 || st.RXRingFull != 0 {
				t.Errorf("unexpected counts: %+v", st)
			}
		})
	}
}

// TestVethModesAndStatistics checks zero-copy refusal on veth, the counters
// of an empty fill ring and of an invalid TX descriptor, and a socket bound
// without need_wakeup.
func TestVethModesAndStatistics(t *testing.T) {
	v, err := newVethXSK(t, topology.Options{}, link.XDPGenericMode)
	if err != nil {
		t.Fatal(err)
	}
	u := newTestUMEM(t, 256)
	opts := SocketOptions{Ifindex: v.ifindexA, RXSize: 64, TXSize: 64, FillSize: 128, CompletionSize: 64}

	zc := opts
	zc.Mode = ModeZeroCopy
	s, err := v.socket(t, u, zc, false)
	if err == nil {
		t.Logf("zero-copy works on veth here: mode %v", s.Mode())
		if s.Mode() != ModeZeroCopy {
			t.Errorf("ModeZeroCopy bound in %v", s.Mode())
		}
		return
	}
	if !errors.Is(err, ErrNoZeroCopy) {
		t.Fatalf("zero-copy on veth: %v, want ErrNoZeroCopy", err)
	}
	t.Logf("zero-copy on veth: %v", err)

	cp := opts
	cp.Mode = ModeCopy
	cp.NoNeedWakeup = true
	s, err = v.socket(t, u, cp, true)
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode() != ModeCopy || !s.TX().NeedWakeup() {
		t.Fatalf("copy mode without need_wakeup: mode %v, TX NeedWakeup %v", s.Mode(), s.TX().NeedWakeup())
	}

	// Nothing on the fill ring: the datagrams are dropped and counted.
	v.sendFromB(t, testPayloads("dropped", 8), 1)
	var st Statistics
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, err = s.Statistics(); err != nil {
			t.Fatal(err)
		}
		if st.RXDropped+st.RXFillRingEmptyDescs >= 8 {
			break
		}
	}
	t.Logf("after 8 datagrams with an empty fill ring: %+v", st)
	if st.RXDropped+st.RXFillRingEmptyDescs < 8 {
		t.Errorf("empty fill ring not counted: %+v", st)
	}
	if _, n := s.RX().Peek(1); n != 0 {
		t.Error("a packet arrived without a fill entry")
	}

	// An address outside the UMEM is an invalid TX descriptor; the kernel
	// consumes it without a completion.
	tx := s.TX()
	idx, n := tx.Reserve(1)
	if n != 1 {
		t.Fatal("TX ring full")
	}
	tx.Set(idx, Desc{Addr: uint64(len(u.Bytes())) + 4096, Len: 60})
	tx.Submit(1)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err := s.Kick(); err != nil {
			t.Fatal(err)
		}
		if st, err = s.Statistics(); err != nil {
			t.Fatal(err)
		}
		if st.TXInvalidDescs > 0 {
			break
		}
	}
	if st.TXInvalidDescs != 1 {
		t.Errorf("TX invalid descriptors %d, want 1", st.TXInvalidDescs)
	}
	if tx.Free() != tx.Size() {
		t.Errorf("kernel left %d TX slots unconsumed", tx.Size()-tx.Free())
	}
	// Kernels differ on whether the invalid frame comes back as completed.
	cq := s.Completion()
	if idx, n := cq.Peek(cq.Size()); n > 0 {
		if n != 1 || cq.Get(idx) != uint64(len(u.Bytes()))+4096 {
			t.Errorf("%d completions after an invalid descriptor, first %#x", n, cq.Get(idx))
		}
		t.Logf("the kernel returned the invalid descriptor's address on the completion ring")
		cq.Release(n)
	}

	// Without need_wakeup, copy mode still sends on Kick, and receives.
	fl := NewFreeList(u.FrameSize(), 0, u.FrameCount())
	s.Fill().Refill(fl, 128)
	c := v.listenB(t)
	out := testPayloads("no-wakeup", 40)
	v.transmit(t, s, fl, out)
	expectAtB(t, c, out)
	in := testPayloads("in", 20)
	v.sendFromB(t, in, 1)
	r := &receiver{v: v, fl: fl}
	got, _ := r.collect(t, len(in), 5*time.Second, s)
	checkInOrder(t, got, in)

	// A second socket over the UMEM must agree on need_wakeup.
	other := opts
	other.QueueID = 0
	if _, err := v.socket(t, u, other, false); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("shared socket with need_wakeup against a first socket without: %v", err)
	}
}

// TestVethSharedUMEM binds sockets to queues 0 and 1 of a two-queue veth
// over one UMEM, each with its own fill and completion rings, and a third to
// queue 0 sharing the first one's, and moves traffic through both queues.
func TestVethSharedUMEM(t *testing.T) {
	// Native mode, where veth gives each receive queue its own NAPI
	// context and rx_queue_index follows B's transmit queue; generic mode
	// (where everything arrives on queue 0) when native is unavailable.
	native := true
	v, err := newVethXSK(t, topology.Options{Queues: 2}, link.XDPDriverMode)
	if errors.Is(err, errAttach) {
		native = false
		t.Logf("native XDP unavailable (%v); generic mode", err)
		v, err = newVethXSK(t, topology.Options{Queues: 2}, link.XDPGenericMode)
	}
	if err != nil {
		t.Fatal(err)
	}
	u := newTestUMEM(t, 1024)
	opts := func(q uint32) SocketOptions {
		return SocketOptions{Ifindex: v.ifindexA, QueueID: q, RXSize: 256, TXSize: 64, FillSize: 256, CompletionSize: 64}
	}
	s0, err := v.socket(t, u, opts(0), true)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := v.socket(t, u, opts(1), true)
	if err != nil {
		t.Fatalf("second queue with shared UMEM: %v", err)
	}
	s2, err := v.socket(t, u, opts(0), false)
	if err != nil {
		t.Fatalf("second socket on queue 0: %v", err)
	}
	if s1.Fill() == s0.Fill() || s1.Completion() == s0.Completion() {
		t.Error("socket on queue 1 shares queue 0's fill/completion rings")
	}
	if s2.Fill() != s0.Fill() || s2.Completion() != s0.Completion() {
		t.Error("second socket on queue 0 has fill/completion rings of its own")
	}
	for i, s := range []*Socket{s0, s1, s2} {
		if s.Mode() != ModeCopy {
			t.Errorf("socket %d mode %v", i, s.Mode())
		}
	}
	zc := opts(1)
	zc.Mode = ModeZeroCopy
	if _, err := v.socket(t, u, zc, false); !errors.Is(err, ErrNoZeroCopy) {
		t.Errorf("zero-copy socket sharing a copy-mode UMEM: %v", err)
	}
	if err := u.Close(); !errors.Is(err, ErrInUse) {
		t.Errorf("Close of a UMEM in use: %v", err)
	}

	// Each queue's fill ring gets its own half of the frames.
	fl0 := NewFreeList(u.FrameSize(), 0, 512)
	fl1 := NewFreeList(u.FrameSize(), 512, 512)
	s0.Fill().Refill(fl0, 256)
	s1.Fill().Refill(fl1, 256)

	// Many source ports, so that B's transmit queue choice (and with it
	// A's receive queue) varies.
	want := testPayloads("shared", 128)
	v.sendFromB(t, want, 16)
	r0 := &receiver{v: v, fl: fl0}
	r1 := &receiver{v: v, fl: fl1}
	var got [][]byte
	per := []int{0, 0}
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < len(want) && time.Now().Before(deadline) {
		for i, pr := range []struct {
			s *Socket
			r *receiver
		}{{s0, r0}, {s1, r1}} {
			g, err := pr.r.drain(pr.s)
			if err != nil {
				t.Fatal(err)
			}
			per[i] += len(g)
			got = append(got, g...)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("received %d of %d datagrams: %d on queue 0, %d on queue 1", len(got), len(want), per[0], per[1])
	if len(got) != len(want) {
		t.Fatalf("received %d of %d datagrams", len(got), len(want))
	}
	if native && per[1] == 0 {
		t.Error("nothing arrived on queue 1 from 16 flows") // 2^-16 by chance
	}
	seen := map[string]bool{}
	for _, p := range want {
		seen[string(p)] = true
	}
	for _, p := range got {
		if !seen[string(p)] {
			t.Fatalf("unexpected or repeated payload %q", p)
		}
		delete(seen, string(p))
	}

	// Transmit from queue 1's socket: completions come back on its own ring.
	c := v.listenB(t)
	out := testPayloads("from-q1", 40)
	v.transmit(t, s1, fl1, out)
	expectAtB(t, c, out)

	// Close the socket that registered the UMEM: the others keep working,
	// and a new socket on queue 0 joins s2's buffer pool.
	if err := s0.Close(); err != nil {
		t.Fatal(err)
	}
	s3, err := v.socket(t, u, opts(0), false)
	if err != nil {
		t.Fatalf("socket on queue 0 after the first closed: %v", err)
	}
	if s3.Fill() != s2.Fill() {
		t.Error("new socket on queue 0 does not share s2's fill ring")
	}
	out = testPayloads("from-q1-again", 10)
	v.transmit(t, s1, fl1, out)
	expectAtB(t, c, out)

	// With every socket closed, the next one registers the UMEM afresh and
	// binds again to the queues just released.
	for _, s := range []*Socket{s1, s2, s3} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for q := uint32(0); q < 2; q++ {
		start := time.Now()
		if _, err := v.socket(t, u, opts(q), false); err != nil {
			t.Fatalf("rebind to queue %d after close: %v", q, err)
		}
		t.Logf("rebind to queue %d after close took %v", q, time.Since(start))
	}
}

// BenchmarkXSKRx measures datagrams per second received on an XSK (copy
// mode; XDP in generic and in native mode) from a sender in the other
// namespace. Each run sends b.N datagrams of 64 bytes, or of 1472 (a
// 1514-octet frame, as a full TCP segment at MTU 1500 is), as fast as one
// sender can: a kernel UDP socket with sendmmsg(2) ("udp") or an XSK in copy
// mode on B's end ("xsk"), and stops after all arrived, after the receiver
// saw nothing for 200 ms, or after 20 s. Datagrams the kernel drops before
// the XSK (its backlog is bounded) show as loss%.
//
// xsk/1472 is the ceiling of any protocol over copy-mode AF_XDP on this veth:
// no TCP, MPA, CRC or placement, one pre-built frame per descriptor, so its
// Gb/s is what a one-queue RNIC could move at MTU 1500 if its own work cost
// nothing. native/xsk/1472/threaded is the same with A's NAPI threaded
// (/sys/class/net/IFACE/threaded): the receive work (XDP, the copy into the
// socket) leaves the sender's softirq for a kernel thread that can run on
// the other CPU (see xdpnet.NAPIMode).
func BenchmarkXSKRx(b *testing.B) {
	for _, mode := range []struct {
		name  string
		flags link.XDPAttachFlags
	}{{"generic", link.XDPGenericMode}, {"native", link.XDPDriverMode}} {
		for _, sender := range []string{"udp", "xsk"} {
			for _, size := range []int{64, 1472} {
				b.Run(fmt.Sprintf("%s/%s/%d", mode.name, sender, size), func(b *testing.B) {
					benchmarkXSKRx(b, mode.flags, sender, size, false)
				})
			}
		}
	}
	b.Run("native/xsk/1472/threaded", func(b *testing.B) { benchmarkXSKRx(b, link.XDPDriverMode, "xsk", 1472, true) })
}

func benchmarkXSKRx(b *testing.B, mode link.XDPAttachFlags, sender string, size int, threaded bool) {
	v, err := newVethXSK(b, topology.Options{}, mode)
	if errors.Is(err, errAttach) && mode == link.XDPDriverMode {
		testenv.Unmet(b, "native XDP on veth unavailable: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	if threaded {
		// A's NAPI exists now that XDP is attached; the setting goes
		// with the namespace.
		path := "/sys/class/net/" + v.p.A.Link + "/threaded"
		if out, err := v.p.A.Command("sh", "-c", "echo 1 > "+path).CombinedOutput(); err != nil {
			b.Fatalf("threaded NAPI: %v: %s", err, out)
		}
	}
	u := newTestUMEM(b, 8192)
	s, err := v.socket(b, u, SocketOptions{Ifindex: v.ifindexA, RXSize: 4096, TXSize: 64, FillSize: 4096, CompletionSize: 64}, true)
	if err != nil {
		b.Fatal(err)
	}
	fl := NewFreeList(u.FrameSize(), 0, u.FrameCount())
	s.Fill().Refill(fl, 4096)

	payload := bytes.Repeat([]byte{0x5a}, size)
	frameLen := uint32(header.EthernetLen + header.IPv4MinLen + udpLen + size)
	const dstPortAt = header.EthernetLen + header.IPv4MinLen + 2
	var send func(n int, deadline time.Time) int
	if sender == "xsk" {
		send = v.xskSender(b, payload)
	} else {
		var fd int
		if err := v.p.B.Do(func() error {
			var err error
			fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			return unix.Connect(fd, &unix.SockaddrInet4{Port: rxPort, Addr: v.p.A.Addr.Addr().As4()})
		}); err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		send = func(n int, deadline time.Time) int { return sendmmsg(fd, payload, n, deadline) }
	}

	b.ResetTimer()
	start := time.Now()
	sent := make(chan int, 1)
	go func() { sent <- send(b.N, time.Now().Add(15*time.Second)) }()
	received, nsent := 0, -1
	last := time.Now()
	hard := time.Now().Add(20 * time.Second)
	rx := s.RX()
	for time.Now().Before(hard) {
		idx, n := rx.Peek(256)
		if n == 0 {
			if nsent < 0 {
				select {
				case nsent = <-sent:
				default:
				}
			}
			if received == b.N || (nsent >= 0 && (received >= nsent || time.Since(last) > 200*time.Millisecond)) {
				break
			}
			if _, err := s.Poll(10 * time.Millisecond); err != nil {
				b.Fatal(err)
			}
			continue
		}
		for i := uint32(0); i < n; i++ {
			d := rx.Get(idx + i)
			// Count the sender's datagrams only, not B's IPv6 chatter.
			if d.Len == frameLen && binary.BigEndian.Uint16(u.Packet(d)[dstPortAt:]) == rxPort {
				received++
			}
			fl.Free(d.Addr)
		}
		rx.Release(n)
		last = time.Now()
		s.Fill().Refill(fl, uint32(fl.Len())) // keep the fill ring topped up
	}
	elapsed := last.Sub(start)
	b.StopTimer()
	if nsent < 0 {
		nsent = <-sent
	}
	if received == 0 {
		b.Fatal("nothing received")
	}
	b.ReportMetric(float64(received)/elapsed.Seconds(), "pkts/s")
	b.ReportMetric(float64(received)*float64(size)*8/elapsed.Seconds()/1e9, "payload-Gb/s")
	b.ReportMetric(100*float64(nsent-received)/float64(max(nsent, 1)), "loss%")
	st, _ := s.Statistics()
	b.Logf("N=%d sent %d received %d in %v; %+v", b.N, nsent, received, elapsed, st)
}

// sendmmsg sends payload n times on the connected socket fd in batches of 64
// and returns how many went out before an error or the deadline.
func sendmmsg(fd int, payload []byte, n int, deadline time.Time) int {
	const batch = 64
	iov := &unix.Iovec{Base: &payload[0]}
	iov.SetLen(len(payload))
	hdrs := make([]unix.Mmsghdr, batch)
	for i := range hdrs {
		hdrs[i].Hdr.Iov = iov
		hdrs[i].Hdr.SetIovlen(1)
	}
	sent := 0
	for sent < n && time.Now().Before(deadline) {
		k := min(batch, n-sent)
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&hdrs[0])), uintptr(k), 0, 0, 0)
		if e != 0 {
			break
		}
		sent += int(r)
	}
	runtime.KeepAlive(iov)
	runtime.KeepAlive(hdrs)
	return sent
}

// xskSender makes a copy-mode socket on B's veth end whose every frame holds
// the same datagram to A:rxPort, and returns a function that sends n of them
// and returns how many completed before the deadline.
func (v *vethXSK) xskSender(t testing.TB, payload []byte) func(n int, deadline time.Time) int {
	t.Helper()
	u := newTestUMEM(t, 4096)
	s := v.socketB(t, u, SocketOptions{RXSize: 64, TXSize: 2048, FillSize: 64, CompletionSize: 2048})
	var l int
	for f := uint32(0); f < u.FrameCount(); f++ {
		l = buildUDP(u.Frame(uint64(f)*uint64(u.FrameSize())), v.macB, v.macA, v.p.B.Addr.Addr(), v.p.A.Addr.Addr(),
			xskPort, rxPort, 0, payload)
	}
	fl := NewFreeList(u.FrameSize(), 0, u.FrameCount())
	return func(n int, deadline time.Time) int {
		tx, cq := s.TX(), s.Completion()
		sent, done := 0, 0
		for done < n && time.Now().Before(deadline) {
			idx, k := tx.Reserve(uint32(min(n-sent, fl.Len(), 256)))
			for j := uint32(0); j < k; j++ {
				addr, _ := fl.Alloc()
				tx.Set(idx+j, Desc{Addr: addr, Len: uint32(l)})
			}
			tx.Submit(k)
			sent += int(k)
			if tx.NeedWakeup() {
				if err := s.Kick(); err != nil {
					break
				}
			}
			done += int(cq.Drain(fl, cq.Size()))
		}
		return done
	}
}

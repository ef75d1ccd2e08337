package topology

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"testing"

	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/tun"
)

// TunPeerOptions describe a kernel-peer topology. The zero value is the
// default.
type TunPeerOptions struct {
	// Prefix starts the namespace names (see Options.Prefix). Default "srn".
	Prefix string
	// MTU of the veth pair and of the TUN device. Default 1500.
	MTU int
	// TxQueueLen is the transmit queue length of the TUN device: how many
	// packets towards the engine the kernel holds while the engine is not
	// reading, before it drops. Default 1000, the kernel's default for
	// Ethernet-like devices (a TUN device starts with 500).
	TxQueueLen int
}

// TunPeer is a userspace network stack's test bench, with the Linux kernel as
// the stack's peer:
//
//	namespace Peer               namespace Engine                  this process
//	kernel sockets               router, ip_forward=1
//	192.0.2.1/24 veth-a ──veth── veth-b 192.0.2.2/24
//	198.51.100.0/24              198.51.100.0/24 dev tun0 ──TUN──  Dev: the engine,
//	  via 192.0.2.2                                                 198.51.100.2
//
// The engine's address, 198.51.100.2, is assigned to no interface: the kernel
// of Engine forwards packets for it out of tun0, so each one is a ReadPacket
// on Dev, and every packet the engine writes to Dev is forwarded to Peer.
// Engine is a plain router; the engine never runs inside it.
//
// Every packet between the kernel peer and the engine passes through the
// process that reads Dev, so impairments (loss, reordering, duplication,
// delay) are applied there: this machine's kernel has no sch_netem.
type TunPeer struct {
	// Peer is the namespace of the kernel's sockets; Peer.Link its veth end.
	Peer Host
	// Engine is the router between the veth pair and Dev.
	Engine Host
	// Dev is the TUN device, created in Engine and up.
	Dev *tun.Device
	// PeerAddr is the address of Peer's sockets, 192.0.2.1.
	PeerAddr netip.Addr
	// EngineAddr is the engine's own address, 198.51.100.2.
	EngineAddr netip.Addr
	// EngineNet is the prefix routed into Dev, 198.51.100.0/24
	// (RFC 5737 TEST-NET-2).
	EngineNet netip.Prefix

	pair *Pair
}

func (o *TunPeerOptions) setDefaults() {
	if o.MTU == 0 {
		o.MTU = 1500
	}
	if o.TxQueueLen == 0 {
		o.TxQueueLen = 1000
	}
}

// tunName is the name of the TUN device in Engine; the namespace is the
// test's own, so a fixed name cannot collide.
const tunName = "tun0"

// OpenTunPeer builds the topology drawn at TunPeer. On error nothing is left
// behind.
//
// Both veth ends have TX checksum offload, TSO, GSO and GRO off. With them on,
// the kernel would move 64 KB super-packets with partial checksums through the
// veth pair, or (GRO in Engine) merge segments back into one, and the engine
// would see aggregates rather than the segments of a real wire. Off, every
// skb is one MTU-sized packet with a full checksum. (Dev itself is
// opened without IFF_VNET_HDR, so the kernel segments and checksums anything
// it sends there in any case.)
func OpenTunPeer(opts TunPeerOptions) (_ *TunPeer, err error) {
	opts.setDefaults()
	pair, err := New(Options{
		Prefix: opts.Prefix,
		AddrA:  netip.MustParsePrefix("192.0.2.1/24"),
		AddrB:  netip.MustParsePrefix("192.0.2.2/24"),
		MTU:    opts.MTU,
	})
	if err != nil {
		return nil, err
	}
	tp := &TunPeer{
		Peer:       pair.A,
		Engine:     pair.B,
		PeerAddr:   pair.A.Addr.Addr(),
		EngineAddr: netip.MustParseAddr("198.51.100.2"),
		EngineNet:  netip.MustParsePrefix("198.51.100.0/24"),
		pair:       pair,
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, tp.Close())
		}
	}()

	// New turned off TX checksum offload, TSO and GSO; GRO too, here.
	for _, h := range []Host{tp.Peer, tp.Engine} {
		if err := run("ip", "netns", "exec", h.Namespace,
			"ethtool", "-K", h.Link, "tx", "off", "tso", "off", "gso", "off", "gro", "off"); err != nil {
			return nil, err
		}
	}
	if err := run("ip", "netns", "exec", tp.Engine.Namespace,
		"sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		return nil, err
	}
	if err := tp.Engine.Do(func() (err error) {
		tp.Dev, err = tun.Open(tunName)
		return err
	}); err != nil {
		return nil, err
	}
	// IPv6 off on tun0, so that its link-local address, router
	// solicitations and MLD reports do not reach the engine: what Dev
	// delivers is exactly what is routed to EngineNet.
	if _, err := os.Stat("/proc/sys/net/ipv6"); err == nil {
		if err := run("ip", "netns", "exec", tp.Engine.Namespace,
			"sysctl", "-qw", "net.ipv6.conf."+tunName+".disable_ipv6=1"); err != nil {
			return nil, err
		}
	}
	en := tp.EngineNet.String()
	for _, s := range [][]string{
		{"ip", "-n", tp.Engine.Namespace, "link", "set", tunName,
			"mtu", strconv.Itoa(opts.MTU), "txqueuelen", strconv.Itoa(opts.TxQueueLen), "up"},
		{"ip", "-n", tp.Engine.Namespace, "route", "add", en, "dev", tunName},
		{"ip", "-n", tp.Peer.Namespace, "route", "add", en, "via", tp.Engine.Addr.Addr().String()},
	} {
		if err := run(s[0], s[1:]...); err != nil {
			return nil, err
		}
	}
	return tp, nil
}

// NewTunPeer is OpenTunPeer for a test: it stops the test (skip outside CI,
// fail in CI) when the host lacks root, the tools or /dev/net/tun, and closes
// the topology when the test ends.
func NewTunPeer(t testing.TB, opts TunPeerOptions) *TunPeer {
	t.Helper()
	testenv.RequireRoot(t)
	for _, tool := range []string{"ip", "ethtool", "sysctl"} {
		testenv.RequireTool(t, tool)
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		testenv.Unmet(t, "needs /dev/net/tun (CONFIG_TUN): %v", err)
	}
	tp, err := OpenTunPeer(opts)
	if err != nil {
		t.Fatalf("topology: %v", err)
	}
	t.Cleanup(func() {
		if err := tp.Close(); err != nil {
			t.Errorf("topology cleanup: %v", err)
		}
	})
	return tp
}

// Close closes Dev (a ReadPacket blocked on it returns os.ErrClosed), then
// kills the processes in both namespaces and deletes them. Dev goes first: its
// descriptor holds a reference to Engine, which would otherwise outlive
// `ip netns del` unseen. It is safe to call twice.
func (tp *TunPeer) Close() error {
	var errs []error
	if tp.Dev != nil {
		if err := tp.Dev.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, fmt.Errorf("topology: close %s: %w", tunName, err))
		}
	}
	if err := tp.pair.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

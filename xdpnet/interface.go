package xdpnet

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/internal/ethtool"
)

// Check says, in words, what makes the interface unusable for cfg, before
// anything is attached to it.
func Check(cfg Config) (*net.Interface, error) { return checkInterface(cfg) }

// checkInterface says, in words, what makes the interface unusable. The
// coalescing check needs the XDP mode: it is made here for an explicit
// ModeGeneric, and by NewPoller once the program is attached otherwise.
func checkInterface(cfg Config) (*net.Interface, error) {
	if !cfg.Addr.Is4() {
		return nil, fmt.Errorf("%w: address %v is not IPv4", ErrInterface, cfg.Addr)
	}
	ifi, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrInterface, cfg.Interface, err)
	}
	if ifi.Flags&net.FlagUp == 0 {
		return nil, fmt.Errorf("%w: %s is down", ErrInterface, ifi.Name)
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("%w: %s has no Ethernet address", ErrInterface, ifi.Name)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, fmt.Errorf("%w: addresses of %s: %w", ErrInterface, ifi.Name, err)
	}
	found := false
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == cfg.Addr {
				found = true
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("%w: %v is not an address of %s", ErrInterface, cfg.Addr, ifi.Name)
	}
	mtu := ifi.MTU
	if cfg.TCP.MTU > mtu {
		return nil, fmt.Errorf("%w: TCP MTU %d above %s's MTU %d", ErrInterface, cfg.TCP.MTU, ifi.Name, mtu)
	}
	if cfg.TCP.MTU != 0 {
		mtu = cfg.TCP.MTU
	}
	if mtu+header.EthernetLen > frameSize {
		return nil, fmt.Errorf("%w: MTU %d does not fit a %d-octet UMEM frame", ErrInterface, mtu, frameSize)
	}
	// veth runs native XDP only with the peer's MTU ≤ 3506 (a page per
	// frame); the pair's MTUs are normally equal, so check ours here and
	// let bpf.Attach report the kernel's ERANGE otherwise.
	if cfg.Mode == bpf.ModeNative && ifi.MTU > vethNativeMaxMTU && driverName(ifi.Name) == "veth" {
		return nil, fmt.Errorf("%w: native XDP on veth needs MTU ≤ %d, %s has %d",
			ErrInterface, vethNativeMaxMTU, ifi.Name, ifi.MTU)
	}
	if err := checkCoalescing(ifi.Name, cfg.Mode); err != nil {
		return nil, err
	}
	return ifi, nil
}

const vethNativeMaxMTU = 3506

// driverName is the interface's driver, "" if unknown.
func driverName(ifname string) string {
	name, err := ethtool.Driver(ifname)
	if err != nil {
		return ""
	}
	return name
}

// RXQueues is the number of receive queues of an interface in the calling
// thread's network namespace (the rx or combined channels), 1 when the
// driver does not say.
func RXQueues(ifname string) int {
	ch, err := ethtool.GetChannels(ifname)
	if err != nil {
		return 1
	}
	return max(int(ch.RX), int(ch.Combined), 1)
}

// checkCoalescing refuses generic XDP on an interface that coalesces what
// it receives (GRO or LRO on): generic XDP runs after GRO, so the program
// would see super-packets that no AF_XDP frame holds, and the RNIC's
// connections would stall on drops. Native XDP runs before GRO. An
// interface whose features cannot be read passes.
func checkCoalescing(ifname string, mode bpf.Mode) error {
	if mode != bpf.ModeGeneric {
		return nil
	}
	if gro, err := ethtool.GRO(ifname); err == nil && gro {
		return fmt.Errorf("%w: generic XDP on %s with GRO on: coalesced segments do not fit AF_XDP frames; "+
			"turn it off (ethtool -K %s gro off) or use native XDP", ErrInterface, ifname, ifname)
	}
	if lro, err := ethtool.LRO(ifname); err == nil && lro {
		return fmt.Errorf("%w: generic XDP on %s with LRO on: coalesced segments do not fit AF_XDP frames; "+
			"turn it off (ethtool -K %s lro off) or use native XDP", ErrInterface, ifname, ifname)
	}
	return nil
}

package topology

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"

	"github.com/softrnic/softrnic/internal/tun"
)

// TunBridge is two namespaces whose only link is the process that holds
// their TUN devices:
//
//	namespace A                       this process                     namespace B
//	198.51.100.1/32 tun0 ──TUN── DevA  (pump, impairment)  DevB ──TUN── tun0 198.51.100.2/32
//
// Every packet A's kernel sends to AddrB is a ReadPacket on DevA; the
// process decides what becomes of it (WritePacket on DevB delivers it to
// B's kernel). The process may also stand in for either kernel: an engine
// using AddrA, fed what B sends, is A as far as B can tell. So a Linux ↔
// Linux stream and an engine ↔ Linux stream cross the same link, with
// the same impairment applied in the same place (the TCP loss benchmark,
// internal/lossgrid).
type TunBridge struct {
	A, B         Host
	DevA, DevB   *tun.Device
	AddrA, AddrB netip.Addr
	pair         *Pair
}

// OpenTunBridge builds the bridge with interfaces of the given MTU (0:
// 1500). On error nothing is left behind. Each TUN device queues 10,000
// packets towards the process (ten times a NIC's default): the pump is
// one goroutine on a shared machine, and the losses the benchmark
// measures are the impairment's, not its queue's.
func OpenTunBridge(prefix string, mtu int) (_ *TunBridge, err error) {
	if mtu == 0 {
		mtu = 1500
	}
	pair, err := New(Options{Prefix: prefix, NoLink: true})
	if err != nil {
		return nil, err
	}
	b := &TunBridge{A: pair.A, B: pair.B, pair: pair,
		AddrA: netip.MustParseAddr("198.51.100.1"), AddrB: netip.MustParseAddr("198.51.100.2")}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Close())
		}
	}()
	ends := []struct {
		h          *Host
		dev        **tun.Device
		self, peer netip.Addr
	}{{&b.A, &b.DevA, b.AddrA, b.AddrB}, {&b.B, &b.DevB, b.AddrB, b.AddrA}}
	for _, e := range ends {
		if err := e.h.Do(func() (err error) {
			*e.dev, err = tun.Open(tunName)
			return err
		}); err != nil {
			return nil, err
		}
		e.h.Link = tunName
		e.h.Addr = netip.PrefixFrom(e.self, 32)
		steps := [][]string{
			{"ip", "-n", e.h.Namespace, "addr", "add", e.h.Addr.String(), "dev", tunName},
			{"ip", "-n", e.h.Namespace, "link", "set", tunName, "mtu", strconv.Itoa(mtu), "txqueuelen", "10000", "up"},
			{"ip", "-n", e.h.Namespace, "route", "add", e.peer.String() + "/32", "dev", tunName},
		}
		if _, err := os.Stat("/proc/sys/net/ipv6"); err == nil {
			// No link-local address, router solicitations or MLD
			// reports: what the device carries is the test's IPv4.
			steps = append([][]string{{"ip", "netns", "exec", e.h.Namespace,
				"sysctl", "-qw", "net.ipv6.conf." + tunName + ".disable_ipv6=1"}}, steps...)
		}
		for _, s := range steps {
			if err := run(s[0], s[1:]...); err != nil {
				return nil, err
			}
		}
	}
	return b, nil
}

// Close closes both devices, then removes the namespaces and what runs in
// them. It is safe to call twice.
func (b *TunBridge) Close() error {
	var errs []error
	for _, d := range []*tun.Device{b.DevA, b.DevB} {
		if d != nil {
			if err := d.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
				errs = append(errs, fmt.Errorf("topology: close %s: %w", d.Name(), err))
			}
		}
	}
	if err := b.pair.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

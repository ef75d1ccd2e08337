package tun_test

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/internal/topology"
)

// An engine's test bench: the kernel of namespace Peer dials the engine's
// address and the engine reads the SYN from the TUN device. (Not run: it needs
// root. Tests use topology.NewTunPeer, which also cleans up.)
func Example() {
	tp, err := topology.OpenTunPeer(topology.TunPeerOptions{})
	if err != nil {
		panic(err)
	}
	defer tp.Close()

	go func() { // a kernel socket in Peer
		if c, err := tp.Peer.DialTCP(netip.AddrPortFrom(tp.EngineAddr, 7000), 5*time.Second); err == nil {
			c.Close()
		}
	}()

	buf := make([]byte, 1500) // the MTU
	tp.Dev.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := tp.Dev.ReadPacket(buf) // one IPv4 packet, no header in front
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d-byte IPv%d packet from %v\n", n, buf[0]>>4, net.IP(buf[12:16]))
	// The engine answers with tp.Dev.WritePacket(reply).
}

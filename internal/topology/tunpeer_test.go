package topology

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestTunPeerLayout(t *testing.T) {
	tp := NewTunPeer(t, TunPeerOptions{MTU: 1400})

	for _, c := range []struct {
		host Host
		args []string
		want []string
	}{
		{tp.Engine, []string{"ip", "link", "show", tp.Dev.Name()}, []string{"mtu 1400", "qlen 1000", ",UP"}},
		{tp.Engine, []string{"ip", "route", "show", "198.51.100.0/24"}, []string{"dev " + tp.Dev.Name()}},
		{tp.Engine, []string{"sysctl", "net.ipv4.ip_forward"}, []string{"= 1"}},
		{tp.Peer, []string{"ip", "route", "show", "198.51.100.0/24"}, []string{"via 192.0.2.2 dev " + tp.Peer.Link}},
		{tp.Peer, []string{"ip", "link", "show", tp.Peer.Link}, []string{"mtu 1400"}},
		{tp.Peer, []string{"ethtool", "-k", tp.Peer.Link}, offloadsOff},
		{tp.Engine, []string{"ethtool", "-k", tp.Engine.Link}, offloadsOff},
	} {
		out, err := c.host.Command(c.args[0], c.args[1:]...).CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v: %s", strings.Join(c.args, " "), err, out)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s in %s: want %q in\n%s", strings.Join(c.args, " "), c.host.Namespace, w, out)
			}
		}
	}
	if tp.PeerAddr.String() != "192.0.2.1" || tp.EngineAddr.String() != "198.51.100.2" ||
		tp.EngineNet.String() != "198.51.100.0/24" || tp.Engine.Addr.String() != "192.0.2.2/24" {
		t.Errorf("addresses: peer %v, engine %v in %v, router %v", tp.PeerAddr, tp.EngineAddr, tp.EngineNet, tp.Engine.Addr)
	}

	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{tp.Peer.Namespace, tp.Engine.Namespace} {
		if exists(ns) {
			t.Errorf("namespace %s survived Close", ns)
		}
	}
	if _, err := tp.Dev.ReadPacket(make([]byte, 1)); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Dev after Close: %v, want %v", err, os.ErrClosed)
	}
	if err := tp.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

var offloadsOff = []string{
	"tx-checksumming: off", "tcp-segmentation-offload: off",
	"generic-segmentation-offload: off", "generic-receive-offload: off",
}

package rnic

import (
	"strings"
	"testing"
)

// Dump describes each QP of a device with its connection: the engine's
// queues, and the kernel socket's or the TCP engine's state, on a
// connected pair of either datapath.
func TestDump(t *testing.T) {
	onBothDatapaths(t, func(t *testing.T, f *fabric) {
		srv, cli := f.hosts(t)
		attr := QPAttr{SQDepth: 4, RQDepth: 4, IRD: 4, ORD: 4}
		s, c := f.pair(t, srv, cli, attr, attr, nil)
		want := map[string]string{"kernel": "kernel socket inq=", "xdp": "engine "}[f.datapath]
		for _, side := range []struct {
			name string
			dev  *Device
			q    *QP
		}{{"server", srv.dev, s}, {"client", cli.dev, c}} {
			var line string
			for _, l := range side.dev.Dump() {
				if strings.HasPrefix(l, "qp "+itoa(side.q.qpn)+":") {
					line = l
				}
			}
			if line == "" || !strings.Contains(line, want) || !strings.Contains(line, "RTS") {
				t.Fatalf("%s: no line for QP %d with %q and RTS in %q", side.name, side.q.qpn, want, side.dev.Dump())
			}
			t.Logf("%s: %s", side.name, line)
		}
	})
}

func itoa(n uint32) string {
	var b [10]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			return string(b[i:])
		}
	}
}

package rnic

import (
	"fmt"
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
				if strings.HasPrefix(l, fmt.Sprintf("qp %d:", side.q.qpn)) {
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

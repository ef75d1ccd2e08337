package main

import (
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/mpadump"
	"github.com/softrnic/softrnic/mpa"
)

// --rev and --p2p hold each connection to the mode a make interop row's
// name claims: the revision of both startup frames, the RTR the Reply
// picked and the zero-length message the client began with.
func TestWantedMode(t *testing.T) {
	v2 := func(p2p bool, r mpa.RTR) *mpa.Frame {
		return &mpa.Frame{Revision: 2, Enhanced: true, PeerToPeer: p2p, RTR: r}
	}
	conn := func(req, rep *mpa.Frame, leading mpa.RTR) *mpadump.Conn {
		return &mpadump.Conn{Request: req, Reply: rep, ToServer: &mpadump.Dir{Leading: leading}, ToClient: &mpadump.Dir{}}
	}
	v1 := &mpa.Frame{Revision: 1}
	for _, c := range []struct {
		want    wanted
		c       *mpadump.Conn
		problem string // "" if none
	}{
		{wanted{rev: 1}, conn(v1, v1, 0), ""},
		{wanted{rev: 1}, conn(v2(false, 0), v2(false, 0), 0), "revision 2"},
		{wanted{rev: 1}, conn(v1, v2(false, 0), 0), "(Reply)"},
		{wanted{rev: 2, noP2P: true}, conn(v2(false, 0), v2(false, 0), 0), ""},
		{wanted{noP2P: true}, conn(v2(true, mpa.RTRWrite), v2(true, mpa.RTRWrite), mpa.RTRWrite), "peer-to-peer, expected not"},
		{wanted{rtr: mpa.RTRRead}, conn(v2(true, mpa.RTRRead|mpa.RTRWrite), v2(true, mpa.RTRRead), mpa.RTRRead), ""},
		{wanted{rtr: mpa.RTRRead}, conn(v2(true, mpa.RTRRead|mpa.RTRWrite), v2(true, mpa.RTRWrite), mpa.RTRWrite), "expected peer-to-peer with RTR read"},
		{wanted{rtr: mpa.RTRRead}, conn(v2(true, mpa.RTRRead), v2(true, mpa.RTRRead), 0), "first message"},
		{wanted{rtr: mpa.RTRWrite}, conn(v2(false, 0), v2(false, 0), 0), "expected peer-to-peer"},
	} {
		got := c.want.mode(c.c)
		if c.problem == "" && got != "" || c.problem != "" && !strings.Contains(got, c.problem) {
			t.Errorf("%+v on %+v / %+v: %q, want %q", c.want, *c.c.Request, *c.c.Reply, got, c.problem)
		}
	}
}

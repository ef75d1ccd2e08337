package tcp_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
)

// Randomized runs: many seeds, each drawing a link (delay, jitter, rate,
// queue, loss, reordering, duplication, corruption) and options (CC, SACK,
// timestamps, window scaling, buffers), moving data both ways and closing.
// Every run must deliver both streams byte-exact and tear down cleanly.
func TestRandomized(t *testing.T) {
	seeds := 60
	if testing.Short() {
		seeds = 15
	}
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		rng := newRand(seed)
		o := tcp.Options{
			CongestionControl:  []string{"cubic", "newreno"}[rng.IntN(2)],
			DisableSACK:        rng.IntN(4) == 0,
			DisableTimestamps:  rng.IntN(4) == 0,
			DisableWindowScale: rng.IntN(6) == 0,
			SendBuffer:         []int{16 << 10, 256 << 10, 4 << 20}[rng.IntN(3)],
			ReceiveBuffer:      []int{16 << 10, 256 << 10, 4 << 20}[rng.IntN(3)],
			TimeWait:           2 * time.Second,
		}
		link := func() *sim.Link {
			l := &sim.Link{
				Delay:  time.Duration(rng.IntN(20_000)) * time.Microsecond,
				Jitter: time.Duration(rng.IntN(2_000)) * time.Microsecond,
			}
			if rng.IntN(2) == 0 {
				l.Rate = int64(10+rng.IntN(990)) * 1e6
				l.Queue = 20_000 + rng.IntN(200_000)
			}
			switch rng.IntN(4) {
			case 0:
			case 1:
				l.Loss = rng.Float64() * 0.05
			default:
				l.Loss = rng.Float64() * 0.03
				l.Reorder = rng.Float64() * 0.03
				l.Duplicate = rng.Float64() * 0.02
				l.Corrupt = rng.Float64() * 0.01
			}
			return l
		}
		ab, ba := link(), link()
		up := uint64(rng.IntN(3 << 20))
		down := uint64(rng.IntN(1 << 20))
		name := fmt.Sprintf("seed %d (%s sack=%v ts=%v ws=%v snd=%d rcv=%d; up %d loss %.3f reord %.3f dup %.3f corrupt %.3f rate %d; down %d loss %.3f)",
			seed, o.CongestionControl, !o.DisableSACK, !o.DisableTimestamps, !o.DisableWindowScale, o.SendBuffer, o.ReceiveBuffer,
			up, ab.Loss, ab.Reorder, ab.Duplicate, ab.Corrupt, ab.Rate, down, ba.Loss)
		p := newPair(t, seed, o, ab, ba, up, down, true)
		ok := p.net.Run(30*time.Minute, func() bool { return p.done(true) })
		p.check(t, name)
		if !ok {
			t.Fatalf("%s: not done: client sent %d recvd %d closed %v (%v), server sent %d recvd %d closed %v",
				name, p.client.Sent, p.client.Recvd, p.client.Closed, p.cconn.State(), p.server.Sent, p.server.Recvd, p.server.Closed)
		}
		if p.client.Err != nil || p.server.Err != nil {
			t.Fatalf("%s: closed with errors %v / %v", name, p.client.Err, p.server.Err)
		}
		cs, ss := p.cconn.Stats, p.server.Conn.Stats
		t.Logf("%s: %.1fs simulated; AB %+v; BA %+v; client retrans %d fast %d rto %d; server retrans %d fast %d rto %d; bad checksums %d/%d",
			name, float64(p.net.Now)/1e9, ab.Stats, ba.Stats, cs.Retransmits, cs.FastRetransmits, cs.RTOs, ss.Retransmits, ss.FastRetransmits, ss.RTOs,
			p.net.A.Stack.Stats.BadChecksum, p.net.B.Stack.Stats.BadChecksum)
		p.net.RunFor(5 * time.Second) // past TIME-WAIT
		if n := p.net.A.Stack.Conns() + p.net.B.Stack.Conns(); n != 0 {
			t.Fatalf("%s: %d connections left after TIME-WAIT", name, n)
		}
	}
}

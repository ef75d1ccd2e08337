package rnic

import (
	"fmt"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/tcp"
)

// Dump describes every QP of the device, one line each: the QP engine's
// queues, the device QP's connection state, and its connection's (the
// kernel socket's, or the TCP engine's on its poller). It is for finding
// a connection that stopped: softrnicd logs it on SIGUSR1. It takes each
// lock on its own, never one inside another.
func (d *Device) Dump() []string {
	d.mu.Lock()
	qps := make([]*QP, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	d.mu.Unlock()
	slices.SortFunc(qps, func(a, b *QP) int { return int(a.qpn) - int(b.qpn) })
	out := make([]string, 0, len(qps))
	for _, q := range qps {
		q.mu.Lock()
		line := fmt.Sprintf("qp %d: %s; batch=%d batchKick=%v abort=%v accepting=%v", q.qpn, q.eng.Diag(), q.batch, q.batchKick, q.abort, q.accepting)
		c := q.conn
		q.mu.Unlock()
		if c != nil {
			line += "; " + c.diag()
		}
		out = append(out, line)
	}
	return out
}

func (kc *kernelConn) diag() string {
	inq, outq := -1, -1
	_ = kc.rc.Control(func(fd uintptr) {
		if n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil {
			inq = n
		}
		if n, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ); err == nil {
			outq = n
		}
	})
	q := kc.lock()
	defer kc.unlock(q)
	return fmt.Sprintf("kernel socket inq=%d outq=%d txBusy=%v txAgain=%v finWanted=%v finSent=%v rxDone=%v closed=%v parked=%v idleOK=%v err=%v mpa ready=%v sent=%d unwritten=%d",
		inq, outq, kc.txBusy, kc.txAgain, kc.finWanted, kc.finSent, kc.rxDone, kc.closed, kc.idleID != 0, kc.idleOK.Load(), kc.err,
		kc.llp.Ready(), kc.llp.sent, kc.llp.unwritten)
}

// dumpWait bounds how long Dump waits for a poller to describe its
// connection: a stopped loop must not stop the dump.
const dumpWait = time.Second

func (ec *engineConn) diag() string {
	res := make(chan string, 1)
	go func() {
		err := ec.poller().Do(func(_ *tcp.Stack, now tcp.Time) {
			if ec.conn == nil {
				res <- fmt.Sprintf("engine: no TCP connection yet dead=%v", ec.dead)
				return
			}
			res <- fmt.Sprintf("engine %s dead=%v queued=%v", ec.conn.Diag(now), ec.dead, ec.queued.Load())
		})
		if err != nil {
			res <- fmt.Sprintf("engine: poller %s: %v", ec.poller().Name(), err) // stopped
		}
	}()
	select {
	case s := <-res:
		return s
	case <-time.After(dumpWait):
		return fmt.Sprintf("engine: poller %s did not answer within %v", ec.poller().Name(), dumpWait)
	}
}

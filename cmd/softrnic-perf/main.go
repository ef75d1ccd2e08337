// Command softrnic-perf measures softrnic the way perftest measures RDMA
// NICs: bandwidth and latency of RDMA Write, RDMA Read, Send and atomics,
// with perftest's flags and output columns.
//
//	softrnic-perf TEST [flags]          server (waits for one client)
//	softrnic-perf TEST [flags] SERVER   client (SERVER is host or host:port)
//
// TEST is write_bw, write_lat, read_bw, read_lat, send_bw, send_lat or
// atomic_lat. Both sides run the same TEST; the client says which in its
// connection request and the server's accept advertises its buffer.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
)

// peakWindow is the shortest interval a peak bandwidth is measured over.
const peakWindow = 20 * time.Millisecond

// maxQPs bounds -q: each queue pair is a connection with its own queues.
const maxQPs = 64

// The tests, numbered as the client's request names them.
const (
	writeBW = iota + 1
	writeLat
	readBW
	readLat
	sendBW
	sendLat
	atomicLat
)

var tests = map[string]int{"write_bw": writeBW, "write_lat": writeLat, "read_bw": readBW, "read_lat": readLat, "send_bw": sendBW, "send_lat": sendLat, "atomic_lat": atomicLat}

type opts struct {
	test       string
	size       int
	all        bool
	iters      int
	duration   time.Duration
	qps        int
	port       int
	depth      int
	gbits      bool
	socket     string
	verify     bool
	jsonOut    bool
	server     string
	noCRC      bool
	mpaRev     int
	p2p        bool
	rtrArg     string
	rtr        client.RTR
	timeout    time.Duration
	isLatency  bool
	bufSize    int
	testNumber int
	perftest   bool
	busy       bool
	polled     bool
}

// Result is one line of output (and of --json).
type Result struct {
	Test        string  `json:"test"`
	Bytes       int     `json:"bytes"`
	Iterations  int     `json:"iterations"`
	BWPeakMBps  float64 `json:"bw_peak_MBps,omitempty"`
	BWAvgMBps   float64 `json:"bw_avg_MBps,omitempty"`
	MsgRateMpps float64 `json:"msg_rate_Mpps,omitempty"`
	TMinUs      float64 `json:"t_min_us,omitempty"`
	TMaxUs      float64 `json:"t_max_us,omitempty"`
	TTypUs      float64 `json:"t_typical_us,omitempty"`
	TAvgUs      float64 `json:"t_avg_us,omitempty"`
	TStdevUs    float64 `json:"t_stdev_us,omitempty"`
	P99Us       float64 `json:"p99_us,omitempty"`
	P999Us      float64 `json:"p99_9_us,omitempty"`
	Verified    bool    `json:"verified,omitempty"`
}

func main() {
	if len(os.Args) < 2 || tests[os.Args[1]] == 0 {
		fmt.Fprintln(os.Stderr, "usage: softrnic-perf write_bw|write_lat|read_bw|read_lat|send_bw|send_lat|atomic_lat [flags] [SERVER]")
		os.Exit(2)
	}
	o := opts{test: os.Args[1], testNumber: tests[os.Args[1]]}
	o.isLatency = strings.HasSuffix(o.test, "_lat")
	fs := newFlagSet(&o, flag.ExitOnError)
	_ = fs.Parse(os.Args[2:])
	if fs.NArg() > 1 || o.qps < 1 || o.qps > maxQPs || o.size < 1 || o.size > 8<<20 || o.depth < 1 {
		fmt.Fprintf(os.Stderr, "softrnic-perf: bad arguments (one SERVER at most, -q 1..%d, -s 1..8388608, -t >= 1)\n", maxQPs)
		os.Exit(2)
	}
	if err := o.checkMPA(); err != nil {
		fmt.Fprintln(os.Stderr, "softrnic-perf:", err)
		os.Exit(2)
	}
	if o.qps > 1 && (o.isLatency || o.perftest) {
		fmt.Fprintln(os.Stderr, "softrnic-perf: -q above 1 is for the bandwidth tests, without --perftest")
		os.Exit(2)
	}
	if o.testNumber == atomicLat {
		o.size = 8
	}
	if o.isLatency && os.Getenv("GOMAXPROCS") == "" {
		// A latency test is one loop, as perftest's are: the runtime's
		// other processors would only wake threads for nothing, which
		// on a machine whose cores the RNIC shares costs its threads
		// the processor they need when a message arrives (measured on
		// two cores: 8 B Write round trips bimodal, 20-25 or 50-90 us,
		// with two; mostly the lower with one).
		runtime.GOMAXPROCS(1)
	}
	if o.iters == 0 {
		o.iters = 5000
		if o.isLatency {
			o.iters = 1000
		}
	}
	o.server = fs.Arg(0)
	o.bufSize = 2 * o.size
	if o.all {
		o.bufSize = 16 << 20
	}
	if o.perftest {
		// perftest's cycle buffer, then the control area at the end.
		o.bufSize = max(2*o.size, 2*ptCycle) + 3*ptCtlBuf
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	var err error
	switch {
	case o.perftest:
		err = runPerftest(ctx, &o)
	case o.server == "":
		err = runServer(ctx, &o)
	default:
		err = runClient(ctx, &o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic-perf:", err)
		os.Exit(1)
	}
}

// peer holds one side's resources: a data buffer (the measured region)
// and a control area for latency ping-pongs and sends.
type peer struct {
	o                        *opts
	ia                       *client.IA
	pz                       *client.PZ
	buf                      *client.Buffer
	lmr                      *client.LMR
	sends, recvs, conn, reqs *client.EVD
	ep                       *client.EP
	remote                   client.RemoteBuffer
	remoteSize               int
}

func setup(ctx context.Context, o *opts) (*peer, error) {
	ia, err := client.Open(ctx, client.Options{Socket: o.socket, Name: "softrnic-perf"})
	if err != nil {
		return nil, err
	}
	p := &peer{o: o, ia: ia}
	pz, err := ia.CreatePZ()
	if err != nil {
		return nil, err
	}
	p.pz = pz
	if p.buf, err = ia.Alloc(o.bufSize); err != nil {
		return nil, err
	}
	if p.lmr, err = pz.RegisterLMR(p.buf, client.LocalWrite|client.RemoteWrite|client.RemoteRead|client.RemoteAtomic); err != nil {
		return nil, err
	}
	return p, p.createEP()
}

// another is one more queue pair for -q: the same IA, PZ and buffer, its
// own event queues and EP.
func (p *peer) another() (*peer, error) {
	q := &peer{o: p.o, ia: p.ia, pz: p.pz, buf: p.buf, lmr: p.lmr}
	return q, q.createEP()
}

func (p *peer) createEP() error {
	o := p.o
	depth := max(o.depth, 64)
	if o.perftest {
		depth = max(depth, 512/4) // room for perftest send_bw's receive depth
	}
	var err error
	for _, e := range []struct {
		p     **client.EVD
		kind  client.EVDKind
		depth int
	}{{&p.sends, client.DTOEvents, 4 * depth}, {&p.recvs, client.DTOEvents, 4 * depth}, {&p.conn, client.ConnectionEvents, 8}, {&p.reqs, client.CREvents, 8}} {
		if *e.p, err = p.ia.CreateEVD(client.EVDOptions{Depth: e.depth, Kind: e.kind}); err != nil {
			return err
		}
	}
	p.ep, err = p.ia.CreateEP(client.EPAttr{PZ: p.pz, RecvEVD: p.recvs, RequestEVD: p.sends, ConnectEVD: p.conn,
		SQDepth: 2 * depth, RQDepth: 4 * depth, IRD: 32, ORD: 32, NoCRC: o.noCRC, MPARevision: o.mpaRev, PeerToPeer: o.p2p, RTR: o.rtr})
	return err
}

// checkMPA checks the MPA options and reads --rtr.
func (o *opts) checkMPA() error {
	switch {
	case o.mpaRev != 1 && o.mpaRev != 2:
		return fmt.Errorf("--mpa-rev %d: 1 or 2", o.mpaRev)
	case o.p2p && o.mpaRev == 1:
		return errors.New("--p2p needs MPA revision 2: revision 1 has no peer-to-peer model")
	case o.rtrArg != "" && !o.p2p:
		return errors.New("--rtr needs --p2p")
	case o.rtrArg == "":
		return nil
	}
	var err error
	o.rtr, err = client.ParseRTR(o.rtrArg)
	return err
}

func (p *peer) waitConn(ctx context.Context) (client.ConnEvent, error) {
	ev, err := p.conn.Wait(ctx)
	return ev.Conn, err
}

func reap(ctx context.Context, e *client.EVD) (client.Event, error) {
	ev, err := e.Wait(ctx)
	return ev, failed(ev, err)
}

// failed turns an unsuccessful completion into an error.
func failed(ev client.Event, err error) error {
	if err == nil && ev.Status != completion.Success {
		err = fmt.Errorf("completion %d: %v (cause %v)", ev.Cookie, ev.Status, ev.Cause)
	}
	return err
}

// poll takes e's next event as the latency tests of perftest take their
// completions, by polling, with pause between looks; reap sleeps instead.
func (o *opts) poll(ctx context.Context, e *client.EVD) (client.Event, error) {
	for {
		ev, ok, err := e.Dequeue()
		if ok || err != nil {
			return ev, err
		}
		if err := ctx.Err(); err != nil {
			return ev, err
		}
		o.pause()
	}
}

// reapPolled is reap by poll.
func (o *opts) reapPolled(ctx context.Context, e *client.EVD) (client.Event, error) {
	ev, err := o.poll(ctx, e)
	return ev, failed(ev, err)
}

// The client's request names the test, its queue pair count and sizes and
// advertises its own buffer (for write_lat); the server's accept
// advertises the server's.
func request(o *opts, p *peer) []byte {
	b := make([]byte, 28)
	b[0] = byte(o.testNumber)
	b[1] = byte(o.qps)
	binary.BigEndian.PutUint32(b[4:], uint32(o.bufSize))
	binary.BigEndian.PutUint32(b[8:], uint32(o.iters))
	binary.BigEndian.PutUint32(b[12:], uint32(o.size))
	binary.BigEndian.PutUint32(b[16:], p.lmr.Context)
	binary.BigEndian.PutUint64(b[20:], p.lmr.Address(0))
	return b
}

func runServer(ctx context.Context, o *opts) error {
	p, err := setup(ctx, o)
	if err != nil {
		return err
	}
	defer p.ia.Close()
	if _, err := p.ia.CreatePSP(uint16(o.port), p.reqs, false); err != nil {
		return err
	}
	if !o.jsonOut {
		fmt.Printf("************************************\n* Waiting for client to connect... *\n************************************\n")
	}
	fillPattern(p.buf.Bytes, 0)
	// With -q the client makes that many connections to the one port; the
	// queue pairs share the buffer and are served side by side.
	qps := []*peer{p}
	for i := 0; i < o.qps; i++ {
		q := p
		if i > 0 {
			if q, err = p.another(); err != nil {
				return err
			}
			qps = append(qps, q)
		}
		if err := p.acceptInto(ctx, q); err != nil {
			return err
		}
	}
	return eachQP(ctx, qps, func(ctx context.Context, _ int, q *peer) error { return q.serve(ctx) })
}

// acceptInto takes the next connection request from p's PSP onto q.
func (p *peer) acceptInto(ctx context.Context, q *peer) error {
	o := p.o
	ev, err := p.reqs.Wait(ctx)
	if err != nil {
		return err
	}
	info, err := ev.CR.Query()
	if err != nil {
		return err
	}
	if len(info.PrivateData) < 28 || int(info.PrivateData[0]) != o.testNumber {
		_ = ev.CR.Reject([]byte("test mismatch"))
		return fmt.Errorf("client asked for a different test")
	}
	if n := int(info.PrivateData[1]); n != o.qps {
		_ = ev.CR.Reject([]byte("queue pair count mismatch"))
		return fmt.Errorf("the client runs -q %d: run the server with -q %d", n, n)
	}
	if need := int(binary.BigEndian.Uint32(info.PrivateData[4:])); need > o.bufSize {
		_ = ev.CR.Reject([]byte("buffer too small"))
		return fmt.Errorf("client needs a %d-octet buffer: run the server with the same -s or -a", need)
	}
	o.size = int(binary.BigEndian.Uint32(info.PrivateData[12:]))
	q.remote = client.RemoteBuffer{Context: binary.BigEndian.Uint32(info.PrivateData[16:]), Address: binary.BigEndian.Uint64(info.PrivateData[20:])}
	// Receives for send tests, posted before accepting.
	if o.testNumber == sendBW || o.testNumber == sendLat {
		// iWARP has no RNR retry: a Send that finds no buffer ends the
		// connection. Four windows of receives, reposted as they fill.
		for i := 0; i < 4*o.depth; i++ {
			if err := q.postRecv(i); err != nil {
				return err
			}
		}
	}
	var adv [16]byte
	binary.BigEndian.PutUint32(adv[0:], q.lmr.Context)
	binary.BigEndian.PutUint64(adv[4:], q.lmr.Address(0))
	binary.BigEndian.PutUint32(adv[12:], uint32(o.bufSize))
	if err := ev.CR.Accept(q.ep, adv[:]); err != nil {
		return err
	}
	if c, err := q.waitConn(ctx); err != nil || c != client.Established {
		return fmt.Errorf("accept: %v %v", c, err)
	}
	return nil
}

// serve is the server's part of the test on one connection.
func (p *peer) serve(ctx context.Context) error {
	switch p.o.testNumber {
	case sendBW:
		return p.serveSends(ctx, false)
	case sendLat:
		return p.serveSends(ctx, true)
	case writeLat:
		return p.serveWriteLat(ctx)
	}
	// Bandwidth and read/atomic tests need nothing of the server's CPU:
	// wait for the client to leave.
	for {
		c, err := p.waitConn(ctx)
		if err != nil {
			return err
		}
		if c == client.Disconnected || c == client.Broken {
			return nil
		}
	}
}

// eachQP runs f for every queue pair at once and returns the first error;
// an error cancels the others' context, so none waits on a dead test.
func eachQP(ctx context.Context, qps []*peer, f func(context.Context, int, *peer) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(qps))
	for i, q := range qps {
		go func() { errs <- f(ctx, i, q) }()
	}
	var first error
	for range qps {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

// recvSlot is where receive i lands: 64 slots if the data area holds
// them. In --perftest mode the control area and credit word at the end of
// the buffer are not data area: a Send must never land on them.
func (p *peer) recvSlot(i int) uint64 {
	data := p.o.bufSize
	if p.o.perftest {
		data -= 3*ptCtlBuf + ptCacheLine
	}
	if p.o.size*64 > data {
		return 0
	}
	return uint64(i%64) * uint64(p.o.size)
}

func (p *peer) postRecv(i int) error {
	return p.ep.PostRecv(uint64(i), []client.Segment{{LMR: p.lmr, Offset: p.recvSlot(i), Length: uint32(p.o.size)}})
}

// creditWindow is how many receives one credit Send stands for.
const creditWindow = 64

// serveSends reposts a receive for every Send; in latency mode it answers
// each with a Send.
func (p *peer) serveSends(ctx context.Context, pong bool) error {
	// send_lat's pong polls as its client does.
	wait := p.recvs.Wait
	if pong {
		wait = func(ctx context.Context) (client.Event, error) { return p.o.poll(ctx, p.recvs) }
	}
	n := 0
	for {
		ev, err := wait(ctx)
		if err != nil {
			return err
		}
		if ev.Status == completion.FlushError {
			return nil // the client is done
		}
		if ev.Status != completion.Success {
			return fmt.Errorf("receive: %v", ev.Status)
		}
		// Every Send carries the pattern's first message.
		if slot := p.recvSlot(int(ev.Cookie)); p.o.verify && !checkPattern(p.buf.Bytes[slot:slot+uint64(ev.Length)], 0) {
			return fmt.Errorf("receive %d: data differs from the pattern", n)
		}
		if err := p.postRecv(n + 4*p.o.depth); err != nil {
			return err
		}
		n++
		// A credit every creditWindow receives tells the client those
		// buffers are posted again.
		if !pong && n%creditWindow == 0 {
			if err := p.ep.PostSend(uint64(n), nil, 0); err != nil {
				return err
			}
		}
		if pong {
			if err := p.ep.PostSend(uint64(n), []client.Segment{{LMR: p.lmr, Length: uint32(p.o.size)}}, client.Signaled); err != nil {
				return err
			}
			if _, err := p.o.reapPolled(ctx, p.sends); err != nil {
				return err
			}
		}
	}
}

// serveWriteLat mirrors perftest write_lat: watch the last octet of our
// buffer for the client's next counter, then write the same to it.
func (p *peer) serveWriteLat(ctx context.Context) error {
	last := (*uint8)(unsafe.Pointer(&p.buf.Bytes[p.o.size-1]))
	var seen uint8
	for i := 0; ctx.Err() == nil; i++ {
		want := uint8(i + 1)
		for atomicLoad8(last) != want {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			p.o.pause()
			if ev, ok, _ := p.conn.Dequeue(); ok && (ev.Conn == client.Disconnected || ev.Conn == client.Broken) {
				return nil
			}
		}
		seen = want
		p.buf.Bytes[p.o.size+p.o.size-1] = seen
		if err := p.ep.PostWrite(uint64(i), []client.Segment{{LMR: p.lmr, Offset: uint64(p.o.size), Length: uint32(p.o.size)}},
			p.remote, 0); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// pause is the latency tests' breath between two looks at memory or at
// an EVD: unless --busy, it yields the processor (sched_yield; on an idle
// core it returns at once). The RNIC here is software whose pollers share
// the cores: a process that spins without yielding can keep the poller it
// waits for, or its peer's process, off a shared core for a whole
// scheduler slice (milliseconds of tail latency on two cores).
func (o *opts) pause() {
	if !o.busy {
		_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
}

// atomicLoad8 reads the octet at p through an atomic load of its aligned
// 8-octet word: the daemon writes the memory from another process.
func atomicLoad8(p *uint8) uint8 {
	off := uintptr(unsafe.Pointer(p)) & 7
	w := atomic.LoadUint64((*uint64)(unsafe.Add(unsafe.Pointer(p), -int(off))))
	return uint8(w >> (8 * off))
}

func runClient(ctx context.Context, o *opts) error {
	p, err := setup(ctx, o)
	if err != nil {
		return err
	}
	defer p.ia.Close()
	addr := o.server
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(addr, strconv.Itoa(o.port))
	}
	fillPattern(p.buf.Bytes, 0)
	qps := []*peer{p}
	for i := 1; i < o.qps; i++ {
		q, err := p.another()
		if err != nil {
			return err
		}
		qps = append(qps, q)
	}
	// One at a time: the server takes the requests in order.
	for _, q := range qps {
		if err := q.connect(ctx, addr); err != nil {
			return err
		}
	}

	sizes := []int{o.size}
	if o.all {
		sizes = nil
		for s := 2; s <= 8<<20; s *= 2 {
			sizes = append(sizes, s)
		}
	}
	var results []Result
	if !o.jsonOut {
		header(o)
	}
	for _, size := range sizes {
		if size > p.remoteSize {
			return fmt.Errorf("server buffer of %d octets too small for %d", p.remoteSize, size)
		}
		r, err := runQPs(ctx, qps, size)
		if err != nil {
			return err
		}
		results = append(results, r)
		if !o.jsonOut {
			line(o, &r)
		}
	}
	if o.jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(results)
	} else {
		fmt.Println(strings.Repeat("-", 87))
	}
	for _, q := range qps {
		_ = q.ep.Disconnect(true)
	}
	for _, q := range qps {
		_, _ = q.waitConn(ctx)
	}
	return nil
}

// connect makes p's connection and learns the server's buffer.
func (p *peer) connect(ctx context.Context, addr string) error {
	if err := p.ep.Connect(addr, request(p.o, p), 10*time.Second); err != nil {
		return err
	}
	c, err := p.waitConn(ctx)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", addr, err)
	}
	if c == client.PeerRejected {
		return fmt.Errorf("connect to %s: the server refused (another test, -q or a smaller -s than ours? its output says which)", addr)
	}
	if c != client.Established {
		return fmt.Errorf("connect to %s: %v", addr, c)
	}
	info, err := p.ep.Query()
	if err != nil {
		return err
	}
	if len(info.PrivateData) != 16 {
		return errors.New("server did not advertise a buffer")
	}
	p.remote = client.RemoteBuffer{Context: binary.BigEndian.Uint32(info.PrivateData), Address: binary.BigEndian.Uint64(info.PrivateData[4:])}
	p.remoteSize = int(binary.BigEndian.Uint32(info.PrivateData[12:]))
	return nil
}

// runQPs runs one size on every queue pair at once. As perftest reports
// -q, average bandwidth and message rate are the sums over the queue pairs
// and the iterations are per queue pair; verification must hold on each.
// Per-pair peaks need not coincide, so the peak is the larger of the
// summed average and the best single pair's peak, never their sum.
func runQPs(ctx context.Context, qps []*peer, size int) (Result, error) {
	if len(qps) == 1 {
		return qps[0].run(ctx, size)
	}
	rs := make([]Result, len(qps))
	err := eachQP(ctx, qps, func(ctx context.Context, i int, q *peer) error {
		var err error
		rs[i], err = q.run(ctx, size)
		return err
	})
	sum := rs[0]
	for _, r := range rs[1:] {
		sum.BWPeakMBps = max(sum.BWPeakMBps, r.BWPeakMBps)
		sum.BWAvgMBps += r.BWAvgMBps
		sum.MsgRateMpps += r.MsgRateMpps
		sum.Iterations = min(sum.Iterations, r.Iterations)
		sum.Verified = sum.Verified && r.Verified
	}
	sum.BWPeakMBps = max(sum.BWPeakMBps, sum.BWAvgMBps)
	return sum, err
}

func (p *peer) run(ctx context.Context, size int) (Result, error) {
	o := p.o
	r := Result{Test: o.test, Bytes: size, Iterations: o.iters}
	switch o.testNumber {
	case writeBW, readBW, sendBW:
		return p.bandwidth(ctx, size, r)
	default:
		return p.latency(ctx, size, r)
	}
}

// bandwidth keeps up to -t requests in flight, signalling each one so that
// per-window rates give the peak.
func (p *peer) bandwidth(ctx context.Context, size int, r Result) (Result, error) {
	o := p.o
	depth := o.depth
	switch o.testNumber {
	case readBW:
		depth = min(depth, 32) // ORD
	case sendBW:
		depth = max(1, depth/2) // well inside the server's receives
	}
	slots := max(1, min(p.remoteSize, o.bufSize)/size)
	post := func(i int) error {
		off := uint64(i%slots) * uint64(size)
		seg := client.Segment{LMR: p.lmr, Offset: off, Length: uint32(size)}
		rb := client.RemoteBuffer{Context: p.remote.Context, Address: p.remote.Address + off}
		switch o.testNumber {
		case writeBW:
			return p.ep.PostWrite(uint64(i), []client.Segment{seg}, rb, client.Signaled)
		case readBW:
			return p.ep.PostRead(uint64(i), seg, rb, client.Signaled)
		}
		seg.Offset = 0 // every Send carries the pattern's first message
		return p.ep.PostSend(uint64(i), []client.Segment{seg}, client.Signaled)
	}
	// send_bw: credits from the server bound the Sends in flight to the
	// receives it has posted (4 windows of -t), less one credit window.
	credits, maxAhead := 0, 4*o.depth-creditWindow
	if o.testNumber == sendBW {
		for i := 0; i < 16; i++ {
			if err := p.ep.PostRecv(uint64(i), nil); err != nil {
				return r, err
			}
		}
	}
	iters := o.iters
	deadline := time.Time{}
	if o.duration > 0 {
		iters = math.MaxInt32
		deadline = time.Now().Add(o.duration)
	}
	pr := newProgress(fmt.Sprintf("%s %d B", o.test, size), o.iters, o.duration)
	defer pr.end()
	start := time.Now()
	winStart, winDone, peak := start, 0, 0.0
	posted, done := 0, 0
	for done < iters {
		for posted < iters && posted-done < depth && (deadline.IsZero() || time.Now().Before(deadline)) {
			if o.testNumber == sendBW && posted-credits*creditWindow >= maxAhead {
				// Take the credits that have come; wait for one
				// only if nothing else can make progress.
				ev, ok, err := p.recvs.Dequeue()
				if err != nil {
					return r, err
				}
				if !ok && posted == done {
					if ev, err = reap(ctx, p.recvs); err != nil {
						return r, err
					}
					ok = true
				}
				if !ok {
					break
				}
				if ev.Status != completion.Success {
					return r, fmt.Errorf("credit: %v", ev.Status)
				}
				credits++
				if err := p.ep.PostRecv(ev.Cookie, nil); err != nil {
					return r, err
				}
				continue
			}
			if err := post(posted); err != nil {
				return r, err
			}
			posted++
		}
		if posted == done {
			break // duration over
		}
		var err error
		if p.o.polled {
			_, err = p.o.reapPolled(ctx, p.sends)
		} else {
			_, err = reap(ctx, p.sends)
		}
		if err != nil {
			return r, err
		}
		done++
		pr.update(done)
		// The peak is the best rate over windows of at least
		// peakWindow: completions come from the daemon's ring in bursts,
		// and a window of a burst alone would measure the ring, not the
		// wire.
		if done-winDone >= depth {
			if d := time.Since(winStart); d >= peakWindow {
				peak = max(peak, float64((done-winDone)*size)/d.Seconds())
				winStart, winDone = time.Now(), done
			}
		}
	}
	elapsed := time.Since(start).Seconds()
	r.Iterations = done
	r.BWAvgMBps = float64(done*size) / elapsed / 1e6
	r.BWPeakMBps = max(peak/1e6, r.BWAvgMBps)
	r.MsgRateMpps = float64(done) / elapsed / 1e6
	// Sends are checked by the server as they arrive (its --verify); the
	// client has nothing of them to check and claims nothing.
	if o.verify && o.testNumber != sendBW {
		ok, err := p.verify(ctx, size, slots)
		if err != nil {
			return r, err
		}
		if !ok {
			return r, fmt.Errorf("%s %d B: data verification failed", o.test, size)
		}
		r.Verified = true
	}
	return r, nil
}

// verify checks what moved: for Writes it reads the server's buffer back;
// for Reads and Sends the pattern came from the server, already in place.
func (p *peer) verify(ctx context.Context, size, slots int) (bool, error) {
	n := min(slots, 8) * size
	switch p.o.testNumber {
	case writeBW:
		scratch := p.buf.Bytes[p.o.bufSize-n:]
		if p.o.bufSize < 2*n {
			return bytesEqualPattern(p, ctx, size)
		}
		clear(scratch)
		if err := p.ep.PostRead(1<<40, client.Segment{LMR: p.lmr, Offset: uint64(p.o.bufSize - n), Length: uint32(n)}, p.remote, client.Signaled); err != nil {
			return false, err
		}
		if _, err := reap(ctx, p.sends); err != nil {
			return false, err
		}
		return checkPattern(scratch[:n], 0), nil
	case readBW:
		return checkPattern(p.buf.Bytes[:n], 0), nil
	}
	return false, fmt.Errorf("%s: no client-side check", p.o.test)
}

func bytesEqualPattern(p *peer, ctx context.Context, size int) (bool, error) {
	// Too little room for a scratch copy: read one message back in place
	// of the pattern's first message and restore the pattern.
	if err := p.ep.PostRead(1<<40, client.Segment{LMR: p.lmr, Length: uint32(size)}, p.remote, client.Signaled); err != nil {
		return false, err
	}
	if _, err := reap(ctx, p.sends); err != nil {
		return false, err
	}
	ok := checkPattern(p.buf.Bytes[:size], 0)
	fillPattern(p.buf.Bytes, 0)
	return ok, nil
}

// latency runs one request at a time and records each round trip.
func (p *peer) latency(ctx context.Context, size int, r Result) (Result, error) {
	o := p.o
	samples := make([]time.Duration, 0, o.iters)
	pr := newProgress(fmt.Sprintf("%s %d B", o.test, size), o.iters, 0)
	defer pr.end()
	last := (*uint8)(unsafe.Pointer(&p.buf.Bytes[size-1]))
	var first uint64 // atomic_lat --verify: the word's first value
	if o.testNumber == sendLat {
		for i := 0; i < 2; i++ {
			if err := p.ep.PostRecv(uint64(i), []client.Segment{{LMR: p.lmr, Offset: uint64(o.size), Length: uint32(size)}}); err != nil {
				return r, err
			}
		}
	}
	for i := 0; i < o.iters; i++ {
		t0 := time.Now()
		var err error
		switch o.testNumber {
		case readLat:
			err = p.ep.PostRead(uint64(i), client.Segment{LMR: p.lmr, Length: uint32(size)}, p.remote, client.Signaled)
			if err == nil {
				_, err = o.reapPolled(ctx, p.sends)
			}
		case atomicLat:
			err = p.ep.PostFetchAdd(uint64(i), client.Segment{LMR: p.lmr, Length: 8}, p.remote, 1, client.Signaled)
			if err == nil {
				_, err = o.reapPolled(ctx, p.sends)
			}
			// Each Fetch-and-Add returns the word as the one before left
			// it: the first value, plus one per earlier iteration.
			if err == nil && o.verify {
				got := binary.NativeEndian.Uint64(p.buf.Bytes[:8])
				if i == 0 {
					first = got
				} else if got != first+uint64(i) {
					err = fmt.Errorf("verify: Fetch-and-Add %d returned %d, want %d", i, got, first+uint64(i))
				}
			}
		case sendLat:
			err = p.ep.PostSend(uint64(i), []client.Segment{{LMR: p.lmr, Length: uint32(size)}}, client.Signaled)
			if err == nil {
				_, err = o.reapPolled(ctx, p.recvs)
			}
			if err == nil {
				_, err = o.reapPolled(ctx, p.sends)
			}
			if err == nil {
				err = p.ep.PostRecv(uint64(i+2), []client.Segment{{LMR: p.lmr, Offset: uint64(o.size), Length: uint32(size)}})
			}
		case writeLat:
			want := uint8(i + 1)
			p.buf.Bytes[o.size+size-1] = want
			err = p.ep.PostWrite(uint64(i), []client.Segment{{LMR: p.lmr, Offset: uint64(o.size), Length: uint32(size)}}, p.remote, 0)
			for err == nil && atomicLoad8(last) != want {
				if ctx.Err() != nil {
					err = ctx.Err()
				}
				o.pause()
			}
		}
		if err != nil {
			return r, err
		}
		samples = append(samples, time.Since(t0))
		pr.update(i + 1)
	}
	slices.Sort(samples)
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	var sum, sq float64
	for _, s := range samples {
		sum += us(s)
	}
	avg := sum / float64(len(samples))
	for _, s := range samples {
		sq += (us(s) - avg) * (us(s) - avg)
	}
	r.TMinUs, r.TMaxUs = us(samples[0]), us(samples[len(samples)-1])
	r.TTypUs = us(samples[len(samples)/2])
	r.TAvgUs, r.TStdevUs = avg, math.Sqrt(sq/float64(len(samples)))
	r.P99Us = us(samples[len(samples)*99/100])
	r.P999Us = us(samples[min(len(samples)-1, len(samples)*999/1000)])
	return r, nil
}

// fillPattern writes a pattern that depends only on the offset.
func fillPattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*131) ^ seed
	}
}

func checkPattern(b []byte, seed byte) bool {
	for i := range b {
		if b[i] != byte(i*131)^seed {
			return false
		}
	}
	return true
}

func header(o *opts) {
	fmt.Println(strings.Repeat("-", 87))
	if o.isLatency {
		fmt.Printf(" %-7s %-11s %-14s %-14s %-16s %-14s %-15s %-22s %s\n", "#bytes", "#iterations", "t_min[usec]", "t_max[usec]",
			"t_typical[usec]", "t_avg[usec]", "t_stdev[usec]", "99% percentile[usec]", "99.9% percentile[usec]")
		return
	}
	unit := "MB/sec"
	if o.gbits {
		unit = "Gb/sec"
	}
	fmt.Printf(" %-10s %-14s %-18s %-20s %s\n", "#bytes", "#iterations", "BW peak["+unit+"]", "BW average["+unit+"]", "MsgRate[Mpps]")
}

func line(o *opts, r *Result) {
	if o.isLatency {
		fmt.Printf(" %-7d %-11d %-14.2f %-14.2f %-16.2f %-14.2f %-15.2f %-22.2f %.2f\n", r.Bytes, r.Iterations, r.TMinUs, r.TMaxUs,
			r.TTypUs, r.TAvgUs, r.TStdevUs, r.P99Us, r.P999Us)
		return
	}
	peak, avg := r.BWPeakMBps, r.BWAvgMBps
	if o.gbits {
		peak, avg = peak*8/1e3, avg*8/1e3
	}
	fmt.Printf(" %-10d %-14d %-18.2f %-20.2f %.6f\n", r.Bytes, r.Iterations, peak, avg, r.MsgRateMpps)
}

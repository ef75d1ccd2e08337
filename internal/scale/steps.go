package scale

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/topology"
)

// run is a Run in progress: the processes of the current pass.
type run struct {
	o       Options
	res     *Result
	dir     string // the current pass's sockets and logs
	name    string // and its name
	daemons [2]*daemon
	clients [2]*clientProc
	guard   *memGuard
	target  Ready  // the passive side's RDMA Write target
	port    uint16 // and the port it listens on
}

// Run measures one datapath. The error is for a run that could not start
// (no daemon, no client); a step that fails later is noted in the
// Result's Errors and the steps that do not need it still run.
func Run(o Options) (*Result, error) {
	o.setDefaults()
	if o.Pair == nil || o.N <= 0 {
		return nil, fmt.Errorf("scale: need a pair and N > 0")
	}
	nofile, note := usableNoFile(o.NoFile)
	o.NoFile = nofile
	r := &run{o: o, res: &Result{Datapath: o.Datapath, N: o.N, Batch: o.Batch, NoFile: nofile, NoFileNote: note,
		ChurnRounds: o.ChurnRounds, ChurnSize: o.ChurnSize, Failures: map[string]int{}}}
	for i, role := range [2]string{Active, Passive} {
		r.res.Daemons[i].Role, r.res.Clients[i].Role = role, role
	}
	dir := o.Dir
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	} else {
		d, err := os.MkdirTemp("", "softrnic-scale")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	if err := r.pass(filepath.Join(dir, "idle"), r.idlePass); err != nil {
		return nil, fmt.Errorf("idle pass: %w", err)
	}
	if err := r.pass(filepath.Join(dir, "churn"), r.churnPass); err != nil {
		r.fail("churn pass", err)
	}
	return r.res, nil
}

// pass runs fn on daemons and clients started for it in dir, and stops
// them after.
func (r *run) pass(dir string, fn func()) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	r.dir, r.name = dir, filepath.Base(dir)
	r.guard = startGuard(r.o.MemGuard)
	defer r.guard.close()
	defer r.stopAll()
	if err := r.start(); err != nil {
		return err
	}
	fn()
	return nil
}

func (r *run) progress(format string, args ...any) {
	fmt.Fprintf(r.o.Progress, "   %s: %s\n", r.o.Datapath, fmt.Sprintf(format, args...))
}

// halted reports whether the memory guard has killed the daemons, noting
// it among the errors the first time: the steps after it would only wait
// out their bounds.
func (r *run) halted() bool {
	why := r.guard.trip()
	if why == "" {
		return false
	}
	if !slices.Contains(r.res.Errors, why) {
		r.res.Errors = append(r.res.Errors, why)
		r.progress("%s", why)
	}
	return true
}

// fail notes a failed step.
func (r *run) fail(step string, err error) {
	r.res.Errors = append(r.res.Errors, fmt.Sprintf("%s pass: %s: %v", r.name, step, err))
	r.progress("%s failed: %v", step, err)
}

func (r *run) sock(i int) string { return filepath.Join(r.dir, [2]string{"a.sock", "b.sock"}[i]) }

// start starts both daemons, B's client, then A's.
func (r *run) start() error {
	for i, h := range []topology.Host{r.o.Pair.A, r.o.Pair.B} {
		// One xdp poller per host, each on its own CPU, as the bench
		// rig runs them.
		d, err := startDaemon(r.guard, h, r.o.Bin, r.o.Datapath, r.sock(i), strconv.Itoa(i%2), r.o.NoFile,
			filepath.Join(r.dir, fmt.Sprintf("softrnicd-%s.log", [2]string{"a", "b"}[i])))
		if err != nil {
			return err
		}
		r.daemons[i] = d
		r.res.Daemons[i].NoFile = openFileLimit(d.pid())
	}
	if err := r.startPassive(r.o.Port); err != nil {
		return err
	}
	c, _, err := startClient(r.o.Pair.A, r.o.Bin, r.o.NoFile, filepath.Join(r.dir, "client-a.log"), ClientOptions{Role: Active,
		Socket: r.sock(0), Peer: r.peer(r.o.Port), ConnectTimeout: connectTimeout})
	if err != nil {
		return err
	}
	r.clients[0] = c
	return nil
}

func (r *run) peer(port uint16) string { return fmt.Sprintf("%s:%d", r.o.Pair.B.Addr.Addr(), port) }

// startPassive starts B's client process, listening on port.
func (r *run) startPassive(port uint16) error {
	c, ready, err := startClient(r.o.Pair.B, r.o.Bin, r.o.NoFile, filepath.Join(r.dir, fmt.Sprintf("client-b-%d.log", port)),
		ClientOptions{Role: Passive, Socket: r.sock(1), Port: port, DataSize: r.o.DataSize})
	if err != nil {
		return err
	}
	r.clients[1], r.target, r.port = c, ready, port
	return nil
}

// stopAll stops whatever still runs, clients first so that none sees its
// daemon go, and keeps what each daemon logged.
func (r *run) stopAll() {
	for i, c := range r.clients {
		if c != nil {
			c.stop()
			r.clients[i] = nil
		}
	}
	for i, d := range r.daemons {
		if d != nil {
			d.kill()
			r.keepLog(i, d)
			r.daemons[i] = nil
		}
	}
}

// keepLog adds what daemon i logged to its figures, named by pass and
// log, once the daemon has ended.
func (r *run) keepLog(i int, d *daemon) {
	for _, l := range logSummary(d.log) {
		rel, _ := filepath.Rel(filepath.Dir(r.dir), d.log)
		r.res.Daemons[i].Log = append(r.res.Daemons[i].Log, rel+": "+l)
	}
}

// idlePass: N QPs on fresh daemons, what they cost idle, and SIGTERM to
// the passive daemon with them live; then a new passive daemon and data.
func (r *run) idlePass() {
	res := r.res
	r.settle()
	fresh := r.snapshot()
	for i := range 2 {
		res.Daemons[i].Fresh, res.Daemons[i].FDs.Fresh = fresh.daemonMem[i], total(fresh.daemonFDs[i])
		res.Clients[i].Fresh, res.Clients[i].FDs.Fresh = fresh.clientMem[i], total(fresh.clientFDs[i])
	}
	cpu := r.idleCPU()
	res.Daemons[0].IdleCPUFresh, res.Daemons[1].IdleCPUFresh = cpu[0], cpu[1]
	r.progress("idle pass, fresh: daemon RSS %s / %s, fds %d / %d, idle CPU %.2f%% / %.2f%%", mib(fresh.daemonMem[0].RSS),
		mib(fresh.daemonMem[1].RSS), total(fresh.daemonFDs[0]), total(fresh.daemonFDs[1]), cpu[0], cpu[1])

	res.Batches = r.connect(r.o.N, "connect")
	res.Connected = sumEstablished(res.Batches)
	if r.halted() {
		return
	}
	res.PassiveEstablished = r.waitPassive(res.Connected)
	r.settle()
	loaded := r.snapshot()
	for i := range 2 {
		d := &res.Daemons[i]
		d.Loaded = loaded.daemonMem[i]
		d.PerQP = perQP(d.Fresh, d.Loaded, res.Connected)
		d.FDs.Loaded, d.FDs.Growth = total(loaded.daemonFDs[i]), growth(fresh.daemonFDs[i], loaded.daemonFDs[i])
		c := &res.Clients[i]
		c.Loaded = loaded.clientMem[i]
		c.FDs.Loaded, c.FDs.Growth = total(loaded.clientFDs[i]), growth(fresh.clientFDs[i], loaded.clientFDs[i])
		if res.Connected > 0 {
			d.FDs.PerQP = float64(d.FDs.Loaded-d.FDs.Fresh) / float64(res.Connected)
			c.FDs.PerQP = float64(c.FDs.Loaded-c.FDs.Fresh) / float64(res.Connected)
		}
	}
	cpu = r.idleCPU()
	for i := range 2 {
		res.Daemons[i].IdleCPULoaded, res.Clients[i].IdleCPULoaded = cpu[i], cpu[2+i]
	}
	r.progress("%d QPs idle: daemon RSS %s / %s (%.0f / %.0f B per QP), fds per QP %.2f / %.2f, idle CPU %.2f%% / %.2f%%",
		res.Connected, mib(loaded.daemonMem[0].RSS), mib(loaded.daemonMem[1].RSS), res.Daemons[0].PerQP.RSS,
		res.Daemons[1].PerQP.RSS, res.Daemons[0].FDs.PerQP, res.Daemons[1].FDs.PerQP, cpu[0], cpu[1])
	if r.halted() {
		return
	}

	res.Teardown = r.teardown()
	r.clients[1].stop()
	r.clients[1] = nil
	r.closeAllActive()
	if r.halted() {
		return
	}
	d, err := startDaemon(r.guard, r.o.Pair.B, r.o.Bin, r.o.Datapath, r.sock(1), "1", r.o.NoFile,
		filepath.Join(r.dir, "softrnicd-b-restarted.log"))
	if err != nil {
		r.fail("restart B's daemon", err)
		return
	}
	r.daemons[1] = d
	// Another port: the first one's connections may linger in the
	// kernel's TIME-WAIT.
	if err := r.startPassive(r.o.Port + 1); err != nil {
		r.fail("restart B's client", err)
		return
	}
	res.DataAfterTeardown = r.dataCheck("data after teardown")
}

// churnPass: N QPs on fresh daemons, all closed, rounds of churn, N
// again and data beside them, with the daemons' memory read after each.
func (r *run) churnPass() {
	res := r.res
	r.settle()
	fresh := r.snapshot()
	res.Daemons[0].ChurnFresh, res.Daemons[1].ChurnFresh = fresh.daemonMem[0], fresh.daemonMem[1]
	r.progress("churn pass, fresh: daemon RSS %s / %s", mib(fresh.daemonMem[0].RSS), mib(fresh.daemonMem[1].RSS))

	res.ChurnPassBatches = r.connect(r.o.N, "connect")
	if r.halted() {
		return
	}
	r.waitPassive(sumEstablished(res.ChurnPassBatches))
	res.Close = r.closeAll()
	if r.halted() {
		return
	}
	for i, s := range r.stats() {
		res.Daemons[i].EPsAfterClose = s
	}
	r.settle()
	closed := r.snapshot()
	res.Daemons[0].Closed, res.Daemons[1].Closed = closed.daemonMem[0], closed.daemonMem[1]
	r.progress("all closed: daemon RSS %s / %s", mib(closed.daemonMem[0].RSS), mib(closed.daemonMem[1].RSS))

	res.ChurnMinRate = -1
	for k := range r.o.ChurnRounds {
		for _, b := range r.connect(r.o.ChurnSize, fmt.Sprintf("churn %d/%d", k+1, r.o.ChurnRounds)) {
			if res.ChurnMinRate < 0 || b.Rate < res.ChurnMinRate {
				res.ChurnMinRate = b.Rate
			}
		}
		if r.halted() {
			return
		}
		r.closeAll()
		if r.halted() {
			return
		}
	}
	res.ChurnMinRate = max(res.ChurnMinRate, 0)
	r.settle()
	churned := r.snapshot()
	res.Daemons[0].Churned, res.Daemons[1].Churned = churned.daemonMem[0], churned.daemonMem[1]
	r.progress("after %d churn rounds of %d, all closed: daemon RSS %s / %s", r.o.ChurnRounds, r.o.ChurnSize,
		mib(churned.daemonMem[0].RSS), mib(churned.daemonMem[1].RSS))
	if r.o.LateReading > 0 {
		time.Sleep(r.o.LateReading)
		late := r.snapshot()
		res.Daemons[0].ChurnedLate, res.Daemons[1].ChurnedLate = late.daemonMem[0], late.daemonMem[1]
		r.progress("%v later: daemon RSS %s / %s", r.o.LateReading, mib(late.daemonMem[0].RSS), mib(late.daemonMem[1].RSS))
	}

	res.Rebatches = r.connect(r.o.N, "reconnect")
	live := sumEstablished(res.Rebatches)
	if r.halted() {
		return
	}
	r.waitPassive(live)
	r.settle()
	reloaded := r.snapshot()
	for i := range 2 {
		d := &res.Daemons[i]
		d.Reloaded = reloaded.daemonMem[i]
		d.PerQPChurn = perQP(d.ChurnFresh, d.Reloaded, live)
	}
	r.progress("%d QPs idle after churn: daemon RSS %s / %s (%.0f / %.0f B per QP)", live, mib(reloaded.daemonMem[0].RSS),
		mib(reloaded.daemonMem[1].RSS), res.Daemons[0].PerQPChurn.RSS, res.Daemons[1].PerQPChurn.RSS)
	res.DataAfterChurn = r.dataCheck("data after churn")
}

// waitPassive waits for the passive side to hold n EPs, all up, and
// returns how many it holds.
func (r *run) waitPassive(n int) int {
	var st Status
	if err := r.clients[1].call(60*time.Second, &st, fmt.Sprintf("wait-live %d 30", n)); err != nil {
		r.fail("passive side's count", err)
	}
	r.passiveFailures(st)
	return st.Live
}

// passiveFailures adds the passive side's failures to the run's.
func (r *run) passiveFailures(st Status) {
	for k, v := range st.Failures {
		r.res.Failures[r.name+" pass, passive side: "+k] += v
	}
}

// settle lets the daemons idle before a memory reading.
func (r *run) settle() { time.Sleep(r.o.Settle) }

// snapshot is the four processes' memory and descriptors at one moment.
type snapshot struct {
	daemonMem, clientMem [2]Mem
	daemonFDs, clientFDs [2]map[string]int
}

func (r *run) snapshot() snapshot {
	var s snapshot
	for i := range 2 {
		var err error
		if d := r.daemons[i]; d != nil {
			if s.daemonMem[i], err = readMem(d.pid()); err != nil {
				r.fail("read daemon memory", err)
			}
			if s.daemonFDs[i], err = fdKinds(d.pid()); err != nil {
				r.fail("count daemon descriptors", err)
			}
		}
		if c := r.clients[i]; c != nil {
			if s.clientMem[i], err = readMem(c.pid()); err != nil {
				r.fail("read client memory", err)
			}
			if s.clientFDs[i], err = fdKinds(c.pid()); err != nil {
				r.fail("count client descriptors", err)
			}
		}
	}
	return s
}

// idleCPU is the CPU the daemons (0, 1) and clients (2, 3) use over the
// Idle window, in % of one CPU.
func (r *run) idleCPU() [4]float64 {
	pids := [4]int{r.daemons[0].pid(), r.daemons[1].pid(), r.clients[0].pid(), r.clients[1].pid()}
	var t0, t1 [4]float64
	for i, p := range pids {
		t0[i], _ = CPUSeconds(p)
	}
	start := time.Now()
	time.Sleep(r.o.Idle)
	el := time.Since(start).Seconds()
	var pct [4]float64
	for i, p := range pids {
		t1[i], _ = CPUSeconds(p)
		pct[i] = (t1[i] - t0[i]) / el * 100
	}
	return pct
}

// connect sets up n connections, a batch at a time, and returns the
// batches; it stops at a batch in which none came up.
func (r *run) connect(n int, step string) []Batch {
	var out []Batch
	for done := 0; done < n && !r.halted(); {
		b := min(r.o.Batch, n-done)
		var rep ConnectReply
		// A batch's Connects each wait up to connectTimeout; the bound
		// adds the EPs' creation and a margin.
		if err := r.clients[0].call(connectTimeout+2*time.Minute, &rep, fmt.Sprintf("connect %d %d", b, b)); err != nil {
			r.fail(step, err)
			return out
		}
		for k, v := range rep.Failures {
			r.res.Failures[r.name+" pass: "+k] += v
		}
		out = append(out, rep.Batches...)
		done += b
		if len(rep.Batches) == 1 {
			x := rep.Batches[0]
			r.progress("%s: %d/%d up (batch of %d: %d in %.2f s, %.0f/s; EPs made in %.2f s)", step, rep.Live, n, x.Size,
				x.Established, x.Seconds, x.Rate, x.CreateSeconds)
		}
		if len(rep.Failures) > 0 {
			r.progress("%s: failures %v", step, rep.Failures)
		}
		if len(rep.Batches) == 0 || rep.Batches[len(rep.Batches)-1].Established == 0 {
			r.fail(step, fmt.Errorf("a batch of %d brought no connection up: %v", b, rep.Failures))
			break
		}
	}
	return out
}

func sumEstablished(bs []Batch) int {
	n := 0
	for _, b := range bs {
		n += b.Established
	}
	return n
}

// closeAll closes every connection from the active side and waits for the
// passive side to have freed its EPs.
func (r *run) closeAll() CloseReply {
	rep := r.closeAllActive()
	var st Status
	if err := r.clients[1].call(90*time.Second, &st, "wait-live 0 60"); err != nil {
		r.fail("passive side's close", err)
	} else if st.Live != 0 {
		r.fail("passive side's close", fmt.Errorf("%d EPs still live 60 s after the active side closed", st.Live))
	}
	r.passiveFailures(st)
	return rep
}

// closeAllActive disconnects and frees the active side's EPs.
func (r *run) closeAllActive() CloseReply {
	var rep CloseReply
	if err := r.clients[0].call(3*time.Minute, &rep, "close"); err != nil {
		r.fail("close", err)
		return rep
	}
	for k, v := range rep.Failures {
		r.res.Failures[r.name+" pass: "+k] += v
	}
	r.progress("closed: %d disconnected, %d saw it, %d EPs freed in %.2f s", rep.Disconnected, rep.Seen, rep.Freed, rep.Seconds)
	return rep
}

// stats is each daemon's live EP count, -1 when it could not be read.
func (r *run) stats() [2]int {
	out := [2]int{-1, -1}
	for i, c := range r.clients {
		var s ctl.StatsReply
		if c == nil {
			continue
		}
		if err := c.call(30*time.Second, &s, "stats"); err != nil {
			r.fail("stats", err)
			continue
		}
		out[i] = int(s.EP)
	}
	return out
}

// dataCheck writes DataSize random octets over a new connection and has
// the passive side verify them.
func (r *run) dataCheck(step string) DataCheck {
	var dc DataCheck
	t := r.target
	if err := r.clients[0].call(3*time.Minute, &dc.Active, fmt.Sprintf("data %d %d %d %d", r.port, t.STag, t.VA, min(r.o.DataSize, t.Size))); err != nil {
		r.fail(step, err)
		return dc
	}
	if !dc.Active.OK {
		r.fail(step, fmt.Errorf("active side: %s", dc.Active.Err))
		return dc
	}
	if err := r.clients[1].call(60*time.Second, &dc.Passive, "await-data 30"); err != nil {
		r.fail(step, err)
		return dc
	}
	dc.Verified = dc.Passive.Verified && dc.Passive.Want == dc.Active.SHA256
	if !dc.Verified {
		r.fail(step, fmt.Errorf("passive side: %+v", dc.Passive))
	}
	r.progress("%s: %d octets, verified %v", step, dc.Active.Bytes, dc.Verified)
	return dc
}

// teardown sends SIGTERM to B's daemon with every QP live, times its exit
// and collects what A's client saw. A's client notes the live connections
// and answers (mark-live) before the signal: a CI run once counted 46
// connections as ended "before" the teardown because the client, slow to
// read its command, took its note after the signal's disconnects began.
// Times are from the signal.
func (r *run) teardown() Teardown {
	var td Teardown
	wait := r.o.TeardownLimit + 30*time.Second
	// The daemon is stopped even if A's client cannot watch: the
	// restart that follows needs its socket.
	var mark MarkReply
	marked := r.clients[0].call(30*time.Second, &mark, "mark-live")
	sent := marked
	if sent == nil {
		sent = r.clients[0].send(fmt.Sprintf("await-disconnects %d", int(wait.Seconds())))
	}
	signalled := time.Now()
	took, exited := r.daemons[1].terminate(r.o.TeardownLimit)
	td.Seconds, td.Exited = took.Seconds(), exited
	td.ExitStatus = exitStatus(r.daemons[1].err)
	if !exited {
		td.ExitStatus = fmt.Sprintf("killed: still running %v after SIGTERM", r.o.TeardownLimit)
	}
	r.keepLog(1, r.daemons[1])
	r.daemons[1] = nil
	if sent != nil {
		r.fail("teardown", sent)
	} else if err := r.clients[0].recv(wait+30*time.Second, &td.Peers); err != nil {
		r.fail("teardown", err)
	}
	td.Live = td.Peers.Live
	td.Peers.EndedBefore = mark.EndedBefore
	if td.Peers.LastUnixNano > 0 {
		td.Peers.LastSeconds = time.Unix(0, td.Peers.LastUnixNano).Sub(signalled).Seconds()
	}
	if len(td.Peers.EndedBefore) > 0 {
		r.fail("teardown", fmt.Errorf("connections that came up ended on their own before it: %v; the hosts' kernels sent resets: %s",
			td.Peers.EndedBefore, r.kernelResets()))
	}
	r.progress("SIGTERM to B's daemon with %d QPs live: %s after %.2f s; A saw %d of %d disconnects (%v), the last at %.2f s",
		td.Live, td.ExitStatus, td.Seconds, td.Peers.Seen, td.Peers.Live, td.Peers.Events, td.Peers.LastSeconds)
	return td
}

func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// kernelResets is how many resets each host's kernel sent (on the xdp
// datapath a segment of an RNIC flow the steering missed gets one).
func (r *run) kernelResets() string {
	var out []string
	for i, h := range []topology.Host{r.o.Pair.A, r.o.Pair.B} {
		c, err := h.Counters()
		name := [2]string{"A", "B"}[i]
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		out = append(out, fmt.Sprintf("%s %d", name, c["Tcp:OutRsts"]))
	}
	return strings.Join(out, ", ")
}

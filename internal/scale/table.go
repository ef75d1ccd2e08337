package scale

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// Issue 16's targets.
const (
	TargetQPs         = 10000
	TargetBytesPerQP  = 8 << 10
	TargetClosedRatio = 1.10
	TargetIdleCPU     = 1.0 // % of one CPU, per daemon
	TargetSetupRate   = 2000
	TargetTeardown    = 2.0 // seconds
	// FixedFDs is how many descriptors a process may gain with its QPs
	// whatever their number: a session-wide object (a shared region, a
	// doorbell) may appear with the first EP; nothing may per QP beyond
	// the target (the kernel datapath's socket in a daemon, none in a
	// client).
	FixedFDs = 4
)

// Target is one of issue 16's targets and its verdict on each datapath.
type Target struct {
	Name     string            `json:"target"`
	Verdicts map[string]string `json:"verdicts"`
}

// Targets judges each result against issue 16's targets. A target stated
// at ten thousand QPs is judged on what a smaller run measured and says
// so; the descriptor counts are the test's bound (at most the kernel
// datapath's socket per QP in a daemon, none in a client, FixedFDs aside).
func Targets(rs []*Result) []Target {
	names := []string{
		"≥ 10,000 connected QPs",
		"≤ 8 KiB daemon RSS per idle QP, fresh",
		"≤ 8 KiB daemon RSS per idle QP, after churn",
		"RSS after closing all ≤ fresh + 10%",
		"RSS after churn, all closed ≤ fresh + 10%",
		"idle CPU ≤ 1% per daemon with N idle QPs",
		"setup ≥ 2,000 QPs/s in every batch, 0 to N",
		"SIGTERM with N live: exit ≤ 2 s, every peer told",
		"data verified after all of it",
		"fds per QP: daemon ≤ 1, client 0",
	}
	ts := make([]Target, len(names))
	for i := range ts {
		ts[i] = Target{Name: names[i], Verdicts: map[string]string{}}
	}
	for _, r := range rs {
		small := ""
		if r.N < TargetQPs {
			small = fmt.Sprintf(" (at N=%d)", r.N)
		}
		d := r.Daemons
		both := func(f func(DaemonFigures) bool) bool { return f(d[0]) && f(d[1]) }
		loaded := r.Connected > 0 && both(func(x DaemonFigures) bool { return x.Loaded.RSS > 0 })
		reloaded := sumEstablished(r.Rebatches) > 0 && both(func(x DaemonFigures) bool { return x.Reloaded.RSS > 0 })
		v := []string{
			verdictQPs(r),
			judge(loaded, both(func(x DaemonFigures) bool { return x.PerQP.RSS <= TargetBytesPerQP })) + small,
			judge(reloaded, both(func(x DaemonFigures) bool { return x.PerQPChurn.RSS <= TargetBytesPerQP })) + small,
			judge(both(func(x DaemonFigures) bool { return x.Closed.RSS > 0 }),
				both(func(x DaemonFigures) bool { return ratio(x.Closed, x.ChurnFresh) <= TargetClosedRatio })),
			judge(both(func(x DaemonFigures) bool { return x.Churned.RSS > 0 }),
				both(func(x DaemonFigures) bool { return ratio(x.Churned, x.ChurnFresh) <= TargetClosedRatio })),
			judge(loaded, both(func(x DaemonFigures) bool { return x.IdleCPULoaded <= TargetIdleCPU })) + small,
			judge(len(r.Batches) > 0, r.Connected > 0 && minRate(r) >= TargetSetupRate) + small,
			judge(r.Teardown.ExitStatus != "", r.Teardown.Exited && r.Teardown.Seconds <= TargetTeardown &&
				r.Teardown.Live > 0 && r.Teardown.Peers.Seen == r.Teardown.Live) + small,
			judge(r.DataAfterChurn.Active.Bytes > 0, r.DataAfterChurn.Verified && r.DataAfterTeardown.Verified),
			judge(loaded, both(func(x DaemonFigures) bool { return x.FDs.Loaded-x.FDs.Fresh <= r.Connected+FixedFDs }) &&
				r.Clients[0].FDs.Loaded-r.Clients[0].FDs.Fresh <= FixedFDs && r.Clients[1].FDs.Loaded-r.Clients[1].FDs.Fresh <= FixedFDs),
		}
		for i := range ts {
			ts[i].Verdicts[r.Datapath] = v[i]
		}
	}
	return ts
}

func verdictQPs(r *Result) string {
	switch {
	case r.Connected >= TargetQPs:
		return "met"
	case r.N < TargetQPs && r.Connected == r.N:
		return fmt.Sprintf("n/a: all %d of N=%d", r.Connected, r.N)
	}
	return fmt.Sprintf("NOT met (%d)", r.Connected)
}

// judge is a target's verdict on a figure, if it was measured.
func judge(measured, ok bool) string {
	switch {
	case !measured:
		return "not measured"
	case ok:
		return "met"
	}
	return "NOT met"
}

func ratio(a, b Mem) float64 {
	if b.RSS == 0 {
		return 0
	}
	return float64(a.RSS) / float64(b.RSS)
}

// minRate is the slowest batch of both runs of N.
func minRate(r *Result) float64 {
	m := -1.0
	for _, b := range slices.Concat(r.Batches, r.Rebatches) {
		if m < 0 || b.Rate < m {
			m = b.Rate
		}
	}
	return max(m, 0)
}

func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }

// Print writes each result's figures and then the targets table.
func Print(w io.Writer, rs []*Result) {
	for _, r := range rs {
		printOne(w, r)
	}
	fmt.Fprintf(w, "\n== issue 16 targets (scale)\n")
	fmt.Fprintf(w, "%-50s", "")
	for _, r := range rs {
		fmt.Fprintf(w, " | %-26s", r.Datapath)
	}
	fmt.Fprintln(w)
	for _, t := range Targets(rs) {
		fmt.Fprintf(w, "%-50s", t.Name)
		for _, r := range rs {
			fmt.Fprintf(w, " | %-26s", t.Verdicts[r.Datapath])
		}
		fmt.Fprintln(w)
	}
}

func printOne(w io.Writer, r *Result) {
	d, c := r.Daemons, r.Clients
	if d[0].Role == "" {
		fmt.Fprintf(w, "\n== scale, %s datapath: could not run: %s\n", r.Datapath, strings.Join(r.Errors, "; "))
		return
	}
	fmt.Fprintf(w, "\n== scale, %s datapath: N=%d QPs in batches of %d, SQ/RQ depth %d, one receive posted each; processes started with RLIMIT_NOFILE %s (daemons run with %s, %s)\n",
		r.Datapath, r.N, r.Batch, epDepth, r.NoFile, d[0].NoFile, d[1].NoFile)
	if r.NoFileNote != "" {
		fmt.Fprintf(w, "NOTE: %s\n", r.NoFileNote)
	}
	fmt.Fprintf(w, "connected QPs:             %d of %d (the passive side holds %d)\n", r.Connected, r.N, r.PassiveEstablished)
	if len(r.Failures) == 0 {
		fmt.Fprintf(w, "failures:                  none\n")
	}
	for _, k := range sortedKeys(r.Failures) {
		fmt.Fprintf(w, "failure:                   %d× %s\n", r.Failures[k], k)
	}
	fmt.Fprintf(w, "setup, QPs/s per batch:    %s\n", rates(r.Batches))
	fmt.Fprintf(w, "  churn pass, first N:     %s\n", rates(r.ChurnPassBatches))
	fmt.Fprintf(w, "  churn pass, after churn: %s\n", rates(r.Rebatches))
	fmt.Fprintf(w, "  churn (%d × %d):         slowest batch %.0f/s\n", r.ChurnRounds, r.ChurnSize, r.ChurnMinRate)
	fmt.Fprintf(w, "%-27s%-56s%s\n", "", "active daemon (A)", "passive daemon (B)")
	row := func(name string, f func(DaemonFigures) string) {
		fmt.Fprintf(w, "%-27s%-56s%s\n", name, f(d[0]), f(d[1]))
	}
	mem := func(m Mem) string {
		if m.RSS == 0 {
			return "not measured"
		}
		return fmt.Sprintf("%s (anon %s, shmem %s)", mib(m.RSS), mib(m.Anon), mib(m.Shmem))
	}
	per := func(p MemPerQP) string {
		return fmt.Sprintf("%s (anon %s, shmem %s)", kib(p.RSS), kib(p.Anon), kib(p.Shmem))
	}
	vsFresh := func(m, fresh Mem) string {
		if m.RSS == 0 {
			return "not measured"
		}
		return fmt.Sprintf("%s (%.2fx fresh)", mib(m.RSS), ratio(m, fresh))
	}
	perIf := func(p MemPerQP, from Mem) string {
		if from.RSS == 0 {
			return "not measured"
		}
		return per(p)
	}
	fmt.Fprintf(w, "idle pass:\n")
	row("RSS fresh", func(x DaemonFigures) string { return mem(x.Fresh) })
	row("RSS, N idle QPs", func(x DaemonFigures) string { return mem(x.Loaded) })
	row("RSS per idle QP", func(x DaemonFigures) string { return perIf(x.PerQP, x.Loaded) })
	fds := func(x FDs) string { return fmt.Sprintf("%d -> %d (%.2f per QP)", x.Fresh, x.Loaded, x.PerQP) }
	row("fds fresh -> N", func(x DaemonFigures) string { return fds(x.FDs) })
	row("  growth by kind", func(x DaemonFigures) string { return kinds(x.FDs.Growth) })
	row("idle CPU fresh / N idle", func(x DaemonFigures) string {
		return fmt.Sprintf("%.2f%% / %.2f%% of a CPU", x.IdleCPUFresh, x.IdleCPULoaded)
	})
	fmt.Fprintf(w, "%-27s%-56s%s\n", "client fds fresh -> N", fds(c[0].FDs), fds(c[1].FDs))
	fmt.Fprintf(w, "%-27s%-56s%s\n", "  growth by kind", kinds(c[0].FDs.Growth), kinds(c[1].FDs.Growth))
	fmt.Fprintf(w, "%-27s%-56s%s\n", "client RSS N idle, CPU", fmt.Sprintf("%s, %.2f%%", mib(c[0].Loaded.RSS), c[0].IdleCPULoaded),
		fmt.Sprintf("%s, %.2f%%", mib(c[1].Loaded.RSS), c[1].IdleCPULoaded))
	t := r.Teardown
	fmt.Fprintf(w, "teardown:                  SIGTERM to B's daemon with %d QPs live: %s after %.2f s; A saw %d of %d disconnects %v, the last %.2f s after the signal\n",
		t.Live, t.ExitStatus, t.Seconds, t.Peers.Seen, t.Peers.Live, t.Peers.Events, t.Peers.LastSeconds)
	fmt.Fprintf(w, "data after teardown:       %s\n", dataLine(r.DataAfterTeardown))
	fmt.Fprintf(w, "churn pass, on daemons of its own:\n")
	row("RSS fresh", func(x DaemonFigures) string { return mem(x.ChurnFresh) })
	row("RSS N up, all closed", func(x DaemonFigures) string { return vsFresh(x.Closed, x.ChurnFresh) })
	row("EPs left after close", func(x DaemonFigures) string { return fmt.Sprint(x.EPsAfterClose) })
	row("RSS after churn, closed", func(x DaemonFigures) string { return vsFresh(x.Churned, x.ChurnFresh) })
	if d[0].ChurnedLate.RSS > 0 {
		row("  read again later", func(x DaemonFigures) string { return vsFresh(x.ChurnedLate, x.ChurnFresh) })
	}
	row("RSS, N idle after churn", func(x DaemonFigures) string { return vsFresh(x.Reloaded, x.ChurnFresh) })
	row("RSS per QP after churn", func(x DaemonFigures) string { return perIf(x.PerQPChurn, x.Reloaded) })
	fmt.Fprintf(w, "data after churn:          %s\n", dataLine(r.DataAfterChurn))
	for i, x := range d {
		for _, l := range x.Log {
			fmt.Fprintf(w, "daemon %s log:              %s\n", [2]string{"A", "B"}[i], l)
		}
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "step failed:               %s\n", e)
	}
}

// rates is the first, last and slowest batch of a run, then every batch.
func rates(bs []Batch) string {
	if len(bs) == 0 {
		return "none"
	}
	slowest := slices.MinFunc(bs, func(a, b Batch) int {
		switch {
		case a.Rate < b.Rate:
			return -1
		case a.Rate > b.Rate:
			return 1
		}
		return 0
	})
	all := make([]string, len(bs))
	for i, b := range bs {
		all[i] = fmt.Sprintf("%.0f", b.Rate)
	}
	return fmt.Sprintf("first %.0f, last %.0f, slowest %.0f (at %d up) [%s]", bs[0].Rate, bs[len(bs)-1].Rate, slowest.Rate,
		slowest.Start, strings.Join(all, " "))
}

func dataLine(dc DataCheck) string {
	switch {
	case dc.Verified:
		return fmt.Sprintf("%d octets by RDMA Write + Send, SHA-256 %s… verified by the passive side", dc.Active.Bytes, dc.Active.SHA256[:16])
	case dc.Active.Err != "":
		return "NOT verified: " + dc.Active.Err
	case dc.Passive.Err != "":
		return "NOT verified: passive side: " + dc.Passive.Err
	case dc.Active.OK:
		return fmt.Sprintf("NOT verified: the passive side computed %s, want %s", dc.Passive.Got, dc.Passive.Want)
	}
	return "not run"
}

// kinds is the growth of each kind of descriptor, for a row.
func kinds(g map[string]int) string {
	if len(g) == 0 {
		return "none"
	}
	var b []string
	for _, k := range sortedKeys(g) {
		b = append(b, fmt.Sprintf("%s %+d", k, g[k]))
	}
	return strings.Join(b, ", ")
}

func sortedKeys(m map[string]int) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

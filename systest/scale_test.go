package systest

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/scale"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
)

// scaleN is the QPs TestScale connects: enough that a cost per QP stands
// out of a daemon's fixed costs and of the runtime's noise (at 8 KiB
// each, 400 QPs are 3.2 MiB), few enough for a busy 2-core CI host.
const scaleN = 400

// TestScale is issue 16's scale benchmark (softrnic-scale, `make bench`
// at 10,000 QPs) at scaleN QPs on each datapath, holding the daemons to
// what does not depend on the machine's speed: every QP connects; the
// daemons hold at most one descriptor per QP (the kernel datapath's
// socket) and the client none; after every connection closed and a round
// of churn, daemon memory is back near a fresh daemon's and no EP is
// left; when the passive daemon gets SIGTERM with every QP live it exits
// and every peer hears of it; and new connections still move verified
// data, after the churn and after that daemon's restart. Timings are the
// benchmark's to report: here they are bounds against a hang only.
func TestScale(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireTool(t, "prlimit")
	dir := t.TempDir()
	gobin := testenv.RequireTool(t, "go")
	if out, err := exec.Command(gobin, "build", "-o", dir+"/", "github.com/softrnic/softrnic/cmd/softrnicd",
		"github.com/softrnic/softrnic/cmd/softrnic-scale").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, dp := range []string{"kernel", "xdp"} {
		t.Run(dp, func(t *testing.T) {
			pair := topology.NewTest(t, topology.Options{})
			r, err := scale.Run(scale.Options{Pair: pair, Bin: dir, Datapath: dp, N: scaleN, Batch: 100,
				ChurnRounds: 1, ChurnSize: scaleN, Settle: 2 * time.Second, Idle: time.Second,
				TeardownLimit: 30 * time.Second, DataSize: 1 << 20, Dir: t.TempDir(), Progress: logWriter{t}})
			if err != nil {
				t.Fatal(err)
			}
			var table bytes.Buffer
			scale.Print(&table, []*scale.Result{r})
			t.Log(table.String())
			checkScale(t, r)
		})
	}
}

// checkScale holds a run to the structural targets.
func checkScale(t *testing.T, r *scale.Result) {
	for _, e := range r.Errors {
		t.Errorf("step failed: %s", e)
	}
	if r.Connected != r.N || r.PassiveEstablished != r.N || len(r.Failures) > 0 {
		t.Errorf("%d of %d QPs connected, the passive side holds %d; failures %v", r.Connected, r.N, r.PassiveEstablished, r.Failures)
	}
	// A descriptor object made once (a session's shared region, a
	// doorbell) may appear with the first EP: a few are allowed on top
	// of the per-QP bound, none per QP.
	for _, d := range r.Daemons {
		if grown := d.FDs.Loaded - d.FDs.Fresh; grown > r.Connected+scale.FixedFDs {
			t.Errorf("%s daemon: %d more descriptors with %d QPs (%.2f per QP: %v), want at most one per QP",
				d.Role, grown, r.Connected, d.FDs.PerQP, d.FDs.Growth)
		}
	}
	for _, c := range r.Clients {
		if grown := c.FDs.Loaded - c.FDs.Fresh; grown > scale.FixedFDs {
			t.Errorf("%s client: %d more descriptors with %d QPs (%.2f per QP: %v), want none per QP",
				c.Role, grown, r.Connected, c.FDs.PerQP, c.FDs.Growth)
		}
	}
	// Back near fresh: the 10% over a fresh daemon, plus 16 KiB
	// for each of the N QPs open at the peak. The Go runtime keeps
	// memory that grows with the peak heap and is never returned (its
	// GC metadata, maps that do not shrink, a record per goroutine that
	// ever ran): 5 to 6 MiB here after 400 QPs, which the bench reports
	// against the 10% target at 10,000. A daemon keeping its closed QPs'
	// buffers (4 MiB each before issue 16) is far past the bound.
	for _, d := range r.Daemons {
		bound := int64(float64(d.ChurnFresh.RSS)*scale.TargetClosedRatio) + int64(r.N)*16<<10
		if d.Churned.RSS == 0 || d.Churned.RSS > bound {
			t.Errorf("%s daemon: RSS %.1f MiB after closing all and a churn round of %d, fresh %.1f MiB: over the bound %.1f MiB (anon %.1f, shmem %.1f MiB)",
				d.Role, mibs(d.Churned.RSS), r.ChurnSize, mibs(d.ChurnFresh.RSS), mibs(bound), mibs(d.Churned.Anon), mibs(d.Churned.Shmem))
		}
		if d.EPsAfterClose != 0 {
			t.Errorf("%s daemon: %d EPs left once every one was freed", d.Role, d.EPsAfterClose)
		}
	}
	td := r.Teardown
	if !td.Exited {
		t.Errorf("the passive daemon did not exit on SIGTERM with %d QPs live: %s", td.Live, td.ExitStatus)
	}
	if td.Live != r.N || td.Peers.Seen != td.Live {
		t.Errorf("SIGTERM to the passive daemon with %d of %d QPs live: %d peers saw their disconnect %v",
			td.Live, r.N, td.Peers.Seen, td.Peers.Events)
	}
	for _, c := range []struct {
		when string
		dc   scale.DataCheck
	}{{"after churn", r.DataAfterChurn}, {"after the passive daemon's restart", r.DataAfterTeardown}} {
		if !c.dc.Verified {
			t.Errorf("data %s not verified: active %+v, passive %+v", c.when, c.dc.Active, c.dc.Passive)
		}
	}
}

func mibs(b int64) float64 { return float64(b) / (1 << 20) }

// logWriter logs each line written to it, as the run's progress.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

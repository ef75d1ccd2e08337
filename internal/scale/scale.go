// Package scale measures what thousands of connected QPs cost a pair of
// softrnicd daemons (issue 16): daemon memory and descriptors per idle QP,
// idle CPU, connection setup rate from the first QP to the last, memory
// after every connection closed and after rounds of churn, the time a
// daemon takes to stop with every QP live and whether each peer hears of
// it, and that the daemons still move verified data after all of it.
//
// It uses the daemons only as their users do: their command line, and two
// client processes speaking the public client package (client.go), so
// that it measures any version of their internals alike.
//
// A run is two passes, each on daemons started for it (steps.go): the
// idle pass connects N QPs to fresh daemons, reads what they cost idle,
// and stops the passive daemon with them live; the churn pass connects N,
// closes them all, churns, connects N again and reads what is left each
// time. Apart, a daemon that keeps what closed connections held (the
// issue found gigabytes) cannot take the teardown figure with it.
//
// Processes and goroutines: a pass starts, in each namespace of a topology
// pair, a daemon (A active, B passive) and one client process; A's client
// connects to B's. Each client process answers commands on its standard
// input with JSON lines, so Run decides when each step happens and reads
// the four processes' /proc between steps. In Run's process there is one
// goroutine per client process reading its answers, one per daemon
// waiting for it to exit and the memory guard's (guard.go); all end
// before Run returns. In a client process there is the command loop and
// one goroutine per EVD draining it (client.go).
package scale

import (
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/topology"
)

// SystemdNoFile is RLIMIT_NOFILE of a systemd service by default (soft
// 1024, hard 524288, systemd ≥ 240); Go raises the soft limit to the hard
// one at start, so a Go daemon under systemd runs with 524288.
const SystemdNoFile = "1024:524288"

// Options of a run.
type Options struct {
	// Pair is the two hosts; A runs the active side, B the passive one.
	Pair *topology.Pair
	// Bin holds softrnicd and softrnic-scale.
	Bin string
	// Datapath is the daemons' --datapath.
	Datapath string
	// N is how many QPs to connect; Batch how many at a time.
	N, Batch int
	// ChurnRounds of ChurnSize connections opened and closed follow
	// the first close.
	ChurnRounds, ChurnSize int
	// Settle is how long the daemons idle before each memory reading.
	Settle time.Duration
	// Idle is the window over which idle CPU is measured.
	Idle time.Duration
	// LateReading, if set, reads the daemons' memory once more that long
	// after the churn's: a Go daemon that frees nothing itself returns
	// its garbage only after the runtime's periodic GC (every 2 min) and
	// the scavenger, so the two readings tell memory still held from
	// memory merely not yet collected.
	LateReading time.Duration
	// TeardownLimit bounds the wait for the passive daemon to exit on
	// SIGTERM; past it, it is killed and the target reported missed.
	TeardownLimit time.Duration
	// DataSize is the size of the data checks' RDMA Write.
	DataSize int
	// NoFile is the daemons' and clients' RLIMIT_NOFILE at start, as
	// prlimit takes it (soft:hard); SystemdNoFile by default.
	NoFile string
	// Port is the passive side's; Port+1 after its daemon's restart.
	Port uint16
	// MemGuard is the daemons' combined RSS past which they are killed
	// and the run reports why (memGuard); 40% of the machine's memory
	// by default.
	MemGuard int64
	// Dir receives the sockets and the processes' logs; a temporary
	// directory, removed at the end, by default.
	Dir string
	// Progress receives a line per step; nil for none.
	Progress io.Writer
}

func (o *Options) setDefaults() {
	if o.Batch <= 0 {
		o.Batch = 1000
	}
	if o.ChurnSize <= 0 {
		o.ChurnSize = max(1, o.N/5)
	}
	if o.Settle <= 0 {
		o.Settle = 3 * time.Second
	}
	if o.Idle <= 0 {
		o.Idle = 5 * time.Second
	}
	if o.TeardownLimit <= 0 {
		o.TeardownLimit = 2 * time.Minute
	}
	if o.DataSize <= 0 {
		o.DataSize = 4 << 20
	}
	if o.NoFile == "" {
		o.NoFile = SystemdNoFile
	}
	if o.Port == 0 {
		o.Port = 19500
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.MemGuard <= 0 {
		o.MemGuard = defaultGuard()
	}
}

// usableNoFile returns want if prlimit can give it to a process here, and
// otherwise want's soft limit under this process's own hard limit, with a
// note saying so: raising a hard limit needs CAP_SYS_RESOURCE, which a
// container's root may lack, and then the daemons get what this shell
// has, the note telling the reader which limit the figures met.
func usableNoFile(want string) (string, string) {
	out, err := exec.Command("prlimit", "--nofile="+want, "--", "true").CombinedOutput()
	if err == nil {
		return want, ""
	}
	var lim unix.Rlimit
	if gerr := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); gerr != nil {
		return want, ""
	}
	soft, _, _ := strings.Cut(want, ":")
	if s, perr := strconv.ParseUint(soft, 10, 64); perr != nil || s > lim.Max {
		soft = strconv.FormatUint(lim.Max, 10)
	}
	use := fmt.Sprintf("%s:%d", soft, lim.Max)
	return use, fmt.Sprintf("RLIMIT_NOFILE %s could not be set here (%s: %s); ran with %s, this host's own hard limit",
		want, err, strings.TrimSpace(string(out)), use)
}

// connectTimeout is each Connect's timeout: the MPA handshake of the
// thousandth connection of a batch waits behind the others'.
const connectTimeout = 30 * time.Second

// Result is one datapath's run. Figures that a failed step left
// unmeasured are zero; Errors says which steps failed.
type Result struct {
	Datapath string `json:"datapath"`
	N        int    `json:"n"`
	Batch    int    `json:"batch"`
	// NoFile is the limit the processes were started with; NoFileNote
	// says why it is not the one asked for, if it is not.
	NoFile     string `json:"nofile_at_start"`
	NoFileNote string `json:"nofile_note,omitempty"`
	// Connected is how many QPs the idle pass brought up;
	// PassiveEstablished how many its passive side saw come up.
	Connected          int `json:"connected"`
	PassiveEstablished int `json:"passive_established"`
	// Failures counts every failure of either client by cause.
	Failures map[string]int `json:"failures,omitempty"`
	// Batches are the idle pass's setup of N; ChurnPassBatches the churn
	// pass's first N, Rebatches its N after churn.
	Batches          []Batch `json:"batches"`
	ChurnPassBatches []Batch `json:"churn_pass_batches"`
	Rebatches        []Batch `json:"batches_after_churn"`
	// ChurnMinRate is the slowest churn batch's rate.
	ChurnRounds  int     `json:"churn_rounds"`
	ChurnSize    int     `json:"churn_size"`
	ChurnMinRate float64 `json:"churn_min_qps_per_second"`
	// Daemons are A's and B's, Clients A's and B's client processes.
	Daemons [2]DaemonFigures `json:"daemons"`
	Clients [2]ClientFigures `json:"clients"`
	// Close is the churn pass's closing of its first N.
	Close CloseReply `json:"close"`
	// DataAfterChurn is the data check with N QPs live after churn;
	// DataAfterTeardown the one after B's daemon was stopped and
	// started again (the idle pass).
	DataAfterChurn    DataCheck `json:"data_after_churn"`
	DataAfterTeardown DataCheck `json:"data_after_teardown"`
	Teardown          Teardown  `json:"teardown"`
	// Errors are the steps that failed, in order.
	Errors []string `json:"errors,omitempty"`
}

// DaemonFigures are one daemon's.
type DaemonFigures struct {
	Role string `json:"role"`
	// NoFile is RLIMIT_NOFILE as the daemon runs with it.
	NoFile string `json:"nofile_running"`
	// The idle pass's Fresh (started, its client attached and set up,
	// no EP yet) and Loaded (N QPs idle).
	Fresh  Mem `json:"fresh"`
	Loaded Mem `json:"loaded"`
	// The churn pass's ChurnFresh, its Fresh, which the others are
	// compared to; Closed: its first N all closed; Churned: after the
	// churn rounds, all closed; Reloaded: N QPs idle again.
	ChurnFresh Mem `json:"churn_pass_fresh"`
	Closed     Mem `json:"closed"`
	Churned    Mem `json:"churned"`
	// ChurnedLate is Churned read again LateReading later, if asked.
	ChurnedLate Mem `json:"churned_late,omitzero"`
	Reloaded    Mem `json:"reloaded"`
	// PerQP is (Loaded - Fresh) / Connected, PerQPChurn (Reloaded -
	// ChurnFresh) / the QPs up then; bytes.
	PerQP      MemPerQP `json:"per_qp"`
	PerQPChurn MemPerQP `json:"per_qp_after_churn"`
	FDs        FDs      `json:"fds"`
	// IdleCPU is % of one CPU: Fresh with no EP, Loaded with N idle.
	IdleCPUFresh  float64 `json:"idle_cpu_fresh_percent"`
	IdleCPULoaded float64 `json:"idle_cpu_loaded_percent"`
	// EPsAfterClose is the daemon's live EP count once every
	// connection was closed and freed (its Stats): 0 unless it leaks.
	EPsAfterClose int `json:"eps_after_close"`
	// Log is the distinct warnings and errors it logged, in either pass.
	Log []string `json:"log,omitempty"`
}

// ClientFigures are one client process's.
type ClientFigures struct {
	Role          string  `json:"role"`
	Fresh         Mem     `json:"fresh"`
	Loaded        Mem     `json:"loaded"`
	FDs           FDs     `json:"fds"`
	IdleCPULoaded float64 `json:"idle_cpu_loaded_percent"`
}

// MemPerQP is a memory growth divided by the QPs that caused it, bytes.
type MemPerQP struct {
	RSS   float64 `json:"vm_rss"`
	Anon  float64 `json:"rss_anon"`
	Shmem float64 `json:"rss_shmem"`
}

func perQP(from, to Mem, n int) MemPerQP {
	if n <= 0 {
		return MemPerQP{}
	}
	return MemPerQP{RSS: float64(to.RSS-from.RSS) / float64(n), Anon: float64(to.Anon-from.Anon) / float64(n),
		Shmem: float64(to.Shmem-from.Shmem) / float64(n)}
}

// FDs are a process's open descriptors fresh and with N QPs up, and
// which kinds grew between the two.
type FDs struct {
	Fresh  int            `json:"fresh"`
	Loaded int            `json:"loaded"`
	PerQP  float64        `json:"per_qp"`
	Growth map[string]int `json:"growth_by_kind,omitempty"`
}

// growth is what each kind of descriptor grew by from a to b.
func growth(a, b map[string]int) map[string]int {
	g := map[string]int{}
	for k, v := range b {
		if d := v - a[k]; d != 0 {
			g[k] = d
		}
	}
	for k, v := range a {
		if _, ok := b[k]; !ok {
			g[k] = -v
		}
	}
	return g
}

// DataCheck is one data check, both sides.
type DataCheck struct {
	Verified bool       `json:"verified"`
	Active   DataReply  `json:"active"`
	Passive  DataResult `json:"passive"`
}

// Teardown is the passive daemon's SIGTERM with the QPs live.
type Teardown struct {
	Live int `json:"live"`
	// Seconds from SIGTERM to exit; Exited false if it was killed at
	// the limit instead.
	Seconds float64 `json:"seconds"`
	Exited  bool    `json:"exited"`
	// ExitStatus is how it ended.
	ExitStatus string `json:"exit_status"`
	// Peers is what the active side saw of it.
	Peers DisconnectReply `json:"peers"`
}

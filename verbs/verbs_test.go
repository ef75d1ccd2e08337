package verbs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/verbs/abi"
	"golang.org/x/sys/unix"
)

// TestMain is also a kernel-datapath softrnicd on loopback (or on
// $SOFTRNIC_VERBS_TEST_IFACE), serving at $SOFTRNIC_VERBS_TEST_DAEMON until
// SIGTERM: a daemon in a process of its own, which a test can run with the
// CPUs or in the network namespace it chooses (TestPollYield,
// TestResolveInDaemonsNamespace).
func TestMain(m *testing.M) {
	if sock := os.Getenv("SOFTRNIC_VERBS_TEST_DAEMON"); sock != "" {
		iface := os.Getenv("SOFTRNIC_VERBS_TEST_IFACE")
		if iface == "" {
			iface = "lo"
		}
		srv, err := daemon.New(daemon.Options{Iface: iface, Socket: sock, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		go func() { <-sig; srv.Close() }()
		if err := srv.Serve(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startDaemon runs a kernel-datapath softrnicd on loopback for the test
// and returns its socket.
func startDaemon(t *testing.T) string {
	t.Helper()
	return startDaemonWith(t, daemon.Options{})
}

// startDaemonWith is startDaemon with options (Iface is the test's, and
// Logger and Socket unless given).
func startDaemonWith(t *testing.T, opts daemon.Options) string {
	t.Helper()
	if opts.Socket == "" {
		opts.Socket = filepath.Join(t.TempDir(), "d.sock")
	}
	sock := opts.Socket
	opts.Iface = "lo"
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	srv, err := daemon.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() { srv.Close(); <-done })
	return sock
}

// build compiles the library for a test, or stops it.
func build(t *testing.T) string {
	t.Helper()
	for _, h := range append([]string{abi.VerbsHeader}, abi.CMHeaders...) {
		if _, err := os.Stat(h); err != nil {
			testenv.Unmet(t, "no %s (Debian's libibverbs-dev and librdmacm-dev; hack/deps.sh build installs them)", h)
		}
	}
	if _, err := exec.LookPath("cc"); err != nil {
		testenv.Unmet(t, "no C compiler")
	}
	dir := t.TempDir()
	if err := Build(".", dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Each library's export table is Debian's, node for node and symbol for
// symbol: what the committed manifest holds, which verbs/abi's tests hold
// to the installed library.
func TestExportTablesAreDebians(t *testing.T) {
	dir := build(t)
	for lib := range Libraries {
		got, err := abi.Read(filepath.Join(dir, lib))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile("abi/" + strings.TrimSuffix(lib, ".so.1") + ".symbols")
		if err != nil {
			t.Fatal(err)
		}
		want, err := abi.ParseManifest(b)
		if err != nil {
			t.Fatal(err)
		}
		if d := abi.Diff(want, got); len(d) > 0 {
			t.Errorf("%s export table:\n%s", lib, strings.Join(d, "\n"))
		}
	}
}

// Each stubs.c is what make generate writes for the sources as they are:
// a function implemented by hand and still stubbed would be defined twice
// (the link fails), one dropped from the sources would be missing.
func TestStubsUpToDate(t *testing.T) {
	for lib, src := range Libraries {
		headers, minusOne := []string{abi.VerbsHeader}, false
		if lib == "librdmacm.so.1" {
			headers, minusOne = abi.CMHeaders, true
		}
		for _, h := range headers {
			if _, err := os.Stat(h); err != nil {
				testenv.Unmet(t, "no %s (Debian's libibverbs-dev and librdmacm-dev)", h)
			}
		}
		b, err := os.ReadFile("abi/" + strings.TrimSuffix(lib, ".so.1") + ".symbols")
		if err != nil {
			t.Fatal(err)
		}
		table, err := abi.ParseManifest(b)
		if err != nil {
			t.Fatal(err)
		}
		defined, err := abi.Defined(src)
		if err != nil {
			t.Fatal(err)
		}
		kinds, err := abi.ReturnKinds(headers...)
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(src + "/stubs.c")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(table.Stubs(defined, kinds, minusOne), committed) {
			t.Errorf("verbs/%s/stubs.c is stale: run make generate", src)
		}
	}
	// The hand-written sources define what ibv_devinfo calls.
	defined, err := abi.Defined("ibverbs")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ibv_get_device_list@@IBVERBS_1.1", "ibv_open_device@@IBVERBS_1.1", "ibv_query_device@@IBVERBS_1.1",
		"ibv_query_port@@IBVERBS_1.1", "ibv_query_gid@@IBVERBS_1.1", "ibv_query_gid_type", "ibv_close_device@@IBVERBS_1.1"} {
		if !defined[name] {
			t.Errorf("%s is not defined by hand", name)
		}
	}
}

// Debian's own ibv_devinfo, unmodified, finds softrnic0 through the
// library and prints the daemon's attributes; with no daemon it finds no
// device, as on a host without an RDMA NIC.
func TestIbvDevinfo(t *testing.T) {
	devinfo := testenv.RequireTool(t, "ibv_devinfo")
	if out, err := exec.Command("dpkg", "-V", "ibverbs-utils").CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("ibverbs-utils is not Debian's as installed: %v %s", err, out)
	}
	lib := build(t)
	sock := startDaemon(t)
	run := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(devinfo, args...)
		cmd.Env = append(os.Environ(), append([]string{"LD_LIBRARY_PATH=" + lib}, env...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run([]string{"SOFTRNIC_SOCKET=" + sock})
	if err != nil {
		t.Fatalf("ibv_devinfo: %v\n%s", err, out)
	}
	for _, want := range []string{"hca_id:\tsoftrnic0", "transport:\t\t\tiWARP (1)", "fw_ver:\t\t\t\tsoftrnicd/", "node_guid:\t\t\t5352:0000:7f00:0001",
		"phys_port_cnt:\t\t\t1", "state:\t\t\tPORT_ACTIVE (4)", "link_layer:\t\tEthernet"} {
		if !strings.Contains(out, want) {
			t.Errorf("ibv_devinfo does not say %q:\n%s", want, out)
		}
	}
	out, err = run([]string{"SOFTRNIC_SOCKET=" + sock, "SOFTRNIC_VERBS_DEVICE=rnic7"}, "-v")
	if err != nil {
		t.Fatalf("ibv_devinfo -v: %v\n%s", err, out)
	}
	for _, want := range []string{"hca_id:\trnic7", "max_qp_rd_atom:\t\t\t64", "atomic_cap:\t\t\tATOMIC_HCA (1)", "max_srq:\t\t\t0",
		"GID[  0]:\t\t0000:0000:0000:0000:0000:ffff:7f00:0001"} {
		if !strings.Contains(out, want) {
			t.Errorf("ibv_devinfo -v does not say %q:\n%s", want, out)
		}
	}
	out, err = run([]string{"SOFTRNIC_SOCKET=" + filepath.Join(t.TempDir(), "none.sock")})
	if err == nil || !strings.Contains(out, "No IB devices found") {
		t.Errorf("with no daemon: %v\n%s", err, out)
	}
}

// With no $SOFTRNIC_SOCKET the library finds the daemon where softrnicd
// puts its socket by default, /run/softrnic/IFACE.sock, when there is one;
// with several it cannot guess and says so. Each run sees its own
// /run/softrnic: a directory of the test's, bind-mounted in a private mount
// namespace.
func TestDefaultSocket(t *testing.T) {
	devinfo := testenv.RequireTool(t, "ibv_devinfo")
	unshare := testenv.RequireTool(t, "unshare")
	testenv.RequireRoot(t)
	lib := build(t)
	dir := filepath.Dir(startDaemon(t))
	if err := os.MkdirAll("/run/softrnic", 0o755); err != nil {
		t.Fatal(err)
	}
	runIn := func(dir string) string {
		// a probe that waits (on a daemon too busy to accept) is a
		// failure, not a hang
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, unshare, "--mount", "--propagation", "private", "sh", "-c",
			`mount --bind "$1" /run/softrnic && exec "$2"`, "sh", dir, devinfo)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LD_LIBRARY_PATH=" + lib}
		out, _ := cmd.CombinedOutput()
		if ctx.Err() != nil {
			return "timed out: " + string(out)
		}
		return string(out)
	}
	run := func() string { return runIn(dir) }
	if out := run(); !strings.Contains(out, "hca_id:\tsoftrnic0") {
		t.Errorf("with one daemon in /run/softrnic, ibv_devinfo does not find it:\n%s", out)
	}
	// a socket a killed daemon left behind is passed over
	stale, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(dir, "stale.sock"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	if out := run(); !strings.Contains(out, "hca_id:\tsoftrnic0") {
		t.Errorf("with one daemon in /run/softrnic and a stale socket, ibv_devinfo does not find it:\n%s", out)
	}
	// sockets and no daemon: said, not silent
	empty := t.TempDir()
	for _, name := range []string{"a.sock", "b.sock"} {
		l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(empty, name), Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close()
	}
	if out := runIn(empty); !strings.Contains(out, "2 sockets in /run/softrnic and no daemon answers on any") {
		t.Errorf("with two sockets and no daemon in /run/softrnic:\n%s", out)
	}
	// a daemon too busy to accept, its backlog full, answers: neither
	// passed over nor waited for
	full := testenv.FullSocket(t, filepath.Join(dir, "full.sock"))
	if out := run(); !strings.Contains(out, "2 daemons answer in /run/softrnic; set SOFTRNIC_SOCKET") {
		t.Errorf("with a daemon and one whose backlog is full in /run/softrnic:\n%s", out)
	}
	full.Close()
	startDaemonWith(t, daemon.Options{Socket: filepath.Join(dir, "e.sock")})
	if out := run(); !strings.Contains(out, "No IB devices found") || !strings.Contains(out, "2 daemons answer in /run/softrnic; set SOFTRNIC_SOCKET") {
		t.Errorf("with two daemons in /run/softrnic:\n%s", out)
	}
}

// The static rate conversions answer as Debian's libibverbs does, value
// for value (testdata/rates.c run over each library).
func TestRatesAreDebians(t *testing.T) {
	lib := build(t)
	bin := filepath.Join(t.TempDir(), "rates")
	if out, err := exec.Command("cc", "-Wall", "-Werror", "-o", bin, filepath.Join("testdata", "rates.c"), "-l:libibverbs.so.1").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	run := func(env ...string) string {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("rates %v: %v\n%s", env, err, out)
		}
		return string(out)
	}
	debian, ours := run(), run("LD_LIBRARY_PATH="+lib)
	if debian != ours {
		d, o := strings.Split(debian, "\n"), strings.Split(ours, "\n")
		for i := range min(len(d), len(o)) {
			if d[i] != o[i] {
				t.Errorf("Debian's: %s; ours: %s", d[i], o[i])
			}
		}
	}
}

// What the libraries do not implement fails as rdma-core's callers test
// for (testdata/unsupported.c).
func TestUnsupportedFails(t *testing.T) {
	runOK(t, "unsupported", startDaemon(t))
}

// The C side of the control protocol uses ctl's numbers.
func TestCtlNumbers(t *testing.T) {
	c, err := os.ReadFile("ibverbs/ctl.c")
	if err != nil {
		t.Fatal(err)
	}
	h, err := os.ReadFile("ibverbs/srn.h")
	if err != nil {
		t.Fatal(err)
	}
	src := append(c, h...)
	// status_errno in ctl.c maps the statuses by number.
	for i, st := range []ctl.Status{ctl.Success, ctl.InvalidHandle, ctl.InvalidState, ctl.InvalidParameter, ctl.InsufficientResources,
		ctl.InvalidAddress, ctl.ProtectionViolation, ctl.NotImplemented, ctl.ModelNotSupported, ctl.Timeout} {
		if int(st) != i {
			t.Errorf("ctl status %v is %d; ctl.c's status_errno has it as %d", st, st, i)
		}
	}
	for name, want := range map[string]int{"CTL_MAGIC": ctl.Magic, "CTL_VERSION": ctl.Version, "CTL_HEADER": ctl.HeaderLen,
		"CTL_MAX": ctl.MaxMessage, "OP_HELLO": int(ctl.OpHello), "STATUS_SUCCESS": int(ctl.Success),
		"SRN_OP_CREATE_PZ": int(ctl.OpCreatePZ), "SRN_OP_FREE_PZ": int(ctl.OpFreePZ), "SRN_OP_CONNECT_QP": int(ctl.OpConnectQP),
		"SRN_OP_RESERVE_PORT": int(ctl.OpReservePort), "SRN_OP_FREE_PORT": int(ctl.OpFreePort),
		"SRN_OP_RESOLVE_ROUTE": int(ctl.OpResolveRoute)} {
		m := regexp.MustCompile(`\b` + name + `\s*=\s*([^,]+),`).FindSubmatch(src)
		if m == nil {
			t.Errorf("ctl.c has no %s", name)
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(strings.Split(string(m[1]), "/*")[0]), 0, 64)
		if err != nil || int(v) != want {
			t.Errorf("ctl.c: %s = %s, ctl has %d", name, m[1], want)
		}
	}
}

// ctxProgram opens the device, frees the list (ibv_get_device_list(3)
// allows it), and goes on with the context.
const ctxProgram = `#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
int main(void) {
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n != 1) { printf("devices %d\n", n); return 1; }
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx) { perror("open"); return 1; }
	ibv_free_device_list(list);
	struct ibv_device_attr a;
	struct ibv_port_attr p;
	union ibv_gid g;
	if (ibv_query_device(ctx, &a) || ibv_query_port(ctx, 1, &p) || ibv_query_gid(ctx, 1, 0, &g)) { perror("query"); return 1; }
	printf("%s ports %d state %d max_qp %d gid %02x%02x\n", ibv_get_device_name(ctx->device), a.phys_port_cnt, p.state, a.max_qp, g.raw[10], g.raw[15]);
	struct ibv_pd *pd1 = ibv_alloc_pd(ctx), *pd2 = ibv_alloc_pd(ctx);
	if (!pd1 || !pd2 || pd1->handle == 0 || pd1->handle == pd2->handle || pd1->context != ctx) { perror("alloc_pd"); return 1; }
	if (ibv_dealloc_pd(pd1) || ibv_dealloc_pd(pd2)) { printf("dealloc_pd\n"); return 1; }
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_wc wc;
	if (!cq || cq->cqe < 16 || ibv_poll_cq(cq, 1, &wc) != 0 || ibv_destroy_cq(cq)) { printf("cq\n"); return 1; }
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
	if (!pd || ibv_create_srq(pd, &sa) != NULL || errno != EOPNOTSUPP || ibv_dealloc_pd(pd)) { printf("create_srq\n"); return 1; }
	if (ibv_close_device(ctx)) { printf("close\n"); return 1; }
	if (ibv_fork_init() != 0 || ibv_is_fork_initialized() != IBV_FORK_UNNEEDED) { printf("fork\n"); return 1; }
	return 0;
}
`

// A context outlives the device list it was opened from (under the
// address sanitizer where the compiler has it); protection domains are
// the daemon's, each its own; a CQ is made, polled empty and destroyed;
// and a call the library does not implement (shared receive queues)
// fails with NULL and EOPNOTSUPP instead of crashing.
func TestContextOutlivesTheList(t *testing.T) {
	lib := build(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "ctx.c")
	if err := os.WriteFile(src, []byte(ctxProgram), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "ctx")
	args := []string{"-o", bin, src, "-L" + lib, "-l:libibverbs.so.1"}
	if err := exec.Command("cc", append([]string{"-fsanitize=address", "-g"}, args...)...).Run(); err != nil {
		t.Logf("no address sanitizer here (%v): plain build", err)
		if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
			t.Fatalf("cc: %v\n%s", err, out)
		}
	}
	sock := startDaemon(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "SOFTRNIC_SOCKET="+sock)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "softrnic0 ports 1 state 4 max_qp 65536 gid ff01") {
		t.Fatalf("%v:\n%s", err, out)
	}
}

// fakeDaemon listens on a control socket and answers every request with
// what answer makes of it: a daemon that lies, or is not one.
func fakeDaemon(t *testing.T, answer func(req []byte) (reply []byte, fds []int, hangUp bool)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "fake.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, ctl.MaxMessage)
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				reply, fds, hangUp := answer(buf[:n])
				if hangUp {
					return
				}
				var oob []byte
				if len(fds) > 0 {
					oob = unix.UnixRights(fds...)
				}
				_, _, _ = c.WriteMsgUnix(reply, oob, nil)
				time.Sleep(100 * time.Millisecond)
			}()
		}
	}()
	return sock
}

// A daemon that lies, or is not one, is no device: ibv_get_device_list
// finds none and nothing crashes, whatever the reply (a hang-up, a short
// or foreign header, a refusal, a body cut short or too long, strings
// claiming more than there is, descriptors passed by the dozen).
func TestHostileDaemon(t *testing.T) {
	devinfo := testenv.RequireTool(t, "ibv_devinfo")
	lib := build(t)
	hello := func(req []byte) []byte {
		b, err := ctl.Marshal(ctl.Header{Op: ctl.OpHello, ID: 1}, &ctl.HelloReply{Session: 1, IA: ctl.IAAttr{Name: "lo", Address: "127.0.0.1"}, Region: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	many := make([]int, 20)
	for i := range many {
		many[i] = int(devnull.Fd())
	}
	for _, c := range []struct {
		name   string
		answer func(req []byte) ([]byte, []int, bool)
	}{
		{"hang-up", func([]byte) ([]byte, []int, bool) { return nil, nil, true }},
		{"short header", func([]byte) ([]byte, []int, bool) { return []byte("SR\x00"), nil, false }},
		{"not the protocol", func([]byte) ([]byte, []int, bool) { return []byte("HTTP/1.1 400 Bad Request\r\n\r\n"), nil, false }},
		{"other version", func(r []byte) ([]byte, []int, bool) { b := hello(r); b[3] = 9; return b, nil, false }},
		{"refused", func([]byte) ([]byte, []int, bool) {
			b, _ := ctl.Marshal(ctl.Header{Op: ctl.OpHello, ID: 1, Status: ctl.InsufficientResources}, &ctl.ErrorBody{Message: "no"})
			return b, nil, false
		}},
		{"body cut short", func(r []byte) ([]byte, []int, bool) { b := hello(r); return b[:len(b)-5], nil, false }},
		{"body too long", func(r []byte) ([]byte, []int, bool) { return append(hello(r), 1, 2, 3), nil, false }},
		{"string past the end", func(r []byte) ([]byte, []int, bool) {
			b := hello(r)
			b[ctl.HeaderLen+4], b[ctl.HeaderLen+5] = 0xff, 0xff // the IA name's length
			return b, nil, false
		}},
		{"twenty descriptors", func(r []byte) ([]byte, []int, bool) { b := hello(r); return b[:len(b)-1], many, false }},
	} {
		t.Run(c.name, func(t *testing.T) {
			sock := fakeDaemon(t, c.answer)
			cmd := exec.Command(devinfo)
			cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "SOFTRNIC_SOCKET="+sock)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 255 || !strings.Contains(string(out), "No IB devices found") {
				t.Fatalf("ibv_devinfo against a daemon that answers %s: %v\n%s", c.name, err, out)
			}
		})
	}
}

// TestDataflow runs testdata/dataflow.c against a daemon on loopback: two
// RDMA-CM ids of one process connected, with private data; a receive
// posted before the accept; an RDMA Write into a 16-octet field of a heap
// struct registered alone (its neighbours untouched, a fork child's copy
// its own); an inline Send whose buffer is overwritten at once; a
// completion channel polled; an 8 KiB RDMA Read compared; a bad local key
// completing in error; unmapped memory refused registration; the event
// channel pollable and non-blocking; a connect to a port nobody listens on
// REJECTED with ECONNREFUSED.
func TestDataflow(t *testing.T) {
	runOK(t, "dataflow", startDaemon(t), "17999")
}

// The calls of rdma_verbs.h's programs (rdma_server, rdma_client, cmtime)
// behave as rdma-core's: rdma_get_devices, synchronous ids made by
// rdma_create_ep and rdma_get_request whose calls wait for their events,
// CQs made for a QP given none, rdma_migrate_id, and DISCONNECTED for an
// id whose QP was destroyed right after rdma_disconnect
// (testdata/syncep.c).
func TestSynchronousEndpoints(t *testing.T) {
	runOK(t, "syncep", startDaemon(t), strconv.Itoa(freePort(t)))
}

// What an id hears once its QP is gone, and the synchronous calls, hold
// at their edges: an unread REJECTED or ESTABLISHED outlives the QP's
// destruction, a request taken in with it is refused when its listener
// goes, a synchronous call with nothing to wait for returns, two threads
// share a listener and a thread blocked in a listener or channel
// destroyed under it goes on waiting, as over rdma-core, a peer's reset
// before rdma_accept
// fails the accept, a synchronous connect to a peer that resets or stays
// silent fails, and bad arguments fail with errno (testdata/syncedge.c).
func TestSynchronousEdges(t *testing.T) {
	runOK(t, "syncedge", startDaemon(t), strconv.Itoa(freePort(t)))
}

// compile builds the libraries and testdata/NAME.c against them.
func compile(t *testing.T, name string) (bin, lib string) {
	t.Helper()
	lib = build(t)
	bin = filepath.Join(t.TempDir(), name)
	out, err := exec.Command("cc", "-Wall", "-Werror", "-pthread", "-o", bin, filepath.Join("testdata", name+".c"), "-L"+lib,
		"-l:librdmacm.so.1", "-l:libibverbs.so.1").CombinedOutput()
	if err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	return bin, lib
}

// runOK compiles testdata/NAME.c against the libraries, runs it with the
// daemon at sock, and wants "ok" of it within 60 s.
func runOK(t *testing.T, name, sock string, args ...string) {
	t.Helper()
	if out := runProgram(t, name, sock, args...); out != "ok\n" {
		t.Fatalf("%s:\n%s", name, out)
	}
}

// runProgram runs testdata/NAME.c's program as runOK does and returns what
// it wrote on stdout and stderr, once it has exited 0.
func runProgram(t *testing.T, name, sock string, args ...string) string {
	t.Helper()
	bin, lib := compile(t, name)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "SOFTRNIC_SOCKET="+sock)
	cmd.WaitDelay = time.Second
	done := make(chan struct{})
	timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill(); close(done) })
	out, err := cmd.CombinedOutput()
	if !timer.Stop() {
		<-done
		t.Fatalf("%s hung for 60 s:\n%s", name, out)
	}
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
	return string(out)
}

// daemonProcess runs the test binary as a daemon (TestMain) serving at
// sock, under the command prefix if one is given (taskset, say), until
// the test ends or the caller kills it, and returns once it serves.
func daemonProcess(t *testing.T, sock string, prefix ...string) *exec.Cmd {
	t.Helper()
	args := append(append([]string(nil), prefix...), os.Args[0], "-test.run=^$")
	d := exec.Command(args[0], args[1:]...)
	d.Env = append(os.Environ(), "SOFTRNIC_VERBS_TEST_DAEMON="+sock)
	d.Stderr = os.Stderr
	_ = os.Remove(sock)
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Process.Signal(syscall.SIGTERM); d.Wait() })
	for i := 0; ; i++ {
		if c, err := net.Dial("unixpacket", sock); err == nil {
			c.Close()
			return d
		}
		if i == 300 {
			t.Fatal("the daemon never answered on its socket")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// When the daemon is killed under a process with connected QPs, every
// wait of the process ends: DEVICE_REMOVAL for each RDMA-CM id,
// IBV_EVENT_DEVICE_FATAL, EIO from the completion channel, ibv_poll_cq
// and the posts, ENODEV from a synchronous listener's rdma_get_request;
// everything can be destroyed; and once a daemon serves
// the socket again, new ids are its (testdata/daemondeath.c).
func TestDaemonDeath(t *testing.T) {
	bin, lib := compile(t, "daemondeath")
	sock := filepath.Join(t.TempDir(), "d.sock")
	d := daemonProcess(t, sock)
	cmd := exec.Command(bin, strconv.Itoa(freePort(t)))
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "SOFTRNIC_SOCKET="+sock)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(outPipe)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	expect := func(want string) {
		t.Helper()
		select {
		case l, ok := <-lines:
			if ok && l == want {
				return
			}
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("daemondeath said %q, want %q:\n%s", l, want, stderr.String())
		case <-time.After(90 * time.Second):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("daemondeath did not say %q in 90 s:\n%s", want, stderr.String())
		}
	}
	expect("ready")
	d.Process.Kill()
	d.Wait()
	expect("removed")
	daemonProcess(t, sock)
	fmt.Fprintln(in, "go")
	expect("ok")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("daemondeath: %v\n%s", err, stderr.String())
	}
}

// ibv_poll_cq on an empty CQ yields the processor as $SOFTRNIC_POLL_YIELD
// says: always by default (a daemon's poller, this one's or another's, may
// share the CPU and would wait out the application's time slice); with
// "daemon" only on a CPU the daemon's datapath runs on, and on any other
// with no system call; with "never", never. The daemon runs pinned to
// CPU 0 (its IA says so), the program on CPU 1 or 0;
// testdata/pollyield.c counts the sched_yield calls. A value it does not
// know is the default, with a warning on stderr.
func TestPollYield(t *testing.T) {
	taskset := testenv.RequireTool(t, "taskset")
	if runtime.NumCPU() < 2 {
		testenv.Unmet(t, "needs 2 CPUs")
	}
	sock := filepath.Join(t.TempDir(), "d.sock")
	daemonProcess(t, sock, taskset, "-c", "0")
	t.Setenv("SOFTRNIC_POLL_YIELD", "daemon")
	runOK(t, "pollyield", sock, "1", "none")
	runOK(t, "pollyield", sock, "0", "some")
	t.Setenv("SOFTRNIC_POLL_YIELD", "never")
	runOK(t, "pollyield", sock, "0", "none")
	t.Setenv("SOFTRNIC_POLL_YIELD", "")
	runOK(t, "pollyield", sock, "1", "some") // always, by default
	// a value it does not know: the default, and said once
	t.Setenv("SOFTRNIC_POLL_YIELD", "sometimes")
	out := runProgram(t, "pollyield", sock, "1", "some")
	const warning = `softrnic: SOFTRNIC_POLL_YIELD="sometimes" is none of always, daemon, never: always is used` + "\n"
	if out != warning+"ok\n" {
		t.Errorf("with SOFTRNIC_POLL_YIELD=sometimes, pollyield wrote %q, want the warning once, then ok", out)
	}
}

// rdma_bind_addr reserves the port with the daemon: a second bind of it is
// EADDRINUSE while its id holds it, bound or listening, and it is free
// again once the id is destroyed; port 0 draws distinct free ports
// (testdata/portbind.c).
func TestPortReservation(t *testing.T) {
	runOK(t, "portbind", startDaemon(t), strconv.Itoa(freePort(t)))
}

// A privileged port is bound for a client that has CAP_NET_BIND_SERVICE
// over the daemon's network namespace (root here), and refused with
// EACCES to the same program in a user namespace of its own, where it has
// every capability, but over nothing of the host's (testdata/privport.c).
func TestPrivilegedPort(t *testing.T) {
	testenv.RequireRoot(t)
	unshare := testenv.RequireTool(t, "unshare")
	sock := startDaemon(t)
	port := testenv.FreePrivilegedPort(t)
	runOK(t, "privport", sock, strconv.Itoa(port), "ok")
	bin, lib := compile(t, "privport")
	cmd := exec.Command(unshare, "--user", "--map-root-user", bin, strconv.Itoa(port), "eacces")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "SOFTRNIC_SOCKET="+sock)
	if out, err := cmd.CombinedOutput(); err != nil || string(out) != "ok\n" {
		t.Fatalf("privport in a user namespace of its own: %v\n%s", err, out)
	}
}

// Address resolution asks the daemon's host, in the daemon's network
// namespace, not the application's: with the daemon in a namespace of its
// own (192.0.2.1/24, no default route) and the program outside it, the
// daemon's neighbour resolves and an address beyond its subnet does not,
// whatever routes the program's namespace has; a connect to an address of
// its subnet where no host answers is UNREACHABLE (testdata/resolve.c).
func TestResolveInDaemonsNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	pair, err := topology.New(topology.Options{Prefix: "srn-res"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pair.Close() })
	sock := filepath.Join(t.TempDir(), "d.sock")
	t.Setenv("SOFTRNIC_VERBS_TEST_IFACE", pair.A.Link)
	daemonProcess(t, sock, "ip", "netns", "exec", pair.A.Namespace)
	runOK(t, "resolve", sock, pair.B.Addr.Addr().String(), "resolved")
	runOK(t, "resolve", sock, "198.51.100.7", "error")
	// nobody at .3: the daemon's host finds no neighbour there
	runOK(t, "resolve", sock, "192.0.2.3", "unreachable")
}

// TestIBConnect runs a C program that connects QPs the InfiniBand way
// (RTR by QPN and GID, and by QPN and LID), one side of each pair at RTS
// and posting before the other's RTR, moves data over them, destroys one
// (its peer keeps its receive until it sends), and sees a connection to
// nobody put its QP in ERR (testdata/ibconnect.c); no connection ends
// with a reset.
func TestIBConnect(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	var log testenv.Buffer
	runOK(t, "ibconnect", startDaemonWith(t, daemon.Options{IBConnPort: port, IBConnTimeout: time.Second, IBConnParkTimeout: 300 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&log, nil))}))
	// A QP destroyed connected ends its connection in order (its
	// last Sends, then its FIN), not with a reset.
	if strings.Contains(log.String(), "how=broken") {
		t.Errorf("a connection ended broken:\n%s", log.String())
	}
}

// TestWorkRequestAPI runs a C program that posts through the work request
// API (ibv_create_qp_ex with send operations, ibv_wr_*) every kind of
// request in one batch, and batches aborted or with an invalid request
// that must post nothing, and reads the receiving side's completions from
// an extended CQ (ibv_create_cq_ex, ibv_start_poll...) (testdata/wrapi.c).
func TestWorkRequestAPI(t *testing.T) {
	runOK(t, "wrapi", startDaemonWith(t, daemon.Options{IBConnPort: freePort(t)}))
}

// freePort is a TCP port of loopback that nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

package scale

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// The /proc readers against the kernel's formats: a status file's RSS
// lines, a stat line whose command name holds the characters that break a
// naive split, and the link targets of /proc/PID/fd.
func TestProcParsers(t *testing.T) {
	status := "Name:\tsoftrnicd\nVmHWM:\t  30000 kB\nVmRSS:\t   25400 kB\nRssAnon:\t    1700 kB\nRssFile:\t    7700 kB\nRssShmem:\t   16000 kB\nThreads:\t7\n"
	m, err := parseStatus([]byte(status))
	if want := (Mem{RSS: 25400 << 10, Anon: 1700 << 10, File: 7700 << 10, Shmem: 16000 << 10}); err != nil || m != want {
		t.Errorf("parseStatus: %+v %v, want %+v", m, err, want)
	}
	if _, err := parseStatus([]byte("VmRSS:\t1 kB\n")); err == nil {
		t.Error("parseStatus took a status without the Rss split")
	}

	stat := "4242 (soft rnic) (d)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 130 0 0 20 0 7 0 100 1000 200\n"
	if s, err := parseStat([]byte(stat)); err != nil || s != 3.8 {
		t.Errorf("parseStat: %v %v, want 3.8 s (250 + 130 ticks)", s, err)
	}
	if _, err := parseStat([]byte("4242 (x) S 1 2")); err == nil {
		t.Error("parseStat took a short line")
	}

	for target, want := range map[string]string{
		"socket:[123456]":                    "socket",
		"anon_inode:[eventfd]":               "eventfd",
		"anon_inode:[eventpoll]":             "eventpoll",
		"/memfd:softrnic-ep (deleted)":       "memfd:softrnic-ep",
		"/memfd:softrnic-session":            "memfd:softrnic-session",
		"pipe:[99]":                          "pipe",
		"/dev/null":                          "file",
		"anon_inode:bpf-map":                 "bpf-map",
		"/tmp/softrnic-scale1/softrnicd.log": "file",
	} {
		if got := fdKind(target); got != want {
			t.Errorf("fdKind(%q) = %q, want %q", target, got, want)
		}
	}
}

// logSummary counts a daemon's repeated warnings once each, most frequent
// first, keyed by level and message whatever their time and attributes.
func TestLogSummary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.log")
	log := `time=2025-01-01T00:00:00Z level=WARN msg="accept failed" err="too many open files"
time=2025-01-01T00:00:01Z level=ERROR msg=stall loop=poller
time=2025-01-01T00:00:02Z level=WARN msg="accept failed" err="too many open files"
`
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`2× time=2025-01-01T00:00:00Z level=WARN msg="accept failed" err="too many open files"`,
		`1× time=2025-01-01T00:00:01Z level=ERROR msg=stall loop=poller`,
	}
	if got := logSummary(path); !reflect.DeepEqual(got, want) {
		t.Errorf("logSummary:\n%q\nwant\n%q", got, want)
	}
}

package scale

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Mem is a process's resident memory as /proc/PID/status gives it, in
// bytes. RSS is Anon + File + Shmem: the split tells the daemon's own
// heap (Anon) from the rings and registered memory it maps from its
// clients (Shmem), which a per-QP figure would otherwise lump together.
type Mem struct {
	RSS   int64 `json:"vm_rss"`
	Anon  int64 `json:"rss_anon"`
	File  int64 `json:"rss_file"`
	Shmem int64 `json:"rss_shmem"`
}

// readMem reads pid's VmRSS and its split.
func readMem(pid int) (Mem, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Mem{}, err
	}
	return parseStatus(b)
}

// parseStatus reads the RSS lines of a /proc/PID/status, each "Name:
// N kB".
func parseStatus(b []byte) (Mem, error) {
	var m Mem
	fields := map[string]*int64{"VmRSS": &m.RSS, "RssAnon": &m.Anon, "RssFile": &m.File, "RssShmem": &m.Shmem}
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		p := fields[name]
		if !ok || p == nil {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return Mem{}, fmt.Errorf("status line %q: want N kB", sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return Mem{}, fmt.Errorf("status line %q: %w", sc.Text(), err)
		}
		*p = kb << 10
		seen++
	}
	if seen != len(fields) {
		return Mem{}, fmt.Errorf("status has %d of VmRSS, RssAnon, RssFile, RssShmem", seen)
	}
	return m, nil
}

// fdKinds counts the descriptors pid holds open by kind (socket,
// eventfd, memfd:NAME, pipe, file...): which kind grows with the QPs says
// which object costs a descriptor each.
func fdKinds(pid int) (map[string]int, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	kinds := map[string]int{}
	for _, e := range es {
		target, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue // closed since the listing
		}
		kinds[fdKind(target)]++
	}
	return kinds, nil
}

// fdKind names what a /proc/PID/fd link points to.
func fdKind(target string) string {
	switch {
	case strings.HasPrefix(target, "socket:"):
		return "socket"
	case strings.HasPrefix(target, "pipe:"):
		return "pipe"
	case strings.HasPrefix(target, "anon_inode:"):
		return strings.Trim(strings.TrimPrefix(target, "anon_inode:"), "[]")
	case strings.HasPrefix(target, "/memfd:"):
		name, _, _ := strings.Cut(strings.TrimPrefix(target, "/"), " (deleted)")
		return name
	}
	return "file"
}

func total(kinds map[string]int) int {
	n := 0
	for _, v := range kinds {
		n += v
	}
	return n
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture the project builds for (sysconf(_SC_CLK_TCK)).
const clockTick = 100

// CPUSeconds is pid's user plus system CPU time so far, all threads.
func CPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStat(b)
}

// parseStat reads utime and stime from a /proc/PID/stat line. The command
// name, in parentheses, may hold spaces and parentheses itself: fields are
// counted from the last ")", after which utime and stime are the 12th and
// 13th (fields 14 and 15 of proc(5)).
func parseStat(b []byte) (float64, error) {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, fmt.Errorf("stat %q: no command name", s)
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("stat %q: %d fields after the name", s, len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("stat %q: utime %v, stime %v", s, err1, err2)
	}
	return float64(ut+st) / clockTick, nil
}

// openFileLimit is pid's RLIMIT_NOFILE as /proc/PID/limits shows it
// ("soft/hard"): what the process runs with after Go raised its soft
// limit at startup, not what it was started with.
func openFileLimit(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return "unknown: " + err.Error()
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			if f := strings.Fields(rest); len(f) >= 2 {
				return f[0] + "/" + f[1]
			}
		}
	}
	return "unknown"
}

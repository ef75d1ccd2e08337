package topology

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// Counters reads the host's network counters as nstat names them
// ("Tcp:OutRsts", "TcpExt:TCPTimeouts", …), from its namespace's
// /proc/net/snmp and /proc/net/netstat.
func (h Host) Counters() (map[string]uint64, error) {
	all := map[string]uint64{}
	err := h.Do(func() error {
		for _, f := range []string{"/proc/thread-self/net/snmp", "/proc/thread-self/net/netstat"} {
			if err := readSNMP(f, all); err != nil {
				return err
			}
		}
		return nil
	})
	return all, err
}

// readSNMP reads a /proc/net/snmp-style file: pairs of lines, names then
// values, each starting with its group.
func readSNMP(path string, into map[string]uint64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var names []string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if names == nil || names[0] != fields[0] {
			names = fields
			continue
		}
		group := strings.TrimSuffix(fields[0], ":")
		for i := 1; i < len(fields) && i < len(names); i++ {
			if v, err := strconv.ParseUint(fields[i], 10, 64); err == nil {
				into[group+":"+names[i]] = v
			}
		}
		names = nil
	}
	return sc.Err()
}

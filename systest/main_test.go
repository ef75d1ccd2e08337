package systest

import (
	"os"
	"testing"

	"github.com/softrnic/softrnic/internal/leakcheck"
)

// TestMain fails the run if a goroutine the tests started in this process
// (an IA's watcher, a copier of a process's output, a namespace hop) is
// still running after the tests ended. The daemons and applications are
// other processes: their own leaks show in their packages' tests.
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }

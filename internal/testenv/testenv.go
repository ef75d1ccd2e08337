// Package testenv says whether a test can use what it needs from the host
// (root, network namespaces, external tools) and how to react when it cannot.
//
// Outside CI a test whose needs are not met is skipped with a message that names
// what is missing. In CI (the CI environment variable is set to anything but
// "false" or "0") the same test fails instead: CI runs as root with every tool
// installed by the project's own scripts, so a missing need there is a defect.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run under CI.
func InCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "false" && v != "0"
}

// Unmet skips the test outside CI and fails it in CI, with the reason.
func Unmet(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI requires this test to run, but: "+format, args...)
	}
	t.Skipf("skipped: "+format, args...)
}

// RequireRoot stops the test (see Unmet) unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unmet(t, "needs root (network namespaces, veth, packet capture); run `sudo make test`")
	}
}

// RequireTool returns the path of an executable, or stops the test (see Unmet).
func RequireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Unmet(t, "needs %q on PATH (`make deps` installs it)", name)
	}
	return p
}

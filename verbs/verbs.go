// Package verbs builds softrnic's replacements for rdma-core's libraries,
// libibverbs.so.1 and librdmacm.so.1: the verbs and RDMA-CM ABI of
// Debian's rdma-core over softrnicd, with no kernel RDMA device, for
// unmodified applications found through LD_LIBRARY_PATH (issue 22). The
// libraries are C (verbs/ibverbs, verbs/rdmacm), linked with the version
// scripts of verbs/abi so that their export tables equal Debian's. So far
// the device is there (ibv_get_device_list, ibv_open_device, the queries
// ibv_devinfo makes) and librdmacm's event names; every other call fails
// with EOPNOTSUPP.
package verbs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Libraries are the libraries Build makes, by soname, with the directory
// of their sources under verbs.
var Libraries = map[string]string{"libibverbs.so.1": "ibverbs", "librdmacm.so.1": "rdmacm"}

// buildOrder is the order Build makes them in: librdmacm links
// libibverbs.
var buildOrder = []string{"libibverbs.so.1", "librdmacm.so.1"}

// shared are sources of libibverbs compiled into librdmacm too: the
// control protocol and EVDs, with which the RDMA-CM drives the session of
// a context libibverbs opened (hidden in both).
var shared = map[string][]string{"librdmacm.so.1": {"ibverbs/ctl.c", "ibverbs/evd.c"}}

// Build compiles the libraries from the sources under dir (the verbs
// directory of the tree) into out.
func Build(dir, out string) error {
	cc, err := exec.LookPath("cc")
	if err != nil {
		return fmt.Errorf("verbs: no C compiler: %w", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, lib := range buildOrder {
		src := Libraries[lib]
		srcs, err := filepath.Glob(filepath.Join(dir, src, "*.c"))
		if err != nil || len(srcs) == 0 {
			return fmt.Errorf("verbs: no sources in %s", filepath.Join(dir, src))
		}
		args := []string{"-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
			"-o", filepath.Join(out, lib), "-Wl,-soname," + lib,
			"-Wl,--version-script=" + filepath.Join(dir, "abi", strings.TrimSuffix(lib, ".so.1")+".map"), "-Wl,-z,defs"}
		args = append(args, "-I", filepath.Join(dir, "ibverbs"))
		args = append(args, srcs...)
		for _, f := range shared[lib] {
			args = append(args, filepath.Join(dir, f))
		}
		if lib != "libibverbs.so.1" {
			args = append(args, filepath.Join(out, "libibverbs.so.1"))
		}
		args = append(args, "-lpthread")
		if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("verbs: cc %s: %v\n%s", lib, err, b)
		}
	}
	return nil
}

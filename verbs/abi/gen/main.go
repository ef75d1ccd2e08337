// Command gen writes verbs/abi's manifests and version scripts from the
// installed rdma-core libraries (make generate; run in verbs/abi).
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/softrnic/softrnic/verbs/abi"
)

func main() {
	for _, lib := range abi.Libraries {
		path, err := abi.Installed(lib)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
		t, err := abi.Read(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
		base := strings.TrimSuffix(lib, ".so.1")
		for name, b := range map[string][]byte{base + ".symbols": t.Manifest(), base + ".map": t.VersionScript()} {
			if err := os.WriteFile(name, b, 0o644); err != nil {
				fmt.Fprintln(os.Stderr, "gen:", err)
				os.Exit(1)
			}
		}
		fmt.Printf("%s: %d nodes, %d symbols\n", path, len(t.Nodes), len(t.Symbols))
		var err2 error
		switch lib {
		case "libibverbs.so.1":
			err2 = writeStubs(t, "../ibverbs", false, abi.VerbsHeader)
		case "librdmacm.so.1":
			err2 = writeStubs(t, "../rdmacm", true, abi.CMHeaders...)
		}
		if err2 != nil {
			fmt.Fprintln(os.Stderr, "gen:", err2)
			os.Exit(1)
		}
	}
}

// writeStubs writes dir/stubs.c: the symbols of t that dir's sources do
// not define.
func writeStubs(t *abi.Table, dir string, minusOne bool, headers ...string) error {
	defined, err := abi.Defined(dir)
	if err != nil {
		return err
	}
	kinds, err := abi.ReturnKinds(headers...)
	if err != nil {
		return err
	}
	return os.WriteFile(dir+"/stubs.c", t.Stubs(defined, kinds, minusOne), 0o644)
}

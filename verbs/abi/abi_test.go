package abi

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/testenv"
)

// committed reads the manifest and the version script make generate wrote
// for lib.
func committed(t *testing.T, lib string) (*Table, []byte, []byte) {
	t.Helper()
	base := strings.TrimSuffix(lib, ".so.1")
	b, err := os.ReadFile(base + ".symbols")
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(base + ".map")
	if err != nil {
		t.Fatal(err)
	}
	return m, script, b
}

// The committed tables are the installed rdma-core's: a distribution with
// another rdma-core (a new version node, a new private ABI number) is
// caught here, and make generate takes its tables.
func TestManifestsMatchInstalled(t *testing.T) {
	for _, lib := range Libraries {
		t.Run(lib, func(t *testing.T) {
			path, err := Installed(lib)
			if err != nil {
				testenv.Unmet(t, "%v (Debian's libibverbs1 and librdmacm1; hack/deps.sh test installs them)", err)
			}
			got, err := Read(path)
			if err != nil {
				t.Fatal(err)
			}
			want, script, manifest := committed(t, lib)
			if d := Diff(want, got); len(d) > 0 {
				t.Fatalf("%s differs from the committed manifest (run make generate):\n%s", path, strings.Join(d, "\n"))
			}
			if !bytes.Equal(got.VersionScript(), script) {
				t.Fatalf("the committed version script is not the one %s gives (run make generate)", path)
			}
			if !bytes.Equal(got.Manifest(), manifest) {
				t.Fatalf("the committed manifest is not the one %s gives (run make generate)", path)
			}
		})
	}
}

// The scheme the replacements use reproduces an export table exactly: a
// shared object linked with the committed version script, each default
// symbol defined by name and each compat symbol bound to its node with
// .symver (as rdma-core's util/symver.h does), exports what the installed
// library exports, node for node and symbol for symbol. The bodies here
// are empty: this checks linking, not behaviour.
func TestVersionScriptReproducesTheTable(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		testenv.Unmet(t, "no C compiler: %v", err)
	}
	for _, lib := range Libraries {
		t.Run(lib, func(t *testing.T) {
			want, script, _ := committed(t, lib)
			dir := t.TempDir()
			var src bytes.Buffer
			for _, s := range want.Symbols {
				id := s.Name
				if want.Versioned(s.Name) {
					at := "@"
					if s.Default {
						at = "@@"
					}
					id = fmt.Sprintf("v_%s_%s", s.Name, strings.NewReplacer(".", "_").Replace(s.Version))
					fmt.Fprintf(&src, "__asm__(\".symver %s, %s%s%s\");\n", id, s.Name, at, s.Version)
				}
				if s.Func {
					fmt.Fprintf(&src, "void %s(void) {}\n", id)
				} else {
					fmt.Fprintf(&src, "int %s;\n", id)
				}
			}
			c, m, so := filepath.Join(dir, "lib.c"), filepath.Join(dir, "lib.map"), filepath.Join(dir, lib)
			if err := os.WriteFile(c, src.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(m, script, 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(cc, "-shared", "-fPIC", "-fno-builtin", "-o", so, "-Wl,-soname,"+lib,
				"-Wl,--version-script="+m, c).CombinedOutput(); err != nil {
				t.Fatalf("cc: %v\n%s", err, out)
			}
			got, err := Read(so)
			if err != nil {
				t.Fatal(err)
			}
			if d := Diff(want, got); len(d) > 0 {
				t.Fatalf("the linked library's table differs:\n%s", strings.Join(d, "\n"))
			}
		})
	}
}

// Diff and the manifest's round trip, on a table made by hand.
func TestManifestRoundTripAndDiff(t *testing.T) {
	a := &Table{Soname: "libx.so.1", Nodes: []Node{{Name: "X_1.0"}, {Name: "X_1.1", Parent: "X_1.0"}},
		Symbols: []Symbol{{Name: "f", Version: "X_1.0", Func: true}, {Name: "f", Version: "X_1.1", Default: true, Func: true},
			{Name: "d", Version: "X_1.1", Default: true}}}
	b, err := ParseManifest(a.Manifest())
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(a, b); len(d) > 0 || !bytes.Equal(a.Manifest(), b.Manifest()) {
		t.Fatalf("round trip: %v\n%s", d, b.Manifest())
	}
	b.Symbols = b.Symbols[1:]
	b.Nodes = append(b.Nodes, Node{Name: "X_1.2", Parent: "X_1.1"})
	d := Diff(a, b)
	if len(d) != 2 || !strings.Contains(strings.Join(d, "\n"), "extra node X_1.2") || !strings.Contains(strings.Join(d, "\n"), "missing symbol") {
		t.Fatalf("diff: %q", d)
	}
	script := string(a.VersionScript())
	if !strings.Contains(script, "X_1.1 {\n\tglobal:\n\t\td;\n\t\tf;\n} X_1.0;") || !strings.Contains(script, "local: *;") {
		t.Fatalf("version script:\n%s", script)
	}
	for _, bad := range []string{"soname", "node", "symbol f func", "symbol @X func", "symbol f@X thing", "what"} {
		if _, err := ParseManifest([]byte("soname l\n" + bad + "\n")); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

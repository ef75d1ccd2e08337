// Command mklib builds softrnic's libibverbs.so.1 (package verbs) into a
// directory: go run ./verbs/mklib -o build/lib (make build does).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/softrnic/softrnic/verbs"
)

func main() {
	out := flag.String("o", "build/lib", "output `directory`")
	src := flag.String("src", "verbs", "the tree's verbs `directory`")
	flag.Parse()
	if err := verbs.Build(*src, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mklib:", err)
		os.Exit(1)
	}
}

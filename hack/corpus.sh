#!/usr/bin/env bash
# Copies what `make fuzz` found interesting from Go's fuzz cache into each
# package's testdata/fuzz, where `go test` (and so `make test`) replays it as
# the committed seed corpus. At most MAX (default 64) entries per target, the
# newest first.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
MAX=${MAX:-64}
cache=$("$GO" env GOCACHE)/fuzz
mod=$("$GO" list -m)
for pkg in $("$GO" list ./...); do
	dir=${pkg#"$mod"}
	dir=.${dir:-/}
	for target in $("$GO" test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
		src=$cache/$pkg/$target
		[ -d "$src" ] || continue
		dst=$dir/testdata/fuzz/$target
		mkdir -p "$dst"
		n=0
		for f in $(ls -t "$src"); do
			[ "$n" -lt "$MAX" ] || break
			cp "$src/$f" "$dst/$f"
			n=$((n + 1))
		done
		echo "corpus: $dst: $(ls "$dst" | wc -l) entries"
	done
done

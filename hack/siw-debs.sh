#!/usr/bin/env bash
# hack/siw-debs.sh [--cpio] [--elf] CACHE PKG...: Debian packages for the
# siw guest (../shared/interop/siw-guest, built by its build.sh), without
# touching the guest's own files. Prints the .deb files, one a line; with
# --cpio, an initramfs overlay holding them unpacked instead (its path).
#
# The packages are the versions apt-get download fetches for the host's
# suite, which must be the guest's (checked: os-release of both), and every
# Depends of each, but those among PKG, must be installed in the guest in a
# version that satisfies it (checked against the guest's dpkg status). Each
# is downloaded once into CACHE/debs; the guest's os-release and dpkg status
# are read from its initramfs once per initramfs (CACHE/guest).
#
# --elf (with --cpio) checks instead that the overlay's programs load: that
# every DT_NEEDED of every ELF file in it (after /usr/share is dropped) is
# found, by its name, in the loader's default directories or the ELF's
# RUNPATH/RPATH, among the guest's files (its initramfs's listing) or the
# overlay's, and fails naming each that is not. That is for packages whose
# Depends name more than their ELF files load (fio's: libdevmapper1.02.1,
# which libcryptsetup12 loads for librbd1, which fio's binary links for an
# engine the rows never use, Depends on dmsetup, a program nothing here
# runs, and Depends would pull in more of that kind); a package's scripts
# (fio's Python ones) are not checked and may not run. The Depends are
# then not checked.
#
# Linux unpacks concatenated cpio archives into one initramfs, later files
# replacing earlier ones, so `cat initramfs.cpio CACHE/overlay.cpio` booted
# with run.sh --initrd is the guest with the packages' files (but
# /usr/share) added; the overlay is rebuilt only when this script, the
# guest's initramfs or the packages change. hack/siw-dapl/overlay.sh uses
# the first form, hack/interop-verbs.sh the second (qperf; fio
# with --elf).
set -euo pipefail
cpio= elf=
while :; do
	case ${1:-} in
	--cpio) cpio=1; shift ;;
	--elf) elf=1; shift ;;
	*) break ;;
	esac
done
CACHE=${1:?usage: siw-debs.sh [--cpio] [--elf] CACHE PKG...}
shift
[ $# -gt 0 ] || { echo "usage: siw-debs.sh [--cpio] [--elf] CACHE PKG..." >&2; exit 2; }
[ -z "$elf" ] || [ -n "$cpio" ] || { echo "siw-debs: --elf needs --cpio" >&2; exit 2; }
IMG=${SIW_GUEST_DIR:-/var/tmp/softrnic-siw-guest}
BASE=$IMG/initramfs.cpio
die() { echo "siw-debs: $*" >&2; exit 1; }
[ -r "$BASE" ] || die "no $BASE (run the guest's build.sh first)"
mkdir -p "$CACHE/debs"

# The guest's suite and installed packages, read from its initramfs once
# per initramfs.
key=$(stat -c '%s %Y' "$BASE")
if [ "$(cat "$CACHE/guest.key" 2>/dev/null)" != "$key" ] || [ ! -s "$CACHE/guest/files" ]; then
	rm -rf "$CACHE/guest" && mkdir -p "$CACHE/guest"
	(cd "$CACHE/guest" && cpio -id --quiet usr/lib/os-release var/lib/dpkg/status < "$BASE")
	[ -s "$CACHE/guest/var/lib/dpkg/status" ] || die "no dpkg status in $BASE"
	cpio -it --quiet < "$BASE" | sed 's|^\./||' > "$CACHE/guest/files"
	echo "$key" > "$CACHE/guest.key"
fi
gsuite=$(. "$CACHE/guest/usr/lib/os-release" && echo "${VERSION_CODENAME:-}")
hsuite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$gsuite" ] && [ "$gsuite" = "$hsuite" ] ||
	die "the guest is Debian '$gsuite', this host '$hsuite': apt-get download here would fetch the wrong suite's $*"

# The packages, downloaded once.
debs=()
for p in "$@"; do
	f=$(ls -t "$CACHE/debs/${p}"_*.deb 2>/dev/null | head -1 || true)
	if [ -z "$f" ]; then
		(cd "$CACHE/debs" && { apt-get download -qq -o APT::Sandbox::User=root "$p" ||
			{ apt-get update -qq && apt-get download -qq -o APT::Sandbox::User=root "$p"; }; }) >&2 ||
			die "apt-get download $p failed"
		f=$(ls -t "$CACHE/debs/${p}"_*.deb | head -1)
	fi
	debs+=("$f")
done

# Every dependency (but the packages named) must be installed in the guest
# in a version that satisfies it: the same suite's glibc, libibverbs,
# librdmacm.
gver() { # the version of package $1 installed in the guest
	awk -v p="$1" '/^Package: / { pk = $2 } /^Status: / { st = $0 }
		/^Version: / { if (pk == p && st ~ /install ok installed/) print $2 }' "$CACHE/guest/var/lib/dpkg/status"
}
for d in "${debs[@]}"; do
	[ -z "$elf" ] || break
	dpkg-deb -f "$d" Depends | tr ',' '\n' | while read -r dep; do
		[ -n "$dep" ] || continue
		name=${dep%% *} rel=
		[[ " $* " == *" $name "* ]] && continue
		have=$(gver "$name")
		[ -n "$have" ] || die "$(basename "$d") needs $dep: not installed in the guest"
		if [[ $dep =~ \((\>=|\<=|\>\>|\<\<|=)\ *([^\)]+)\) ]]; then
			case ${BASH_REMATCH[1]} in '>=') rel=ge ;; '<=') rel=le ;; '>>') rel=gt ;; '<<') rel=lt ;; '=') rel=eq ;; esac
			dpkg --compare-versions "$have" "$rel" "${BASH_REMATCH[2]}" ||
				die "$(basename "$d") needs $dep; the guest has $name $have"
		fi
	done
done

if [ -z "$cpio" ]; then
	printf '%s\n' "${debs[@]}"
	exit 0
fi
[ -s "$CACHE/guest/files" ] || die "no listing of $BASE in $CACHE/guest (remove $CACHE/guest.key)"
stamp=$( { cat "$0"; echo "$elf $key ${debs[*]##*/}"; } | sha256sum | cut -c1-16)
if [ -f "$CACHE/overlay.cpio" ] && [ "$(cat "$CACHE/overlay.stamp" 2>/dev/null)" = "$stamp" ]; then
	echo "$CACHE/overlay.cpio"
	exit 0
fi
R=$CACHE/root.tmp
rm -rf "$R" && mkdir -p "$R"
for d in "${debs[@]}"; do dpkg-deb -x "$d" "$R"; done
rm -rf "$R/usr/share"
# A directory of the overlay where the guest has a symlink (merged /usr:
# /lib -> usr/lib) would replace the symlink when Linux unpacks it, and
# the guest would find no /init: its files go where the symlink points.
for d in bin sbin lib lib32 lib64 libx32; do
	[ -d "$R/$d" ] && [ ! -L "$R/$d" ] || continue
	grep -qxF "$d" "$CACHE/guest/files" && ! grep -q "^$d/" "$CACHE/guest/files" || continue
	mkdir -p "$R/usr/$d" && cp -a "$R/$d/." "$R/usr/$d/" && rm -rf "${R:?}/$d"
done
if [ -n "$elf" ]; then
	# every DT_NEEDED of every ELF file, found by name (see the top)
	have=$CACHE/have.tmp
	{ cat "$CACHE/guest/files"; (cd "$R" && find . -mindepth 1 ! -type d | sed 's|^\./||'); } | LC_ALL=C sort -u > "$have"
	missing=()
	while IFS= read -r -d '' f; do
		head -c 4 "$f" | grep -q $'^\x7fELF' || continue
		dyn=$(readelf -d "$f" 2>/dev/null) || die "readelf -d ${f#"$R"/} failed"
		dirs="lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu lib64 usr/lib64 lib usr/lib"
		origin=$(dirname "${f#"$R"/}")
		for rp in $(sed -n 's/.*(R\(UN\)\?PATH).*\[\(.*\)\]$/\2/p' <<< "$dyn" | tr ':' ' '); do
			rp=${rp//\$ORIGIN/\/$origin} rp=${rp//\$\{ORIGIN\}/\/$origin}
			dirs+=" ${rp#/}"
		done
		for n in $(sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p' <<< "$dyn"); do
			found=
			for dir in $dirs; do
				grep -qxF "$dir/$n" "$have" && { found=1; break; }
			done
			[ -n "$found" ] || missing+=("${f#"$R"/} needs $n")
		done
	done < <(find "$R" -type f -print0)
	rm -f "$have"
	if [ "${#missing[@]}" -gt 0 ]; then
		printf 'siw-debs: not in the guest or the overlay: %s\n' "${missing[@]}" >&2
		rm -rf "$R"
		die "${#missing[@]} DT_NEEDED not found (first: ${missing[0]})"
	fi
fi
(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$CACHE/overlay.cpio.tmp"
mv "$CACHE/overlay.cpio.tmp" "$CACHE/overlay.cpio"
echo "$stamp" > "$CACHE/overlay.stamp"
rm -rf "$R"
echo "$CACHE/overlay.cpio"

#!/usr/bin/env bash
# hack/siw-dapl/overlay.sh GUESTDIR: builds (cached) an initramfs overlay that
# teaches the siw guest (GUESTDIR = interop/siw-guest, built by its build.sh)
# uDAPL, without touching the guest's own files. Prints the overlay's path.
#
# Linux unpacks concatenated cpio archives into one initramfs, later files
# replacing earlier ones, so `cat initramfs.cpio overlay.cpio job.cpio` booted
# with run.sh --initrd adds:
#   * Debian's libdapl2 (libdat2, libdaplofa) and dapl2-utils (dtest,
#     dapltest), the versions apt-get download fetches for the host's suite,
#     which must be the guest's (hack/siw-debs.sh checks that, and every
#     Depends of the two packages against the guest's dpkg status);
#   * /etc/dat.conf and /dapl/dat.conf: one entry, IA name softrnic0 (the
#     name softrnic's side uses: dtest's client takes the server's name) on
#     libdaplofa with ia_params "eth0 0" (siw0 is attached to eth0);
#   * /dapl/lib.sh, the job helpers;
#   * /init: the guest's own init with one hook inserted before its mode
#     dispatch: when /dapl/job exists (appended by hack/interop-dapl.sh for
#     each boot) it is sourced instead of the mode, so any of run.sh's modes
#     (interop uses hold) boots into the job, with siw set up by the guest's
#     own code from iw.siwopts.
# The result lives in $SIW_DAPL_CACHE (default /var/tmp/softrnic-siw-dapl)
# and is rebuilt only when this script, lib.sh, the guest's init, the
# guest's initramfs or the packages change.
set -euo pipefail
GUEST=${1:?usage: overlay.sh GUESTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
IMG=${SIW_GUEST_DIR:-/var/tmp/softrnic-siw-guest}
CACHE=${SIW_DAPL_CACHE:-/var/tmp/softrnic-siw-dapl}
IA=softrnic0
BASE=$IMG/initramfs.cpio
die() { echo "siw-dapl overlay: $*" >&2; exit 1; }
[ -r "$BASE" ] || die "no $BASE (run $GUEST/build.sh first)"
[ -r "$GUEST/init" ] || die "no $GUEST/init"

# libdapl2 and dapl2-utils of the guest's suite, every Depends checked
# against the guest's dpkg status (hack/siw-debs.sh).
mapfile -t debs < <(bash "$HERE/../siw-debs.sh" "$CACHE" libdapl2 dapl2-utils)
[ "${#debs[@]}" = 2 ] || die "hack/siw-debs.sh found no libdapl2 and dapl2-utils for the guest"
key=$(stat -c '%s %Y' "$BASE")

stamp=$( { cat "$0" "$HERE/lib.sh" "$GUEST/init"; echo "$key ${debs[*]##*/}"; } | sha256sum | cut -c1-16)
if [ -f "$CACHE/overlay.cpio" ] && [ "$(cat "$CACHE/overlay.stamp" 2>/dev/null)" = "$stamp" ]; then
	echo "$CACHE/overlay.cpio"
	exit 0
fi

R=$CACHE/root.tmp
rm -rf "$R" && mkdir -p "$R/dapl"
for d in "${debs[@]}"; do dpkg-deb -x "$d" "$R"; done
rm -rf "$R/usr/share"
for f in usr/bin/dtest usr/bin/dapltest usr/lib/x86_64-linux-gnu/libdat2.so.2 usr/lib/x86_64-linux-gnu/libdaplofa.so.2; do
	[ -e "$R/$f" ] || die "the packages lack /$f"
done
printf '%s u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 "eth0 0" ""\n' "$IA" > "$R/dapl/dat.conf"
cp "$R/dapl/dat.conf" "$R/etc/dat.conf"
install -m 0644 "$HERE/lib.sh" "$R/dapl/lib.sh"

# The guest's init with the job hook before `case "$MODE" in`; the hook uses
# the init's result, up and poweroff_now, and lib.sh its wait_peer, MYIP and
# PEER: all must be there.
for need in '^result() {' '^up() {' '^poweroff_now() {' '^wait_peer() {' '^MYIP=' '^case "\$MODE" in$'; do
	[ "$(grep -c -- "$need" "$GUEST/init")" = 1 ] || die "$GUEST/init no longer has exactly one line matching '$need'; adapt overlay.sh"
done
awk '$0 == "case \"$MODE\" in" {
	print "# --- softrnic hack/siw-dapl: a job appended to the initramfs replaces the mode"
	print "if [ -r /dapl/job ]; then"
	print "  MODE=dapl-job"
	print "  echo \"IWGUEST: dapl job: $(grep -m1 \"^# \" /dapl/job)\""
	print "  . /dapl/job"
	print "  echo \"IWGUEST: dmesg tail\"; dmesg | tail -8"
	print "  echo \"IWGUEST: done mode=$MODE failed=$FAILED at $(up)s\""
	print "  poweroff_now"
	print "fi"
}
{ print }' "$GUEST/init" > "$R/init"
chmod 0755 "$R/init"
[ "$(grep -c '^  \. /dapl/job$' "$R/init")" = 1 ] || die "the hook did not go into init"

(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$CACHE/overlay.cpio.tmp"
mv "$CACHE/overlay.cpio.tmp" "$CACHE/overlay.cpio"
echo "$stamp" > "$CACHE/overlay.stamp"
rm -rf "$R"
echo "$CACHE/overlay.cpio"

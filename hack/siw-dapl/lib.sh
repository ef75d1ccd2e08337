# /dapl/lib.sh in the siw guest (hack/siw-dapl/overlay.sh puts it there):
# helpers for the job that hack/interop-dapl.sh appends as /dapl/job. The
# guest's /init sources the job once siw0 is up, with its own helpers
# (result, wait_peer, up) and variables (MYIP, PEER) in scope.
#
# Every program's output reaches the console line by line as
#   IWGUEST: out TAG: LINE
# and its exit status as "IWGUEST: TAG rc=N role=ROLE" (dtest's and
# dapltest's exit statuses say little: the host judges the output).
export DAT_OVERRIDE=/dapl/dat.conf

# dapl_run TAG SECONDS ROLE COMMAND...: runs COMMAND line-buffered, bounded.
dapl_run() {
  _t=$1 _s=$2 _r=$3; shift 3
  { timeout "$_s" stdbuf -oL -eL "$@" 2>&1; echo $? > "/tmp/$_t.rc"; } | sed -u "s/^/IWGUEST: out $_t: /"
  result "$_t" "$(cat "/tmp/$_t.rc" 2>/dev/null || echo 99)" "$_r"
}

# dapl_listening TAG PORT SECONDS: prints "IWGUEST: TAG listening on
# IP:PORT" once a TCP port listens here (siw's listeners too: siw listens
# with a kernel socket); gives up after SECONDS.
dapl_listening() {
  for _i in $(seq 1 $(($3 * 5))); do
    if ss -Hltn "sport = :$2" | grep -q .; then echo "IWGUEST: $1 listening on $MYIP:$2"; return 0; fi
    sleep 0.2
  done
  echo "IWGUEST: note: nothing listens on port $2 ($1) after $3 s"
}

# dapl_server TAG PORT SECONDS COMMAND...: starts a server in the background
# and says when its port listens.
dapl_server() {
  _st=$1 _sp=$2 _ss=$3; shift 3
  dapl_run "$_st" "$_ss" server "$@" &
  dapl_listening "$_st" "$_sp" 60
}

# dapl_wait: waits for the servers; FAILED counts every tool that did not
# exit 0 (the servers ran in subshells).
dapl_wait() {
  wait
  FAILED=0
  for _f in /tmp/*.rc; do [ -e "$_f" ] && [ "$(cat "$_f")" != 0 ] && FAILED=$((FAILED + 1)); done
  return 0
}

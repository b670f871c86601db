#!/bin/sh
# Stand-in for kolo-coordinator / kolo-agent in kolorun's tests (set
# KOLO_COORDINATOR_BIN / KOLO_AGENT_BIN to it). It takes the daemons' flags,
# writes "127.0.0.1:<its pid>" to --ready-file atomically, then waits for
# SIGTERM and exits 0. It acts as an agent when given --agent-id; then
# FAKE_AGENT_MODE (else FAKE_COORDINATOR_MODE) changes the behaviour:
#   crash  print an error and exit 1 before becoming ready
#   hang   never become ready
ready=""
mode="${FAKE_COORDINATOR_MODE:-normal}"
while [ $# -gt 0 ]; do
  case "$1" in
    --ready-file) ready="$2"; shift ;;
    --agent-id) mode="${FAKE_AGENT_MODE:-normal}"; shift ;;
  esac
  shift
done
echo "fake-daemon $$ starting (mode $mode)" >&2
trap 'echo "fake-daemon $$ got SIGTERM" >&2; exit 0' TERM
case "$mode" in
  crash) echo "fake-daemon: cannot bind the socket: boom" >&2; exit 1 ;;
  hang) sleep 1000 & wait $!; exit 0 ;;
esac
printf '127.0.0.1:%s\n' "$$" > "$ready.tmp" && mv "$ready.tmp" "$ready"
sleep 1000 & wait $!

#!/bin/bash
# usage: tests/scripts/offcpu_pingpong.sh PROFILER_BIN ROUNDS -- ping-pong: no daemon / daemon with off-CPU off / daemon with defaults, alternating
BIN=$1; ROUNDS=${2:-3}; PP=/work/main/target/release/pingpong; [ -x $PP ] || PP=/work/main/target/debug/pingpong
W=/tmp/ocb; mkdir -p $W
sysctl -q kernel.bpf_stats_enabled=1
idle() { awk '/^cpu /{print $5}' /proc/stat; }
start() { # $1 label, rest args
  L=$1; shift; D=$W/data-$L; rm -rf $D
  $BIN run --data-dir $D --listen off "$@" > $W/$L.log 2>&1 &
  PID=$!
  for i in $(seq 1 120); do grep -q "samples written\|off-CPU program attached\|sampling" $W/$L.log && break; sleep 1; done
  sleep 8
}
stat2() { awk '{print $14+$15}' /proc/$PID/stat; }
echo "== $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) bin $BIN pp $PP"
for r in $(seq 1 $ROUNDS); do
  i0=$(idle); echo "r$r no daemon: $($PP 5) idle_ticks=$(( $(idle)-i0 ))"
  start off$r --off-cpu-threshold-ms 0
  u0=$(stat2); i0=$(idle); out=$($PP 5); u1=$(stat2)
  echo "r$r daemon off-cpu off: $out daemon_ticks=$((u1-u0)) idle_ticks=$(( $(idle)-i0 ))"
  kill -INT $PID; wait $PID
  start on$r
  insns=$(grep -o 'offcpu_switch [0-9]* ms ([0-9]* instructions' $W/on$r.log | grep -o '([0-9]*' | tr -d '(')
  FD=""; for f in /proc/$PID/fdinfo/*; do grep -q "verified_insns:.$insns\$" $f 2>/dev/null && FD=$f && break; done
  rt() { awk '/run_time_ns/{print $2}' $FD; }; rc() { awk '/run_cnt/{print $2}' $FD; }
  rec() { tr ',' '\n' < $W/data-on$r/offcpu.json 2>/dev/null | grep -m1 '"recorded_waits"' | tr -dc 0-9; }
  w0=$(rec); t0=$(rt); c0=$(rc); u0=$(stat2); i0=$(idle)
  out=$($PP 5)
  t1=$(rt); c1=$(rc); u1=$(stat2)
  echo "r$r daemon defaults: $out bpf_ns=$((t1-t0)) runs=$((c1-c0)) ns_per_switch=$(( (t1-t0)/(c1-c0+1) )) daemon_ticks=$((u1-u0)) idle_ticks=$(( $(idle)-i0 ))"
  kill -INT $PID; wait $PID; w1=$(rec)
  echo "r$r recorded waits: at the last write before ${w0:-0}, at stop $w1"
  grep -i "off-CPU counts so far\|off-cpu.*recorded" $W/on$r.log | tail -1
  cat $W/data-on$r/offcpu.json 2>/dev/null | head -c 600; echo
done

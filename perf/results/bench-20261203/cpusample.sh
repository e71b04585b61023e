#!/bin/bash
# Every second: unix time, busy and total jiffies of all CPUs, IO pressure avg10. Until killed.
while true; do
  read -r _ u n s i w q sq st _ < /proc/stat
  io=$(awk '/some/ {print $2}' /proc/pressure/io)
  echo "$(date +%s) $((u+n+s+q+sq+st)) $((u+n+s+i+w+q+sq+st)) ${io#avg10=}"
  sleep 1
done

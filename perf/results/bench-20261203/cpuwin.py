# cpuwin.py RESULTS.jsonl SAMPLES: host CPU busy % (both cores = 100 %) in the 18 s before each
# throughput and latency-open line's end time (the last ~2 s are left out as drain).
import json, sys
s = [tuple(float(x) for x in l.split()[:3]) for l in open(sys.argv[2]) if len(l.split()) >= 3]
def busy(t0, t1):
    a = min(s, key=lambda r: abs(r[0]-t0)); b = min(s, key=lambda r: abs(r[0]-t1))
    return 100.0*(b[1]-a[1])/max(1.0, b[2]-a[2])
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j['mode'] in ('throughput', 'latency-open'):
        t = j['unix_time']
        extra = round(j['records_per_s']) if j['mode']=='throughput' else j['ack_from_schedule_us']['p99']
        print(j['peer'], j['label'].split()[0], j['mode'], extra, 'cpu busy %.0f%%' % busy(t-19, t-1))

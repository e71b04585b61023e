import json,sys,statistics as st
rows={}
for l in open(sys.argv[1]):
    j=json.loads(l); lab=j['label'].rsplit(' ',1)[0]
    if j['mode']=='throughput':
        rows.setdefault((lab,'thr'),[]).append((round(j['records_per_s']), j['ack_us']['p50'], j['ack_us']['p99'], round(j['cpu']['per_record_ms'] or 0,4)))
    else:
        a=j.get('from_schedule_us') or j['ack_us']
        rows.setdefault((lab,'open'),[]).append((a['p50'],a['p99'],a['p999'], round(j['cpu']['per_record_ms'] or 0,3)))
for k,v in sorted(rows.items()):
    print(k, v)

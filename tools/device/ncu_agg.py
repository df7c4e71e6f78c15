import csv,collections,os,sys
rows=list(csv.reader(open(sys.argv[1])))
hdr=None;agg=collections.defaultdict(lambda:[0,0.0])
for r in rows:
    if 'Kernel Name' in r: hdr=r; continue
    if not hdr or len(r)!=len(hdr): continue
    d=dict(zip(hdr,r))
    if d.get('Metric Name')!='gpu__time_duration.sum': continue
    v=float(d['Metric Value'].replace(',',''))
    u=d.get('Metric Unit','')
    us = v/1000 if u in('nsecond','ns') else v if u in ('usecond','us') else v*1000
    k=d['Kernel Name'][:50]+' '+d.get('Grid Size','')
    agg[k][0]+=1; agg[k][1]+=us
tot=sum(a[1] for a in agg.values())
print('total us', round(tot,1), 'kernels', sum(a[0] for a in agg.values()))
for k,(n,t) in sorted(agg.items(), key=lambda x:-x[1][1])[:int(sys.argv[2]) if len(sys.argv) > 2 else 14]: print(f'{t:9.1f} {n:5d} {t/n:8.2f}  {k}')

"""ncu_step.py CSV [PATTERN] - one decode step out of an ncu csv (gpu__time_duration.sum,
kernels in launch order): the kernels between the last two launches whose name matches
PATTERN (default get_rows: a step starts with its embedding lookup), summed by kernel
name and grid, and the step's total kernel time (tools/device/decode_step_h200.sh)."""
import collections, csv, re, sys

rows, hdr = [], None
for r in csv.reader(open(sys.argv[1])):
    if 'Kernel Name' in r:
        hdr = r
        continue
    if not hdr or len(r) != len(hdr):
        continue
    d = dict(zip(hdr, r))
    if d.get('Metric Name') != 'gpu__time_duration.sum':
        continue
    v = float(d['Metric Value'].replace(',', ''))
    u = d.get('Metric Unit', '')
    us = v / 1000 if u in ('nsecond', 'ns') else v if u in ('usecond', 'us') else v * 1000
    rows.append((d['Kernel Name'], d.get('Grid Size', ''), us))
pat = re.compile(sys.argv[2] if len(sys.argv) > 2 else 'get_rows')
starts = [i for i, r in enumerate(rows) if pat.search(r[0])]
if len(starts) < 2:
    sys.exit(f'ncu_step: fewer than two launches match {pat.pattern} in {len(rows)} kernels')
step = rows[starts[-2]:starts[-1]]
agg = collections.defaultdict(lambda: [0, 0.0])
for name, grid, us in step:
    k = re.sub(r'^void ', '', name)[:70] + ' ' + grid
    agg[k][0] += 1
    agg[k][1] += us
print(f'step: {len(step)} kernels, {sum(r[2] for r in step):.1f} us of kernel time')
for k, (n, t) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f'{t:9.1f} {n:5d} {t / n:8.2f}  {k}')

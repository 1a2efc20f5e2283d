#!/usr/bin/env python3
# The hottest SASS lines of an ncu source page (ncu -i REP --page source --csv --print-source sass > F.csv):
#   python3 scripts/probes/ncu_source_top.py F.csv [N]
# prints the share of warp stall samples per instruction and its top three stall reasons.
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
h=rows[1]; data=rows[2:]
ix={c:i for i,c in enumerate(h)}
stalls=[c for c in h if c.startswith('stall_') and '(Not' not in c]
tot=sum(int(r[ix['Warp Stall Sampling (All Samples)']] or 0) for r in data)
print('total samples',tot, 'instructions', len(data))
agg={s:sum(int(r[ix[s]] or 0) for r in data) for s in stalls}
print(sorted(agg.items(), key=lambda x:-x[1])[:10])
order=sorted(range(len(data)), key=lambda i:-int(data[i][ix['Warp Stall Sampling (All Samples)']] or 0))
N=int(sys.argv[2]) if len(sys.argv)>2 else 40
for i in order[:N]:
    r=data[i]; s=int(r[ix['Warp Stall Sampling (All Samples)']])
    top=sorted(((int(r[ix[c]] or 0),c[6:]) for c in stalls), reverse=True)[:3]
    print(f"{i:5d} {100*s/tot:5.2f}% {r[1].strip()[:60]:60s} {top} exec={r[ix['Instructions Executed']]}")

import csv,sys,glob,statistics as st
d=sys.argv[1]; nl=int(sys.argv[2])
runs={}
for f in glob.glob(d+'/*.csv'):
    rows=list(csv.DictReader(open(f)))
    r=int(rows[0]['rank']); runs[r]=[{k:int(v) for k,v in x.items()} for x in rows]
R=sorted(runs); n=min(len(runs[r]) for r in R)
T=range(n-2000,n-1)  # timed window
def med(xs): xs=sorted(xs); return xs[len(xs)//2]
def p(xs,q): xs=sorted(xs); return xs[int(q*(len(xs)-1))]
def show(name,xs): print(f"{name:38s} med {med(xs)/1e3:7.2f}  p10 {p(xs,.1)/1e3:7.2f}  p90 {p(xs,.9)/1e3:7.2f} us")
period=[ (runs[0][i+1]['k1']-runs[0][i]['k1']) for i in T]
show('period (rank0 k1->k1)',period)
show('start skew max-min k1',[max(runs[r][i]['k1'] for r in R)-min(runs[r][i]['k1'] for r in R) for i in T])
for r in R:
    print('rank',r)
    x=runs[r]
    show(' gap prev k8 -> k1',[x[i]['k1']-x[i-1]['k8'] for i in T])
    for a,b,lab in [('k1','k2','local acq+pub'),('k2','k3','local recv wait'),('k3','k4','local reduce'),('k4','k5','rail acquire'),('k5','k6','rail publish'),('k6','k7','rail recv wait'),('k7','k8','reduce+release')]:
        show(f' {lab} {a}-{b}',[x[i][b]-x[i][a] for i in T])
    show(' host launch - host prev launch',[x[i]['host']-x[i-1]['host'] for i in T])
    show(' host launch call dur',[x[i]['hostAfter']-x[i]['host'] for i in T])
    show(' k1 - host (offset+lag)',[x[i]['k1']-x[i]['host'] for i in T])
# rail trip
nn=len(R)//nl
for r in R:
    node,l=divmod(r,nl)
    for b in range(nn):
        if b==node: continue
        s=b*nl+l
        show(f'rail trip {s}->{r} (recv k7 - send k6)',[runs[r][i]['k7']-runs[s][i]['k6'] for i in T])
        show(f'  sender k6 - recv k6 ',[runs[s][i]['k6']-runs[r][i]['k6'] for i in T])
if nl>1:
  for r in R:
    node,l=divmod(r,nl)
    for j in range(nl):
        if j==l: continue
        s=node*nl+j
        show(f'local: {s}->{r} recv k3 - send k2',[runs[r][i]['k3']-runs[s][i]['k2'] for i in T])

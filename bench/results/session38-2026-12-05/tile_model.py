#!/usr/bin/env python3
"""CPU model (session 38) of the attention kernel's static tile schedule for ring attention at
16K and 32K causal: one rank over the whole sequence against 4 zigzag ranks whose kernels run
one after another on 132 CTAs. Tile cost = visible key blocks of 176 keys (per source, so each
source rounds up) + 2 blocks of fixed cost. Prints the makespans (block units) of the snake
schedule the kernel runs, a greedy dynamic one, and the ideal even split. A model, not a
measurement: it says how much of the measured gap the schedule and the rounding can explain."""
import heapq
def tiles_costs(S_total, n, r, BM=128, BN=176, heads=16, overhead=2.0, zigzag=True):
    S = S_total//n
    # positions of rank r's rows
    if n==1: pos=list(range(S_total))
    else:
        C=S_total//(2*n)
        pos=list(range(r*C,(r+1)*C))+list(range((2*n-1-r)*C,(2*n-r)*C))
    mB=(S+BM-1)//BM
    costs=[]
    # tile order: heaviest first: t -> hb = t % heads, mb = mBlocks-1 - t//heads
    for t in range(mB*heads):
        mb=mB-1-t//heads
        rows=pos[mb*BM:min((mb+1)*BM,S)]
        qhi=max(rows)+1
        # visible keys: 0..qhi-1 over all sources; blocks per source of S/n... approx
        nblk=0
        # keys from each source j: positions of source j; count blocks of BN that have any key < qhi
        for j in range(n):
            if n==1: kp=list(range(S_total))
            else:
                C=S_total//(2*n); kp=list(range(j*C,(j+1)*C))+list(range((2*n-1-j)*C,(2*n-j)*C))
            # walk stops at causal bound: count blocks until last visible key
            vis=[i for i,p in enumerate(kp) if p<qhi]
            if vis: nblk+= (max(vis)//BN)+1
        costs.append(nblk+overhead)
    return costs
def static_snake(costs,G):
    load=[0.0]*G
    k=0
    while True:
        any_=False
        for cta in range(G):
            t=k*G+((G-1-cta) if (k&1) else cta)
            if t<len(costs): load[cta]+=costs[t]; any_=True
        if not any_: break
        k+=1
    return max(load), sum(costs)/G
def dynamic(costs,G):
    h=[(0.0,i) for i in range(G)]
    for c in costs:
        l,i=heapq.heappop(h); heapq.heappush(h,(l+c,i))
    return max(l for l,_ in h), sum(costs)/G
G=132
for S in (16384,32768):
    one=tiles_costs(S,1,0,zigzag=False)
    ms,avg=static_snake(one,G); md,_=dynamic(one,G)
    print("S",S,"1-rank: static",round(ms),"dyn",round(md),"ideal",round(avg))
    tot_s=tot_d=tot_i=0
    for r in range(4):
        c=tiles_costs(S,4,r)
        ms,avg=static_snake(c,G); md,_=dynamic(c,G)
        tot_s+=ms; tot_d+=md; tot_i+=avg
    print("   4 ranks serial: static",round(tot_s),"dyn",round(tot_d),"ideal",round(tot_i))

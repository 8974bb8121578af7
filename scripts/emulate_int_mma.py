#!/usr/bin/env python3
"""scripts/emulate_int_mma.py: src/backend/cuda/matmul_int.cuh's bookkeeping
replayed lane by lane on the CPU, for checking a change to it without a GPU.

One warp's chunks of integer products for an 8-row weight tile and up to 16
rows of x: quantize_act_kernel's stored form of x (levels interleaved per 4
elements, U4's even/odd order), fetch_b's 16 bytes a lane, int_fragments'
exchange (8-bit groups of 32) or 4x4 transpose (groups of 16, 4-bit), the
A/B/C fragments of mma.m16n8k32 / m16n8k16 (.s8, .u8) as the PTX ISA lays
them out, and int_chunk's folding of each group into f32. Each output must
equal the float64 product of the dequantized weights and activations to 1e-5
of sum |w x|; a wrong offset or register order misses by 0.1 or more. It
models the kernel, it does not run it: keep the two in step, and the GPU
tests (tests/gpu/test_cuda_int.cpp) decide. Run: .venv/bin/python scripts/emulate_int_mma.py
"""
import numpy as np
rng=np.random.default_rng(1)

def quantize_act(x, k_pad, nibbles):
    M=x.shape[0]; n_in=x.shape[1]
    xp=np.zeros((M,k_pad),np.float32); xp[:,:n_in]=x
    q=np.zeros((M,2*k_pad),np.uint8); d=np.zeros((M,k_pad//32),np.float32); s=np.zeros((M,k_pad//16),np.int64)
    xhat=np.zeros((M,k_pad))
    for r in range(M):
        for b in range(k_pad//32):
            v=xp[r,32*b:32*b+32]; amax=np.float32(np.abs(v).max()); dd=np.float32(amax/np.float32(127))
            for l in range(32):
                e=32*b+l
                if amax>0:
                    q1=int(np.clip(np.rint(np.float32(v[l]/dd)),-127,127))
                    rest=np.float32(v[l]-np.float32(dd*np.float32(q1)))
                    q2=int(np.clip(np.rint(np.float32(np.float32(rest*256)/dd)),-127,127))
                else: q1=q2=0
                w=e&7; p=(e&~7)+(w&1)*4+(w>>1) if nibbles else e
                q[r,(p//4)*8+p%4]=q1&0xff; q[r,(p//4)*8+p%4+4]=q2&0xff
                s[r,2*b+l//16]+=256*q1+q2
                xhat[r,e]=float(dd/np.float32(256))*(256*q1+q2)
            d[r,b]=np.float32(dd/np.float32(256))
    return q,d,s,xhat

def s8(u):
    u=int(u); return u-256 if u>=128 else u
def bytes_of(w): return [(w>>(8*i))&0xff for i in range(4)]
def word(bs): return sum((int(b)&0xff)<<(8*i) for i,b in enumerate(bs))

def imma(Aregs,Bregs,k):
    # Aregs[lane]=list of regs, Bregs[lane]=list; returns C[lane][4] per PTX layouts
    A=np.zeros((16,k),np.int64); B=np.zeros((k,8),np.int64)
    for lane in range(32):
        g,c=lane>>2,lane&3
        if k==32:
            for i in range(16):
                reg=i//4; byte=bytes_of(Aregs[lane][reg])[i&3]
                row=g if (i<4 or 8<=i<12) else g+8
                col=4*c+(i&3)+(16 if i>=8 else 0)
                A[row,col]=s8(byte)
            for i in range(8):
                reg=i//4; byte=bytes_of(Bregs[lane][reg])[i&3]
                kk=4*c+(i&3)+(16 if i>=4 else 0)
                B[kk,g]=byte if Bu8 else s8(byte)
        else:
            for i in range(8):
                reg=i//4; byte=bytes_of(Aregs[lane][reg])[i&3]
                row=g if i<4 else g+8
                A[row,4*c+(i&3)]=s8(byte)
            for i in range(4):
                byte=bytes_of(Bregs[lane][0])[i]
                B[4*c+i,g]=s8(byte)
    C=A@B
    return [[C[lane>>2,2*(lane&3)],C[lane>>2,2*(lane&3)+1],C[(lane>>2)+8,2*(lane&3)],C[(lane>>2)+8,2*(lane&3)+1]] for lane in range(32)]

def run(fmt, G, has_min, M=16, n_in=256, min8=False):
    global Bu8
    Bu8 = fmt=='U4'
    E=32 if fmt=='U4' else 16; KC=4*E; k_pad=((n_in+KC-1)//KC)*KC
    n_out=8
    if fmt=='U4': qv=rng.integers(0,16,(n_out,k_pad))
    else: qv=rng.integers(-128,128,(n_out,k_pad))
    qv[:,n_in:]=0
    scale=rng.uniform(0.01,0.1,(n_out,k_pad//G)).astype(np.float32)
    mn=(rng.uniform(-0.5,0.5,(n_out,k_pad//G)).astype(np.float32) if has_min else np.zeros((n_out,k_pad//G),np.float32))
    if min8: mn=(8*scale).astype(np.float32)  # Q4_0: not stored, folded into the integer sum
    wdeq=np.array([[float(np.float32(np.float32(qv[o,k]*scale[o,k//G])-mn[o,k//G])) for k in range(k_pad)] for o in range(n_out)])
    # stored rows
    if fmt=='U4':
        rows=[bytes([(qv[o,2*b]&15)|((qv[o,2*b+1]&15)<<4) for b in range(k_pad//2)]) for o in range(n_out)]
    else:
        rows=[bytes([v&0xff for v in qv[o]]) for o in range(n_out)]
    x=rng.standard_normal((M,n_in)).astype(np.float32)
    xq,xd,xs,xhat=quantize_act(x,k_pad,fmt=='U4')
    NG=KC//G; NB=1 if G==16 else 2; N32=KC//32
    def first(q,c):
        if fmt=='I8' and G==32: return 32*q+(16*c if c<2 else 16*c-24)
        if G==16: return 16*q+4*c
        return 32*q+8*c
    acc=np.zeros((32,4))
    for ch in range(k_pad//KC):
        # fetch
        raw=[]
        for lane in range(32):
            g,c=lane>>2,lane&3
            k=ch*KC+E*c
            off=k//2 if fmt=='U4' else k
            b16=rows[g][off:off+16]
            raw.append([word(b16[4*i:4*i+4]) for i in range(4)])
        # fragments
        b=[[[0]*NB for _ in range(NG)] for _ in range(32)]
        if fmt=='I8' and G==32:
            send0=[raw[l][2] if (l&3)<2 else raw[l][0] for l in range(32)]
            send1=[raw[l][3] if (l&3)<2 else raw[l][1] for l in range(32)]
            for l in range(32):
                lo=(l&3)<2; t0=send0[l^2]; t1=send1[l^2]; r=raw[l]
                b[l][0][0]=r[0] if lo else t0; b[l][0][1]=r[1] if lo else t1
                b[l][1][0]=t0 if lo else r[2]; b[l][1][1]=t1 if lo else r[3]
        else:
            R=[list(raw[l]) for l in range(32)]
            for s_ in (1,2):
                new=[list(r) for r in R]
                for l in range(32):
                    c=l&3; high=(c&s_)!=0
                    for lo_ in range(4):
                        if lo_&s_: continue
                        sendp = lambda ll: R[ll][lo_] if ((ll&3)&s_) else R[ll][lo_+s_]
                        got=sendp(l^s_)
                        if high: new[l][lo_]=got
                        else: new[l][lo_+s_]=got
                R=new
            for l in range(32):
                for q in range(4):
                    if fmt=='I8': b[l][q][0]=R[l][q]
                    else: b[l][q][0]=R[l][q]&0x0f0f0f0f; b[l][q][1]=(R[l][q]>>4)&0x0f0f0f0f
        for q in range(NG):
            A=[]
            for l in range(32):
                g,c=l>>2,l&3
                regs=[]
                for h in range(2):
                    row=min(g+8*h,M-1)
                    at=2*(ch*KC+first(q,c))
                    if NB==2: bs=xq[row,at:at+16]; regs.append([word(bs[0:4]),word(bs[4:8]),word(bs[8:12]),word(bs[12:16])])
                    else: bs=xq[row,at:at+8]; regs.append([word(bs[0:4]),word(bs[4:8])])
                A.append(regs)
            if M <= 8:
                # no row 8-15 read: one mma, row g's two levels as its rows g and g + 8
                cc=imma([A[l][0] for l in range(32)],[b[l][q] for l in range(32)],32 if NB==2 else 16)
                c1=[[cc[l][0],cc[l][1],0,0] for l in range(32)]
                c2=[[cc[l][2],cc[l][3],0,0] for l in range(32)]
            elif NB==2:
                c1=imma([[A[l][0][0],A[l][1][0],A[l][0][2],A[l][1][2]] for l in range(32)],[b[l][q] for l in range(32)],32)
                c2=imma([[A[l][0][1],A[l][1][1],A[l][0][3],A[l][1][3]] for l in range(32)],[b[l][q] for l in range(32)],32)
            else:
                c1=imma([[A[l][0][0],A[l][1][0]] for l in range(32)],[b[l][q] for l in range(32)],16)
                c2=imma([[A[l][0][1],A[l][1][1]] for l in range(32)],[b[l][q] for l in range(32)],16)
            q32=q//2 if G==16 else q
            for l in range(32):
                g,c=l>>2,l&3
                sc=[scale[2*c+j,ch*NG+q] for j in range(2)]
                mm=[mn[2*c+j,ch*NG+q] for j in range(2)]
                for i in range(4 if M > 8 else 2):
                    h,j=i//2,i%2
                    row=min(g+8*h,M-1)
                    dx=xd[row,ch*N32+q32]
                    s16=xs[row,ch*2*N32:ch*2*N32+2*N32]
                    xsum=s16[q] if G==16 else s16[2*q]+s16[2*q+1]
                    v=np.float32(c1[l][i]*256+c2[l][i]-(8*xsum if min8 else 0))
                    acc[l,i]=np.float32(acc[l,i]+np.float32(v*np.float32(dx*sc[j])))
                    if has_min and not min8:
                        acc[l,i]=np.float32(acc[l,i]-np.float32(mm[j]*np.float32(np.float32(xsum)*dx)))
    # compare: C element (row g+8h, col 2c+j) = sum_k wdeq[col,k]*xhat[row,k]
    worst=0
    for l in range(32):
        g,c=l>>2,l&3
        for i in range(4):
            h,j=i//2,i%2; row=g+8*h; col=2*c+j
            if row>=M: continue
            ref=wdeq[col]@xhat[row]; mag=np.abs(wdeq[col]*xhat[row]).sum()
            worst=max(worst,abs(acc[l,i]-ref)/mag)
    # also vs the exact x
    err_x=max(abs((wdeq[c2_%8,:n_in]@x[r])- (wdeq[c2_%8]@xhat[r]))/np.abs(wdeq[c2_%8,:n_in]*x[r]).sum() for r in range(M) for c2_ in range(8))
    print(fmt,G,'min8' if min8 else 'min' if has_min else '', 'M',M,'worst vs xhat',worst,'xhat vs x',err_x)
    assert worst<1e-5, worst

if __name__ == '__main__':  # (scripts/emulate_int_dp4a.py imports quantize_act)
    for fmt,G,mnf in [('I8',32,False),('I8',32,True),('I8',16,False),('I8',16,True),('U4',32,True),('U4',32,False)]:
        run(fmt,G,mnf,M=16,n_in=256)
    run('I8',32,False,M=3,n_in=200)
    run('U4',32,True,M=1,n_in=200)
    run('U4',32,True,M=5,n_in=256,min8=True)
    for fmt,G,mnf in [('I8',32,False),('I8',16,True),('U4',32,True)]:
        run(fmt,G,mnf,M=8,n_in=256)

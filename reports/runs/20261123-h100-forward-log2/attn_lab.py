"""Attention forward lab: compile variants of attention.cu with NVRTC, launch
them through the driver on torch tensors, check out/probs against float64, and
graph-time them at qwen2.5-0.5b's layer shape.

usage: attn_lab.py NVRTC_LIB [--once] VARIANT...
VARIANT = name:file:build:part:rows:threads:smem:grid[:opt,opt]
  grid 'head'  = (ceil(seq/rows), heads, batch)
  grid 'group' = (ceil(seq/rows), kv_heads, batch)
"""
import ctypes, math, statistics, sys
import torch

lib_nvrtc = ctypes.CDLL(sys.argv[1])
cu = ctypes.CDLL('libcuda.so.1')
args = sys.argv[2:]
once = '--once' in args
args = [a for a in args if a != '--once']
KD = 'qlora/src/kernels/'
common = open(KD + 'common.cuh').read()


def nvrtc(src, opts):
    prog = ctypes.c_void_p()
    assert lib_nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b'x.cu', 0, None, None) == 0
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    r = lib_nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t(); lib_nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    b = ctypes.create_string_buffer(n.value); lib_nvrtc.nvrtcGetProgramLog(prog, b)
    if r != 0:
        raise RuntimeError(b.value.decode()[-3000:])
    n = ctypes.c_size_t(); lib_nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    b = ctypes.create_string_buffer(n.value); lib_nvrtc.nvrtcGetCUBIN(prog, b)
    return b.raw


def check(r, what):
    if r != 0:
        raise RuntimeError(f'{what}: CUresult {r}')


torch.zeros(1, device='cuda')  # makes the primary context current
B, S, H, KV, D = 4, 256, 14, 2, 64
if len(sys.argv) > 1 and False:
    pass
g = torch.Generator(device='cuda').manual_seed(0)
q = torch.randn(B, S, H, D, device='cuda', generator=g)
k = torch.randn(B, S, KV, D, device='cuda', generator=g)
v = torch.randn(B, S, KV, D, device='cuda', generator=g)
scale = 1.0 / math.sqrt(D)
# float64 reference
qd, kd, vd = (t.double().permute(0, 2, 1, 3) for t in (q, k, v))
kd = kd.repeat_interleave(H // KV, dim=1); vd = vd.repeat_interleave(H // KV, dim=1)
sc = (qd @ kd.transpose(-1, -2)) * scale
mask = torch.ones(S, S, device='cuda', dtype=torch.bool).triu(1)
sc.masked_fill_(mask, float('-inf'))
ref_p = torch.softmax(sc, dim=-1)
ref_o = (ref_p @ vd).permute(0, 2, 1, 3)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


for spec in args:
    f = spec.split(':')
    name, file, build, part, rows, threads, smem, grid = f[:8]
    extra = f[8].split(',') if len(f) > 8 and f[8] else []
    rows, threads, smem = int(rows), int(threads), int(smem)
    src = common + f'\n#define ATT_BUILD {build}\n#define ATT_PART {part}\n' + open(file).read()
    opts = ['--gpu-architecture=sm_90', '--std=c++17', '-minimal'] + extra
    import time
    t0 = time.time()
    try:
        cubin = nvrtc(src, opts)
    except RuntimeError as e:
        print(f'{name}: COMPILE FAILED\n{e}'); continue
    ct = (time.time() - t0) * 1e3
    mod = ctypes.c_void_p(); check(cu.cuModuleLoadData(ctypes.byref(mod), cubin), 'load')
    sym = f'attention_tc_fwd_d{build}_f32' if part == '3' else f'attention_fwd_d{build}_f32'
    fn = ctypes.c_void_p(); check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, sym.encode()), 'sym')
    regs = ctypes.c_int(); cu.cuFuncGetAttribute(ctypes.byref(regs), 4, fn)
    spill = ctypes.c_int(); cu.cuFuncGetAttribute(ctypes.byref(spill), 3, fn)  # local bytes
    if smem > 48 * 1024:
        check(cu.cuFuncSetAttribute(fn, 8, smem), 'smem attr')
    out = torch.full_like(q, float('nan'))
    probs = torch.full((B, H, S, S), float('nan'), device='cuda')
    gx = (S + rows - 1) // rows
    gy = H if grid == 'head' else KV
    ptrs = [ctypes.c_void_p(t.data_ptr()) for t in (q, k, v, out, probs)]
    ints = [ctypes.c_int(x) for x in (B, S, H, KV, D)]
    params = ptrs + ints + [ctypes.c_float(scale), ctypes.c_longlong(out.numel())]
    pa = (ctypes.c_void_p * len(params))(*[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params])

    def launch():
        st = torch.cuda.current_stream().cuda_stream
        check(cu.cuLaunchKernel(fn, gx, gy, B, threads, 1, 1, smem, ctypes.c_void_p(st), pa, None), 'launch')

    launch(); torch.cuda.synchronize()
    eo, ep = rel(out, ref_o), rel(probs, ref_p)
    if once:
        print(f'{name}: out {eo:.2e} probs {ep:.2e}'); continue
    R = 20
    for _ in range(3): launch()
    gr = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        gr.capture_begin()
        for _ in range(R): launch()
        gr.capture_end()
    torch.cuda.synchronize()
    times = []
    for _ in range(25):
        a, b_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); gr.replay(); b_.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b_) * 1e3 / R)
    med = statistics.median(times[5:])
    print(f'{name}: {med:6.1f} us (min {min(times[5:]):.1f})  out {eo:.2e} probs {ep:.2e}  '
          f'regs {regs.value} local {spill.value} B  compile {ct:.0f} ms')

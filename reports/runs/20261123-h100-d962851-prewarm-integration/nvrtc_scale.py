# Wall of compiling a pre-warm's module set with T threads (one program each), and
# the summed per-phase NVRTC times (--time) at that T. usage: nvrtc_scale.py LIB ARCH SET T...
import ctypes, re, sys, time, os, tempfile
from concurrent.futures import ThreadPoolExecutor
lib = ctypes.CDLL(sys.argv[1]); arch = sys.argv[2]; which = sys.argv[3]; Ts = [int(t) for t in sys.argv[4:]]
kd = 'qlora/src/kernels/'
mod = open(kd + 'mod.rs').read(); common = open(kd + 'common.cuh').read()
mods = {}
for m in re.finditer(r'module!\(\s*"(\w+)"', mod): mods[m.group(1)] = (m.group(1), '')
for m in re.finditer(r'module_with!\(\s*"(\w+)",\s*"(\w+)",\s*"([^"]*)"', mod):
    mods[m.group(1)] = (m.group(2), m.group(3).encode().decode('unicode_escape'))
small = ['embedding', 'rmsnorm', 'rope_qkv_fwd', 'rope_qkv_bwd', 'swiglu', 'cross_entropy', 'clip', 'train']
sets = {'qwen': small + ['rmsnorm_bwd_warp2', 'attention_tc_fwd_d64', 'attention_dq_d64', 'attention_dkv_d64'],
        'coder': small + ['rmsnorm_bwd_warp2', 'attention_tc_fwd_d128', 'attention_dq_d128', 'attention_dkv_d128']}
names = sets[which]
tmp = tempfile.mkdtemp()
def comp(name):
    f, pre = mods[name]
    src = common + '\n' + pre + '\n' + open(kd + f + '.cu').read()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), (name + '.cu').encode(), 0, None, None) == 0
    tf = os.path.join(tmp, name + '.csv')
    if os.path.exists(tf): os.remove(tf)
    opts = ['--gpu-architecture=' + arch, '--std=c++17', '--time=' + tf] + (['--Ofast-compile=min'] if 'tc_fwd' in name else [])
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    t = time.time(); r = lib.nvrtcCompileProgram(prog, len(opts), arr); dt = time.time() - t
    assert r == 0, name
    ph = [float(l.split(',')[2]) for l in open(tf).read().splitlines()[1:] if l.strip()]
    return dt, ph
comp('adamw')
for T in Ts:
    for rep in range(3):
        t0 = time.time()
        with ThreadPoolExecutor(T) as pool: res = list(pool.map(comp, names))
        w = (time.time() - t0) * 1e3
        tot = sum(d for d, _ in res) * 1e3
        ph = [sum(p[i] for _, p in res) for i in range(3)]
        slow = max(zip(res, names), key=lambda x: x[0][0])
        print(f'{which} T={T:2d}: wall {w:5.0f} ms, summed {tot:5.0f} ms (front {ph[0]:.0f}, nvvm {ph[1]:.0f}, ptx {ph[2]:.0f}), slowest {slow[1]} {slow[0][0]*1e3:.0f}', flush=True)

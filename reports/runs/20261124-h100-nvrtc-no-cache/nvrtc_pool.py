# Cold compile wall of one pre-warm module set on a pool of T threads, with the
# modules queued in the pre-warm's list order or heaviest first (the attention
# modules), as the suite compiles them (-minimal; --Ofast-compile=min on the
# tensor-core forward). usage: nvrtc_pool.py LIB REPS SET T...
import ctypes, re, sys, time, os, tempfile
from concurrent.futures import ThreadPoolExecutor
lib = ctypes.CDLL(sys.argv[1]); reps = int(sys.argv[2]); which = sys.argv[3]; Ts = [int(t) for t in sys.argv[4:]]
kd = 'qlora/src/kernels/'
mod = open(kd + 'mod.rs').read(); common = open(kd + 'common.cuh').read()
mods = {}
for m in re.finditer(r'module!\(\s*"(\w+)"', mod): mods[m.group(1)] = (m.group(1), '', False)
for m in re.finditer(r'module_with!\(\s*"(\w+)",\s*"(\w+)",\s*"([^"]*)",\s*\[[^\]]*\](,\s*Compile::FastMin)?', mod):
    mods[m.group(1)] = (m.group(2), m.group(3).encode().decode('unicode_escape'), bool(m.group(4)))
base = ['embedding', 'rmsnorm', 'rmsnorm_bwd_warp8', 'rope_qkv_fwd', 'rope_qkv_bwd', 'swiglu', 'cross_entropy', 'clip', 'train']
sets = {'qwen': base + ['attention_tc_fwd_d64', 'attention_dq_d64', 'attention_dkv_d64'],
        'coder-nf4': base + ['attention_tc_fwd_d128', 'attention_dq_d128', 'attention_dkv_d128', 'nf4']}
names = sets[which]
heavy_first = [n for n in names if n.startswith('attention')] + [n for n in names if not n.startswith('attention')]
def comp(name):
    f, pre, fast = mods[name]
    src = common + '\n' + pre + '\n' + open(kd + f + '.cu').read()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), (name + '.cu').encode(), 0, None, None) == 0
    opts = ['--gpu-architecture=sm_90', '--std=c++17', '-minimal', '--no-cache'] + (['--Ofast-compile=min'] if fast else [])
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    t = time.time(); r = lib.nvrtcCompileProgram(prog, len(opts), arr); dt = time.time() - t
    assert r == 0, name
    return name, dt * 1e3
comp('adamw')
for rep in range(reps):
    for T in Ts:
        for label, order in (('list', names), ('heavy', heavy_first)):
            if T >= len(names) and label == 'heavy': continue  # all start at once: order is moot
            t0 = time.time()
            with ThreadPoolExecutor(T) as pool: res = list(pool.map(comp, order))
            w = (time.time() - t0) * 1e3
            slow = max(res, key=lambda x: x[1])
            print(f'{which} T={T:2d} {label:5s}: wall {w:5.0f} ms, summed {sum(d for _, d in res):5.0f}, slowest {slow[0]} {slow[1]:.0f}', flush=True)

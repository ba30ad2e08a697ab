# Does NVRTC 13's --no-cache keep a compilation out of (and away from) the compute cache?
# usage: nocache_lab.py LIB MODULE ; run WITHOUT CUDA_CACHE_DISABLE.
import ctypes, re, sys, time
lib = ctypes.CDLL(sys.argv[1]); name = sys.argv[2]
kd = 'qlora/src/kernels/'
mod = open(kd + 'mod.rs').read(); common = open(kd + 'common.cuh').read()
m = re.search(r'module_with!\(\s*"%s",\s*"(\w+)",\s*"([^"]*)"' % name, mod)
src = (common + '\n' + m.group(2).encode().decode('unicode_escape') + '\n' + open(kd + m.group(1) + '.cu').read()).encode()
def comp(extra):
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, (name + '.cu').encode(), 0, None, None) == 0
    opts = ['--gpu-architecture=sm_90', '--std=c++17', '-minimal'] + extra
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    t = time.time(); r = lib.nvrtcCompileProgram(prog, len(opts), arr); dt = (time.time() - t) * 1e3
    assert r == 0
    return dt
for label, extra in (('no-cache', ['--no-cache']), ('no-cache', ['--no-cache']), ('default', []), ('default', []), ('no-cache', ['--no-cache']), ('no-cache', ['--no-cache']), ('default', [])):
    print(f'{name} {label:8s}: {comp(extra):6.0f} ms', flush=True)

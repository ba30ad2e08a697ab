import csv, sys, collections, re
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
stalls = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
tot = collections.Counter(); op_exec = collections.Counter(); op_samp = collections.Counter()
allsamp = 0
for r in data:
    if len(r) < len(hdr): continue
    src = r[ix['Source']].strip()
    op = re.sub(r'^@!?U?P\w+\s+', '', src).split(' ')[0].split('.')[0]
    ex = int(r[ix['Instructions Executed']] or 0); s = int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
    op_exec[op] += ex; op_samp[op] += s; allsamp += s
    for h in stalls: tot[h] += int(r[ix[h]] or 0)
print('samples', allsamp, 'executed', sum(op_exec.values()))
for h, c in tot.most_common(10): print(f'  {h:24s} {c:7d} {100*c/allsamp:5.1f}%')
print('opcodes (executed warp insts, % samples):')
for op, c in op_exec.most_common(22): print(f'  {op:10s} {c:9d} {100*c/sum(op_exec.values()):5.1f}%  samp {100*op_samp[op]/allsamp:5.1f}%')

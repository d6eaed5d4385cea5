#!/usr/bin/env python3
"""Not a test: how fast a cluster recovers from a worker killed with SIGKILL mid-generation.

Starts `strata up` on models/strata-demo with two workers, streams a 400-token generation,
kills worker 1 after 0.3 s, and prints when the router gave its experts to the other worker
(its "is gone" log line), when the supervisor-restarted worker registered again, when the
router took it back, and whether the request finished with every token.

    python3 bench/faults/recovery.py [BIN_DIR]   (default build/bin)
"""
import subprocess, time, threading, os, signal, re, sys, json
B = sys.argv[1] if len(sys.argv) > 1 else 'build/bin'
p = subprocess.Popen([f'{B}/strata','up','--model','models/strata-demo','--workers','2','--threads','1'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
addr=None
events=[]
def read_err():
    for line in p.stderr:
        events.append((time.monotonic(), line.strip()))
threading.Thread(target=read_err, daemon=True).start()
for line in p.stdout:
    if line.startswith('READY '): addr=line.split()[1]; break
# find worker 1
def worker1():
    for pid in os.listdir('/proc'):
        if not pid.isdigit(): continue
        try:
            cmd=open(f'/proc/{pid}/cmdline').read()
            stat=open(f'/proc/{pid}/stat').read().split()
        except Exception: continue
        if 'strata-worker' in cmd and '--index=1' in cmd and int(stat[3])==p.pid and stat[2]!='Z': return int(pid)
w=worker1()
gen = subprocess.Popen([f'{B}/strata','generate','--server',addr,'--prompt','In the beginning','--max-new-tokens','400','--ignore-eos'], stdout=subprocess.PIPE, text=True)
time.sleep(0.3)
t_kill=time.monotonic(); os.kill(w, signal.SIGKILL)
out=gen.communicate()[0]; t_done=time.monotonic()
res=json.loads(out)
time.sleep(3)
p.send_signal(signal.SIGTERM); p.wait()
gone=[t for t,l in events if 'is gone' in l and t>=t_kill]
back=[t for t,l in events if 'is back' in l and t>=t_kill]
reg=[t for t,l in events if 'worker[1]: registered' in l and t>=t_kill]
print(json.dumps({'finish': res['finish_reason'], 'tokens': len(res['token_ids']),
  'kill_to_gone_ms': round((gone[0]-t_kill)*1000,1) if gone else None,
  'kill_to_reregistered_ms': round((reg[0]-t_kill)*1000,1) if reg else None,
  'kill_to_back_ms': round((back[0]-t_kill)*1000,1) if back else None}))

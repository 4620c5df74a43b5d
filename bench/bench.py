#!/usr/bin/env python3
"""trainerd against the seed question's own PyTorch loops, on the same data and hyper-parameters.

Workloads (bench/README.md): seed (linear:1 on 800 rows, batch 16), sweep (the seed job over 8
learning rates x 8 seeds, 64 members), mlp (64-256-256-10 on 20,000 rows, batch 256) and mlp3 (the
small MLP a user asks about: 2-64-64-3 on a 3,000-row spiral, batch 32). For each workload and
device it runs, interleaved (one of each per round, median of --repeats rounds):
  pytorch-original   the question's slow loop (../shared/bench/seed_scenario.py --style original;
                     bench/peer_mlp3.py for mlp3): a copy per batch, a loss read per step
  pytorch-optimized  the same script, --style optimized (data on the device, one read per epoch)
  trainerd           the real daemon: the job's own wall_seconds (the engine alone: no upload, no
                     queueing, no client), engine auto (the fused path where the job qualifies)
  trainerd-libtorch  the same with --engine libtorch: the LibTorch path alone
  trainerd-e2e       `trainctl submit ... --watch` as a process, timed from outside (the dataset
                     already uploaded): what a user waits for
and for sweep:
  pytorch-original-x64, pytorch-optimized-x64
                     the seed loop (styles as above) run once, its own time x 64: each of the 64
                     runs is the same loop with another learning rate and seed
  trainerd-sweep     `trainctl sweep` (one sweep, 64 members): latest member end - earliest member
                     start (the engine alone)
  trainerd-sweep-e2e `trainctl sweep ... --watch` as a process, timed from outside
The peers run on the same torch as trainerd (this Python's) and with the intra-op threads trainerd
chose for the job (its report's intra_op_threads). Prints a table and the ratios, and writes
bench.json into --results-dir.
"""
import argparse
import calendar
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORKLOADS = {
    'seed': dict(model='linear:1', loss='mse', optimizer='sgd', lr='0.1', batch=16,
                 target_dtype='float32'),
    'mlp': dict(model='linear:256,relu,linear:256,relu,linear:10', loss='cross_entropy',
                optimizer='adam', lr='0.001', batch=256, target_dtype='int64'),
    'mlp3': dict(model='linear:64,relu,linear:64,relu,linear:3', loss='cross_entropy',
                 optimizer='sgd', lr='0.05', batch=32, target_dtype='int64'),
}

# The sweep workload: the seed job over these learning rates x seeds, one sweep of 64 members.
SWEEP = dict(base='seed', lrs=['0.2', '0.15', '0.1', '0.07', '0.05', '0.03', '0.02', '0.01'],
             seeds=[str(s) for s in range(1, 9)])
SWEEP_MEMBERS = len(SWEEP['lrs']) * len(SWEEP['seeds'])


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


class Daemon:
    def __init__(self, build_dir, device, work):
        os.makedirs(work, exist_ok=True)
        self.work = work
        self.ctl = os.path.join(build_dir, 'client', 'trainctl')
        self.proc = subprocess.Popen(
            [os.path.join(build_dir, 'server', 'trainerd'), '--listen=127.0.0.1:0',
             '--metrics_listen=127.0.0.1:0', f'--data_dir={work}/data', f'--device={device}'],
            stdout=subprocess.PIPE, stderr=open(os.path.join(work, 'trainerd.log'), 'w'), text=True)
        line = self.proc.stdout.readline()
        m = re.search(r'listening on (\S+)', line)
        if not m:
            raise RuntimeError(f'trainerd did not start: {line!r}')
        self.addr = m.group(1)
        # Waits for the start-up measurement (peak, launch cost), so that it neither overlaps a
        # timed job nor leaves the jobs' verdicts without figures; kept in the results.
        self.diagnosis = self.ctl_json('diagnose')

    def ctl_json(self, *args):
        out = run([self.ctl, '--addr', self.addr, '-o', 'json', *args]).stdout
        return json.loads(out)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def upload(daemon, workload, work, uploaded):
    if workload in uploaded:
        return
    w = WORKLOADS[workload]
    csv = os.path.join(work, f'{workload}.csv')
    run([sys.executable, os.path.join(HERE, 'seed_data.py'), '--workload', workload, csv])
    daemon.ctl_json('dataset', 'upload', workload, csv, '--target-dtype', w['target_dtype'])
    uploaded.add(workload)


def submit_args(workload, device, epochs, engine='auto', command='submit', lr=None, seed='42'):
    w = WORKLOADS[workload]
    return [command, '--dataset', workload, '--model', w['model'], '--loss', w['loss'],
            '--optimizer', w['optimizer'], '--lr', lr or w['lr'], '--batch-size', str(w['batch']),
            '--epochs', str(epochs), '--seed', seed, '--device', device, '--engine', engine]


def sweep_args(device, epochs, engine='auto'):
    return submit_args(SWEEP['base'], device, epochs, engine=engine, command='sweep',
                       lr=','.join(SWEEP['lrs']), seed=','.join(SWEEP['seeds']))


def rfc3339_ns(t):
    """'2026-12-01T15:36:17.045241806Z' (or with an offset) -> nanoseconds since the epoch."""
    m = re.fullmatch(r'(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)', t)
    if not m:
        raise ValueError(f'not an RFC 3339 time: {t!r}')
    secs = calendar.timegm(tuple(int(g) for g in m.group(1, 2, 3, 4, 5, 6)))
    if m.group(8) != 'Z':
        sign = 1 if m.group(8)[0] == '+' else -1
        secs -= sign * (int(m.group(8)[1:3]) * 3600 + int(m.group(8)[4:6]) * 60)
    return secs * 10**9 + int((m.group(7) or '0')[:9].ljust(9, '0'))


def job_result(job):
    steps = int(job['steps'])
    report = job.get('report', {})
    return dict(seconds=job['wall_seconds'], us_per_step=job['wall_seconds'] / steps * 1e6,
                samples_per_s=job['samples_per_second'], final_loss=job['final_loss'],
                host_syncs=int(job['host_syncs']), steps=steps,
                threads=int(report.get('intra_op_threads', 0)), verdict=report.get('verdict', ''),
                engine=report.get('engine', ''), engine_reason=report.get('engine_reason', ''))


def trainerd_run(daemon, workload, device, epochs, engine='auto'):
    job = daemon.ctl_json(*submit_args(workload, device, epochs, engine))
    subprocess.run([daemon.ctl, '--addr', daemon.addr, 'job', 'watch', job['id']], check=True,
                   capture_output=True)
    return job_result(daemon.ctl_json('job', 'get', job['id']))


def trainerd_e2e_run(daemon, workload, device, epochs, engine='auto'):
    """What a user waits for: the client process from start to exit, submit and watch."""
    t0 = time.perf_counter()
    out = run([daemon.ctl, '--addr', daemon.addr, '-o', 'json',
               *submit_args(workload, device, epochs, engine), '--watch']).stdout
    seconds = time.perf_counter() - t0
    job_id = None
    for line in out.splitlines():
        m = re.search(r'"(job-[0-9a-f]{12})"', line)
        if m:
            job_id = m.group(1)
            break
    r = job_result(daemon.ctl_json('job', 'get', job_id))
    r.update(seconds=seconds, us_per_step=seconds / r['steps'] * 1e6,
             samples_per_s=r['samples_per_s'] * r['seconds'] / seconds if seconds else 0)
    return r


def sweep_result(members):
    """A sweep's figures from its ended members (Job objects, as `job get` prints them)."""
    first = members[0]
    report = first.get('report', {})
    ok = [m for m in members if m['state'] == 'JOB_STATE_SUCCEEDED']
    start = min(rfc3339_ns(m['start_time']) for m in members)
    end = max(rfc3339_ns(m['end_time']) for m in members)
    seconds = (end - start) / 1e9
    steps = sum(int(m['steps']) for m in members)
    samples = sum(m['samples_per_second'] * m['wall_seconds'] for m in members)
    # Per step and per sample over all members' steps, as the x64 peers' figures are.
    return dict(seconds=seconds, engine_seconds=seconds,
                us_per_step=seconds / steps * 1e6 if steps else 0,
                samples_per_s=samples / seconds if seconds else 0,
                final_loss=min((m['final_loss'] for m in ok), default=float('nan')),
                max_member_wall_seconds=max(m['wall_seconds'] for m in members),
                members=len(members), succeeded=len(ok), steps=int(first['steps']),
                packed_members=int(report.get('packed_members', 0)),
                threads=int(report.get('intra_op_threads', 0)), engine=report.get('engine', ''))


def trainerd_sweep_run(daemon, device, epochs, engine='auto'):
    """The engine alone: from the first member's start to the last member's end."""
    sweep = daemon.ctl_json(*sweep_args(device, epochs, engine))
    ids = [m['id'] for m in sweep['members']]
    for job_id in ids:  # exits 1 for a member that failed: its state tells, below
        subprocess.run([daemon.ctl, '--addr', daemon.addr, 'job', 'watch', job_id],
                       capture_output=True)
    members = [daemon.ctl_json('job', 'get', job_id) for job_id in ids]
    for m in members:
        if m['state'] not in ('JOB_STATE_SUCCEEDED', 'JOB_STATE_FAILED', 'JOB_STATE_CANCELLED'):
            raise RuntimeError(f"sweep member {m['id']} still {m['state']} after job watch")
    return dict(sweep_result(members), sweep_id=sweep['sweep_id'])


def trainerd_sweep_e2e_run(daemon, device, epochs):
    """What a user waits for: `trainctl sweep ... --watch` from start to exit. With -o json it
    prints the SubmitSweepResponse on its first line, then each member as it ends."""
    cmd = [daemon.ctl, '--addr', daemon.addr, '-o', 'json', *sweep_args(device, epochs), '--watch']
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if p.returncode not in (0, 1):  # 1: a member failed or was cancelled
        raise subprocess.CalledProcessError(p.returncode, cmd, p.stdout, p.stderr)
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    sweep, ended = lines[0], {m['id']: m for m in lines[1:]}
    ids = [m['id'] for m in sweep['members']]
    if sorted(ended) != sorted(ids):
        raise RuntimeError(f'trainctl sweep --watch printed {len(ended)} ended members of {len(ids)}')
    r = sweep_result([ended[i] for i in ids])
    r.update(seconds=seconds, us_per_step=r['us_per_step'] * seconds / r['seconds'],
             samples_per_s=r['samples_per_s'] * r['seconds'] / seconds, sweep_id=sweep['sweep_id'])
    return r


def pytorch_run(a, workload, style, device, epochs, threads):
    script = os.path.join(HERE, 'peer_mlp3.py') if workload == 'mlp3' else a.seed_script
    cmd = [sys.executable, script, '--style', style, '--device', device, '--epochs', str(epochs)]
    if workload != 'mlp3':
        cmd += ['--workload', workload]
    if threads:
        cmd += ['--threads', str(threads)]
    r = json.loads(run(cmd).stdout.strip().splitlines()[-1])
    return dict(seconds=r['seconds'], us_per_step=r['us_per_step'], samples_per_s=r['samples_per_s'],
                final_loss=r['final_loss'], threads=threads)


def pytorch_x64_run(a, style, device, epochs, threads):
    """The seed loop run once, its own time x 64 (the sweep's members): each of the 64 runs would
    be this loop with another learning rate and seed. Per step and per sample stay one run's."""
    r = pytorch_run(a, SWEEP['base'], style, device, epochs, threads)
    return dict(r, seconds=r['seconds'] * SWEEP_MEMBERS, one_run_seconds=r['seconds'],
                scaled_from_one_run=SWEEP_MEMBERS)


def torchscript_module(work, workload):
    """The workload's model as a scripted nn.Sequential saved with torch.jit.save (as a user
    would), with the same layer sizes as its spec."""
    import torch
    path = os.path.join(work, f'{workload}.pt')
    if os.path.exists(path):
        return path
    layers, width = [], {'seed': 1, 'mlp3': 2, 'mlp': 64}[workload]
    for part in WORKLOADS[workload]['model'].split(','):
        if part == 'relu':
            layers.append(torch.nn.ReLU())
        else:
            out = int(part.split(':')[1])
            layers.append(torch.nn.Linear(width, out))
            width = out
    torch.jit.script(torch.nn.Sequential(*layers)).save(path)
    return path


def torchscript_e2e_run(daemon, workload, device, epochs, module):
    """A TorchScript job as a user waits for it (submit --watch, timed from outside), with the
    worker's start and the job's time to its first step from its report."""
    w = WORKLOADS[workload]
    args = ['submit', '--dataset', workload, '--torchscript', module, '--loss', w['loss'],
            '--optimizer', w['optimizer'], '--lr', w['lr'], '--batch-size', str(w['batch']),
            '--epochs', str(epochs), '--seed', '42', '--device', device]
    t0 = time.perf_counter()
    out = run([daemon.ctl, '--addr', daemon.addr, '-o', 'json', *args, '--watch']).stdout
    seconds = time.perf_counter() - t0
    job_id = re.search(r'"(job-[0-9a-f]{12})"', out).group(1)
    job = daemon.ctl_json('job', 'get', job_id)
    r = job_result(job)
    report = job.get('report', {})
    r.update(seconds=seconds, us_per_step=seconds / r['steps'] * 1e6,
             worker_start_seconds=report.get('worker_start_seconds', 0.0),
             data_seconds=report.get('data_seconds', 0.0), job_seconds=job['wall_seconds'])
    return r


def runners_for(a, daemon, workload, device, epochs, threads):
    """The runners of a workload, and which of them the ratios compare: (peers, trainerd's)."""
    if workload.startswith('torchscript-'):
        base = workload[len('torchscript-'):]
        module = torchscript_module(daemon.work, base)
        return {
            'trainerd-libtorch-e2e': lambda: dict(
                trainerd_e2e_run(daemon, base, device, epochs, engine='libtorch')),
            'trainerd-torchscript-e2e':
                lambda: torchscript_e2e_run(daemon, base, device, epochs, module),
        }, (('trainerd-torchscript-e2e',), ('trainerd-libtorch-e2e',))
    if workload == 'sweep':
        return {
            'pytorch-original-x64': lambda: pytorch_x64_run(a, 'original', device, epochs, threads),
            'pytorch-optimized-x64': lambda: pytorch_x64_run(a, 'optimized', device, epochs, threads),
            'trainerd-sweep': lambda: trainerd_sweep_run(daemon, device, epochs),
            'trainerd-sweep-libtorch': lambda: trainerd_sweep_run(daemon, device, epochs, 'libtorch'),
            'trainerd-sweep-e2e': lambda: trainerd_sweep_e2e_run(daemon, device, epochs),
        }, (('pytorch-original-x64', 'pytorch-optimized-x64'),
            ('trainerd-sweep', 'trainerd-sweep-e2e', 'trainerd-sweep-libtorch'))
    return {
        'pytorch-original': lambda: pytorch_run(a, workload, 'original', device, epochs, threads),
        'pytorch-optimized': lambda: pytorch_run(a, workload, 'optimized', device, epochs, threads),
        'trainerd': lambda: trainerd_run(daemon, workload, device, epochs),
        'trainerd-libtorch': lambda: trainerd_run(daemon, workload, device, epochs, 'libtorch'),
        'trainerd-e2e': lambda: trainerd_e2e_run(daemon, workload, device, epochs),
    }, (('pytorch-original', 'pytorch-optimized'), ('trainerd', 'trainerd-e2e', 'trainerd-libtorch'))


UPLOAD_ROWS = 4 << 20     # rows of the upload workload: 4 Mi rows x 64 float32 values = 1 GiB
UPLOAD_FEATURES = 63      # features per row, plus one float32 target


def make_upload_files(work):
    """The 1 GiB upload: x.npy (4 Mi x 63 float32) and y.npy (4 Mi float32), written in slices."""
    import numpy as np
    x_path, y_path = os.path.join(work, 'upload_x.npy'), os.path.join(work, 'upload_y.npy')
    rng = np.random.default_rng(0)
    x = np.lib.format.open_memmap(x_path, mode='w+', dtype=np.float32,
                                  shape=(UPLOAD_ROWS, UPLOAD_FEATURES))
    step = 1 << 18
    for begin in range(0, UPLOAD_ROWS, step):
        x[begin:begin + step] = rng.standard_normal((step, UPLOAD_FEATURES), dtype=np.float32)
    x.flush()
    del x
    np.save(y_path, rng.standard_normal(UPLOAD_ROWS, dtype=np.float32))
    return x_path, y_path


def vm_kb(pid, field):
    with open(f'/proc/{pid}/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1])
    return 0


def upload_run(a, device, work, files, round_no):
    """One upload of the 1 GiB dataset into a fresh daemon: throughput and both sides' peak RSS."""
    daemon = Daemon(a.build_dir, device, os.path.join(work, f'upload-{round_no}'))
    try:
        baseline_kb = vm_kb(daemon.proc.pid, 'VmRSS')
        # trainctl's peak resident memory from GNU time: a child's own rusage would count the
        # pages it shared with this (large) Python process between fork and exec.
        cmd = [daemon.ctl, '--addr', daemon.addr, 'dataset', 'upload', 'big', files[0],
               '--targets', files[1]]
        gnu_time = '/usr/bin/time' if os.path.exists('/usr/bin/time') else None
        if gnu_time:
            cmd = [gnu_time, '-f', 'maxrss_kb=%M', *cmd]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f'upload failed: {done.stderr}')
        m = re.search(r'maxrss_kb=(\d+)', done.stderr)
        client_kb = int(m.group(1)) if m else 0
        daemon_peak_kb = vm_kb(daemon.proc.pid, 'VmHWM')
    finally:
        daemon.stop()
        subprocess.run(['rm', '-rf', os.path.join(work, f'upload-{round_no}')])
    payload = UPLOAD_ROWS * (UPLOAD_FEATURES + 1) * 4
    return dict(seconds=seconds, mb_per_s=payload / seconds / 1e6, payload_bytes=payload,
                client_peak_rss_mb=client_kb / 1024,
                daemon_peak_rss_mb=daemon_peak_kb / 1024,
                daemon_growth_mb=(daemon_peak_kb - baseline_kb) / 1024)


def upload_bench(a, device, work, rows):
    files = make_upload_files(work)
    try:
        results = [upload_run(a, device, work, files, i) for i in range(a.repeats)]
    finally:
        for f in files:
            os.remove(f)
    r = median(results)
    rows.append(dict(workload='upload', device=device, runner='trainctl-upload',
                     all_seconds=[x['seconds'] for x in results], **r))
    print(f"upload {device:7} trainctl-upload      {r['seconds']:8.3f} s {r['mb_per_s']:8.0f} MB/s "
          f"trainctl peak {r['client_peak_rss_mb']:.0f} MB, trainerd peak "
          f"{r['daemon_peak_rss_mb']:.0f} MB ({r['daemon_growth_mb']:+.0f} MB over its start) "
          f"for a {r['payload_bytes'] / 2**30:.2f} GiB payload", flush=True)


def median(results):
    results = sorted(results, key=lambda r: r['seconds'])
    return results[len(results) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--build-dir', default=os.path.join(ROOT, 'build', 'release'))
    ap.add_argument('--seed-script',
                    default=os.path.join(ROOT, '..', 'shared', 'bench', 'seed_scenario.py'))
    ap.add_argument('--devices', default='cpu', help='comma-separated: cpu,cuda')
    ap.add_argument('--workloads',
                    default='seed,sweep,mlp3,mlp,torchscript-seed,torchscript-mlp3,upload')
    ap.add_argument('--epochs-seed', type=int, default=100)
    ap.add_argument('--epochs-sweep', type=int, default=100)
    ap.add_argument('--epochs-mlp3', type=int, default=20)
    ap.add_argument('--epochs-mlp', type=int, default=5)
    ap.add_argument('--repeats', type=int, default=5, help='median of this many rounds')
    ap.add_argument('--results-dir', default=os.environ.get('RESULTS_DIR', ''))
    a = ap.parse_args()
    if not os.path.exists(a.seed_script):
        sys.exit(f'bench: the seed scenario is not at {a.seed_script} (pass --seed-script)')

    import torch  # noqa: the same torch trainerd links
    meta = dict(date=time.strftime('%Y-%m-%d'), host=platform.node(), cpu_count=os.cpu_count(),
                torch=torch.__version__, cuda=torch.version.cuda,
                gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    rows = []
    ratios = []
    with tempfile.TemporaryDirectory(prefix='trainerd-bench.') as work:
        for device in a.devices.split(','):
            daemon = Daemon(a.build_dir, device, work + '/' + device.replace(':', '_'))
            uploaded = set()
            try:
                for workload in a.workloads.split(','):
                    if workload == 'upload':  # fresh daemons of its own, below
                        continue
                    base = workload[len('torchscript-'):] if workload.startswith(
                        'torchscript-') else workload
                    epochs = getattr(a, f'epochs_{base}')
                    data = SWEEP['base'] if workload == 'sweep' else base
                    upload(daemon, data, work, uploaded)
                    # A first job settles the daemon (allocator, thread pools) and tells the
                    # thread count the peers get.
                    threads = trainerd_run(daemon, data, device, 1)['threads']
                    runners, (peers, ours_all) = runners_for(a, daemon, workload, device, epochs,
                                                             threads)
                    results = {name: [] for name in runners}
                    for _ in range(a.repeats):  # interleaved: one of each per round
                        for name, fn in runners.items():
                            results[name].append(fn())
                    medians = {name: median(r) for name, r in results.items()}
                    for name, r in medians.items():
                        rows.append(dict(workload=workload, device=device, runner=name, epochs=epochs,
                                         all_seconds=[x['seconds'] for x in results[name]], **r))
                        notes = [r.get('engine', '')]
                        if 'scaled_from_one_run' in r:
                            notes.append(f"(one run x{r['scaled_from_one_run']})")
                        if 'members' in r:  # the loss is the best member's
                            notes.append(f"packed {r['packed_members']}, {r['succeeded']}/"
                                         f"{r['members']} succeeded, lowest loss, slowest member "
                                         f"{r['max_member_wall_seconds']:.3f} s")
                        if 'worker_start_seconds' in r:
                            notes.append(f"worker start {r['worker_start_seconds'] * 1e3:.1f} ms, "
                                         f"to the first step {r['data_seconds'] * 1e3:.1f} ms, "
                                         f"job {r['job_seconds']:.3f} s")
                        print(f"{workload:5} {device:7} {name:21} {r['seconds']:8.3f} s "
                              f"{r['us_per_step']:9.1f} us/step {r['samples_per_s']:12.0f} samples/s "
                              f"loss {r['final_loss']:.6f} threads {r.get('threads', 0)} "
                              + ' '.join(n for n in notes if n), flush=True)
                    verdict = medians.get('trainerd', {}).get('verdict')
                    if verdict:
                        print(f"      verdict: {verdict}", flush=True)
                    reason = medians.get('trainerd', {}).get('engine_reason')
                    if reason:
                        print(f"      not fused: {reason}", flush=True)
                    if workload.startswith('torchscript-'):
                        extra = (medians['trainerd-torchscript-e2e']['seconds'] -
                                 medians['trainerd-libtorch-e2e']['seconds'])
                        cold = results['trainerd-torchscript-e2e'][0]['worker_start_seconds']
                        print(f"      a TorchScript job (warm worker) adds {extra * 1e3:.1f} ms to "
                              f"the same model in the daemon; the first job's worker "
                              f"(cold) started in {cold * 1e3:.1f} ms", flush=True)
                        ratios.append(dict(workload=workload, device=device,
                                           torchscript_overhead_seconds=round(extra, 4),
                                           cold_worker_start_seconds=round(cold, 4)))
                        continue
                    for peer in peers:
                        for ours in ours_all:
                            ratio = medians[peer]['seconds'] / medians[ours]['seconds']
                            ratios.append(dict(workload=workload, device=device, peer=peer,
                                               trainerd=ours, speedup=round(ratio, 2)))
                            print(f"      {ours} is {ratio:6.2f}x faster than {peer}", flush=True)
                meta.setdefault('diagnosis', {})[device] = daemon.diagnosis
            finally:
                daemon.stop()
            if 'upload' in a.workloads.split(','):
                upload_bench(a, device, work, rows)
    if a.results_dir:
        os.makedirs(a.results_dir, exist_ok=True)
        with open(os.path.join(a.results_dir, 'bench.json'), 'w') as f:
            json.dump(dict(meta=meta, results=rows, ratios=ratios), f, indent=1)
    print(json.dumps(meta))


if __name__ == '__main__':
    main()

#!/usr/bin/env python3
"""trainerd against the seed question's own PyTorch loops, on the same data and hyper-parameters.

Workloads (bench/README.md): seed (linear:1 on 800 rows, batch 16), mlp (64-256-256-10 on 20,000
rows, batch 256) and mlp3 (the small MLP a user asks about: 2-64-64-3 on a 3,000-row spiral, batch
32). For each workload and device it runs, interleaved (one of each per round, median of
--repeats rounds):
  pytorch-original   the question's slow loop (../shared/bench/seed_scenario.py --style original;
                     bench/peer_mlp3.py for mlp3): a copy per batch, a loss read per step
  pytorch-optimized  the same script, --style optimized (data on the device, one read per epoch)
  trainerd           the real daemon: the job's own wall_seconds (the engine alone: no upload, no
                     queueing, no client), engine auto (the fused path where the job qualifies)
  trainerd-libtorch  the same with --engine libtorch: the LibTorch path alone
  trainerd-e2e       `trainctl submit ... --watch` as a process, timed from outside (the dataset
                     already uploaded): what a user waits for
The peers run on the same torch as trainerd (this Python's) and with the intra-op threads trainerd
chose for the job (its report's intra_op_threads). Prints a table and the ratios, and writes
bench.json into --results-dir.
"""
import argparse
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


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


class Daemon:
    def __init__(self, build_dir, device, work):
        os.makedirs(work, exist_ok=True)
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


def submit_args(workload, device, epochs, engine='auto'):
    w = WORKLOADS[workload]
    return ['submit', '--dataset', workload, '--model', w['model'], '--loss', w['loss'],
            '--optimizer', w['optimizer'], '--lr', w['lr'], '--batch-size', str(w['batch']),
            '--epochs', str(epochs), '--seed', '42', '--device', device, '--engine', engine]


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


def trainerd_e2e_run(daemon, workload, device, epochs):
    """What a user waits for: the client process from start to exit, submit and watch."""
    t0 = time.perf_counter()
    out = run([daemon.ctl, '--addr', daemon.addr, '-o', 'json',
               *submit_args(workload, device, epochs), '--watch']).stdout
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


def median(results):
    results = sorted(results, key=lambda r: r['seconds'])
    return results[len(results) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--build-dir', default=os.path.join(ROOT, 'build', 'release'))
    ap.add_argument('--seed-script',
                    default=os.path.join(ROOT, '..', 'shared', 'bench', 'seed_scenario.py'))
    ap.add_argument('--devices', default='cpu', help='comma-separated: cpu,cuda')
    ap.add_argument('--workloads', default='seed,mlp3,mlp')
    ap.add_argument('--epochs-seed', type=int, default=100)
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
                    epochs = getattr(a, f'epochs_{workload}')
                    upload(daemon, workload, work, uploaded)
                    # A first job settles the daemon (allocator, thread pools) and tells the
                    # thread count the peers get.
                    threads = trainerd_run(daemon, workload, device, 1)['threads']
                    runners = {
                        'pytorch-original': lambda: pytorch_run(a, workload, 'original', device, epochs, threads),
                        'pytorch-optimized': lambda: pytorch_run(a, workload, 'optimized', device, epochs, threads),
                        'trainerd': lambda: trainerd_run(daemon, workload, device, epochs),
                        'trainerd-libtorch': lambda: trainerd_run(daemon, workload, device, epochs, 'libtorch'),
                        'trainerd-e2e': lambda: trainerd_e2e_run(daemon, workload, device, epochs),
                    }
                    results = {name: [] for name in runners}
                    for _ in range(a.repeats):  # interleaved: one of each per round
                        for name, fn in runners.items():
                            results[name].append(fn())
                    medians = {name: median(r) for name, r in results.items()}
                    for name, r in medians.items():
                        rows.append(dict(workload=workload, device=device, runner=name, epochs=epochs,
                                         all_seconds=[x['seconds'] for x in results[name]], **r))
                        print(f"{workload:5} {device:7} {name:18} {r['seconds']:8.3f} s "
                              f"{r['us_per_step']:9.1f} us/step {r['samples_per_s']:12.0f} samples/s "
                              f"loss {r['final_loss']:.6f} threads {r.get('threads', 0)} "
                              f"{r.get('engine', '')}", flush=True)
                    verdict = medians['trainerd'].get('verdict')
                    if verdict:
                        print(f"      verdict: {verdict}", flush=True)
                    reason = medians['trainerd'].get('engine_reason')
                    if reason:
                        print(f"      not fused: {reason}", flush=True)
                    for peer in ('pytorch-original', 'pytorch-optimized'):
                        for ours in ('trainerd', 'trainerd-e2e', 'trainerd-libtorch'):
                            ratio = medians[peer]['seconds'] / medians[ours]['seconds']
                            ratios.append(dict(workload=workload, device=device, peer=peer,
                                               trainerd=ours, speedup=round(ratio, 2)))
                            print(f"      {ours} is {ratio:6.2f}x faster than {peer}", flush=True)
                meta.setdefault('diagnosis', {})[device] = daemon.diagnosis
            finally:
                daemon.stop()
    if a.results_dir:
        os.makedirs(a.results_dir, exist_ok=True)
        with open(os.path.join(a.results_dir, 'bench.json'), 'w') as f:
            json.dump(dict(meta=meta, results=rows, ratios=ratios), f, indent=1)
    print(json.dumps(meta))


if __name__ == '__main__':
    main()

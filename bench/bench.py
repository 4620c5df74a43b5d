#!/usr/bin/env python3
"""trainerd against the seed question's own PyTorch loops, on the same data and hyper-parameters.

For each workload (seed: linear:1 on 800 rows, batch 16; mlp: 64-256-256-10 on 20,000 rows,
batch 256) and device, it runs:
  pytorch-original   ../shared/bench/seed_scenario.py --style original  (a copy per batch, a loss
                     read per step: the slow code of the question)
  pytorch-optimized  the same script, --style optimized (data on the device, one read per epoch)
  trainerd           the real daemon and client: upload once, submit, read the Job's figures
with the Python of the torch that trainerd is built against, so both sides use one LibTorch.
Prints a table and writes bench.json into --results-dir. Timings are wall-clock of the training
loop only (trainerd: the job's wall_seconds, which excludes upload and queueing).
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


def trainerd_run(daemon, workload, device, epochs, work, uploaded):
    w = WORKLOADS[workload]
    if workload not in uploaded:
        csv = os.path.join(work, f'{workload}.csv')
        run([sys.executable, os.path.join(HERE, 'seed_data.py'), '--workload', workload, csv])
        daemon.ctl_json('dataset', 'upload', workload, csv, '--target-dtype', w['target_dtype'])
        uploaded.add(workload)
    job = daemon.ctl_json('submit', '--dataset', workload, '--model', w['model'], '--loss', w['loss'],
                          '--optimizer', w['optimizer'], '--lr', w['lr'], '--batch-size',
                          str(w['batch']), '--epochs', str(epochs), '--seed', '42', '--device',
                          device)
    subprocess.run([daemon.ctl, '--addr', daemon.addr, 'job', 'watch', job['id']], check=True,
                   capture_output=True)
    job = daemon.ctl_json('job', 'get', job['id'])
    steps = int(job['steps'])
    return dict(seconds=job['wall_seconds'], us_per_step=job['wall_seconds'] / steps * 1e6,
                samples_per_s=job['samples_per_second'], final_loss=job['final_loss'],
                host_syncs=int(job['host_syncs']), steps=steps,
                verdict=job.get('report', {}).get('verdict', ''))


def pytorch_run(seed_script, workload, style, device, epochs):
    out = run([sys.executable, seed_script, '--workload', workload, '--style', style, '--device',
               device, '--epochs', str(epochs)]).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return dict(seconds=r['seconds'], us_per_step=r['us_per_step'], samples_per_s=r['samples_per_s'],
                final_loss=r['final_loss'])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--build-dir', default=os.path.join(ROOT, 'build', 'release'))
    ap.add_argument('--seed-script',
                    default=os.path.join(ROOT, '..', 'shared', 'bench', 'seed_scenario.py'))
    ap.add_argument('--devices', default='cpu', help='comma-separated: cpu,cuda')
    ap.add_argument('--workloads', default='seed,mlp')
    ap.add_argument('--epochs-seed', type=int, default=100)
    ap.add_argument('--epochs-mlp', type=int, default=5)
    ap.add_argument('--repeats', type=int, default=3, help='median of this many runs')
    ap.add_argument('--results-dir', default=os.environ.get('RESULTS_DIR', ''))
    a = ap.parse_args()
    if not os.path.exists(a.seed_script):
        sys.exit(f'bench: the seed scenario is not at {a.seed_script} (pass --seed-script)')

    import torch  # noqa: the same torch trainerd links
    meta = dict(date=time.strftime('%Y-%m-%d'), host=platform.node(), cpu_count=os.cpu_count(),
                torch=torch.__version__, cuda=torch.version.cuda,
                gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    rows = []
    with tempfile.TemporaryDirectory(prefix='trainerd-bench.') as work:
        for device in a.devices.split(','):
            daemon = Daemon(a.build_dir, device, work + '/' + device.replace(':', '_'))
            uploaded = set()
            try:
                for workload in a.workloads.split(','):
                    epochs = a.epochs_seed if workload == 'seed' else a.epochs_mlp
                    runs = {
                        'pytorch-original': lambda: pytorch_run(a.seed_script, workload, 'original', device, epochs),
                        'pytorch-optimized': lambda: pytorch_run(a.seed_script, workload, 'optimized', device, epochs),
                        'trainerd': lambda: trainerd_run(daemon, workload, device, epochs, work, uploaded),
                    }
                    for name, fn in runs.items():
                        results = sorted((fn() for _ in range(a.repeats)), key=lambda r: r['seconds'])
                        r = results[len(results) // 2]
                        rows.append(dict(workload=workload, device=device, runner=name, epochs=epochs, **r))
                        print(f"{workload:5} {device:7} {name:18} {r['seconds']:8.3f} s "
                              f"{r['us_per_step']:9.1f} us/step {r['samples_per_s']:12.0f} samples/s "
                              f"loss {r['final_loss']:.6f}", flush=True)
                        if r.get('verdict'):
                            print(f"      verdict: {r['verdict']}", flush=True)
                meta.setdefault('diagnosis', {})[device] = daemon.diagnosis
            finally:
                daemon.stop()
    if a.results_dir:
        os.makedirs(a.results_dir, exist_ok=True)
        with open(os.path.join(a.results_dir, 'bench.json'), 'w') as f:
            json.dump(dict(meta=meta, results=rows), f, indent=1)
    print(json.dumps(meta))


if __name__ == '__main__':
    main()

#!/usr/bin/env python3
"""The web console's costs (server/console): how long its jobs page takes to show in headless
Chromium with 10,000 jobs on the node, what one page of the JSON API costs, and what 50 open
consoles cost the daemon. Writes console.json in --results-dir. Needs selenium and Debian's
chromium and chromium-driver (deploy/install-deps.sh installs them).

The 50 consoles are 50 clients doing what an open jobs page and a job page do (console.js): a
WatchJob stream on a running job, and ListJobs of 50 every 3 s; real browsers would add their
own CPU to the same two cores and measure the browsers, not the daemon. The daemon's CPU is read
from /proc/<pid>/stat over the same interval with and without them."""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


class Daemon:
    def __init__(self, build_dir, work):
        self.ctl_bin = os.path.join(build_dir, 'client', 'trainctl')
        self.log = open(os.path.join(work, 'trainerd.log'), 'w')
        self.proc = subprocess.Popen(
            [os.path.join(build_dir, 'server', 'trainerd'), '--listen=127.0.0.1:0',
             '--metrics_listen=', '--console_listen=127.0.0.1:0', f'--data_dir={work}/data',
             '--device=cpu', '--diagnose_at_start=false', '--max_queued_jobs=100000'],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.addr = self.console = None
        while self.console is None:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError('trainerd exited; see ' + self.log.name)
            if m := re.match(r'trainerd listening on (\S+)', line):
                self.addr = m.group(1)
            if m := re.match(r'trainerd console on (http://\S+)/', line):
                self.console = m.group(1)

    def ctl(self, *args):
        out = subprocess.run([self.ctl_bin, '--addr', self.addr, '-o', 'json', *args],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out) if out.strip() else None

    def cpu_seconds(self):
        with open(f'/proc/{self.proc.pid}/stat') as f:
            fields = f.read().rsplit(')', 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')

    def rss_bytes(self):
        with open(f'/proc/{self.proc.pid}/status') as f:
            return int(re.search(r'VmRSS:\s+(\d+)', f.read()).group(1)) * 1024

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def api(console, method, body):
    req = urllib.request.Request(f'{console}/api/v1/{method}', data=json.dumps(body).encode(),
                                 headers={'Content-Type': 'application/json'}, method='POST')
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def fill(daemon, work, jobs):
    """`jobs` one-epoch jobs: sweeps of 250 learning rates (a sweep is one submit)."""
    csv = os.path.join(work, 'seed.csv')
    with open(csv, 'w') as f:
        f.write('x,y\n' + ''.join(f'{i / 100},{2 * i / 100 + 1}\n' for i in range(100)))
    daemon.ctl('dataset', 'upload', 'seed', csv, '--target-dtype', 'float32')
    lrs = ','.join(f'{0.001 * (i + 1):.3f}' for i in range(250))
    for _ in range(jobs // 250):
        daemon.ctl('sweep', '--dataset', 'seed', '--model', 'linear:1', '--loss', 'mse',
                   '--lr', lrs, '--batch-size', '100', '--epochs', '1', '--device', 'cpu')
    while True:  # until every one ended
        page = api(daemon.console, 'JobService/ListJobs', {'page_size': 1, 'state': 'JOB_STATE_QUEUED'})
        if not page.get('jobs'):
            break
        time.sleep(0.5)


def page_load(console, rounds):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    options = webdriver.ChromeOptions()
    for arg in ('--headless=new', '--no-sandbox', '--disable-dev-shm-usage'):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service('/usr/bin/chromedriver'), options=options)
    try:
        seconds = []
        for _ in range(rounds):
            start = time.perf_counter()
            driver.get(console + '/#/jobs')
            WebDriverWait(driver, 60).until(
                lambda d: len(d.find_elements(By.CSS_SELECTOR, '#jobs-table tbody tr[data-job-id]')) >= 50)
            seconds.append(time.perf_counter() - start)
            driver.get('about:blank')
        return seconds
    finally:
        driver.quit()


def consoles(daemon, count, seconds, model):
    """CPU and memory of the daemon with `count` consoles open for `seconds`, and without."""
    # A job that runs the whole time, an epoch every few milliseconds (each a watch event for
    # every console): a live curve far busier than a real job's.
    job = daemon.ctl('submit', '--dataset', 'seed', '--model', model, '--loss', 'mse',
                     '--lr', '0.001', '--batch-size', '1', '--epochs', '1000000',
                     '--device', 'cpu')['id']
    def epochs():
        return api(daemon.console, 'JobService/GetJob', {'id': job}).get('epochs_completed', 0)

    time.sleep(2)
    idle_cpu0, idle_epochs0, t0 = daemon.cpu_seconds(), epochs(), time.monotonic()
    time.sleep(seconds)
    idle_epochs = epochs() - idle_epochs0
    idle = (daemon.cpu_seconds() - idle_cpu0) / (time.monotonic() - t0)
    rss_before = daemon.rss_bytes()
    stop = threading.Event()
    events = [0] * count
    listed = [0] * count

    def one(i):
        req = urllib.request.Request(f'{daemon.console}/api/v1/JobService/WatchJob',
                                     data=json.dumps({'id': job}).encode(),
                                     headers={'Content-Type': 'application/json'}, method='POST')
        stream = urllib.request.urlopen(req, timeout=120)

        def read():
            try:
                for line in stream:
                    if stop.is_set():
                        break
                    if line.startswith(b'data: '):
                        events[i] += 1
            except (OSError, ValueError, AttributeError):
                pass  # closed under it at the end
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while not stop.wait(3):
            api(daemon.console, 'JobService/ListJobs', {'page_size': 50, 'newest_first': True})
            listed[i] += 1
        stream.close()

    history = epochs()
    opened = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    # Each watch first replays the job's epochs so far (the page draws the whole curve): measured
    # apart, then the steady state.
    while min(events) < history:
        time.sleep(0.05)
    catch_up = time.monotonic() - opened
    busy_cpu0, busy_epochs0, t0 = daemon.cpu_seconds(), epochs(), time.monotonic()
    time.sleep(seconds)
    busy_epochs = epochs() - busy_epochs0
    busy = (daemon.cpu_seconds() - busy_cpu0) / (time.monotonic() - t0)
    rss_during = daemon.rss_bytes()
    stop.set()
    for t in threads:
        t.join(timeout=10)
    daemon.ctl('job', 'cancel', job)
    return dict(consoles=count, seconds=seconds, history_epochs=history,
                catch_up_seconds=catch_up, daemon_cpu_cores_without=idle,
                daemon_cpu_cores_with=busy, extra_cpu_cores=busy - idle,
                rss_bytes_without=rss_before, rss_bytes_with=rss_during,
                job_epochs_per_second_without=idle_epochs / seconds,
                job_epochs_per_second_with=busy_epochs / seconds,
                epoch_events_per_console=statistics.median(events),
                listings_per_console=statistics.median(listed))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument('--build-dir', default='build/release')
    ap.add_argument('--results-dir', default='build/bench')
    ap.add_argument('--jobs', type=int, default=10000)
    ap.add_argument('--rounds', type=int, default=5)
    ap.add_argument('--consoles', type=int, default=50)
    ap.add_argument('--seconds', type=float, default=20)
    ap.add_argument('--watched-model', default='linear:256,relu,linear:256,relu,linear:1',
                    help='the running job the consoles watch')
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix='trainerd-console-bench-')
    daemon = Daemon(args.build_dir, work)
    try:
        t = time.monotonic()
        fill(daemon, work, args.jobs)
        fill_seconds = time.monotonic() - t
        api_seconds = []
        for _ in range(20):
            t = time.perf_counter()
            page = api(daemon.console, 'JobService/ListJobs', {'page_size': 50, 'newest_first': True})
            api_seconds.append(time.perf_counter() - t)
        assert len(page['jobs']) == 50
        loads = page_load(daemon.console, args.rounds)
        load = consoles(daemon, args.consoles, args.seconds, args.watched_model)
        result = dict(date=time.strftime('%Y-%m-%d'), cpu_count=os.cpu_count(), jobs=args.jobs,
                      fill_seconds=fill_seconds, list_page_seconds_median=statistics.median(api_seconds),
                      page_load_seconds=loads, page_load_seconds_median=statistics.median(loads),
                      open_consoles=load)
        os.makedirs(args.results_dir, exist_ok=True)
        with open(os.path.join(args.results_dir, 'console.json'), 'w') as f:
            json.dump(result, f, indent=1)
        print(f"console: {args.jobs} jobs; jobs page shown in {result['page_load_seconds_median']:.3f} s "
              f"(median of {args.rounds}); ListJobs of 50 {result['list_page_seconds_median'] * 1e3:.1f} ms; "
              f"{args.consoles} consoles: each replayed {load['history_epochs']} epochs in "
              f"{load['catch_up_seconds']:.2f} s, then daemon {load['daemon_cpu_cores_with']:.3f} cores "
              f"(without {load['daemon_cpu_cores_without']:.3f}), the running job "
              f"{load['job_epochs_per_second_with']:.0f} epochs/s "
              f"(without {load['job_epochs_per_second_without']:.0f}), RSS "
              f"{(load['rss_bytes_with'] - load['rss_bytes_without']) / 2**20:+.1f} MiB")
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()

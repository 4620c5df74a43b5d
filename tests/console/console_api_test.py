#!/usr/bin/env python3
"""The web console's HTTP side against a real trainerd and the real trainctl (server/console):
its assets and security headers, the JSON API's authentication, tenancy and errors, a watch as
server-sent events, a cancel, a revoked token, and the refusal to serve other machines without
authentication. Standard library only. TRAINERD_BIN and TRAINCTL_BIN name the binaries."""

import datetime
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

TRAINERD = os.environ.get('TRAINERD_BIN', 'build/release/server/trainerd')
TRAINCTL = os.environ.get('TRAINCTL_BIN', 'build/release/client/trainctl')
ALICE = 'alice-token-0123456789abcdef'
BOB = 'bob-token-0123456789abcdefgh'
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class Console:
    """A trainerd with two tenants and its console on loopback ports of its choosing; with `pki`
    (Pki) it serves TLS and asks for client certificates, and `cert` names the one that requests
    and trainctl present ('alice', 'bob', 'mallory'; None: none)."""

    def __init__(self, pki=None):
        self.dir = tempfile.mkdtemp(prefix='trainerd-console-')
        self.pki = pki
        self.cert = None
        self.tokens = os.path.join(self.dir, 'tokens')
        self.write_tokens([f'alice:{ALICE}', f'bob:{BOB}'])
        self.log_file = open(os.path.join(self.dir, 'trainerd.log'), 'w')
        tls = [] if pki is None else [
            f'--tls_cert_file={pki.path("server.crt")}', f'--tls_key_file={pki.path("server.key")}',
            f'--tls_client_ca_file={pki.path("ca.crt")}', '--tls_reload_interval=1s']
        self.proc = subprocess.Popen(
            [TRAINERD, '--listen=127.0.0.1:0', '--metrics_listen=', '--console_listen=127.0.0.1:0',
             f'--data_dir={self.dir}/data', '--device=cpu', '--diagnose_at_start=false',
             f'--auth_token_file={self.tokens}', *tls],
            stdout=subprocess.PIPE, stderr=self.log_file, text=True)
        self.addr = self.console = None
        while self.console is None:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError('trainerd exited: ' + self.log())
            if m := re.match(r'trainerd listening on (\S+)', line):
                self.addr = m.group(1)
            if m := re.match(r'trainerd console on (https?://\S+)/', line):
                self.console = m.group(1)

    def tls_context(self):
        """What a browser holding `self.cert` brings: the CA it trusts and its certificate."""
        if self.pki is None:
            return None
        context = ssl.create_default_context(cafile=self.pki.path('ca.crt'))
        if self.cert:
            context.load_cert_chain(self.pki.path(f'{self.cert}.crt'),
                                    self.pki.path(f'{self.cert}.key'))
        return context

    def write_tokens(self, lines):
        with open(self.tokens + '.new', 'w') as f:
            f.write('\n'.join(lines) + '\n')
        os.replace(self.tokens + '.new', self.tokens)

    def log(self):
        with open(os.path.join(self.dir, 'trainerd.log')) as f:
            return f.read()[-2000:]

    def ctl(self, token, *args):
        tls = [] if self.pki is None else [
            '--tls-ca', self.pki.path('ca.crt'), '--tls-cert', self.pki.path(f'{self.cert}.crt'),
            '--tls-key', self.pki.path(f'{self.cert}.key')]
        out = subprocess.run([TRAINCTL, '--addr', self.addr, '-o', 'json', *tls, *args], check=True,
                             capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, TRAINERD_TOKEN=token))
        return json.loads(out.stdout) if out.stdout.strip() else None

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.proc.stdout.close()
        self.log_file.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def request(self, path, body=None, token=None, method=None, headers=None):
        """(status, headers, body bytes) of one request to the console."""
        data = None if body is None else (body if isinstance(body, bytes)
                                          else json.dumps(body).encode())
        req = urllib.request.Request(self.console + path, data=data, method=method)
        if data is not None:
            req.add_header('Content-Type', 'application/json')
        if token:
            req.add_header('Authorization', f'Bearer {token}')
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        try:
            with urllib.request.urlopen(req, timeout=60, context=self.tls_context()) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def call(self, method, body=None, token=ALICE, **kw):
        status, _, data = self.request(f'/api/v1/{method}', body if body is not None else {},
                                       token, **kw)
        return status, json.loads(data)


class Pki:
    """Certificates made by openssl as an operator would: a CA, the daemon's certificate for
    127.0.0.1, clients alice and bob signed by the CA, and mallory signed by a CA nobody trusts."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix='trainerd-console-pki-')
        self.ca('ca', 'trainerd test CA')
        self.ca('other-ca', 'nobody trusts this CA')
        self.sign('server', 'localhost', 'ca', server=True)
        self.sign('alice', 'alice', 'ca', organization='team-a')
        self.sign('bob', 'bob', 'ca')
        self.sign('mallory', 'alice', 'other-ca', organization='team-a')

    def path(self, name):
        return os.path.join(self.dir, name)

    def openssl(self, *args):
        subprocess.run(['openssl', *args], check=True, capture_output=True)

    def ca(self, name, common_name):
        self.openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1',
                     '-nodes', '-days', '1', '-subj', f'/CN={common_name}', '-keyout',
                     self.path(f'{name}.key'), '-out', self.path(f'{name}.crt'))

    def sign(self, name, common_name, ca, server=False, organization=None):
        """Writes name.crt and name.key (each under a new name first, then renamed: a
        rotation)."""
        ext = self.path(f'{name}.ext')
        with open(ext, 'w') as f:
            f.write('subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n'
                    if server else 'extendedKeyUsage=clientAuth\n')
        subject = f'/CN={common_name}' + (f'/O={organization}' if organization else '')
        self.openssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
                     '-subj', subject, '-keyout', self.path(f'{name}.key.new'), '-out',
                     self.path(f'{name}.csr'))
        self.openssl('x509', '-req', '-days', '1', '-in', self.path(f'{name}.csr'), '-CA',
                     self.path(f'{ca}.crt'), '-CAkey', self.path(f'{ca}.key'), '-set_serial',
                     str(int.from_bytes(os.urandom(8), 'big')), '-extfile', ext, '-out',
                     self.path(f'{name}.crt.new'))
        os.replace(self.path(f'{name}.key.new'), self.path(f'{name}.key'))
        os.replace(self.path(f'{name}.crt.new'), self.path(f'{name}.crt'))

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def rfc3339(text):
    """A protobuf JSON Timestamp ("2026-12-06T13:45:01.123456789Z") as a datetime (to the
    microsecond)."""
    m = re.fullmatch(r'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z', text)
    assert m, text
    micros = int(((m.group(2) or '') + '000000')[:6])
    return datetime.datetime.fromisoformat(m.group(1)).replace(
        microsecond=micros, tzinfo=datetime.timezone.utc)


def seed_csv(path):
    with open(path, 'w') as f:
        f.write('x,y\n')
        for i in range(200):
            x = i / 100
            f.write(f'{x},{2 * x + 1}\n')


class ConsoleApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Console()
        csv = os.path.join(cls.c.dir, 'seed.csv')
        seed_csv(csv)
        cls.c.ctl(ALICE, 'dataset', 'upload', 'seed', csv, '--target-dtype', 'float32')

    @classmethod
    def tearDownClass(cls):
        cls.c.stop()

    def submit(self, epochs, token=ALICE):
        return self.c.ctl(token, 'submit', '--dataset', 'seed', '--model', 'linear:1', '--loss',
                          'mse', '--lr', '0.1', '--batch-size', '16', '--epochs', str(epochs),
                          '--device', 'cpu')['id']

    def test_assets_carry_the_security_headers(self):
        status, headers, body = self.c.request('/')
        self.assertEqual(status, 200)
        self.assertEqual(headers['Content-Type'], 'text/html; charset=utf-8')
        self.assertIn(b'/console.js', body)
        for path, kind in (('/console.js', 'text/javascript'), ('/console.css', 'text/css')):
            status, h, _ = self.c.request(path)
            self.assertEqual(status, 200, path)
            self.assertTrue(h['Content-Type'].startswith(kind), h['Content-Type'])
        for h in (headers, self.c.request('/api/v1/JobService/ListJobs', {})[1]):
            self.assertEqual(h['Content-Security-Policy'], CSP)
            self.assertEqual(h['X-Content-Type-Options'], 'nosniff')
            self.assertEqual(h['X-Frame-Options'], 'DENY')
        status, _, body = self.c.request('/etc/passwd')
        self.assertEqual(status, 404)
        self.assertEqual(json.loads(body)['code'], 'NOT_FOUND')

    def test_calls_need_a_token_the_daemon_knows(self):
        status, error = self.c.call('JobService/ListJobs', token=None)
        self.assertEqual((status, error['code']), (401, 'UNAUTHENTICATED'))
        status, error = self.c.call('JobService/ListJobs', token='not-a-token-0123456789')
        self.assertEqual((status, error['code']), (401, 'UNAUTHENTICATED'))
        status, version = self.c.call('SystemService/GetVersion')
        self.assertEqual(status, 200)
        self.assertTrue(version['trainerd_version'])

    def test_each_tenant_sees_its_own_jobs(self):
        mine = self.submit(2)
        status, page = self.c.call('JobService/ListJobs', {'page_size': 1000})
        self.assertEqual(status, 200)
        self.assertIn(mine, [j['id'] for j in page['jobs']])
        status, page = self.c.call('JobService/ListJobs', {'page_size': 1000}, token=BOB)
        self.assertEqual(status, 200)
        self.assertNotIn(mine, [j['id'] for j in page['jobs']])
        status, error = self.c.call('JobService/GetJob', {'id': mine}, token=BOB)
        self.assertEqual((status, error['code']), (404, 'NOT_FOUND'))
        status, error = self.c.call('JobService/CancelJob', {'id': mine}, token=BOB)
        self.assertEqual(status, 404)
        status, datasets = self.c.call('DatasetService/ListDatasets', token=BOB)
        self.assertEqual((status, datasets.get('datasets', [])), (200, []))

    def test_bad_requests_get_the_right_status(self):
        status, error = self.c.call('JobService/GetJob', b'{"id": ')
        self.assertEqual((status, error['code']), (400, 'INVALID_ARGUMENT'))
        self.assertIn('GetJobRequest', error['message'])
        status, error = self.c.call('JobService/GetJob', {'no_such_field': 1})
        self.assertEqual(status, 400)
        # Submitting is not the console's.
        status, error = self.c.call('JobService/SubmitJob', {})
        self.assertEqual((status, error['code']), (404, 'NOT_FOUND'))
        status, _, _ = self.c.request('/api/v1/JobService/ListJobs', b'{}', ALICE,
                                      headers={'Content-Type': 'text/plain'})
        self.assertEqual(status, 415)
        status, error = self.c.call('JobService/ListJobs',
                                    headers={'Origin': 'http://evil.example'})
        self.assertEqual((status, error['code']), (403, 'PERMISSION_DENIED'))
        status, _, _ = self.c.request('/api/v1/JobService/ListJobs', b' ' * (65 * 1024), ALICE)
        self.assertEqual(status, 413)
        status, _, _ = self.c.request('/', method='DELETE')
        self.assertEqual(status, 405)

    def test_a_watch_streams_every_epoch_then_the_end(self):
        job = self.submit(30)
        req = urllib.request.Request(self.c.console + '/api/v1/JobService/WatchJob',
                                     data=json.dumps({'id': job}).encode(), method='POST')
        req.add_header('Content-Type', 'application/json')
        req.add_header('Authorization', f'Bearer {ALICE}')
        epochs, last = [], None
        with urllib.request.urlopen(req, timeout=120) as r:
            self.assertEqual(r.headers['Content-Type'], 'text/event-stream')
            for raw in r:
                line = raw.decode().rstrip('\n')
                if not line.startswith('data: '):
                    continue
                event = json.loads(line[6:])
                if 'epoch' in event:
                    epochs.append(event['epoch']['epoch'])
                if 'job' in event:
                    last = event['job']
        self.assertEqual(sorted(set(epochs)), list(range(1, 31)))
        self.assertEqual(last['state'], 'JOB_STATE_SUCCEEDED')

    def test_a_watch_of_a_job_that_does_not_exist_ends_with_an_error_event(self):
        status, _, body = self.c.request('/api/v1/JobService/WatchJob', {'id': 'job-nope'}, ALICE)
        self.assertEqual(status, 200)
        text = body.decode()
        self.assertIn('event: error', text)
        self.assertIn('"NOT_FOUND"', text)

    def test_a_model_downloads_whole_in_each_format(self):
        job = self.submit(3)
        deadline = time.time() + 60
        while (done := self.c.ctl(ALICE, 'job', 'get', job))['state'] != 'JOB_STATE_SUCCEEDED':
            self.assertLess(time.time(), deadline)
            time.sleep(0.1)
        status, headers, body = self.c.request('/api/v1/JobService/DownloadModel', {'id': job},
                                               ALICE)
        self.assertEqual(status, 200)
        self.assertEqual(headers['Content-Type'], 'application/octet-stream')
        self.assertEqual(hashlib.sha256(body).hexdigest(), done['model_sha256'])
        out = os.path.join(self.c.dir, 'model.safetensors')
        self.c.ctl(ALICE, 'job', 'model', job, '--format', 'safetensors', '-f', out)
        status, _, body = self.c.request('/api/v1/JobService/DownloadModel',
                                         {'id': job, 'format': 'MODEL_FORMAT_SAFETENSORS'}, ALICE)
        with open(out, 'rb') as f:
            self.assertEqual((status, body), (200, f.read()))
        # Errors before any byte are errors with their status.
        status, _, body = self.c.request('/api/v1/JobService/DownloadModel', {'id': 'job-nope'},
                                         ALICE)
        self.assertEqual((status, json.loads(body)['code']), (404, 'NOT_FOUND'))
        status, _, body = self.c.request('/api/v1/JobService/DownloadModel', {'id': job}, BOB)
        self.assertEqual(status, 404)

    def test_a_dataset_shows_when_a_job_last_took_it(self):
        def seed():
            status, datasets = self.c.call('DatasetService/ListDatasets')
            self.assertEqual(status, 200)
            return next(d for d in datasets['datasets'] if d['name'] == 'seed')

        before = seed()['last_use_time']
        job = self.submit(2)
        deadline = time.time() + 60
        while (done := self.c.ctl(ALICE, 'job', 'get', job))['state'] != 'JOB_STATE_SUCCEEDED':
            self.assertLess(time.time(), deadline)
            time.sleep(0.1)
        after = seed()
        self.assertGreater(rfc3339(after['last_use_time']), rfc3339(before))
        self.assertGreaterEqual(rfc3339(after['last_use_time']), rfc3339(after['create_time']))
        self.assertLessEqual(rfc3339(after['last_use_time']), rfc3339(done['end_time']))

    def test_the_devices_diagnosis_is_readable(self):
        status, diagnosis = self.c.call('SystemService/Diagnose')
        self.assertEqual(status, 200)
        self.assertEqual(diagnosis['devices'][0]['device'], 'cpu')
        self.assertGreater(diagnosis['devices'][0]['matmul_flops_per_second'], 0)

    def test_cancel_from_the_console_is_what_trainctl_sees(self):
        job = self.submit(100000)
        status, cancelled = self.c.call('JobService/CancelJob', {'id': job})
        self.assertEqual(status, 200)
        deadline = time.time() + 60
        while self.c.ctl(ALICE, 'job', 'get', job)['state'] != 'JOB_STATE_CANCELLED':
            self.assertLess(time.time(), deadline)
            time.sleep(0.1)

    def test_one_address_holds_at_most_64_connections(self):
        host, port = self.c.console[len('http://'):].rsplit(':', 1)
        held = []
        try:
            for _ in range(80):  # idle: connected, nothing sent
                sock = socket.create_connection((host, int(port)), timeout=5)
                held.append(sock)
            time.sleep(0.5)
            closed = 0
            for sock in held:
                sock.settimeout(0.05)
                try:
                    if sock.recv(1) == b'':
                        closed += 1
                except (socket.timeout, ConnectionResetError):
                    closed += isinstance(sys.exc_info()[1], ConnectionResetError)
            self.assertGreaterEqual(closed, 80 - 64)
        finally:
            for sock in held:
                sock.close()
        deadline = time.time() + 10
        while self.c.call('SystemService/GetVersion')[0] != 200:  # served again once they went
            self.assertLess(time.time(), deadline)
            time.sleep(0.1)

    def test_z_a_revoked_token_is_refused(self):
        self.assertEqual(self.c.call('JobService/ListJobs', token=BOB)[0], 200)
        self.c.write_tokens([f'alice:{ALICE}'])
        deadline = time.time() + 10
        while self.c.call('JobService/ListJobs', token=BOB)[0] != 401:
            self.assertLess(time.time(), deadline)
            time.sleep(0.2)
        self.assertEqual(self.c.call('JobService/ListJobs')[0], 200)
        self.c.write_tokens([f'alice:{ALICE}', f'bob:{BOB}'])


class ConsoleMutualTlsTest(unittest.TestCase):
    """The console of a daemon with mutual TLS: HTTPS with the daemon's own certificate, the API
    only for a client certificate its CA signed, the caller named by its subject exactly as the
    gRPC API names it, and certificates rotated without a restart."""

    @classmethod
    def setUpClass(cls):
        cls.pki = Pki()
        cls.c = Console(cls.pki)
        cls.c.cert = 'alice'
        csv = os.path.join(cls.c.dir, 'seed.csv')
        seed_csv(csv)
        cls.c.ctl('', 'dataset', 'upload', 'seed', csv, '--target-dtype', 'float32')

    @classmethod
    def tearDownClass(cls):
        cls.c.stop()
        cls.pki.remove()

    def as_(self, cert):
        self.c.cert = cert
        self.addCleanup(setattr, self.c, 'cert', 'alice')

    def test_the_console_serves_https_with_the_daemons_certificate(self):
        self.assertTrue(self.c.console.startswith('https://127.0.0.1:'), self.c.console)
        self.as_(None)
        status, headers, body = self.c.request('/')  # the page's assets need no certificate
        self.assertEqual(status, 200)
        self.assertIn(b'/console.js', body)
        plain = 'http://' + self.c.console[len('https://'):]
        with self.assertRaises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(plain + '/', timeout=10).read()

    def test_the_api_needs_a_certificate_the_daemons_ca_signed(self):
        self.as_(None)
        status, error = self.c.call('SystemService/GetVersion', token=None)
        self.assertEqual((status, error['code']), (401, 'UNAUTHENTICATED'))
        self.assertIn('requires a client certificate', error['message'])
        # A token does not stand in for the certificate, as on the gRPC API.
        status, error = self.c.call('SystemService/GetVersion', token=ALICE)
        self.assertEqual(status, 401)
        self.c.cert = 'mallory'  # alice's very subject, from a CA nobody trusts
        status, error = self.c.call('JobService/ListJobs', token=None)
        self.assertEqual((status, error['code']), (401, 'UNAUTHENTICATED'))
        self.assertIn('does not verify', error['message'])
        self.c.cert = 'alice'
        status, version = self.c.call('SystemService/GetVersion', token=None)
        self.assertEqual(status, 200)
        self.assertTrue(version['trainerd_version'])

    def test_a_long_chain_is_bounded(self):
        # A browser that sends its certificate with 20 more after it: the console looks at the
        # first 8 (the CA is among them here, so alice verifies); GnuTLS bounds the handshake.
        with open(self.pki.path('alice.crt')) as f:
            leaf = f.read()
        with open(self.pki.path('ca.crt')) as f:
            ca = f.read()
        with open(self.pki.path('long.crt'), 'w') as f:
            f.write(leaf + ca * 20)
        shutil.copy(self.pki.path('alice.key'), self.pki.path('long.key'))
        self.as_('long')
        status, page = self.c.call('JobService/ListJobs', {'page_size': 1000}, token=None)
        self.assertEqual(status, 200)
        self.assertTrue(all('CN=alice' in j['owner'] for j in page.get('jobs', [])))

    def test_a_certificate_names_its_caller_as_the_grpc_api_does(self):
        job = self.c.ctl('', 'submit', '--dataset', 'seed', '--model', 'linear:1', '--loss', 'mse',
                         '--lr', '0.1', '--batch-size', '16', '--epochs', '5', '--device', 'cpu')
        owner = job['owner']
        self.assertIn('CN=alice', owner)
        status, page = self.c.call('JobService/ListJobs', {'page_size': 1000}, token=None)
        self.assertEqual(status, 200)
        mine = [j for j in page['jobs'] if j['id'] == job['id']]
        self.assertEqual([j['owner'] for j in mine], [owner])
        status, datasets = self.c.call('DatasetService/ListDatasets', token=None)
        self.assertEqual([(d['name'], d['owner']) for d in datasets['datasets']], [('seed', owner)])
        # A watch and a download carry the certificate too.
        status, _, body = self.c.request('/api/v1/JobService/WatchJob', {'id': job['id']})
        self.assertEqual(status, 200)
        self.assertIn('JOB_STATE_SUCCEEDED', body.decode())
        done = self.c.ctl('', 'job', 'get', job['id'])
        status, _, model = self.c.request('/api/v1/JobService/DownloadModel', {'id': job['id']})
        self.assertEqual((status, hashlib.sha256(model).hexdigest()), (200, done['model_sha256']))
        # Bob's certificate is another tenant; a token sent with it names its own caller.
        self.as_('bob')
        status, page = self.c.call('JobService/ListJobs', {'page_size': 1000}, token=None)
        self.assertEqual(status, 200)
        self.assertNotIn(job['id'], [j['id'] for j in page.get('jobs', [])])
        status, error = self.c.call('JobService/GetJob', {'id': job['id']}, token=None)
        self.assertEqual((status, error['code']), (404, 'NOT_FOUND'))
        status, page = self.c.call('JobService/ListJobs', {'page_size': 1000}, token=BOB)
        self.assertEqual(status, 200)
        self.assertNotIn(job['id'], [j['id'] for j in page.get('jobs', [])])

    def test_z_certificates_rotate_without_a_restart(self):
        host, port = self.c.console[len('https://'):].rsplit(':', 1)

        def served():
            context = ssl.create_default_context(cafile=self.pki.path('ca.crt'))
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                with context.wrap_socket(raw, server_hostname=host) as tls:
                    return tls.getpeercert(binary_form=True)

        before = served()
        self.pki.sign('server', 'localhost', 'ca', server=True)
        with open(self.pki.path('server.crt'), 'rb') as f:
            rotated = ssl.PEM_cert_to_DER_cert(f.read().decode())
        self.assertNotEqual(before, rotated)
        deadline = time.time() + 30
        while served() != rotated:
            self.assertLess(time.time(), deadline)
            time.sleep(0.2)
        self.assertEqual(self.c.call('SystemService/GetVersion', token=None)[0], 200)


class ConsoleStartTest(unittest.TestCase):
    def test_a_malformed_address_is_refused_at_start(self):
        for address in ('nonsense', '127.0.0.1:99999', '127.0.0.1:-1', '[::1', ':8470'):
            d = tempfile.mkdtemp(prefix='trainerd-console-')
            try:
                r = subprocess.run([TRAINERD, '--listen=127.0.0.1:0', '--metrics_listen=',
                                    f'--console_listen={address}', f'--data_dir={d}/data',
                                    '--device=cpu', '--diagnose_at_start=false'],
                                   capture_output=True, text=True, timeout=60)
                self.assertNotEqual(r.returncode, 0, address)
                self.assertIn('trainerd: ', r.stderr, address)
            finally:
                shutil.rmtree(d, ignore_errors=True)


    def test_another_machines_reach_needs_authentication(self):
        d = tempfile.mkdtemp(prefix='trainerd-console-')
        try:
            r = subprocess.run([TRAINERD, '--listen=127.0.0.1:0', '--metrics_listen=',
                                '--console_listen=0.0.0.0:0', f'--data_dir={d}/data',
                                '--device=cpu', '--diagnose_at_start=false'],
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn('refusing to serve the console on 0.0.0.0:0', r.stderr)
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == '__main__':
    unittest.main()

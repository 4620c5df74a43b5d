#!/usr/bin/env python3
"""The web console in a real browser: headless Chromium (Debian's chromium and chromium-driver)
driven by Selenium against a real trainerd started with --console_listen, fed by the real trainctl.

    console_test.py [BUILD_DIR] [unittest args...]

BUILD_DIR (default: $TRAINERD_BIN's build, else build/release) holds server/trainerd and
client/trainctl; $TRAINERD_BIN and $TRAINCTL_BIN name the binaries instead when no BUILD_DIR is
given. Screenshots (and, when a case fails, the page, its source and the browser's console) go to
$TRAINERD_ARTIFACTS_DIR, else BUILD_DIR/tests/browser/screenshots. Exits 77 (ctest's
SKIP_RETURN_CODE) only when chromium or chromedriver is missing; tests/browser/README.md has the
cases.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("TRAINERD_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("TRAINERD_CHROMEDRIVER", "/usr/bin/chromedriver"))
SKIP = 77

# Tenants of the token file (docs/SECURITY.md: NAME:TOKEN, at least 16 characters).
TOKENS = {
    "alice": "alice-0123456789abcdef0123456789abcdef",
    "bob": "bob-fedcba9876543210fedcba9876543210",
}
WRONG_TOKEN = "nobody-00000000000000000000000000000000"

# What a hostile user would like the page to run. Dataset names are [A-Za-z0-9._-]{1,128}, so this
# one cannot be a dataset's name; it comes back in a job's error instead (a TorchScript module that
# raises it while training), with terminal escapes the daemon shows as text (\x1b...).
HOSTILE_HTML = "<img src=x onerror=alert(1)>"
HOSTILE_ERROR = HOSTILE_HTML + "\x1b[31mred\x1b[0m\x1b]0;owned\x07<script>alert(2)</script>"
# The most hostile dataset name the rules allow: a key that breaks pages that index plain objects
# by name (obj[name] = ...).
HOSTILE_DATASET = "__proto__"

# The epochs of the job the page watches and cancels: one row per step on the LibTorch path takes
# about 40 ms an epoch on a CPU, so 3000 epochs run for minutes unless cancelled.
SLOW_JOB = ["--engine", "libtorch", "--batch-size", "1", "--epochs", "3000"]


# --- Where things are ------------------------------------------------------------------------------


def locate(argv: list[str]) -> tuple[Path, Path, Path, list[str]]:
    """trainerd, trainctl and the artifacts folder, and the arguments left for unittest."""
    rest = list(argv[1:])
    build: Path | None = None
    if rest and not rest[0].startswith("-"):
        build = Path(rest.pop(0)).resolve()
    if build is not None:
        trainerd = build / "server" / "trainerd"
        trainctl = build / "client" / "trainctl"
    else:
        trainerd = Path(os.environ.get("TRAINERD_BIN", REPO / "build" / "release" / "server" / "trainerd"))
        build = trainerd.resolve().parent.parent
        trainctl = Path(os.environ.get("TRAINCTL_BIN", build / "client" / "trainctl"))
    artifacts = Path(os.environ.get("TRAINERD_ARTIFACTS_DIR") or build / "tests" / "browser" / "screenshots")
    return trainerd, trainctl, artifacts, rest


def missing_browser() -> str:
    """Why the browser cannot run here, or "" (the only reason this test skips)."""
    gone = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if gone:
        return (f"no {' or '.join(gone)}: the browser test needs Debian's chromium and "
                "chromium-driver (deploy/install-deps.sh installs them)")
    return ""


# --- The daemon ---------------------------------------------------------------------------------


class Daemon:
    """A trainerd on free loopback ports (gRPC, metrics, console) with a token file; its addresses
    are read from the lines it prints on stdout."""

    def __init__(self, binary: Path, directory: Path, token_file: Path) -> None:
        self.directory = directory
        self.stderr_path = directory / "trainerd.stderr.log"
        argv = [
            str(binary),
            "--listen=127.0.0.1:0",
            "--metrics_listen=127.0.0.1:0",
            "--console_listen=127.0.0.1:0",
            f"--data_dir={directory / 'data'}",
            f"--auth_token_file={token_file}",
            "--device=cpu",
            "--diagnose_at_start=false",
        ]
        # TRAINERD_<FLAG> variables are flags to trainerd (TRAINERD_PYTHON, TRAINERD_ARTIFACTS_DIR
        # are not): it gets none.
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINERD_")}
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr,
                                            stdin=subprocess.DEVNULL, env=env)
        self.stdout = ""
        self.drain: threading.Thread | None = None
        self.grpc_address = self._wait_for(r"^trainerd listening on (\S+)")
        console = self._wait_for(r"^trainerd console on (http://\S+)")
        self.console_url = console if console.endswith("/") else console + "/"
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _wait_for(self, pattern: str, timeout: float = 60.0) -> str:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern, re.M)
        while True:
            found = regex.search(self.stdout)
            if found:
                return found.group(1)
            if time.monotonic() > deadline or self.process.poll() is not None:
                break
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                data = os.read(fd, 4096)
                if not data:
                    self.process.wait(timeout=10)
                    break
                self.stdout += data.decode(errors="replace")
        self.stop()
        raise RuntimeError(
            f"trainerd printed no line matching {pattern!r} (exit {self.process.returncode}); "
            f"stdout:\n{self.stdout}\nstderr (end):\n{self.stderr_tail()}")

    def _drain(self) -> None:
        assert self.process.stdout is not None
        try:
            while os.read(self.process.stdout.fileno(), 4096):
                pass
        except OSError:
            pass

    def stderr_tail(self, chars: int = 3000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.drain is not None:
            self.drain.join(timeout=5)
        if self.process.stdout is not None and not self.process.stdout.closed:
            self.process.stdout.close()
        return self.process.returncode


# --- The test -------------------------------------------------------------------------------------


def keep_evidence(method: Callable[[Any], None]) -> Callable[[Any], None]:
    """On a failure, saves what the browser showed (screenshot, page source, console log)."""

    @functools.wraps(method)
    def wrapper(self: "ConsoleTest") -> None:
        try:
            method(self)
        except unittest.SkipTest:
            raise
        except BaseException:
            self.save_evidence(method.__name__)
            raise

    return wrapper


class ConsoleTest(unittest.TestCase):
    """The cases share one daemon and one browser and run in the order of their names."""

    trainerd: Path
    trainctl: Path
    artifacts: Path
    tenant = ""  # whom the browser is logged in as
    slow_job = ""  # alice's long job (cases 2, 3)

    @classmethod
    def setUpClass(cls) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        cls.tmp = Path(tempfile.mkdtemp(prefix="trainerd-console-test-"))
        cls.artifacts.mkdir(parents=True, exist_ok=True)
        for old in cls.artifacts.glob("failed-*"):  # an earlier run's
            old.unlink()
        cls.token_file = cls.tmp / "tokens"
        cls.write_tokens(TOKENS)
        cls.token_files = {}
        for name, token in TOKENS.items():
            path = cls.tmp / f"{name}.token"
            path.write_text(f"{token}\n")
            path.chmod(0o600)
            cls.token_files[name] = path
        try:
            cls.daemon = Daemon(cls.trainerd, cls.tmp, cls.token_file)
        except BaseException:
            cls.keep_logs()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise
        try:
            # The seed: y = 2x + 1 (+ a little noise), 800 rows, as bench/seed_data.py's.
            seed_csv = cls.tmp / "seed.csv"
            rows = ["x,y"]
            for i in range(800):
                x = ((i * 7919) % 800) / 800.0
                rows.append(f"{x:.6f},{2 * x + 1 + 0.05 * (((i * 31) % 17) / 8.0 - 1):.6f}")
            seed_csv.write_text("\n".join(rows) + "\n")
            cls.seed_csv = seed_csv
            for tenant in ("alice", "bob"):
                cls.ctl_ok(tenant, "dataset", "upload", "seed", str(seed_csv))

            # Selenium Manager must not look for (or download) a driver or a browser.
            os.environ["SE_OFFLINE"] = "true"
            options = webdriver.ChromeOptions()
            options.binary_location = str(CHROMIUM)
            for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                        "--window-size=1280,1000", "--no-first-run", "--disable-extensions",
                        "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", "--disable-default-apps"):
                options.add_argument(arg)
            # Alerts stay open so that the test sees any the page should not have shown.
            options.unhandled_prompt_behavior = "ignore"
            options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
            service = Service(executable_path=str(CHROMEDRIVER),
                              log_output=str(cls.tmp / "chromedriver.log"))
            cls.driver = webdriver.Chrome(service=service, options=options)
            cls.driver.set_page_load_timeout(30)
        except BaseException:
            cls.daemon.stop()
            cls.keep_logs()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            if cls.slow_job:  # still running when a case failed: the daemon then stops at once
                cls.ctl("alice", "job", "cancel", cls.slow_job)
            cls.driver.quit()
        finally:
            code = cls.daemon.stop()
            cls.keep_logs()
            shutil.rmtree(cls.tmp, ignore_errors=True)
        if code != 0:
            raise AssertionError(f"trainerd exited {code}:\n{cls.daemon.stderr_tail()}")

    @classmethod
    def keep_logs(cls) -> None:
        for name in ("trainerd.stderr.log", "chromedriver.log"):
            if (cls.tmp / name).exists():
                shutil.copy(cls.tmp / name, cls.artifacts / name)

    @classmethod
    def write_tokens(cls, tokens: dict[str, str]) -> None:
        """Replaces the token file whole (a new file renamed over it: the daemon sees a new one)."""
        text = "# trainerd's tokens for the console test\n" + "".join(
            f"{name}:{token}\n" for name, token in tokens.items())
        fresh = cls.token_file.with_suffix(".new")
        fresh.write_text(text)
        fresh.chmod(0o600)
        fresh.replace(cls.token_file)

    # --- trainctl ---

    @classmethod
    def ctl(cls, tenant: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("TRAINERD_ADDR", "TRAINERD_TOKEN")}
        env["TRAINCTL_CONFIG"] = str(cls.tmp / "trainctl-config.yaml")
        return subprocess.run(
            [str(cls.trainctl), "--addr", cls.daemon.grpc_address,
             "--token-file", str(cls.token_files[tenant]), *args],
            capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)

    @classmethod
    def ctl_ok(cls, tenant: str, *args: str, timeout: float = 60) -> str:
        done = cls.ctl(tenant, *args, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"trainctl {' '.join(args)} (as {tenant}) exited "
                                 f"{done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def job(self, tenant: str, job_id: str) -> dict[str, Any]:
        return json.loads(self.ctl_ok(tenant, "-o", "json", "job", "get", job_id))

    def submit(self, tenant: str, *args: str) -> str:
        out = self.ctl_ok(tenant, "submit", "--dataset", "seed", "--model", "linear:1",
                          "--loss", "mse", "--lr", "0.01", "--seed", "1", *args).strip()
        self.assertRegex(out, r"^job-\S+$", "trainctl submit printed no job id")
        return out

    # --- The console's JSON API, called directly ---

    def api(self, method: str, body: dict[str, Any], token: str | None) -> tuple[int, str]:
        request = urllib.request.Request(
            self.daemon.console_url + "api/v1/" + method, data=json.dumps(body).encode(),
            method="POST", headers={"Content-Type": "application/json",
                                    **({"Authorization": f"Bearer {token}"} if token else {})})
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, reply.read().decode(errors="replace")[:500]
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")[:500]
        except OSError as error:
            return 0, str(error)

    # --- The browser ---

    def open(self, fragment: str) -> None:
        self.driver.get(self.daemon.console_url + fragment)

    def find(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def displayed(self, css: str) -> Any:
        """The first displayed element matching css, or None."""
        from selenium.common.exceptions import StaleElementReferenceException

        for element in self.find(css):
            try:
                if element.is_displayed():
                    return element
            except StaleElementReferenceException:
                continue
        return None

    def text(self, css: str) -> str:
        element = self.displayed(css)
        return element.text.strip() if element is not None else ""

    def wait(self, condition: Callable[[], Any], timeout: float, what: str) -> Any:
        """Polls condition (every 100 ms) until it is truthy; fails naming what was awaited and
        what the page showed."""
        from selenium.common.exceptions import (NoSuchElementException,
                                                StaleElementReferenceException,
                                                TimeoutException)
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1,
                                 ignored_exceptions=(NoSuchElementException,
                                                     StaleElementReferenceException)).until(
                lambda _: condition())
        except TimeoutException:
            self.fail(f"after {timeout:g} s, still waiting for {what}; {self.page_state()}")

    def page_state(self) -> str:
        """What the page shows, for failure messages."""
        try:
            banner = self.text("#error-banner")
            login = self.text("#login-error")
            view = self.displayed("#view")
            shown = view.text[:400] if view is not None else ""
            return (f"page {self.driver.current_url}, error banner {banner!r}, login error "
                    f"{login!r}, login view shown: {self.displayed('#login-token') is not None}, "
                    f"view text {shown!r}")
        except Exception as error:  # an open alert, a dead browser: say so
            return f"page state unreadable: {error!r}"

    def screenshot(self, name: str) -> None:
        self.driver.save_screenshot(str(self.artifacts / f"{name}.png"))

    def save_evidence(self, name: str) -> None:
        try:
            self.screenshot(f"failed-{name}")
            (self.artifacts / f"failed-{name}.html").write_text(self.driver.page_source)
            log = self.driver.get_log("browser")
            (self.artifacts / f"failed-{name}.console.log").write_text(
                "\n".join(f"{e.get('level')} {e.get('message')}" for e in log))
        except Exception as error:  # the evidence is a bonus; the failure is what matters
            print(f"console_test: could not save the evidence of {name}: {error!r}", file=sys.stderr)

    def assert_no_alert(self) -> None:
        from selenium.common.exceptions import NoAlertPresentException

        try:
            alert = self.driver.switch_to.alert
            text = alert.text
        except NoAlertPresentException:
            return
        alert.dismiss()
        self.fail(f"the page showed an alert: {text!r}")

    def login(self, tenant_or_token: str) -> None:
        """Types a token (a tenant's, or any string) into the login view and submits it."""
        token = TOKENS.get(tenant_or_token, tenant_or_token)
        field = self.wait(lambda: self.displayed("#login-token"), 20, "the login view (#login-token)")
        field.clear()
        field.send_keys(token)
        self.displayed("#login-submit").click()

    def logged_in(self) -> bool:
        return self.displayed("#logout") is not None and self.displayed("#login-token") is None

    def log_out(self) -> None:
        self.wait(lambda: self.displayed("#logout"), 10, "#logout").click()
        self.wait(lambda: self.displayed("#login-token"), 10, "the login view after #logout")
        type(self).tenant = ""

    def be(self, tenant: str) -> None:
        """Logged in as tenant, on the jobs list."""
        if self.tenant == tenant and self.logged_in():
            return
        if self.logged_in():
            self.log_out()
        elif self.displayed("#login-token") is None:
            self.open("#/jobs")
        self.login(tenant)
        self.wait(self.logged_in, 20, f"the console after logging in as {tenant}")
        type(self).tenant = tenant

    def epochs_drawn(self) -> int:
        found = re.search(r"\d+", self.text("#job-epochs").replace(",", ""))
        return int(found.group()) if found else -1

    def the_slow_job(self) -> str:
        """alice's job that runs for minutes (submitted once, for cases 2 and 3)."""
        if not self.slow_job:
            type(self).slow_job = self.submit("alice", *SLOW_JOB)
        return self.slow_job

    # --- The cases ---

    @keep_evidence
    def test_1_a_wrong_token_is_refused_and_the_right_one_logs_in(self) -> None:
        status, body = self.api("JobService/ListJobs", {}, None)
        self.assertEqual(status, 401, f"POST /api/v1/JobService/ListJobs without a token: {body}")
        self.open("#/jobs")
        self.login(WRONG_TOKEN)
        error = self.wait(lambda: self.text("#login-error"), 20, "a text in #login-error")
        self.assertTrue(error)
        self.assertIsNone(self.displayed("#jobs-table"), "a jobs table shown to a wrong token")
        self.assertIsNotNone(self.displayed("#login-token"), "the login view went away")
        self.assertNotIn(WRONG_TOKEN, self.driver.page_source, "the wrong token is shown in the page")
        self.assert_no_alert()

        self.login("alice")
        self.wait(self.logged_in, 20, "the console after logging in as alice")
        type(self).tenant = "alice"
        self.wait(lambda: self.displayed("#jobs-table"), 20, "#jobs-table after logging in")
        self.assertIsNone(self.displayed("#login-error"), "#login-error still shown after logging in")

    @keep_evidence
    def test_2_a_running_job_draws_its_epochs(self) -> None:
        self.be("alice")
        job = self.the_slow_job()
        # The jobs list has it.
        self.open("#/jobs")
        self.wait(lambda: self.displayed(f'#jobs-table tbody tr[data-job-id="{job}"]'), 20,
                  f"the row of {job} in #jobs-table")
        self.screenshot("jobs")

        self.open(f"#/jobs/{job}")
        self.wait(lambda: "RUNNING" in self.text("#job-state"), 30, f"#job-state RUNNING for {job}")
        first = self.wait(lambda: max(self.epochs_drawn(), 0), 30, "#job-epochs above 0")
        read_at = time.monotonic()
        later = self.wait(
            lambda: time.monotonic() - read_at >= 1.5 and self.epochs_drawn() > first and
            self.epochs_drawn(), 30, f"#job-epochs to grow past {first}")
        self.assertGreater(later, first)
        d = self.wait(lambda: "".join(p.get_attribute("d") or "" for p in self.find(
            "#loss-chart path.train")).strip(), 20, "#loss-chart path.train with a non-empty d")
        self.assertTrue(d)
        self.screenshot("job")
        self.assert_no_alert()

    @keep_evidence
    def test_3_cancelling_from_the_page_cancels_the_job(self) -> None:
        from selenium.webdriver.support import expected_conditions

        self.be("alice")
        job = self.the_slow_job()
        self.open(f"#/jobs/{job}")
        self.wait(lambda: "RUNNING" in self.text("#job-state"), 30, f"#job-state RUNNING for {job}")
        self.wait(lambda: self.displayed("#job-cancel"), 10, "#job-cancel").click()
        confirm = self.wait(lambda: expected_conditions.alert_is_present()(self.driver), 10,
                            "the confirm of #job-cancel")
        confirm.accept()

        deadline = time.monotonic() + 30
        state = ""
        while time.monotonic() < deadline:
            state = self.job("alice", job)["state"]
            if state.endswith("CANCELLED"):
                break
            time.sleep(0.2)
        self.assertTrue(state.endswith("CANCELLED"),
                        f"trainctl job get {job} says {state} 30 s after the page's cancel")
        self.wait(lambda: "CANCELLED" in self.text("#job-state"), 20, "#job-state CANCELLED")
        self.assert_no_alert()

    @keep_evidence
    def test_4_a_sweep_shows_its_members_and_one_best(self) -> None:
        self.be("alice")
        rates = ["0.3", "0.1", "0.03", "0.01"]
        sweep = json.loads(self.ctl_ok(
            "alice", "-o", "json", "sweep", "--dataset", "seed", "--model", "linear:1", "--loss",
            "mse", "--lr", ",".join(rates), "--epochs", "100", "--batch-size", "16", "--seed", "1"))
        sweep_id = sweep["sweep_id"]
        members = [m["id"] for m in sweep["members"]]
        self.assertEqual(len(members), len(rates))

        self.open(f"#/sweeps/{sweep_id}")
        self.wait(lambda: {r.get_attribute("data-job-id") for r in self.find(
            "#sweep-members tr[data-job-id]")} == set(members), 30,
            f"#sweep-members to list exactly {members}")
        for member in members:
            self.ctl_ok("alice", "job", "wait", member, "--for", "ended", "--timeout", "60",
                        timeout=90)
        records = {m: self.job("alice", m) for m in members}
        self.assertEqual({r["state"] for r in records.values()}, {"JOB_STATE_SUCCEEDED"})
        losses = {m: r.get("final_loss", float("inf")) for m, r in records.items()}
        best = min(losses, key=lambda m: losses[m])
        # The page follows them (it polls): every row says so.
        self.wait(lambda: all("SUCCEEDED" in r.text for r in self.find(
            "#sweep-members tr[data-job-id]")), 20, "every row of #sweep-members SUCCEEDED")

        def one_best() -> Any:
            rows = self.find("#sweep-members tr.best")
            return {r.get_attribute("data-job-id") for r in rows} if len(rows) == 1 else None

        marked = self.wait(one_best, 30, "exactly one .best row in #sweep-members once every member ended")
        self.assertEqual(marked, {best}, f"the best member by final loss is {best} ({losses})")
        drawn = {p.get_attribute("data-job-id") for p in self.find("#sweep-chart path[data-job-id]")}
        self.assertTrue(set(members) <= drawn, f"#sweep-chart draws {drawn}, not every member {members}")
        self.screenshot("sweep")
        self.assert_no_alert()

    @keep_evidence
    def test_4b_a_model_downloads_from_its_page_and_the_devices_show_their_diagnosis(self) -> None:
        self.be("alice")
        job = self.submit("alice", "--epochs", "3")
        self.ctl_ok("alice", "job", "wait", job, "--for", "ended", "--timeout", "60", timeout=90)
        record = self.job("alice", job)
        self.assertEqual(record["state"], "JOB_STATE_SUCCEEDED")
        downloads = self.tmp / "downloads"
        downloads.mkdir(exist_ok=True)
        self.driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                                    {"behavior": "allow", "downloadPath": str(downloads)})
        self.open(f"#/jobs/{job}")
        button = self.wait(lambda: self.displayed(
            'button.model-download[data-format="MODEL_FORMAT_TORCHSCRIPT"]'), 20,
            "the TorchScript download button")
        self.assertEqual(len(self.find("button.model-download")), 3)
        button.click()
        saved = downloads / f"{job}.pt"
        self.wait(lambda: saved.exists() and not list(downloads.glob("*.crdownload")), 30,
                  f"{saved} downloaded")
        self.assertEqual(hashlib.sha256(saved.read_bytes()).hexdigest(), record["model_sha256"],
                         "the downloaded model is not the one the job recorded")

        self.open("#/devices")
        diagnosis = self.wait(lambda: self.displayed(
            'section.device-card[data-device="cpu"] .device-diagnosis'), 60,
            "the CPU's card with its diagnosis")
        self.assertIn("FLOP/s", diagnosis.text)
        self.assert_no_alert()

    @keep_evidence
    def test_5_hostile_text_is_shown_as_text(self) -> None:
        self.be("alice")
        # No dataset can carry markup in its name: trainctl refuses it before sending anything.
        refused = self.ctl("alice", "dataset", "upload", HOSTILE_HTML, str(self.seed_csv))
        self.assertEqual(refused.returncode, 2, refused.stderr)
        # The most hostile name the rules allow.
        self.ctl_ok("alice", "dataset", "upload", HOSTILE_DATASET, str(self.seed_csv))
        self.open("#/datasets")
        row = self.wait(lambda: self.displayed(f'#datasets-table tr[data-dataset="{HOSTILE_DATASET}"]'),
                        20, f"the row of dataset {HOSTILE_DATASET} in #datasets-table")
        self.assertIn(HOSTILE_DATASET, row.text)
        self.assertTrue(self.displayed('#datasets-table tr[data-dataset="seed"]'),
                        "dataset seed is not listed beside it")
        # Its creation and its last use (by the jobs of the earlier tests) are times.
        headers = [th.text for th in self.find("#datasets-table th")]
        self.assertIn("Last used", headers)
        times = self.find('#datasets-table tr[data-dataset="seed"] time')
        self.assertEqual(len(times), 2, "seed's created and last used")
        self.assertGreater(times[1].get_attribute("datetime"), times[0].get_attribute("datetime"))
        self.screenshot("datasets")

        # Markup and terminal escapes in a job's error: a TorchScript module that passes the
        # submit's check (eval mode) and raises them in training.
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest(f"{sys.executable} has no torch to write the hostile module with "
                          "(run this test with the torch environment's python: TRAINERD_PYTHON)")
        module = self.tmp / "hostile.pt"
        script = self.tmp / "hostile_module.py"  # (torch.jit.script reads the class's source)
        script.write_text(HOSTILE_MODULE)
        done = subprocess.run([sys.executable, str(script), str(module), HOSTILE_ERROR],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        job = self.ctl_ok("alice", "submit", "--dataset", "seed", "--torchscript", str(module),
                          "--loss", "mse", "--epochs", "2").strip()
        self.ctl("alice", "job", "wait", job, "--for", "ended", "--timeout", "60", timeout=90)
        error = self.job("alice", job)["error"]
        self.assertIn(HOSTILE_HTML, error, "the daemon's error does not echo the module's message")

        self.open(f"#/jobs/{job}")
        self.wait(lambda: "FAILED" in self.text("#job-state"), 30, "#job-state FAILED")
        shown = self.wait(lambda: self.displayed("#job-error"), 10, "#job-error shown")
        self.assert_no_alert()
        self.assertEqual(self.find("#job-error img, #job-error script"), [],
                         "the error's markup became elements")
        self.assertIn(" ".join(error.split()),
                      " ".join((shown.get_attribute("textContent") or "").split()),
                      "#job-error's text is not the job's error as the API gives it")
        self.assertIn(HOSTILE_HTML, shown.text)
        self.screenshot("job-error")

        self.open("#/jobs")
        self.wait(lambda: self.displayed(f'#jobs-table tbody tr[data-job-id="{job}"]'), 20,
                  f"the row of {job} in #jobs-table")
        self.assert_no_alert()
        self.assertEqual(self.find("#jobs-table img, #jobs-table script"), [],
                         "markup in #jobs-table became elements")
        self.assertEqual(self.find('img[src="x"], img[onerror]'), [], "an <img src=x> is in the page")

    @keep_evidence
    def test_6_a_tenant_sees_only_its_own_jobs(self) -> None:
        self.be("alice")
        alices = [self.submit("alice", "--epochs", "5")] + ([self.slow_job] if self.slow_job else [])
        bobs = self.submit("bob", "--epochs", "5")
        self.log_out()
        self.login("bob")
        self.wait(self.logged_in, 20, "the console after logging in as bob")
        type(self).tenant = "bob"
        self.open("#/jobs")
        self.wait(lambda: self.displayed(f'#jobs-table tbody tr[data-job-id="{bobs}"]'), 20,
                  f"bob's job {bobs} in #jobs-table")
        listed = {r.get_attribute("data-job-id") for r in self.find("#jobs-table tbody tr[data-job-id]")}
        self.assertFalse(listed & set(alices), f"bob sees alice's jobs {listed & set(alices)}")
        self.open("#/datasets")
        self.wait(lambda: self.displayed('#datasets-table tr[data-dataset="seed"]'), 20,
                  "bob's dataset seed in #datasets-table")
        self.assertEqual(self.find(f'#datasets-table tr[data-dataset="{HOSTILE_DATASET}"]'), [],
                         f"bob sees alice's dataset {HOSTILE_DATASET}")
        self.assert_no_alert()

    @keep_evidence
    def test_7_a_revoked_token_falls_back_to_the_login_view(self) -> None:
        self.be("bob")
        self.open("#/jobs")
        self.wait(lambda: self.displayed("#jobs-table"), 20, "#jobs-table as bob")
        # docs/SECURITY.md: the token file is re-read when it changes (at most once a second) and
        # its new content replaces the old.
        self.write_tokens({"alice": TOKENS["alice"]})
        deadline = time.monotonic() + 15
        while self.ctl("bob", "dataset", "list").returncode == 0:
            self.assertLess(time.monotonic(), deadline, "trainctl still works with bob's revoked token")
            time.sleep(0.2)
        # The page's next call is refused: it shows the login view.
        nav = self.displayed("#nav-datasets")
        if nav is not None:  # (unless a refresh of its own already found out)
            nav.click()
        self.wait(lambda: self.displayed("#login-token"), 20,
                  "the login view once bob's token was revoked (after clicking #nav-datasets)")
        type(self).tenant = ""
        self.assertIsNone(self.displayed("#datasets-table"), "bob's datasets still shown")
        # The revoked token no longer logs in; alice's still does.
        self.login("bob")
        self.wait(lambda: self.text("#login-error"), 20, "#login-error for the revoked token")
        self.assertFalse(self.logged_in(), "bob's revoked token logged in")
        self.login("alice")
        self.wait(self.logged_in, 20, "the console after logging in as alice")
        type(self).tenant = "alice"
        self.assert_no_alert()


# Run by the test's own interpreter: writes a TorchScript module (argv[1]) whose forward raises
# argv[2] in training mode and is a linear layer in eval mode (which the submit's check runs).
HOSTILE_MODULE = '''
import sys, warnings, torch
class Net(torch.nn.Module):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
        self.message = message
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise RuntimeError(self.message)
        return self.linear(x)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.jit.script(Net(sys.argv[2])).save(sys.argv[1])
'''


def main() -> int:
    trainerd, trainctl, artifacts, rest = locate(sys.argv)
    why = missing_browser()
    if why:
        print(f"console_test: SKIPPED: {why}", file=sys.stderr)
        return SKIP
    try:
        import selenium  # noqa: F401
    except ImportError:
        print(f"console_test: {sys.executable} has no selenium: deploy/install-deps.sh installs it "
              "into the torch environment (TRAINERD_PYTHON)", file=sys.stderr)
        return 1
    for binary in (trainerd, trainctl):
        if not os.access(binary, os.X_OK):
            print(f"console_test: no {binary} (build it, or name the build folder)", file=sys.stderr)
            return 1
    ConsoleTest.trainerd, ConsoleTest.trainctl, ConsoleTest.artifacts = trainerd, trainctl, artifacts
    print(f"console_test: {trainerd}; screenshots in {artifacts}", file=sys.stderr)
    program = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())

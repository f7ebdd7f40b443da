"""kvrharness — start the real kvrouterd binary for integration tests.

Contract (used by every integration test; see conftest.py for the fixtures):

    d = daemon_factory(config=None, extra_env=None, check_exit=True)

``config`` is ``{section: {key: str | list[str] | None}}`` merged over HARNESS_DEFAULTS (a list
value writes the key once per element; None removes the key). The config is written into a
fresh temp dir, the binary (``$KVR_BIN`` or ``<repo>/build/kvrouterd``) is started with ``-c``,
and the harness waits (hard timeout 10 s, ``ready_timeout=`` to change it) for the
``kvrouterd ready`` log line on stderr and
parses its ``key=value`` pairs into ``d.ready``. Every wait in here is bounded.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HARNESS_DEFAULTS = {
    "log": {"level": "debug"},
    "events": {"bind": "tcp://127.0.0.1:*"},
    "http": {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0"},
    "daemon": {"shutdown_timeout": "5s"},
}

READY_TIMEOUT = 10.0
READY_RE = re.compile(r"kvrouterd ready((?: [A-Za-z0-9_.-]+=[^\s\"]*)*)")
SANITIZER_MARKERS = (
    "ERROR: AddressSanitizer",
    "runtime error:",
    "WARNING: ThreadSanitizer",
    "ERROR: LeakSanitizer",
)



def free_port():
    """A TCP port free on 127.0.0.1 now (a later bind may still lose a race)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port

def kvr_bin():
    """Path of the binary under test."""
    return os.environ.get("KVR_BIN") or os.path.join(REPO, "build", "kvrouterd")


def merge_config(config=None, defaults=None):
    """Returns the harness defaults with `config` merged over them (None removes a key)."""
    base = HARNESS_DEFAULTS if defaults is None else defaults
    merged = {s: dict(kv) for s, kv in base.items()}
    for section, kv in (config or {}).items():
        sect = merged.setdefault(section, {})
        for key, value in kv.items():
            if value is None:
                sect.pop(key, None)
            else:
                sect[key] = value
    return merged


def render_config(config):
    """INI text for {section: {key: str | list[str]}}."""
    lines = []
    for section, kv in config.items():
        lines.append("[%s]" % section)
        for key, value in kv.items():
            values = value if isinstance(value, (list, tuple)) else [value]
            for v in values:
                lines.append("%s = %s" % (key, v))
        lines.append("")
    return "\n".join(lines)


def parse_ready(text):
    """Dict of the key=value pairs of the first ready line in text, or None."""
    m = READY_RE.search(text)
    if m is None:
        return None
    pairs = {}
    for tok in m.group(1).split():
        k, _, v = tok.partition("=")
        pairs[k] = v
    return pairs


def sanitizer_report(text):
    """The first sanitizer marker found in text, or None."""
    for marker in SANITIZER_MARKERS:
        if marker in text:
            return marker
    return None


def run_kvr(args, timeout=10, env=None):
    """Runs the binary to completion (e.g. -t, --version); returns CompletedProcess."""
    return subprocess.run([kvr_bin()] + list(args), capture_output=True, text=True,
                          timeout=timeout, env=env)


class DaemonError(Exception):
    pass


class Daemon:
    """A running kvrouterd. Attributes: proc, pid, conf_path, tmpdir, ready, http_port,
    admin_port, events. Use the methods below; stop() or the fixture teardown ends it."""

    def __init__(self, config=None, extra_env=None, check_exit=True, config_text=None,
                 tmpdir=None, args=None, ready_timeout=None):
        self.check_exit = check_exit
        self.ready_timeout = ready_timeout or READY_TIMEOUT
        self.tmpdir = tmpdir or tempfile.mkdtemp(prefix="kvr-it-")
        self.conf_path = os.path.join(self.tmpdir, "kvrouterd.conf")
        self.config = merge_config(config)
        with open(self.conf_path, "w") as f:
            f.write(config_text if config_text is not None else render_config(self.config))
        env = dict(os.environ)
        env.update(extra_env or {})
        self._lock = threading.Condition()
        self._chunks = []
        self._text = ""
        self._eof = False
        self.exit_code = None
        self.ready = {}
        self.http_port = None
        self.admin_port = None
        self.events = []
        self.proc = subprocess.Popen([kvr_bin(), "-c", self.conf_path] + list(args or []),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env, cwd=self.tmpdir)
        self.pid = self.proc.pid
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        try:
            self._wait_ready()
        except Exception:
            self._kill()
            raise

    # ---- stderr collection --------------------------------------------------------------
    def _read_stderr(self):
        fd = self.proc.stderr.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            with self._lock:
                if not data:
                    self._eof = True
                    self._lock.notify_all()
                    return
                self._text += data.decode("utf-8", "replace")
                self._lock.notify_all()

    def stderr_text(self):
        """Everything the daemon wrote to stderr so far."""
        with self._lock:
            return self._text

    def log_mark(self):
        """Current length of the collected stderr (pass as since= to wait_log)."""
        with self._lock:
            return len(self._text)

    def wait_log(self, regex, timeout=5, since=0):
        """Waits (bounded) until regex matches the stderr text from offset `since`; returns the
        re.Match. Raises DaemonError with the log on timeout or when the daemon exited."""
        pat = re.compile(regex, re.M) if isinstance(regex, str) else regex
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                m = pat.search(self._text, since)
                if m is not None:
                    return m
                left = deadline - time.monotonic()
                if left <= 0 or self._eof:
                    break
                self._lock.wait(min(left, 0.2))
            text = self._text
        raise DaemonError("no log line matching %r within %.1fs (daemon %s); stderr:\n%s"
                          % (pat.pattern, timeout,
                             "exited" if self.proc.poll() is not None else "running", text))

    def _wait_ready(self):
        try:
            self.wait_log(READY_RE, timeout=self.ready_timeout)
        except DaemonError:
            code = self.proc.poll()
            raise DaemonError("kvrouterd did not become ready within %.0fs (exit status %s); "
                              "stderr:\n%s" % (self.ready_timeout, code, self.stderr_text()))
        self.ready = parse_ready(self.stderr_text()) or {}
        if "http" in self.ready:
            self.http_port = int(self.ready["http"].rsplit(":", 1)[1])
        if "admin" in self.ready:
            self.admin_port = int(self.ready["admin"].rsplit(":", 1)[1])
        if self.ready.get("events"):
            self.events = self.ready["events"].split(",")

    # ---- HTTP ---------------------------------------------------------------------------
    def _port(self, admin):
        port = self.admin_port if admin and self.admin_port else self.http_port
        if port is None:
            raise DaemonError("no %s listener in the ready line: %r"
                              % ("admin" if admin else "http", self.ready))
        return port

    def url(self, path, admin=False):
        if not path.startswith("/"):
            path = "/" + path
        return "http://127.0.0.1:%d%s" % (self._port(admin), path)

    def request(self, method, path, body=None, headers=None, admin=False, timeout=5):
        """One request on a fresh connection. Returns (status, headers, body bytes); header
        names are lower-cased."""
        conn = http.client.HTTPConnection("127.0.0.1", self._port(admin), timeout=timeout)
        try:
            if isinstance(body, str):
                body = body.encode()
            conn.request(method, path, body=body, headers=dict(headers or {}))
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def json(self, method, path, obj=None, admin=False, headers=None, timeout=5):
        """JSON request; returns (status, parsed body or None when empty / not JSON)."""
        hdrs = dict(headers or {})
        body = None
        if obj is not None:
            body = json.dumps(obj).encode()
            hdrs.setdefault("Content-Type", "application/json")
        status, _, data = self.request(method, path, body=body, headers=hdrs, admin=admin,
                                       timeout=timeout)
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = None
        return status, parsed

    # ---- signals and lifetime -----------------------------------------------------------
    def signal(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def reload(self, timeout=5):
        """SIGHUP, then waits for the "reload ok" / "reload failed" line; returns the Match."""
        mark = self.log_mark()
        self.signal(signal.SIGHUP)
        return self.wait_log(r"reload (ok|failed)(: [^\"\n]*)?", timeout=timeout, since=mark)

    def _join_reader(self):
        self._reader.join(timeout=5)

    def _kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.exit_code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._join_reader()

    def stop(self, timeout=10):
        """SIGTERM and wait; returns the exit code (kills with SIGKILL after `timeout` and
        returns -9). Idempotent."""
        if self.exit_code is not None:
            return self.exit_code
        self.signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill()
            self.exit_code = -signal.SIGKILL
        self._join_reader()
        return self.exit_code

    def running(self):
        return self.proc.poll() is None

    def finish(self, timeout=10):
        """Teardown: stop; return a list of problems (empty when clean)."""
        problems = []
        was_stopped = self.exit_code is not None
        code = self.stop(timeout=timeout)
        if self.check_exit and not was_stopped and code != 0:
            problems.append("kvrouterd exited with status %s after SIGTERM" % code)
        marker = sanitizer_report(self.stderr_text())
        if marker:
            problems.append("sanitizer report in stderr (%s)" % marker)
        if problems:
            problems.append("stderr:\n" + self.stderr_text())
        if not os.environ.get("KVR_KEEP_TMP"):
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        return problems

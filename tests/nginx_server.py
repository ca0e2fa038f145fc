"""The real nginx on loopback, and a TCP fault proxy in front of it (test helpers).

``NginxServer(root, workdir)`` runs /usr/sbin/nginx as the current user (``daemon
off``, one worker) with a generated config in ``workdir``: its own pid file, error
and access logs and temp paths, listening on a free 127.0.0.1 port and serving
``root``.  Fault locations are configured in nginx itself:

    /<path>              the file under root (ranges honoured: 206)
    /norange/<path>      the same file, Range ignored (``max_ranges 0``: always 200)
    /slow/<path>         the same file at ``limit_rate`` (SLOW_RATE bytes/s)
    /fault/500/<any>     500        /fault/503/<any>  503
    /fault/404/<any>     404        /fault/403/<any>  403

The same locations are served over https on ``tls_port`` with a self-signed
certificate for 127.0.0.1 (``ca_file``) when openssl is there to make one.

The access log has one line per request: method, URI, status, the Range header
("-" when none) and the body bytes sent, tab-separated (``requests()`` parses it).
``stop()`` sends SIGTERM, waits for the master, and checks that its workers are
gone too.

``FaultProxy(upstream_port)`` is a TCP forwarder for what nginx cannot do:
``plan(kind, after)`` makes the next accepted connection forward ``after`` bytes of
the response and then ``"reset"`` (RST), ``"close"`` (FIN: a body shorter than its
Content-Length) or ``"stall"`` (keep the connection open, send nothing more).
Later connections are forwarded untouched.  ``requests`` lists the request heads
it saw, in order, as dicts (method, path, range), so a test can check that a
resume sent a Range header.

The pytest fixtures (``nginx``: one server per session over a temp directory,
``fault_proxy``: one proxy per test) are imported by conftest.py; they skip when
nginx is not installed (scripts/setup.sh installs it).
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
SLOW_RATE = 512 * 1024  # bytes per second under /slow/


def nginx_available():
    return os.access(NGINX, os.X_OK)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)


_CONF = """\
{user}
daemon off;
master_process on;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log info;
events {{ worker_connections 128; }}
http {{
    log_format fl "$request_method\\t$request_uri\\t$status\\t$http_range\\t$body_bytes_sent";
    access_log {work}/access.log fl;
    client_body_temp_path {work}/client_body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    default_type application/octet-stream;
    keepalive_timeout 10s;
    server {{
        listen 127.0.0.1:{port};
{locations}
    }}
{tls}}}
"""
_LOCATIONS = """\
        root {root};
        location /norange/ {{ alias {root}/; max_ranges 0; }}
        location /slow/ {{ alias {root}/; limit_rate {rate}; }}
        location /fault/500/ {{ return 500; }}
        location /fault/503/ {{ return 503; }}
        location /fault/404/ {{ return 404; }}
        location /fault/403/ {{ return 403; }}"""
_TLS = """\
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {work}/cert.pem;
        ssl_certificate_key {work}/key.pem;
{locations}
    }}
"""


def _make_cert(work):
    """A self-signed certificate for 127.0.0.1 (its own CA); False without openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return False
    r = subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-days", "2",
                        "-keyout", os.path.join(work, "key.pem"), "-out", os.path.join(work, "cert.pem")],
                       stdin=subprocess.DEVNULL, capture_output=True)
    return r.returncode == 0


class NginxServer:
    def __init__(self, root, workdir):
        self.root = os.path.abspath(root)
        self.work = os.path.abspath(workdir)
        self.proc = None
        self.port = None
        self.tls_port = None   # https on this port when openssl could make a certificate
        self.ca_file = None    # the certificate to trust for it (self-signed)
        self.workers = []

    # -- life cycle -------------------------------------------------------
    def start(self, attempts=5):
        os.makedirs(self.work, exist_ok=True)
        user = ""
        if os.geteuid() == 0:  # root: workers would switch to "nobody" and not read the temp dirs
            user = f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};"
        last = ""
        tls = _make_cert(self.work)
        self.ca_file = os.path.join(self.work, "cert.pem") if tls else None
        for _ in range(attempts):  # a port found free may be taken before nginx binds it
            self.port = _free_port()
            self.tls_port = _free_port() if tls else None
            locations = _LOCATIONS.format(root=self.root, rate=SLOW_RATE)
            conf = os.path.join(self.work, "nginx.conf")
            with open(conf, "w") as f:
                f.write(_CONF.format(user=user, work=self.work, port=self.port, locations=locations,
                                     tls=_TLS.format(port=self.tls_port, work=self.work, locations=locations)
                                     if tls else ""))
            self.proc = subprocess.Popen(
                [NGINX, "-p", self.work, "-c", conf, "-e", os.path.join(self.work, "error.log")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                _wait_until(lambda: self.proc.poll() is not None or self._accepts(), 10, "nginx did not start")
            except TimeoutError:
                self.stop()
                raise
            if self.proc.poll() is None:
                self.workers = self._children()
                return self
            last = self.proc.stderr.read().decode(errors="replace")
            self.proc.stderr.close()
            self.proc = None
            if "Address already in use" not in last:
                break
        raise RuntimeError(f"nginx failed to start: {last.strip()}")

    def _accepts(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _children(self):
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []

    def stop(self):
        """SIGTERM, wait for the master, and check that no worker is left."""
        if self.proc is None:
            return
        workers = self.workers or self._children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        left = [p for p in workers if _alive(p)]
        assert not left, f"nginx workers outlived their master: {left}"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- helpers for tests -----------------------------------------------
    def url(self, path, port=None):
        return f"http://127.0.0.1:{port or self.port}/{path.lstrip('/')}"

    def tls_url(self, path):
        """The https URL of path (skips the test when there is no https server)."""
        if self.tls_port is None:
            pytest.skip("no https server: openssl could not make a certificate")
        return f"https://127.0.0.1:{self.tls_port}/{path.lstrip('/')}"

    def put(self, name, data):
        """Write data to root/name and return its URL."""
        path = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return self.url(name)

    def requests(self):
        """The access log as dicts: method, uri, status, range (None when absent), sent."""
        try:
            with open(os.path.join(self.work, "access.log")) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            m, uri, status, rng, sent = line.split("\t")
            out.append(dict(method=m, uri=uri, status=int(status), range=None if rng == "-" else rng,
                            sent=int(sent)))
        return out

    def wait_requests(self, cond, timeout=5.0):
        """nginx logs a request after its last byte is sent, so a client may be
        done first: poll the log until cond(requests) holds."""
        got = []

        def check():
            got[:] = self.requests()
            return cond(got)

        try:
            _wait_until(check, timeout, "")
        except TimeoutError:
            raise AssertionError(f"nginx's access log never matched; it holds {got}") from None
        return list(got)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class FaultProxy:
    """A threaded TCP forwarder with per-connection faults (see the module doc)."""

    def __init__(self, upstream_port):
        self.upstream = ("127.0.0.1", upstream_port)
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.port = self.lsock.getsockname()[1]
        self.requests = []          # request heads seen, in order
        self.connections = 0        # connections accepted
        self.faults = 0             # planned faults that have struck (the bytes before them sent)
        self._plans = []            # faults for the next connections, in order
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._socks = []
        self._threads = []
        t = threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True)
        t.start()
        self._threads.append(t)

    def plan(self, kind, after):
        """The next connection forwards `after` response bytes, then `kind`."""
        assert kind in ("reset", "close", "stall"), kind
        with self._lock:
            self._plans.append((kind, after))

    def url(self, path):
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def ranges(self):
        with self._lock:
            return [r["range"] for r in self.requests]

    # -- internals ----------------------------------------------------------
    def _accept_loop(self):
        while not self._stopping.is_set():
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            with self._lock:
                if self._stopping.is_set():
                    c.close()
                    return
                self.connections += 1
                plan = self._plans.pop(0) if self._plans else None
                self._socks.append(c)
                t = threading.Thread(target=self._serve, args=(c, plan), name="fault-proxy-conn", daemon=True)
                self._threads.append(t)
            t.start()

    def _record(self, head):
        lines = head.decode("latin-1").split("\r\n")
        method, path = (lines[0].split(" ") + ["", ""])[:2]
        rng = None
        for line in lines[1:]:
            if line.lower().startswith("range:"):
                rng = line.split(":", 1)[1].strip()
        with self._lock:
            self.requests.append(dict(method=method, path=path, range=rng))

    def _client_to_upstream(self, c, u, closed):
        buf = b""
        try:
            while True:
                data = c.recv(65536)
                if not data:
                    break
                buf += data
                while b"\r\n\r\n" in buf:  # GETs have no body: heads follow each other
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    self._record(head)
                u.sendall(data)
        except OSError:
            pass
        finally:
            closed.set()
            try:
                u.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _serve(self, c, plan):
        try:
            u = socket.create_connection(self.upstream)
        except OSError:
            c.close()
            return
        with self._lock:
            self._socks.append(u)
        closed = threading.Event()
        t = threading.Thread(target=self._client_to_upstream, args=(c, u, closed), daemon=True)
        t.start()
        sent = 0
        kind, after = plan if plan else (None, None)
        try:
            while True:
                data = u.recv(65536)
                if not data:
                    break
                if kind is not None and sent + len(data) >= after:
                    c.sendall(data[:after - sent])
                    sent = after
                    with self._lock:
                        self.faults += 1
                    if kind == "stall":
                        while not (closed.is_set() or self._stopping.is_set()):
                            closed.wait(0.05)
                    elif kind == "reset":
                        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    break
                c.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for s in (c, u):
                try:
                    s.shutdown(socket.SHUT_RD)  # wakes the other thread's recv; sends nothing
                except OSError:
                    pass
                s.close()  # with the zero linger set above: RST instead of FIN
            t.join(5)

    def stop(self):
        self._stopping.set()
        try:
            self.lsock.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone does not
        except OSError:
            pass
        try:
            self.lsock.close()
        except OSError:
            pass
        with self._lock:
            socks = list(self._socks)
            threads = list(self._threads)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threads:
            t.join(5)
        alive = [t for t in threads if t.is_alive()]
        assert not alive, f"fault proxy threads still running: {alive}"


@pytest.fixture(scope="session")
def nginx(tmp_path_factory):
    """The real nginx serving a session temp directory (NginxServer)."""
    if not nginx_available():
        pytest.skip(f"nginx is not installed ({NGINX} not found; scripts/setup.sh installs it with apt-get)")
    base = tmp_path_factory.mktemp("nginx")
    server = NginxServer(base / "www", base / "nginx")
    os.makedirs(server.root, exist_ok=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fault_proxy(nginx):
    """A FaultProxy in front of the session's nginx."""
    proxy = FaultProxy(nginx.port)
    try:
        yield proxy
    finally:
        proxy.stop()

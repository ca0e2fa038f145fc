"""csrc/sources/stream.c and csrc/sources/tar.c through their test-only bindings (_C._stream_read,
_C._tar_samples): local files, pipe: commands and http(s) against the real nginx
(tests/nginx_server.py), with faults; tar shards compared with the webdataset
library's own reading of the same files."""

from __future__ import annotations

import errno
import gzip
import inspect
import io
import itertools
import json
import os
import re
import tarfile
import threading
import time

import pytest

from fastloader import _C

pytestmark = pytest.mark.fastloader_only

FAST = dict(retries=5, backoff_ms=10, stall_timeout_ms=5000)


def _read(url, **kw):
    opts = dict(FAST)
    opts.update(kw)
    return _C._stream_read(url, **opts)


def _fds():
    return sorted(os.listdir("/proc/self/fd"))


def _alive(pid):
    """Running (a zombie counts as gone: it no longer runs, and init reaps orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# --------------------------------------------------------------------------
# local files


def test_file_reads_the_bytes_on_disk(tmp_path):
    data = os.urandom(300_001)
    p = tmp_path / "a b.bin"
    p.write_bytes(data)
    for url in (str(p), "file://" + str(p), "file://" + str(p).replace(" ", "%20"), "file://localhost" + str(p)):
        got, st = _read(url)
        assert got == data, url
        assert st["bytes"] == len(data) and st["retries"] == 0
    got, _ = _read(str(p), chunk=7)  # many short reads give the same bytes
    assert got == data
    (tmp_path / "empty").write_bytes(b"")
    assert _read(str(tmp_path / "empty"), chunk=1)[0] == b""


def test_file_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        _read(str(tmp_path / "missing.tar"))
    assert e.value.filename == str(tmp_path / "missing.tar")
    with pytest.raises(IsADirectoryError):
        _read(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(OSError, match="a FIFO, not a regular file"):
        _read(str(fifo))  # refused by its type, without blocking for a writer
    assert time.monotonic() - t0 < 2
    with pytest.raises(ValueError, match="unsupported URL scheme 's3'.*pipe:"):
        _read("s3://bucket/shard.tar")


# --------------------------------------------------------------------------
# pipe:


def test_pipe_reads_the_commands_stdout(tmp_path):
    data = os.urandom(200_000)
    p = tmp_path / "a.bin"
    p.write_bytes(data)
    got, st = _read(f"pipe:cat {p}")
    assert got == data and st["bytes"] == len(data)
    assert _read("pipe:printf abc")[0] == b"abc"
    # stdin is /dev/null: a command that reads it ends at once
    assert _read("pipe:cat")[0] == b""


def test_pipe_exit_status_and_signal_are_errors_naming_the_command(tmp_path):
    p = tmp_path / "a.bin"
    p.write_bytes(b"x" * 1000)
    with pytest.raises(OSError) as e:
        _read(f"pipe:cat {p}; exit 3")
    assert f"pipe:cat {p}; exit 3" in str(e.value) and "exit status 3" in str(e.value)
    with pytest.raises(OSError, match=r"killed by signal 15 \(SIGTERM\)"):
        _read("pipe:kill -TERM $$")
    with pytest.raises(OSError, match="exit status 127"):
        _read("pipe:/nonexistent/command")


def test_pipe_stall_and_cancel_kill_the_whole_command(tmp_path):
    """A command that writes nothing fails after the stall timeout; a cancel
    stops the read at once; either way close kills the process group (the
    shell and what it started) and reaps the shell: nothing keeps running."""
    before = _fds()
    for i, kw in enumerate((dict(stall_timeout_ms=200), dict(stall_timeout_ms=0, cancel_after_ms=200))):
        pids = tmp_path / f"pids{i}"
        cmd = f"pipe:sleep 30 & echo $! > {pids}; echo $$ >> {pids}; wait"
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            _read(cmd, **kw)
        assert time.monotonic() - t0 < 3
        if "cancel_after_ms" in kw:
            assert e.value.errno == errno.ECANCELED
        else:
            assert "wrote nothing for 200 ms (stalled)" in str(e.value)
        sleeper, shell = (int(x) for x in pids.read_text().split())
        assert _wait(lambda: not _alive(sleeper) and not _alive(shell)), "the command outlived its stream"
        with pytest.raises(ChildProcessError):
            os.waitpid(shell, os.WNOHANG)  # already reaped by close: no zombie left to us
    assert _fds() == before


# --------------------------------------------------------------------------
# http(s) against the real nginx


@pytest.fixture(scope="module")
def blob(nginx):
    data = os.urandom(300_000)
    nginx.put("blob.bin", data)
    return data


def test_http_whole_file_equals_the_bytes_on_disk(nginx, blob):
    got, st = _read(nginx.url("blob.bin"))
    assert got == blob
    assert st["bytes"] == len(blob) and st["retries"] == 0 and st["wait_ns"] > 0
    big = os.urandom(3_000_000)
    nginx.put("big.bin", big)
    # small reads against the bounded buffer: the transfer pauses and resumes many times
    assert _read(nginx.url("big.bin"), chunk=1000, buffer_bytes=1)[0] == big
    nginx.put("empty.bin", b"")
    assert _read(nginx.url("empty.bin"))[0] == b""


@pytest.mark.parametrize("status", [404, 403])
def test_http_client_errors_fail_at_once_naming_url_and_status(nginx, status):
    url = nginx.url(f"fault/{status}/shard-000.tar")
    t0 = time.monotonic()
    with pytest.raises(OSError) as e:
        _read(url, retries=5, backoff_ms=2000)
    assert time.monotonic() - t0 < 1.5  # no back-off: not retried
    assert url in str(e.value) and f"HTTP {status}" in str(e.value)
    reqs = nginx.wait_requests(lambda r: any(q["uri"].endswith(f"/{status}/shard-000.tar") for q in r))
    assert sum(q["uri"] == f"/fault/{status}/shard-000.tar" for q in reqs) == 1


def test_http_500_is_retried_then_fails_naming_url_offset_and_cause(nginx):
    url = nginx.url("fault/500/retried.tar")
    with pytest.raises(OSError) as e:
        _read(url, retries=2, backoff_ms=20)
    msg = str(e.value)
    assert url in msg and "at byte 0" in msg and "3 failed attempts" in msg and "HTTP 500" in msg
    reqs = nginx.wait_requests(lambda r: sum(q["uri"] == "/fault/500/retried.tar" for q in r) >= 3)
    assert sum(q["uri"] == "/fault/500/retried.tar" for q in reqs) == 3


def test_http_refused_connection_is_retried_then_fails():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/x.tar"
    with pytest.raises(OSError, match=r"gave up at byte 0 after 2 failed attempts in a row: .*connect") as e:
        _read(url, retries=1)
    assert url in str(e.value)


@pytest.mark.parametrize("kind", ["reset", "close"])
def test_http_broken_body_resumes_with_range(nginx, fault_proxy, blob, kind):
    """A connection reset (RST) or closed early (FIN, a body shorter than its
    Content-Length) after 100000 bytes: the stream resumes where it broke with
    a Range request, answered 206 by nginx; no byte is lost or repeated."""
    fault_proxy.plan(kind, 100_000)
    got, st = _read(fault_proxy.url("blob.bin"))
    assert got == blob
    assert st["retries"] == 1 and st["range_resumes"] == 1 and st["skipped_bytes"] == 0
    first, second = fault_proxy.requests
    assert first["range"] is None
    m = re.fullmatch(r"bytes=(\d+)-", second["range"] or "")
    assert m and 50_000 < int(m.group(1)) < 100_000  # 100000 response bytes, less the head
    start = int(m.group(1))
    reqs = nginx.wait_requests(lambda r: any(q["range"] == f"bytes={start}-" for q in r))
    resumed = [q for q in reqs if q["range"] == f"bytes={start}-"]
    assert resumed[-1]["status"] == 206 and resumed[-1]["sent"] == len(blob) - start


def test_http_resume_when_the_server_ignores_range(nginx, fault_proxy, blob):
    """nginx with max_ranges 0 answers the resume with 200 and the whole body:
    the bytes already delivered are dropped, not repeated."""
    fault_proxy.plan("reset", 100_000)
    got, st = _read(fault_proxy.url("norange/blob.bin"))
    assert got == blob
    assert st["retries"] == 1 and st["range_resumes"] == 0
    start = int(fault_proxy.requests[1]["range"][len("bytes="):-1])
    assert st["skipped_bytes"] == start


def test_http_stall_resumes(nginx, fault_proxy, blob):
    fault_proxy.plan("stall", 100_000)
    t0 = time.monotonic()
    got, st = _read(fault_proxy.url("blob.bin"), stall_timeout_ms=300)
    assert got == blob
    assert time.monotonic() - t0 >= 0.3
    assert st["retries"] == 1 and st["range_resumes"] == 1
    assert fault_proxy.requests[1]["range"].startswith("bytes=")


def test_http_slow_body_is_not_a_stall(nginx):
    """nginx's limit_rate sends 400 kB in about 0.7 s with gaps of about
    0.13 s: a 0.35 s stall timeout counts silence, not the whole transfer."""
    from nginx_server import SLOW_RATE

    data = os.urandom(400_000)
    nginx.put("slow.bin", data)
    t0 = time.monotonic()
    got, st = _read(nginx.url("slow/slow.bin"), stall_timeout_ms=350, retries=0)
    took = time.monotonic() - t0
    assert got == data and st["retries"] == 0
    assert took > 0.35 and took > 0.8 * len(data) / SLOW_RATE - 0.5


def test_http_retry_budget_counts_failures_in_a_row(nginx, fault_proxy, blob):
    """Three breaks, each after progress, with retries=1: an attempt that
    delivered new bytes resets the budget, so a long shard over a flaky link
    still completes."""
    for _ in range(3):
        fault_proxy.plan("reset", 60_000)
    got, st = _read(fault_proxy.url("blob.bin"), retries=1)
    assert got == blob and st["retries"] == 3 and st["range_resumes"] == 3
    starts = [int(r["range"][6:-1]) for r in fault_proxy.requests[1:]]
    assert starts == sorted(starts) and len(set(starts)) == 3


def test_http_resource_changed_between_attempts_is_an_error(nginx, fault_proxy):
    nginx.put("changing.bin", os.urandom(300_000))
    fault_proxy.plan("stall", 100_000)
    out = {}

    def run():
        try:
            out["r"] = _read(fault_proxy.url("changing.bin"), stall_timeout_ms=1000)
        except OSError as e:
            out["e"] = e

    t = threading.Thread(target=run)
    t.start()
    # the stall has struck: the first response, old ETag and 100 kB, is out
    # (its request alone is not enough: nginx may not have answered it yet,
    # and would then serve the new file to both attempts, consistently)
    assert _wait(lambda: fault_proxy.faults >= 1)
    nginx.put("changing.bin", os.urandom(250_000))  # while the first attempt hangs
    t.join(10)
    assert "e" in out, out
    assert "changed" in str(out["e"]) and fault_proxy.url("changing.bin") in str(out["e"])


def test_http_cancel_stops_a_blocked_read_and_a_back_off(nginx, fault_proxy, blob):
    fault_proxy.plan("stall", 50_000)
    t0 = time.monotonic()
    with pytest.raises(OSError) as e:
        _read(fault_proxy.url("blob.bin"), stall_timeout_ms=30_000, cancel_after_ms=200)
    assert e.value.errno == errno.ECANCELED and time.monotonic() - t0 < 2
    t0 = time.monotonic()
    with pytest.raises(OSError) as e:
        _read(nginx.url("fault/503/x.tar"), retries=5, backoff_ms=10_000, cancel_after_ms=200)
    assert e.value.errno == errno.ECANCELED and time.monotonic() - t0 < 2


def test_https_with_the_servers_ca_and_without(nginx, blob):
    """https through libcurl's TLS: the bytes with the server's certificate
    trusted (ca_file); without it, verification fails at once (not retried),
    naming the URL and the certificate problem."""
    url = nginx.tls_url("blob.bin")
    assert _read(url, ca_file=nginx.ca_file)[0] == blob
    t0 = time.monotonic()
    with pytest.raises(OSError) as e:
        _read(url, retries=5, backoff_ms=2000)
    assert time.monotonic() - t0 < 1.5
    assert url in str(e.value) and "certificate" in str(e.value)


def test_http_messages_hide_query_and_credentials(nginx):
    port = nginx.port
    for url in (f"http://127.0.0.1:{port}/fault/404/x.tar?X-Amz-Signature=SECRET123&X-Amz-Expires=60",
                f"http://user:SECRET123@127.0.0.1:{port}/fault/404/x.tar"):
        with pytest.raises(OSError) as e:
            _read(url)
        assert "SECRET123" not in e.value.args[0] and "HTTP 404" in str(e.value)
        assert "/fault/404/x.tar" in str(e.value)


def test_streams_leak_no_fds(nginx, blob, tmp_path):
    p = tmp_path / "a.bin"
    p.write_bytes(b"abc")
    _read(nginx.url("blob.bin"))  # libcurl's one-time set-up, out of the count
    before = _fds()
    for _ in range(5):
        _read(str(p))
        _read(f"pipe:cat {p}")
        _read(nginx.url("blob.bin"))
        with pytest.raises(OSError):
            _read(nginx.url("fault/404/x"))
        with pytest.raises(OSError):
            _read("pipe:exit 1")
    assert _fds() == before


# --------------------------------------------------------------------------
# tar shards: against the webdataset library


def _wds_samples(path):
    """The webdataset library's own reading: [(key, {ext: bytes})]."""
    from webdataset import tariterators

    out = []
    for s in tariterators.tarfile_samples([dict(url=str(path))]):
        out.append((s["__key__"], {k: v for k, v in s.items() if k not in ("__key__", "__url__", "__local_path__")}))
    return out


def _samples(url, **kw):
    opts = dict(FAST)
    opts.update(kw)
    return _C._tar_samples(str(url), **opts)


@pytest.fixture(scope="module")
def wds_shards(tmp_path_factory):
    """Shards written by webdataset's ShardWriter: member sizes around block
    boundaries and above the reader's 64 KiB direct-read threshold."""
    import webdataset as wds

    d = tmp_path_factory.mktemp("wds")
    sizes = [0, 1, 511, 512, 513, 1024, 70_000, 200_000, 3]
    with wds.ShardWriter(str(d / "shard-%06d.tar"), maxcount=4, verbose=0) as w:
        for i in range(11):
            w.write({"__key__": f"sample{i:04d}", "jpg": os.urandom(sizes[i % len(sizes)]), "cls": i % 3,
                     "json": {"i": i, "name": f"s{i}"}, "txt": "caption é %d" % i})
    return sorted(d.glob("shard-*.tar"))


def test_shardwriter_shards_match_webdataset(wds_shards, nginx):
    assert len(wds_shards) == 3
    for shard in wds_shards:
        want = _wds_samples(shard)
        assert len(want) in (3, 4)
        assert _samples(shard) == want
        assert _samples(f"pipe:cat {shard}") == want
        url = nginx.put(f"wds/{shard.name}", shard.read_bytes())
        got, st = _samples(url, with_stats=True)
        assert got == want and st["bytes"] == shard.stat().st_size


def test_shard_over_http_with_a_reset_matches_webdataset(wds_shards, nginx, fault_proxy):
    shard = wds_shards[1]  # members of 70 kB and 200 kB
    assert shard.stat().st_size > 250_000
    nginx.put(f"wds/{shard.name}", shard.read_bytes())
    fault_proxy.plan("reset", 150_000)
    got, st = _samples(fault_proxy.url(f"wds/{shard.name}"), with_stats=True)
    assert got == _wds_samples(shard)
    assert st["retries"] == 1 and st["range_resumes"] == 1


def _add(tf, name, data=b"", type=tarfile.REGTYPE, linkname=""):
    ti = tarfile.TarInfo(name)
    ti.type = type
    ti.linkname = linkname
    ti.mtime = 1_700_000_000
    if type in (tarfile.REGTYPE, tarfile.AREGTYPE):
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    else:
        tf.addfile(ti)


LONG = "long/" + "d" * 120 + "/" + "n" * 90  # over 100 characters: 'L', pax, or a ustar prefix


def _tricky_members(fmt):
    m = [
        ("a/b/c.jpg", b"jpeg-ish"), ("a/b/c.CLS", b"7"), ("a/b/c.seg.png", b"png"),
        ("d.e/f.txt", b"dot in dir"), ("d.e/f.json", b"{}"),
        ("x/.hidden.jpg", b"h1"), ("x/.hidden.txt", b"h2"),  # base name starts with '.': key "x/"
        ("noext", b"dropped"), ("dir/noext", b"dropped"), ("__meta__", b"meta"), ("__dir__/inside.jpg", b"meta"),
        ("__key__.txt", b"kept: not a meta name"), ("sample.0.jpg", b"multi"), ("sample.0.JSON", b"{}"),
        ("a/b/c.late", b"the key again, later: a second sample"),
        ("zero.bin", b""), ("block.bin", b"b" * 512), ("block.txt", b"c" * 513),
        (LONG + ".jpg", b"long name"), (LONG + ".cls", b"3"),
        ("bin/z.jpg", bytes(range(256)) * 300),
    ]
    if fmt != tarfile.USTAR_FORMAT:  # ustar cannot store non-ASCII names portably
        m += [("ünï/çødé.JPG", b"unicode"), ("ünï/çødé.txt", b"u")]
    return m


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT],
                         ids=["gnu", "pax", "ustar"])
def test_tarfile_shards_match_webdataset(tmp_path, fmt):
    """Long names ('L' / pax path= / ustar prefix), directories, links, FIFOs,
    meta names, names without an extension, dot files, upper-case and
    multi-dot extensions, sizes around 512: the same samples as webdataset."""
    p = tmp_path / "t.tar"
    with tarfile.open(p, "w", format=fmt) as tf:
        _add(tf, "a", type=tarfile.DIRTYPE)
        _add(tf, "a/b", type=tarfile.DIRTYPE)
        for name, data in _tricky_members(fmt):
            _add(tf, name, data)
            if name == "d.e/f.txt":
                _add(tf, "d.e/f.lnk", type=tarfile.SYMTYPE, linkname="f.txt")  # skipped, sample goes on
                _add(tf, "d.e/f.hard", type=tarfile.LNKTYPE, linkname="d.e/f.txt")
                _add(tf, "d.e/f.fifo", type=tarfile.FIFOTYPE)
    want = _wds_samples(p)
    got = _samples(p)
    assert got == want
    keys = [k for k, _ in got]
    assert "x/" in keys and LONG in keys and "__key__" in keys  # the rules above were exercised
    assert got[0] == ("a/b/c", {"jpg": b"jpeg-ish", "cls": b"7", "seg.png": b"png"})
    assert ("a/b/c", {"late": b"the key again, later: a second sample"}) in got


def test_pax_global_header_and_comment(tmp_path):
    """A global pax header with only a comment (git archive writes one) changes
    nothing; one with path= renames every later member that has no name of its
    own, as tarfile reads it."""
    for pax, name in (({"comment": "0123abcd"}, "plain"), ({"path": "g/global.jpg"}, "renamed")):
        p = tmp_path / f"{name}.tar"
        with tarfile.open(p, "w", format=tarfile.PAX_FORMAT, pax_headers=pax) as tf:
            _add(tf, "k1.jpg", b"1")
            if name == "plain":
                _add(tf, "k1.txt", b"2")
            _add(tf, LONG + ".jpg", b"3")  # has a pax path= of its own
        got = _samples(p)
        assert got == _wds_samples(p), name
        assert got[0][0] == ("k1" if name == "plain" else "g/global") and got[-1][0] == LONG


def test_end_of_archive_missing_is_accepted_like_tarfile(tmp_path, wds_shards):
    data = wds_shards[0].read_bytes()
    end = data.rstrip(b"\0")
    end += b"\0" * ((-len(end)) % 512)  # the last member's padding stays; the zero blocks go
    p = tmp_path / "no-trailer.tar"
    p.write_bytes(end)
    assert _samples(p) == _wds_samples(p) == _wds_samples(wds_shards[0])


def test_truncated_shard_names_shard_and_member(tmp_path, wds_shards, nginx):
    data = wds_shards[1].read_bytes()
    with tarfile.open(wds_shards[1]) as tf:
        members = tf.getmembers()
    victim = next(m for m in members if m.size > 10_000)
    cut = tmp_path / "cut-body.tar"
    cut.write_bytes(data[:victim.offset_data + victim.size // 2])
    for url in (str(cut), nginx.put("cut/cut-body.tar", cut.read_bytes())):
        with pytest.raises(ValueError) as e:
            _samples(url)
        assert isinstance(e.value, _C.DecodeError)
        assert url in str(e.value) and victim.name in str(e.value) and "cut short" in str(e.value)
    # webdataset also refuses it
    with pytest.raises(Exception):
        _wds_samples(cut)
    # a header cut short: named by its offset and the member before it
    second = members[1]
    cut2 = tmp_path / "cut-header.tar"
    cut2.write_bytes(data[:second.offset + 100])
    with pytest.raises(_C.DecodeError) as e:
        _samples(cut2)
    msg = str(e.value)
    assert str(cut2) in msg and f"byte {second.offset}" in msg and members[0].name in msg and "cut short" in msg


def test_not_a_tar_raises(tmp_path, wds_shards):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(os.urandom(5000))
    with pytest.raises(_C.DecodeError, match="not a tar archive"):
        _samples(junk)
    short = tmp_path / "short.tar"
    short.write_bytes(b"hello")
    with pytest.raises(_C.DecodeError, match="not a tar archive"):
        _samples(short)
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with pytest.raises(_C.DecodeError, match="empty shard"):
        _samples(empty)
    gz = tmp_path / "shard.tar.gz"
    gz.write_bytes(gzip.compress(wds_shards[0].read_bytes()))
    with pytest.raises(_C.DecodeError, match=r"gzip-compressed.*pipe:gzip -dc"):
        _samples(gz)
    assert _samples(f"pipe:gzip -dc {gz}") == _wds_samples(wds_shards[0])


def _patch(data, offset, pos, value):
    """Change header bytes at offset+pos and fix the header's checksum."""
    b = bytearray(data)
    b[offset + pos:offset + pos + len(value)] = value
    b[offset + 148:offset + 156] = b" " * 8
    b[offset + 148:offset + 156] = b"%06o\0 " % sum(b[offset:offset + 512])
    return bytes(b)


def test_damaged_headers(tmp_path, wds_shards):
    data = wds_shards[0].read_bytes()
    with tarfile.open(wds_shards[0]) as tf:
        members = tf.getmembers()
    m2 = members[2]
    bad = bytearray(data)
    bad[m2.offset + 10] ^= 0xFF  # a flipped bit in the name: checksum mismatch
    p = tmp_path / "bad-sum.tar"
    p.write_bytes(bytes(bad))
    with pytest.raises(_C.DecodeError, match=f"bad header checksum at byte {m2.offset}.*after this member") as e:
        _samples(p)
    assert members[1].name in str(e.value)
    sparse = tmp_path / "sparse.tar"
    sparse.write_bytes(_patch(data, m2.offset, 156, b"S"))
    with pytest.raises(_C.DecodeError, match="sparse"):
        _samples(sparse)
    # an unknown type is skipped with its data, as tarfile does
    unknown = tmp_path / "unknown.tar"
    unknown.write_bytes(_patch(data, m2.offset, 156, b"Z"))
    assert _samples(unknown) == _wds_samples(unknown)


def test_duplicate_and_reserved_extensions_raise_like_webdataset(tmp_path):
    for names in (["a.jpg", "a.jpg"], ["a.JPG", "a.jpg"], ["a.jpg", "a.JPG"], ["a.__key__"], ["a.__URL__"]):
        p = tmp_path / "dup.tar"
        with tarfile.open(p, "w") as tf:
            for n in names:
                _add(tf, n, b"x")
        with pytest.raises(ValueError):
            _wds_samples(p)
        with pytest.raises(_C.DecodeError) as e:
            _samples(p)
        assert str(p) in str(e.value) and names[-1] in str(e.value)


def test_limits(tmp_path):
    p = tmp_path / "big.tar"
    with tarfile.open(p, "w") as tf:
        _add(tf, "a.jpg", b"x" * 2000)
        _add(tf, "a.cls", b"1")
        _add(tf, "a.txt", b"t")
    with pytest.raises(_C.DecodeError, match=r"member 'a.jpg'.*2000 bytes exceeds the limit of 1000"):
        _samples(p, max_member_bytes=1000)
    with pytest.raises(_C.DecodeError, match="more than 2 members"):
        _samples(p, max_fields=2)
    assert _samples(p, max_member_bytes=2000, max_fields=3) == _wds_samples(p)


def test_pipe_shard_whose_command_fails_after_the_archive(tmp_path, wds_shards):
    """The reader reads on after the end-of-archive blocks, so a command that
    wrote a whole shard and then failed is still an error."""
    with pytest.raises(OSError, match="exit status 4"):
        _samples(f"pipe:cat {wds_shards[0]}; exit 4")


def test_stream_failure_inside_a_member_names_the_member(wds_shards, nginx, fault_proxy):
    shard = wds_shards[1]
    with tarfile.open(shard) as tf:
        victim = next(m for m in tf.getmembers() if m.size == 200_000)
    cut = victim.offset_data + 1000
    with pytest.raises(OSError) as e:
        _samples(f"pipe:head -c {cut} {shard}; exit 2")
    assert "exit status 2" in str(e.value) and f"(member '{victim.name}')" in str(e.value)
    nginx.put(f"wds/{shard.name}", shard.read_bytes())
    fault_proxy.plan("stall", cut + 300)
    url = fault_proxy.url(f"wds/{shard.name}")
    with pytest.raises(OSError) as e:
        _samples(url, retries=0, stall_timeout_ms=200)
    msg = str(e.value)
    assert url in msg and "gave up at byte" in msg and "stalled" in msg and f"(member '{victim.name}')" in msg


# --------------------------------------------------------------------------
# the name rules, exhaustively against webdataset's own


def test_name_rules_match_webdataset_exhaustively():
    """Every name of up to 6 characters over an alphabet that exercises the
    regexes (letters, '.', '/', '_', newline): _wds_split equals webdataset's
    base_plus_ext, and _wds_skip its two meta-name rules."""
    from webdataset import tariterators as T

    skip_meta = inspect.signature(T.tar_file_iterator).parameters["skip_meta"].default

    def wds_skip(fname):
        if "/" not in fname and fname.startswith(T.meta_prefix) and fname.endswith(T.meta_suffix):
            return True
        return skip_meta is not None and re.match(skip_meta, fname) is not None

    n = 0
    for k in range(1, 7):
        for chars in itertools.product("a._/\n", repeat=k):
            name = "".join(chars)
            key, ext = T.base_plus_ext(name)
            want = None if key is None else (key, ext)
            assert _C._wds_split(name) == want, repr(name)
            assert _C._wds_skip(name) == wds_skip(name), repr(name)
            n += 1
    assert n == sum(5 ** k for k in range(1, 7))
    for name in ("____", "__a__/b.jpg", "__a__b.jpg", "x/__a__/b.jpg", "__a__\n", LONG + ".jpg"):
        assert _C._wds_skip(name) == wds_skip(name), repr(name)

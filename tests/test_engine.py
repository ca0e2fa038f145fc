"""The C worker pool (_C.Engine) and batch buffers (_C.Buffer, _C.stack) on their own."""
import gc
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time

import numpy as np
import pytest

from fastloader import _C

torch = pytest.importorskip("torch")


def test_engine_runs_jobs_in_worker_threads_and_returns_results_by_seq():
    seen = []

    def fetch(wid, payload):
        seen.append((threading.get_ident(), wid))
        return payload * 2

    eng = _C.Engine(3, fetch)
    try:
        for seq in range(20):
            eng.submit(seq, seq)
        out = [eng.wait(seq) for seq in range(20)]
    finally:
        eng.close()
    assert [r[0] for r in out] == list(range(20))
    assert [r[2] for r in out] == [2 * s for s in range(20)]
    assert all(0 <= r[1] < 3 for r in out)
    assert threading.get_ident() not in {t for t, _ in seen}


def test_engine_pinned_jobs_run_on_their_worker():
    def fetch(wid, payload):
        return wid

    eng = _C.Engine(4, fetch)
    try:
        for seq in range(16):
            eng.submit(seq, None, seq % 4)
        got = [eng.wait(seq)[2] for seq in range(16)]
    finally:
        eng.close()
    assert got == [s % 4 for s in range(16)]


def test_engine_wait_times_out_and_unknown_seq_is_an_error():
    ev = threading.Event()

    def fetch(wid, payload):
        ev.wait(5)
        return payload

    eng = _C.Engine(1, fetch)
    try:
        eng.submit(0, "x")
        t0 = time.perf_counter()
        assert eng.wait(0, 0.2) is None
        assert time.perf_counter() - t0 < 2
        with pytest.raises(LookupError):
            eng.wait(99, 0.1)
        ev.set()
        assert eng.wait(0)[2] == "x"
    finally:
        ev.set()
        eng.close()


def test_engine_reset_drops_old_generation_and_close_is_idempotent():
    gate = threading.Event()

    def fetch(wid, payload):
        gate.wait(5)
        return payload

    eng = _C.Engine(1, fetch)
    for seq in range(5):
        eng.submit(seq, [seq])
    eng.reset()
    gate.set()
    eng.submit(0, ["new"])
    assert eng.wait(0)[2] == ["new"]
    eng.close()
    eng.close()
    assert eng.closed
    with pytest.raises(RuntimeError):
        eng.submit(1, None)


def test_engine_init_and_finish_run_once_per_thread():
    inits, finishes = [], []
    eng = _C.Engine(3, lambda w, p: p, lambda w: inits.append((w, threading.get_ident())),
                    lambda w: finishes.append((w, threading.get_ident())))
    eng.submit(0, 1)
    eng.wait(0)
    eng.close()
    assert sorted(w for w, _ in inits) == [0, 1, 2]
    assert sorted(inits) == sorted(finishes)


def test_engine_exception_escaping_fetch_is_returned_not_lost():
    def fetch(wid, payload):
        raise KeyError(payload)

    eng = _C.Engine(1, fetch)
    try:
        eng.submit(0, "k")
        status, exc = eng.wait(0)[2]
    finally:
        eng.close()
    assert status == 1 and isinstance(exc, KeyError) and exc.__traceback__ is not None


def test_stack_matches_torch_stack_for_dtypes_and_strides():
    for dt in (torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool, torch.float16, torch.bfloat16,
               torch.int16, torch.complex64):
        xs = [((torch.arange(12) + i) % 3).to(dt).reshape(3, 4) for i in range(5)]
        xs[1] = xs[1].t().contiguous().t()  # non-contiguous view
        got = torch.from_dlpack(_C.stack(xs))
        assert got.dtype == dt
        assert torch.equal(got, torch.stack(xs))
    arrs = [np.arange(24, dtype=np.float64).reshape(2, 3, 4)[:, ::2, ::-1] + i for i in range(3)]
    assert np.array_equal(np.from_dlpack(_C.stack(arrs)), np.stack(arrs))


def test_stack_declines_what_it_cannot_do_natively():
    assert _C.stack([np.zeros(3), np.zeros(4)]) is None            # shape mismatch -> torch's error
    assert _C.stack([np.zeros(3), np.zeros(3, np.float32)]) is None  # dtype mismatch -> torch promotes
    assert _C.stack([torch.zeros(2, requires_grad=True)] * 2) is None
    assert _C.stack([np.zeros(2, dtype=">f4")] * 2) is None         # big-endian


def test_buffer_lives_until_last_consumer_dies():
    buf = _C.empty_buffer(1 << 20)
    t = torch.from_dlpack(buf)
    a = np.from_dlpack(buf)
    base = sys.getrefcount(buf)
    del buf
    gc.collect()
    t += 7
    assert int(a[123]) == 7 and int(t.sum()) == 7 * (1 << 20)
    del t
    assert int(a.sum()) == 7 * (1 << 20)
    assert base >= 2


def test_buffer_refcount_returns_to_baseline_after_exports():
    buf = _C.empty_buffer(64)
    before = sys.getrefcount(buf)
    for _ in range(100):
        t = torch.from_dlpack(buf)
        del t
        cap = buf.__dlpack__()  # never consumed: its destructor must release the ref
        del cap
        cap = buf.__dlpack__(max_version=(1, 0))
        del cap
    assert sys.getrefcount(buf) == before


def test_buffer_dlpack_device_and_errors():
    buf = _C.empty_buffer(8)
    assert buf.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError):
        buf.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        buf.__dlpack__(copy=True)


def test_close_from_another_thread_while_waiting_raises_instead_of_crashing():
    gate = threading.Event()

    def fetch(wid, payload):
        gate.wait(0.05)
        return payload

    for _ in range(10):
        eng = _C.Engine(2, fetch)
        for seq in range(50):
            eng.submit(seq, seq)
        errors = []

        def waiter():
            try:
                eng.wait(49)
            except RuntimeError as e:
                errors.append(str(e))

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.02)
        eng.close()
        t.join(5)
        assert not t.is_alive()
        assert errors == [] or "closed" in errors[0]


def test_stack_of_empty_non_compact_tensors_matches_torch():
    # e.g. boxes[:, :4] of an image without annotations: shape (0, 4), strides (5, 1)
    items = [torch.zeros(0, 5)[:, :4], torch.zeros(0, 5)[:, :4]]
    got = _C.stack(items)
    assert got is not None
    out = torch.from_dlpack(got)
    assert out.shape == (2, 0, 4) and torch.equal(out, torch.stack(items))
    t = [torch.zeros(3, 0).t(), torch.zeros(3, 0).t()]
    assert torch.equal(torch.from_dlpack(_C.stack(t)), torch.stack(t))


def test_close_with_a_straggler_releases_queued_payloads():
    import weakref

    release = threading.Event()

    class Payload:
        pass

    def fetch(wid, payload):
        release.wait(5)  # a dataset call that does not return in time
        return None

    eng = _C.Engine(1, fetch)
    refs = []
    for seq in range(5):
        p = Payload()
        refs.append(weakref.ref(p))
        eng.submit(seq, p)
    del p
    time.sleep(0.05)  # the worker is now stuck on job 0
    assert eng.close(0.1) is False  # not every thread could be joined
    gc.collect()
    assert sum(r() is not None for r in refs[1:]) == 0  # queued payloads were freed
    release.set()
    deadline = time.time() + 5
    while refs[0]() is not None and time.time() < deadline:  # the straggler frees its own when done
        time.sleep(0.02)
        gc.collect()
    assert refs[0]() is None


def _run_python(code, preload=None):
    """Run `code` in a fresh interpreter that imports this tree's fastloader
    (a crash there must fail the test, not end the test run), with `preload`
    after any sanitizer runtime already preloaded.  torch is kept out (the
    code does not need it), which makes the start quick, under a sanitizer
    too."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    if preload:
        env["LD_PRELOAD"] = " ".join(p for p in [os.environ.get("LD_PRELOAD", ""), preload] if p)
    code = 'import sys\nsys.modules["torch"] = None\n' + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_engine_collected_in_a_cycle_joins_its_workers_before_the_cycle_is_cleared():
    # finish -> finish.__dict__ -> engine -> finish: only the GC frees it.  The
    # collector clears the cycle's objects one by one; joining the workers
    # from tp_clear ran `finish` (thread exit) after the function had been
    # cleared, and calling a cleared function crashes.  Joined from
    # tp_finalize, which runs before anything is cleared, finish works.
    proc = _run_python("""
        import gc
        from fastloader import _C
        calls = []
        def fetch(wid, payload):
            return payload
        def finish(wid):
            calls.append(wid)  # a global: needs finish's globals intact
        eng = _C.Engine(2, fetch, None, finish)
        finish.engine = eng
        eng.submit(0, 7)
        assert eng.wait(0)[2] == 7
        del eng, finish
        gc.collect()
        print(sorted(calls))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["[0,", "1]"]


def test_worker_keeps_one_thread_state_when_an_allocation_at_start_fails(tmp_path):
    # tests/fakealloc/worker_calloc.c fails the extension's small callocs on
    # worker threads.  A worker whose per-thread state could not be allocated
    # used to fall back to a fresh Python thread state per job, so what init
    # set in its thread-locals (get_worker_info()) was gone in every job.  The
    # states are now allocated before the threads start.  (Under a sanitizer
    # its own calloc comes first and the stand-in is not used.)
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if not shutil.which(cc):
        cc = "cc"
    shim = str(tmp_path / "libworkercalloc.so")
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", shim, os.path.join(here, "fakealloc", "worker_calloc.c")],
                   check=True)
    proc = _run_python("""
        import fastloader
        class DS:
            def __len__(self):
                return 8
            def __getitem__(self, i):
                info = fastloader.get_worker_info()
                return -1 if info is None else info.id
        ids = [int(x) for b in fastloader.DataLoader(DS(), batch_size=2, num_workers=2) for x in b]
        assert len(ids) == 8 and set(ids) <= {0, 1}, ids  # every sample saw its worker's info
        print("ok")
    """, preload=shim)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ok"]


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux scheduling controls and two CPUs")
def test_native_wait_survives_a_close_that_leaves_workers_behind(tmp_path):
    # A waiter takes its finished batch without the GIL, then waits for the
    # GIL; meanwhile close(0) on another thread leaves a worker busy decoding
    # a huge image behind and drops the engine's ctx.  wait() used ctx for
    # the batch it already had: a NULL dereference.  The waiter runs at
    # SCHED_IDLE on a CPU a decoding worker keeps busy, so it gets the GIL
    # only after close() returned.  (Repeated because the scheduler may still
    # let it in first.)  The worker left behind used to be blocked on a FIFO,
    # which reproduced the crash every time; FIFOs are now refused without
    # being opened for reading, and with a long decode in its place this
    # checks the outcome (the batch, or "closed") but no longer reproduces
    # the crash on the unfixed code.
    proc = _run_python(f"""
        import ctypes, os, sys, threading, time
        import numpy as np
        from PIL import Image
        from fastloader import _C
        from fastloader import transforms as FT
        from fastloader.datasets import NativeImageDataset

        d = {str(tmp_path)!r}
        large, huge = os.path.join(d, "large.jpg"), os.path.join(d, "huge.jpg")
        rng = np.random.default_rng(0)
        Image.fromarray(rng.integers(0, 255, (1000, 1000, 3), dtype=np.uint8)).save(large)
        Image.fromarray(rng.integers(0, 255, (5000, 6000, 3), dtype=np.uint8)).save(huge, quality=95)
        cpu0, cpu1 = sorted(os.sched_getaffinity(0))[:2]
        tf = FT.Compose([FT.Resize((8, 8)), FT.ToTensor()])
        sys.setswitchinterval(5.0)          # a thread waiting for the GIL asks for it after 5 s only
        usleep = ctypes.PyDLL(None).usleep  # PyDLL: the call keeps the GIL
        for i in range(5):
            os.sched_setaffinity(0, {{cpu1}})
            hog = _C.NativeEngine(1, NativeImageDataset([(large, 0)], transform=tf)._native)  # worker on cpu1
            os.sched_setaffinity(0, {{cpu0}})
            ds = NativeImageDataset([(large, 0), (huge, 1)], transform=tf)
            eng = _C.NativeEngine(2, ds._native)
            eng.submit(0, [0] * 60, 0, 0)   # job 0: 60 decodes of ~6 ms, so the waiter waits for it
            out = []
            def waiter():
                os.sched_setaffinity(0, {{cpu1}})
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
                try:
                    out.append(eng.wait(0)[0])
                except RuntimeError as e:
                    out.append(str(e))
            t = threading.Thread(target=waiter)
            t.start()
            time.sleep(0.05)                   # the waiter is in wait(), without the GIL
            usleep(1500000)                    # job 0 is done; the waiter waits for the GIL we hold
            eng.submit(1, [1], 0, 0)           # a worker starts the huge decode (~0.2 s): not joined in time
            usleep(20000)
            hog.submit(0, [0] * 1000, 0, 0)    # keep cpu1 busy: the waiter stays off it
            assert eng.close(0) is False       # the huge decode is left behind
            hog.close(None)
            t.join()
            assert out == [0] or "closed" in out[0], out
        print("ok")
    """)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.split() == ["ok"]


def test_native_submit_checks_the_engine_after_reading_the_indices(tmp_path):
    # An index's __index__ runs Python, which may close the engine: submit
    # then went on with no engine and no dataset (a NULL dereference).
    from PIL import Image
    from fastloader import transforms as FT
    from fastloader.datasets import NativeImageDataset

    p = str(tmp_path / "x.jpg")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(p)
    ds = NativeImageDataset([(p, 0)], transform=FT.Compose([FT.Resize((4, 4)), FT.ToTensor()]))
    eng = _C.NativeEngine(1, ds._native)

    class ClosesTheEngine:
        def __index__(self):
            eng.close()
            return 0

    with pytest.raises(RuntimeError, match="closed"):
        eng.submit(0, [ClosesTheEngine()], 0, 0)
    assert eng.closed


def _engine_of_kind(kind, tmp_path, post=None):
    """(engine, submit(seq)) for one engine of each kind over a one-image
    native dataset or a Python fetch."""
    if kind == "python":
        eng = _C.Engine(2, lambda wid, payload: payload * 2)
        return eng, lambda seq: eng.submit(seq, seq)
    from PIL import Image
    from fastloader import transforms as FT
    from fastloader.datasets import NativeImageDataset

    p = str(tmp_path / "x.jpg")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(p)
    ds = NativeImageDataset([(p, 0)], transform=FT.Compose([FT.Resize((4, 4)), FT.ToTensor()]))
    eng = _C.NativeEngine(2, ds._native, post=post, post_always=post is not None)
    return eng, lambda seq: eng.submit(seq, [0], 0, 0)


@pytest.mark.parametrize("kind", ["python", "native"])
def test_both_engine_kinds_share_one_binding(kind, tmp_path):
    # Engine and NativeEngine used to be two copies that drifted: close()
    # took a timeout in one only, reset kept the GIL in one only, and only
    # Engine had weakrefs, num_workers, outstanding and consumer_gil_wait.
    # Both are now the one _EngineBase with a thin kind on top.
    import weakref

    eng, submit = _engine_of_kind(kind, tmp_path)
    assert isinstance(eng, _C._EngineBase)
    assert gc.is_tracked(eng)
    ref = weakref.ref(eng)
    assert eng.num_workers == 2 and not eng.closed
    submit(0)
    seq, wid, result = eng.wait(0, timeout=10)
    assert seq == 0 and 0 <= wid < 2 and result is not None
    assert eng.outstanding() == 0
    stats = eng.worker_stats()
    assert len(stats) == 2 and sum(w["jobs"] for w in stats) == 1 and all("busy_s" in w for w in stats)
    assert eng.consumer_gil_wait()[1] >= 1  # wait() measured taking the GIL back
    assert isinstance(eng.reset(), int)
    assert eng.set_active(1) == 1
    assert eng.close(timeout=None) is True  # every worker joined, no time limit
    assert eng.closed and eng.close(1.0) is True  # closing again changes nothing
    assert len(eng.worker_stats()) == 2  # still answers, with what it can
    for call in (lambda: eng.wait(0), eng.reset, eng.outstanding, lambda: eng.set_active(1), lambda: submit(1)):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    del eng, submit, call  # the lambdas hold it too
    assert ref() is None


def test_native_engine_in_a_reference_cycle_is_collected_and_joined(tmp_path):
    # post -> holder -> engine -> post: only the garbage collector frees it,
    # and it must join the workers (the autouse fixture checks none outlives
    # the test) and let go of the engine (the weak reference dies).
    import weakref

    holder = {}

    def post(batch, epoch, seed, seq, worker, native_s):
        return ("post", seq, holder["engine"].num_workers)

    eng, submit = _engine_of_kind("native", tmp_path, post=post)
    holder["engine"] = eng
    submit(0)
    assert eng.wait(0, timeout=10)[2] == ("post", 0, 2)
    ref = weakref.ref(eng)
    del eng, submit, holder, post
    gc.collect()
    assert ref() is None

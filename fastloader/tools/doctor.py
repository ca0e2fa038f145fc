"""``python -m fastloader doctor``: what limits data loading on this machine
(``doctor DATASET_SCRIPT``: which path a dataset should take, doctor_dataset.py).

Every check reads what the kernel / runtime says (CPU affinity, cgroup quotas,
/proc, /sys, rlimits, the CUDA runtime) and prints one line per finding with
what it means and what to do about it, then a recommended DataLoader
configuration.  ``--json`` prints the same as one JSON object.

Nothing here needs the compiled extension: if ``fastloader._C`` cannot be
imported, that is reported as a finding instead of a crash.
"""
from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import sys
import sysconfig

from ..sysinfo import (affinity_cpus, cgroup_dirs, cpu_quota, meminfo, memory_limit,  # noqa: F401 - doctor's API
                       parse_cpulist, read_text, usable_cpus)

__all__ = ["collect", "recommend", "render", "main"]

_GiB = 1024 ** 3
_MiB = 1024 ** 2
# what the memory prediction assumes unless told: an ImageNet training batch
DEFAULT_SETTINGS = {"batch_size": 64, "prefetch_factor": 2, "sample_bytes": 3 * 224 * 224 * 4,
                    "worker_mode": "thread", "worker_mib": None}


# ----------------------------------------------------------------------------
# small readers


def _fmt_bytes(n):
    if n is None:
        return "unlimited"
    if n >= _GiB:
        return f"{n / _GiB:.1f} GiB"
    if n >= _MiB:
        return f"{n / _MiB:.0f} MiB"
    return f"{n / 1024:.0f} KiB"


# ----------------------------------------------------------------------------
# checks


def check_cpus():
    aff = affinity_cpus()
    quota, src = cpu_quota()
    usable = usable_cpus(aff, quota)
    return {"usable_cpus": usable, "affinity_cpus": len(aff), "affinity": aff,
            "online_cpus": os.cpu_count(), "cgroup_cpu_quota": quota, "cgroup_cpu_source": src}


def check_memory():
    lim, src = memory_limit()
    mi = meminfo()
    total = mi.get("MemTotal")
    eff = min(v for v in (lim, total) if v is not None) if (lim or total) else None
    return {"limit_bytes": eff, "cgroup_limit_bytes": lim, "cgroup_source": src,
            "mem_total_bytes": total, "mem_available_bytes": mi.get("MemAvailable"),
            "source": src or ("/proc/meminfo MemTotal" if total else None)}


def check_shm():
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return {"present": False, "size_bytes": None, "free_bytes": None}
    return {"present": True, "size_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}


def check_memlock():
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (AttributeError, OSError, ValueError):  # pragma: no cover
        return {"soft_bytes": None, "hard_bytes": None, "known": False}

    def conv(v):
        return None if v == resource.RLIM_INFINITY else int(v)

    return {"soft_bytes": conv(soft), "hard_bytes": conv(hard), "known": True}


def check_numa():
    base = "/sys/devices/system/node"
    nodes = []
    try:
        names = sorted((n for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit()),
                       key=lambda n: int(n[4:]))
    except OSError:
        names = []
    for n in names:
        cpus = parse_cpulist(read_text(os.path.join(base, n, "cpulist")))
        nodes.append({"node": int(n[4:]), "cpus": cpus})
    aff = set(affinity_cpus())
    used = [nd["node"] for nd in nodes if aff & set(nd["cpus"])]
    return {"nodes": len(nodes) or None, "node_cpus": nodes, "nodes_in_affinity": used}


def _driver_version():
    """CUDA driver version (e.g. 12040) from libcuda, or None; never raises."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            v = ctypes.c_int(0)
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value > 0:
                return v.value
        except Exception:
            pass
        return None
    return None


def _cuda_ver(v):
    if not v:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


def check_build_and_cuda():
    """fastloader.build_info() (CUDA probe, libjpeg-turbo), or the import error."""
    try:
        import fastloader

        info = fastloader.build_info()
        err = None
    except Exception as e:  # the extension is not built / cannot load
        info, err = {}, f"{type(e).__name__}: {e}"
    cuda = dict(info.get("cuda") or {})
    if "driver_version" not in cuda:
        cuda["driver_version"] = _driver_version()
    cuda.setdefault("found", False)
    cuda.setdefault("devices", 0)
    cuda.setdefault("error", None if info else "fastloader could not be imported, CUDA not probed")
    return info, err, cuda


def _cpu_flags():
    flags, features = set(), set()
    for line in (read_text("/proc/cpuinfo") or "").splitlines():
        k, _, v = line.partition(":")
        k = k.strip().lower()
        if k == "flags":
            flags.update(v.split())
        elif k == "features":  # arm
            features.update(v.split())
    return flags | features


def check_jpeg(info):
    machine = platform.machine().lower()
    flags = _cpu_flags()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        if "avx2" in flags:
            simd = "AVX2"
        elif "sse2" in flags:
            simd = "SSE2"
        else:
            simd = None
    elif machine in ("aarch64", "arm64") or machine.startswith("arm"):
        simd = "NEON" if ({"asimd", "neon"} & flags or machine in ("aarch64", "arm64")) else None
    else:
        simd = None
    return {"libjpeg_turbo": info.get("libjpeg_turbo"), "jpeg_lib_version": info.get("jpeg_lib_version"),
            "machine": machine, "simd": simd,
            "cpu_flags": sorted(f for f in flags if f in ("sse2", "avx2", "avx512f", "asimd", "neon"))}


def check_python():
    ft_build = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    return {"version": platform.python_version(), "implementation": platform.python_implementation(),
            "executable": sys.executable, "free_threaded_build": ft_build, "gil_enabled": bool(gil)}


def check_world():
    raw = os.environ.get("LOCAL_WORLD_SIZE")
    try:
        lws = int(raw) if raw else None
        if lws is not None and lws < 1:
            lws = None
    except ValueError:
        lws = None
    return {"local_world_size": lws, "raw": raw}


# ----------------------------------------------------------------------------
# the traps: thread oversubscription, the memory of the user's settings, a cold page cache

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _torch_threads():
    """torch.get_num_threads(), or None without torch (never raises)."""
    try:
        import torch

        return int(torch.get_num_threads())
    except Exception:
        return None


def check_threads(usable, workers, env=None, torch_threads=None):
    """The thread pools that share the usable CPUs: torch's intra-op pool
    (sized by OMP_NUM_THREADS / torch.set_num_threads, else the CPUs the
    machine has), the BLAS pools numpy and torch call (MKL_NUM_THREADS,
    OPENBLAS_NUM_THREADS) and the loader's worker threads.  ``env`` and
    ``torch_threads`` default to this process's."""
    env = os.environ if env is None else env
    raw = {k: env.get(k) for k in THREAD_VARS}
    vals = {}
    for k, v in raw.items():
        try:
            vals[k] = int(v) if v not in (None, "") else None
        except ValueError:
            vals[k] = None
    t = _torch_threads() if torch_threads is None else torch_threads
    return {"env": raw, "env_threads": vals, "torch_threads": t, "usable_cpus": usable, "loader_workers": workers,
            "online_cpus": os.cpu_count()}


def thread_fix(usable, workers):
    """Threads the training loop's own pools should use so that they and the
    loader's worker threads fit the usable CPUs (at least 1)."""
    return max(1, usable - workers)


def check_settings_memory(settings, limit_bytes, base_mib=None):
    """Predicted peak host memory of a training process with these DataLoader
    settings: what the process holds now (``base_mib``, default its RSS: the
    interpreter, torch, fastloader) + the batches in flight (batch_size x
    sample_bytes x (prefetch_factor x num_workers + 2)) + for worker processes
    one base each (``worker_mib`` overrides it).  The same line tune fits,
    with slope 1 (fastloader/tools/tuning/memory.py)."""
    from .tuning.memory import predict_peak_mib

    if base_mib is None:
        try:
            with open("/proc/self/status") as f:
                base_mib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024.0
        except (OSError, StopIteration, ValueError):
            base_mib = 0.0
    s = settings
    procs = s.get("worker_mode") == "process"
    peak = predict_peak_mib(base_mib, s["sample_bytes"], s["batch_size"], s["num_workers"], s["prefetch_factor"],
                            process_workers=procs, per_process_mib=s.get("worker_mib"))
    return {"settings": dict(s), "base_mib": base_mib, "batch_mib": s["batch_size"] * s["sample_bytes"] / _MiB,
            "predicted_mib": peak, "limit_bytes": limit_bytes,
            "share": (peak * _MiB / limit_bytes) if limit_bytes else None}


def page_cache_verdict(first_s, second_s, nbytes):
    """'cold' when the first read of the files took over twice as long as the
    second (and long enough to matter: 20 ms), else 'warm'."""
    if second_s <= 0 or first_s <= 0:
        return "warm"
    return "cold" if first_s > 2.0 * second_s and first_s - second_s > 0.02 else "warm"


def check_page_cache(root, n=64, max_bytes=64 * _MiB, seed=0, read=None):
    """Read up to ``n`` files (at most ``max_bytes``) picked at random under
    ``root`` and time it: the first pass comes from storage for the files not
    in the page cache, the passes after it (the fastest of three) from memory.  ``read(path)``
    (default: read the whole file) is injectable for tests."""
    import random
    import time

    files, total, seen = [], 0, 0
    for dp, dns, fns in os.walk(root):
        dns.sort()
        for fn in sorted(fns):
            p = os.path.join(dp, fn)
            try:
                sz = os.path.getsize(p)
            except OSError:
                continue
            files.append((p, sz))
            total += sz
            seen += 1
        if seen >= 200000:
            break
    if not files:
        return {"root": root, "files": 0, "error": "no files"}

    def _read(p):
        with open(p, "rb") as f:
            while f.read(1 << 20):
                pass

    read = read or _read
    rng = random.Random(seed)
    pick, nbytes = [], 0
    for p, sz in rng.sample(files, min(n, len(files))):
        if pick and nbytes + sz > max_bytes:
            break
        pick.append(p)
        nbytes += sz
    times = []
    for _ in range(4):  # the first pass, then the best of three from the cache (the machine may be busy)
        t0 = time.perf_counter()
        for p in pick:
            read(p)
        times.append(time.perf_counter() - t0)
    times = [times[0], min(times[1:])]
    return {"root": root, "files": len(pick), "bytes": nbytes, "first_s": times[0], "second_s": times[1],
            "first_mb_s": nbytes / 1e6 / times[0] if times[0] > 0 else None,
            "second_mb_s": nbytes / 1e6 / times[1] if times[1] > 0 else None,
            "verdict": page_cache_verdict(times[0], times[1], nbytes),
            "dataset_files": len(files), "dataset_bytes": total, "walk_capped": seen >= 200000}


def trap_findings(rep):
    """The findings of the three traps (threads, settings memory, page cache)."""
    out = []
    add = lambda *a: out.append(list(a))  # noqa: E731
    th = rep.get("threads")
    if th:
        u, w, t = th["usable_cpus"], th["loader_workers"], th["torch_threads"]
        k = thread_fix(u, w)
        fix = (f"Fix: export OMP_NUM_THREADS={k} MKL_NUM_THREADS={k} OPENBLAS_NUM_THREADS={k} before starting "
               f"Python (or torch.set_num_threads({k}) first thing in the script).")
        env = th["env_threads"]
        parts = [f"torch intra-op {t if t is not None else 'n/a (no torch)'}"]
        parts += [f"{name}={th['env'][name]}" for name in THREAD_VARS if th["env"][name] not in (None, "")]
        parts.append(f"{w} loader worker thread(s), {u} usable CPUs")
        val = ", ".join(parts)
        too_many = [name for name in THREAD_VARS if env[name] is not None and env[name] > u]
        if (t is not None and t > u) or too_many:
            what = []
            if t is not None and t > u:
                what.append(f"torch's intra-op pool has {t} threads for {u} usable CPUs (it counts the "
                            f"{th['online_cpus']} CPUs the machine shows, not the affinity or cgroup quota)")
            if too_many:
                what.append(", ".join(f"{n}={env[n]}" for n in too_many) + f" is more than the {u} usable CPUs")
            add("warn", "thread oversubscription", val,
                "; ".join(what) + f". With {w} loader worker thread(s) as well, threads wait for each other and "
                "the model step slows down. " + fix)
        elif t is not None and t + w > u:
            add("note", "thread oversubscription", val,
                f"torch's {t} intra-op threads plus {w} loader worker thread(s) are more than the {u} usable CPUs: "
                "a model step that runs on the CPU competes with loading (on a GPU the intra-op pool is mostly "
                "idle and this matters little). " + fix + " A Python dataset calling numpy/BLAS in its "
                "__getitem__ runs that pool in every worker thread: OPENBLAS_NUM_THREADS=1 there.")
        else:
            add("ok", "thread oversubscription", val,
                "The training loop's thread pools and the loader's workers fit the usable CPUs.")
    sm = rep.get("settings_memory")
    if sm:
        s = sm["settings"]
        lim = sm["limit_bytes"]
        pk = sm["predicted_mib"] * _MiB
        inflight = s["batch_size"] * s["sample_bytes"]
        from .tuning.memory import inflight_batches

        nb = inflight_batches(s["num_workers"], s["prefetch_factor"])
        inflight_note = (f"{nb} batches in flight x {_fmt_bytes(inflight)} (batch_size {s['batch_size']} x "
                         f"{_fmt_bytes(s['sample_bytes'])} per sample)")
        val = (f"{_fmt_bytes(pk)} for batch_size={s['batch_size']}, num_workers={s['num_workers']}, "
               f"prefetch_factor={s['prefetch_factor']}" + (", worker processes" if s.get("worker_mode") == "process"
                                                            else "") + f" (limit {_fmt_bytes(lim)})")
        adv = (f"= this process now ({sm['base_mib']:.0f} MiB: Python, torch, fastloader) + {inflight_note}"
               + (f" + {s['num_workers']} worker processes" if s.get("worker_mode") == "process" else "")
               + ". Your model, optimizer and other data come on top. ")
        if lim and pk > 0.8 * lim:
            add("warn", "predicted peak memory", val, adv + "That is over 80% of the limit: lower prefetch_factor or "
                "num_workers (or batch_size) before the kernel's OOM killer ends the run; `python -m fastloader "
                "tune` measures it.")
        else:
            add("ok", "predicted peak memory", val, adv + "Well under the limit. `python -m fastloader tune` "
                "measures the real peak for your dataset.")
    pc = rep.get("page_cache")
    if pc:
        if pc.get("error"):
            add("note", "page cache", f"{pc['root']}: {pc['error']}", "Nothing to read there.")
        else:
            val = (f"{pc['files']} files ({_fmt_bytes(pc['bytes'])}) read twice: {pc['first_mb_s']:.0f} MB/s, "
                   f"then {pc['second_mb_s']:.0f} MB/s")
            big = ""
            avail = rep.get("memory", {}).get("mem_available_bytes")
            if avail and pc["dataset_bytes"] > avail:
                big = (f" The data set ({_fmt_bytes(pc['dataset_bytes'])}) is larger than the memory available "
                       f"({_fmt_bytes(avail)}): every epoch, not only the first, reads from storage.")
            if pc["verdict"] == "cold":
                add("warn", "cold page cache", val,
                    f"The first read was {pc['first_s'] / pc['second_s']:.1f}x slower than the second: files not "
                    "yet in the page cache come from storage, so the first epoch will be slower than the next ones "
                    "(and a benchmark's first configuration looks worse than it is). Warm the cache before timing "
                    "(cat the files > /dev/null, or vmtouch -t), or keep the data on local SSD." + big)
            else:
                add("ok", "page cache", val,
                    "These files were already in the page cache (both reads at memory speed): the first epoch "
                    "reads like the later ones." + big)
    return out


# ----------------------------------------------------------------------------
# assembling


def recommend(usable_cpus, cuda_devices, local_world_size=None):
    """The DataLoader settings doctor recommends, as a dict.

    num_workers: one CPU is left for the training loop itself and the rest is
    shared among the ranks on this machine (LOCAL_WORLD_SIZE), at least 1.
    """
    ranks = max(1, local_world_size or 1)
    nw = max(1, (usable_cpus - 1) // ranks)
    return {"num_workers": nw, "pin_memory": bool(cuda_devices), "prefetch_factor": 2,
            "per_ranks": ranks}


def collect(settings=None, data=None):
    """Run every check; return the JSON-able report.  ``settings`` (dict:
    batch_size, num_workers, prefetch_factor, sample_bytes, worker_mode,
    worker_mib) are the DataLoader settings whose memory is predicted
    (default: the recommended ones, batch 64 of 3x224x224 float32); ``data``
    a folder whose page-cache state is measured."""
    info, import_error, cuda = check_build_and_cuda()
    cpus = check_cpus()
    world = check_world()
    rep = {
        "fastloader": info.get("fastloader"),
        "import_error": import_error,
        "cpus": cpus,
        "usable_cpus": cpus["usable_cpus"],
        "memory": check_memory(),
        "shm": check_shm(),
        "memlock": check_memlock(),
        "numa": check_numa(),
        "cuda": cuda,
        "jpeg": check_jpeg(info),
        "python": check_python(),
        "local_world_size": world["local_world_size"],
    }
    rep["recommended"] = recommend(cpus["usable_cpus"], cuda.get("devices") or 0, world["local_world_size"])
    st = dict(DEFAULT_SETTINGS, num_workers=rep["recommended"]["num_workers"])
    st.update({k: v for k, v in (settings or {}).items() if v is not None})
    rep["threads"] = check_threads(cpus["usable_cpus"], st["num_workers"])
    rep["settings_memory"] = check_settings_memory(st, rep["memory"]["limit_bytes"])
    rep["page_cache"] = check_page_cache(data) if data else None
    rep["findings"] = findings(rep)
    return rep


def findings(rep):
    """[(level, name, value, advice)] with level in ok/note/warn."""
    out = []
    add = lambda *a: out.append(list(a))  # noqa: E731

    c = rep["cpus"]
    val = f"{c['usable_cpus']}"
    extra = [f"affinity {c['affinity_cpus']} of {c['online_cpus']} online"]
    if c["cgroup_cpu_quota"] is not None:
        extra.append(f"cgroup quota {c['cgroup_cpu_quota']:.2f} CPUs")
    else:
        extra.append("no cgroup CPU quota")
    val += " (" + ", ".join(extra) + ")"
    lvl = "warn" if c["usable_cpus"] <= 2 else "ok"
    adv = ("Decoding and augmenting images is CPU work: loader workers and the training loop share these CPUs, "
           "so more workers than usable CPUs only adds contention.")
    if c["cgroup_cpu_quota"] is not None and c["cgroup_cpu_quota"] < c["affinity_cpus"]:
        adv += (" The container's CPU quota is below the CPUs it can see: os.cpu_count() overstates what you get; "
                "size num_workers from this number.")
    if c["usable_cpus"] <= 2:
        adv += " With this few CPUs loading will likely limit training; prefer lighter augmentation or pre-resized data."
    add(lvl, "usable CPUs", val, adv)

    m = rep["memory"]
    if m["limit_bytes"] is not None:
        val = _fmt_bytes(m["limit_bytes"]) + (f" (cgroup limit; host has {_fmt_bytes(m['mem_total_bytes'])})"
                                               if m["cgroup_limit_bytes"] else " (MemTotal, no cgroup limit)")
        if m["mem_available_bytes"]:
            val += f", {_fmt_bytes(m['mem_available_bytes'])} available"
        lvl = "warn" if m["limit_bytes"] < 8 * _GiB else "ok"
        add(lvl, "memory limit", val,
            "Batches in flight = num_workers x prefetch_factor x batch size; a 64x3x224x224 float32 batch is 37 MiB. "
            "torch's worker processes each hold a copy of the Python heap they touch (copy-on-write), so with many "
            "workers and a Python-list dataset memory grows per worker; fastloader's worker threads share one copy. "
            "If you hit the limit, lower num_workers or prefetch_factor before batch size.")
    else:
        add("note", "memory limit", "unknown", "Could not read /proc/meminfo or a cgroup limit.")

    s = rep["shm"]
    if not s["present"]:
        add("warn", "/dev/shm", "missing",
            "torch.utils.data.DataLoader with num_workers > 0 passes every batch through shared memory and fails "
            "without it; fastloader's workers are threads and do not use /dev/shm.")
    else:
        small = s["size_bytes"] < 1 * _GiB
        add("warn" if small else "ok", "/dev/shm", f"{_fmt_bytes(s['size_bytes'])} ({_fmt_bytes(s['free_bytes'])} free)",
            ("torch's worker processes send batches through /dev/shm; below ~1 GiB they die with 'bus error' / "
             "'unable to write to file </torch_...>' (Docker's default is 64 MiB: run with --shm-size=8g or "
             "--ipc=host). fastloader's workers are threads and do not need /dev/shm.") if small else
            "Large enough for torch's worker processes (they pass batches through it); fastloader does not need it.")

    ml = rep["memlock"]
    if ml["known"]:
        soft = ml["soft_bytes"]
        low = soft is not None and soft < 64 * _MiB
        add("note" if low else "ok", "locked-memory limit (RLIMIT_MEMLOCK)",
            f"soft {_fmt_bytes(soft)}, hard {_fmt_bytes(ml['hard_bytes'])}",
            ("Page-locked memory for pin_memory=True comes from the CUDA driver (not limited by this on most "
             "systems), but mlock()-based pinning and RDMA (NCCL over InfiniBand, GPUDirect) are capped by it; "
             "raise it with 'ulimit -l unlimited' or docker --ulimit memlock=-1 if those fail.") if low else
            "No practical cap on pinned memory.")

    n = rep["numa"]
    if n["nodes"]:
        multi = n["nodes"] > 1
        add("note" if multi else "ok", "NUMA nodes",
            f"{n['nodes']} (this process may run on node(s) {n['nodes_in_affinity']})",
            ("Memory on another node is slower to reach; bind each rank and its loader to one node "
             "(numactl --cpunodebind=N --membind=N, or taskset); fastloader's worker threads inherit the "
             "process's CPU affinity.") if multi else "One node: nothing to tune.")
    else:
        add("note", "NUMA nodes", "unknown", "/sys/devices/system/node is not readable; nothing to tune.")

    cu = rep["cuda"]
    parts = []
    if cu.get("found"):
        parts.append(f"runtime {cu.get('library')}" + (f" {_cuda_ver(cu.get('runtime_version'))}"
                                                       if cu.get("runtime_version") else ""))
    else:
        parts.append("no CUDA runtime library found")
    parts.append(f"driver {_cuda_ver(cu.get('driver_version')) or 'not found'}")
    parts.append(f"{cu.get('devices') or 0} device(s)")
    if cu.get("error"):
        parts.append(f"error: {cu['error']}")
    if cu.get("devices"):
        add("ok", "CUDA", "; ".join(parts),
            "GPUs visible: use pin_memory=True so host-to-device copies are asynchronous, and keep the loader ahead "
            "of the GPU (check the consumer wait % with `python -m fastloader bench --step-ms <your step>`).")
    else:
        why = ("The runtime is there but no device is usable (see error): if you expected GPUs, check the driver "
               "(nvidia-smi) and CUDA_VISIBLE_DEVICES." if cu.get("found") else
               "Training runs on CPU here (or the GPU stack is not installed).")
        add("note", "CUDA", "; ".join(parts), why + " pin_memory=True has no effect without a device.")

    j = rep["jpeg"]
    if rep["import_error"]:
        add("warn", "fastloader", rep["import_error"],
            "The native extension could not be loaded; rebuild it (pip install -e . in the source tree).")
    simd = j["simd"]
    add("ok" if simd in ("AVX2", "NEON") else "note", "libjpeg-turbo",
        f"{j['libjpeg_turbo'] or 'unknown'}, SIMD: {simd or 'none detected'} ({j['machine']}; "
        f"cpu flags {', '.join(j['cpu_flags']) or 'none'})",
        "libjpeg-turbo picks its SIMD code at run time from these CPU flags; with AVX2 (x86) or NEON (ARM) it "
        "decodes several times faster than its plain-C code." + ("" if simd in ("AVX2", "NEON") else
                                          " Without them JPEG decoding is the bottleneck sooner; "
                                          "more workers or smaller source images help."))

    py = rep["python"]
    if py["free_threaded_build"]:
        val = f"{py['version']} free-threaded build, GIL {'enabled' if py['gil_enabled'] else 'disabled'}"
        adv = ("Python-level __getitem__/transforms run in parallel on fastloader's worker threads."
               if not py["gil_enabled"] else
               "The GIL was re-enabled (PYTHON_GIL=1 or an extension that needs it): Python-level dataset code "
               "on worker threads runs one at a time.")
    else:
        val = f"{py['version']} ({py['implementation']}, with GIL)"
        adv = ("fastloader's native ImageFolder/ImageList pipeline decodes and transforms without the GIL, so "
               "threads scale; a dataset whose __getitem__ is heavy Python code is serialized by the GIL on "
               "threads, so the default (worker_mode='auto') runs such a dataset in worker processes; a "
               "free-threaded Python (3.13t+) for such datasets; `python -m fastloader doctor DATASET_SCRIPT` "
               "measures which path a dataset should take.")
    add("ok", "Python", val, adv)

    lws = rep["local_world_size"]
    if lws:
        add("note", "LOCAL_WORLD_SIZE", str(lws),
            f"{lws} ranks on this machine share its {rep['usable_cpus']} usable CPUs; workers per rank are divided "
            "accordingly below.")
    else:
        add("ok", "LOCAL_WORLD_SIZE", "not set",
            "Single process per machine assumed; under torchrun each rank's share is divided by LOCAL_WORLD_SIZE.")
    out.extend(trap_findings(rep))
    return out


def _wrap(text, width, indent):
    import textwrap

    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent)


def render(rep, width=100):
    marks = {"ok": "[ok]  ", "note": "[note]", "warn": "[warn]"}
    lines = ["fastloader doctor: what limits data loading on this machine"
             + (f" (fastloader {rep['fastloader']})" if rep.get("fastloader") else ""), ""]
    for lvl, name, val, adv in rep["findings"]:
        lines.append(f"{marks[lvl]} {name}: {val}")
        lines.append(_wrap(adv, width, "         "))
    r = rep["recommended"]
    lines.append("")
    share = (f", shared among LOCAL_WORLD_SIZE={r['per_ranks']} ranks" if r["per_ranks"] > 1 else "")
    lines.append("Recommended DataLoader settings (fastloader.DataLoader or torch.utils.data.DataLoader):")
    lines.append(f"    num_workers={r['num_workers']:<6}  # usable CPUs ({rep['usable_cpus']}) - 1 for the training "
                 f"loop{share}, at least 1")
    lines.append(f"    pin_memory={str(r['pin_memory']):<7}  # " + ("CUDA devices present: async host-to-device copies"
                                                          if r["pin_memory"] else "no CUDA device: pinning only costs"))
    lines.append(f"    prefetch_factor={r['prefetch_factor']:<2}  # batches queued per worker; raise only if "
                 "batch times are very uneven")
    lines.append("With fastloader.DataLoader, num_workers='auto' starts with every usable CPU and parks the workers")
    lines.append("your training loop does not need (it settles within seconds; see stats()['num_workers_auto']).")
    lines.append("Measure before and after: python -m fastloader bench --workers 0,1,2,4 --step-ms <your model step>")
    lines.append("or search them for your own dataset and step: python -m fastloader tune --dataset mypkg.data:make "
                 "--step mypkg.train:step")
    return "\n".join(lines)


def add_arguments(p):
    from . import doctor_dataset

    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    g = p.add_argument_group("the settings whose peak memory is predicted (default: the recommended ones)")
    g.add_argument("--batch-size", type=int, default=None, help="default 64")
    g.add_argument("--num-workers", type=int, default=None, help="default: the recommended num_workers")
    g.add_argument("--prefetch-factor", type=int, default=None, help="default 2")
    g.add_argument("--sample-bytes", default=None, metavar="SIZE",
                   help="bytes of one collated sample, e.g. 588KiB (default 3x224x224 float32 = 588 KiB)")
    g.add_argument("--worker-processes", action="store_true",
                   help="the workers are processes (torch's DataLoader, worker_mode='process'): each holds its own "
                        "copy of the interpreter")
    g.add_argument("--worker-mib", type=float, default=None,
                   help="memory of one worker process in MiB (default: what this process holds)")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="also read a sample of the files under DIR twice, to see whether the first epoch will "
                        "wait for storage (cold page cache)")
    doctor_dataset.add_arguments(p)  # doctor DATASET_SCRIPT / --dataset mod:attr


def _settings_from_args(args):
    sb = getattr(args, "sample_bytes", None)
    if sb is not None:
        from .sizes import parse_size

        sb = parse_size(sb)
    return {"batch_size": getattr(args, "batch_size", None), "num_workers": getattr(args, "num_workers", None),
            "prefetch_factor": getattr(args, "prefetch_factor", None), "sample_bytes": sb,
            "worker_mode": "process" if getattr(args, "worker_processes", False) else None,
            "worker_mib": getattr(args, "worker_mib", None)}


def run(args) -> int:
    if getattr(args, "script", None) or getattr(args, "dataset", None):
        from . import doctor_dataset

        return doctor_dataset.run(args)
    rep = collect(_settings_from_args(args), getattr(args, "data", None))
    if args.json:
        print(json.dumps(rep, indent=1, default=str))
    else:
        print(render(rep))
    return 0


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m fastloader doctor", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

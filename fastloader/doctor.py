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

from .sysinfo import (_affinity, _cgroup_dirs, _meminfo, _parse_cpulist, _read,  # noqa: F401 - doctor's API
                      cpu_quota, memory_limit, usable_cpus)

__all__ = ["collect", "recommend", "render", "main"]

_GiB = 1024 ** 3
_MiB = 1024 ** 2


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
    aff = _affinity()
    quota, src = cpu_quota()
    usable = usable_cpus(aff, quota)
    return {"usable_cpus": usable, "affinity_cpus": len(aff), "affinity": aff,
            "online_cpus": os.cpu_count(), "cgroup_cpu_quota": quota, "cgroup_cpu_source": src}


def check_memory():
    lim, src = memory_limit()
    mi = _meminfo()
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
        cpus = _parse_cpulist(_read(os.path.join(base, n, "cpulist")))
        nodes.append({"node": int(n[4:]), "cpus": cpus})
    aff = set(_affinity())
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
    for line in (_read("/proc/cpuinfo") or "").splitlines():
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


def collect():
    """Run every check; return the JSON-able report."""
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
               "threads (fastloader warns when that happens) -- use worker_mode='process' (or 'auto') or a "
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
    return "\n".join(lines)


def add_arguments(p):
    from . import doctor_dataset

    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    doctor_dataset.add_arguments(p)  # doctor DATASET_SCRIPT / --dataset mod:attr


def run(args) -> int:
    if getattr(args, "script", None) or getattr(args, "dataset", None):
        from . import doctor_dataset

        return doctor_dataset.run(args)
    rep = collect()
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

"""What the kernel says about this process's machine: usable CPUs (affinity
and cgroup quota), the memory limit (cgroup or physical) and what is left of
it, idle CPU time.  Shared by the loader (num_workers="auto", max_memory,
the memory-pressure check, GIL detection) and by `doctor`.

Plain file reads of /proc and /sys; nothing here imports the extension.
"""
from __future__ import annotations

import math
import os

# Values at or above this are "no limit" in cgroup v1 (PAGE_COUNTER_MAX * page size).
_V1_UNLIMITED = 1 << 62


def read_text(path):
    """The stripped text of a /proc or /sys file, or None if it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def parse_cpulist(s):
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    out = []
    for part in (s or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


# ----------------------------------------------------------------------------
# cgroups


def cgroup_dirs(controller, cgroup_text=None, mountinfo_text=None):
    """Directories (deepest first) whose limit files apply to this process for
    ``controller`` ('cpu' or 'memory'), as [(version, dir)].

    Reads /proc/self/cgroup and /proc/self/mountinfo, so it works on the host,
    in containers with a cgroup namespace (path '/') and in containers that see
    the host's hierarchy.  The ancestors up to the mount point are included,
    since a parent's limit binds the child too.
    """
    text = read_text("/proc/self/cgroup") if cgroup_text is None else cgroup_text
    info = read_text("/proc/self/mountinfo") if mountinfo_text is None else mountinfo_text
    if not text or not info:
        return []
    v1_paths, v2_path = {}, None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            v2_path = path
        else:
            for c in ctrls.split(","):
                v1_paths[c] = path
    mounts = []  # (version, mount_root, mount_point, super options)
    for line in info.splitlines():
        left, _, right = line.partition(" - ")
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3:
            continue
        fstype = rf[0]
        if fstype == "cgroup2":
            mounts.append((2, lf[3], lf[4], set()))
        elif fstype == "cgroup":
            mounts.append((1, lf[3], lf[4], set(rf[2].split(","))))
    out = []

    def chain(version, mroot, mpoint, path):
        rel = path
        if mroot != "/" and (path == mroot or path.startswith(mroot.rstrip("/") + "/")):
            rel = path[len(mroot.rstrip("/")):] or "/"
        d = os.path.normpath(os.path.join(mpoint, rel.lstrip("/")))
        if not os.path.isdir(d):  # hierarchy not visible at that path: fall back to the mount point
            d = mpoint
        dirs = []
        while True:
            dirs.append((version, d))
            if os.path.normpath(d) == os.path.normpath(mpoint) or d in ("/", ""):
                break
            d = os.path.dirname(d)
        return dirs

    for version, mroot, mpoint, opts in mounts:
        if version == 1 and controller in opts and controller in v1_paths:
            out.extend(chain(1, mroot, mpoint, v1_paths[controller]))
        elif version == 2 and v2_path is not None:
            ctrl = read_text(os.path.join(mpoint, "cgroup.controllers")) or ""
            if controller in ctrl.split():
                out.extend(chain(2, mroot, mpoint, v2_path))
    return out


def cpu_quota(dirs=None):
    """The tightest cgroup CPU quota as (cpus: float, source: str), or (None, None).

    ``dirs`` ([(cgroup version, directory)]) defaults to this process's cgroups."""
    best = (None, None)
    for version, d in (cgroup_dirs("cpu") if dirs is None else dirs):
        q = None
        if version == 2:
            s = read_text(os.path.join(d, "cpu.max"))
            if s:
                parts = s.split()
                if parts[0] != "max" and len(parts) >= 2 and int(parts[1]) > 0:
                    q = int(parts[0]) / int(parts[1])
                    src = f"cgroup v2 {os.path.join(d, 'cpu.max')} = {s}"
        else:
            qs = read_text(os.path.join(d, "cpu.cfs_quota_us"))
            ps = read_text(os.path.join(d, "cpu.cfs_period_us"))
            if qs and ps and int(qs) > 0 and int(ps) > 0:
                q = int(qs) / int(ps)
                src = f"cgroup v1 {d}/cpu.cfs_quota_us = {qs} / cpu.cfs_period_us = {ps}"
        if q is not None and (best[0] is None or q < best[0]):
            best = (q, src)
    return best


def memory_limit(dirs=None):
    """The tightest cgroup memory limit as (bytes, source), or (None, None)."""
    best = (None, None)
    for version, d in (cgroup_dirs("memory") if dirs is None else dirs):
        name = "memory.max" if version == 2 else "memory.limit_in_bytes"
        s = read_text(os.path.join(d, name))
        if not s or s == "max":
            continue
        try:
            v = int(s)
        except ValueError:
            continue
        if version == 1 and v >= _V1_UNLIMITED:
            continue
        if best[0] is None or v < best[0]:
            best = (v, f"cgroup v{version} {os.path.join(d, name)}")
    return best


def meminfo():
    """/proc/meminfo as {field: bytes}."""
    out = {}
    for line in (read_text("/proc/meminfo") or "").splitlines():
        k, _, v = line.partition(":")
        parts = v.split()
        if parts and parts[0].isdigit():
            out[k] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out



# ----------------------------------------------------------------------------
# CPUs


def affinity_cpus():
    """The CPUs this process may run on (its affinity mask), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def usable_cpus(affinity=None, quota=None):
    """CPUs this process can keep busy: its affinity, capped by the cgroup
    CPU quota (rounded up).  Both default to what the kernel says now."""
    aff = affinity_cpus() if affinity is None else affinity
    if affinity is None and quota is None:
        quota, _ = cpu_quota()
    n = len(aff)
    if quota is not None:
        n = max(1, min(n, math.ceil(quota - 1e-9)))
    return n


def system_idle_s():
    """Seconds all CPUs of the machine have been idle (from /proc/stat), or None."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# ----------------------------------------------------------------------------
# memory


def memory_limits():
    """(available bytes, limit bytes): the tighter of the cgroup limit and
    MemAvailable / MemTotal; None where unknown."""
    info = meminfo()
    avail, total = info.get("MemAvailable"), info.get("MemTotal")
    limit, _ = memory_limit()
    if limit is not None:
        try:
            with open("/sys/fs/cgroup/memory.current") as f:
                used = int(f.read())
            avail = min(avail or limit, max(0, limit - used))
        except (OSError, ValueError):
            pass
        total = min(total or limit, limit)
    return avail, total


def memory_pressure(limits=None):
    """True when less than 5% of the memory limit is left (`limits`: an
    (available, total) pair, default memory_limits())."""
    avail, total = memory_limits() if limits is None else limits
    return bool(avail is not None and total and avail < 0.05 * total)

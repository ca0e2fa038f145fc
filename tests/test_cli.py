"""The command line: python -m fastloader {make-sample, bench, doctor, version, --help}
(pack: tests/test_pack.py)."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.fastloader_only

pytest.importorskip("skimage")  # make-sample's source photographs

from fastloader import __main__ as cli  # noqa: E402
from fastloader.tools import doctor  # noqa: E402


def _env(**extra):
    env = dict(os.environ)
    env.pop("LOCAL_WORLD_SIZE", None)
    env.update(extra)
    return env


def _doctor_json(capsys, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert cli.main(["doctor", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------
# --help, version


def test_help_exits_0_and_lists_commands():
    r = subprocess.run([sys.executable, "-m", "fastloader", "--help"], capture_output=True, text=True,
                       timeout=60, env=_env())
    assert r.returncode == 0, r.stderr
    for cmd in ("make-sample", "bench", "doctor", "pack", "version"):
        assert cmd in r.stdout
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--help"])
    assert e.value.code == 0


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 2
    assert "make-sample" in capsys.readouterr().out


def test_version_prints_build_info(capsys):
    import fastloader

    assert cli.main(["version"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["fastloader"] == fastloader.__version__
    assert info["libjpeg_turbo"] == fastloader.build_info()["libjpeg_turbo"]
    assert "devices" in info["cuda"]


# ----------------------------------------------------------------------------
# doctor


def test_doctor_json_fields(capsys, monkeypatch):
    rep = _doctor_json(capsys, monkeypatch)
    aff = len(os.sched_getaffinity(0))
    c = rep["cpus"]
    assert rep["usable_cpus"] == c["usable_cpus"] >= 1
    assert c["affinity_cpus"] == aff
    if c["cgroup_cpu_quota"] is None:
        assert rep["usable_cpus"] == aff
    else:  # a quota can only lower it
        assert rep["usable_cpus"] == max(1, min(aff, math.ceil(c["cgroup_cpu_quota"] - 1e-9)))
    mem = rep["memory"]
    assert mem["limit_bytes"] is None or mem["limit_bytes"] > 64 * 2**20
    if mem["mem_total_bytes"]:
        assert mem["limit_bytes"] <= mem["mem_total_bytes"]
    if os.path.isdir("/dev/shm"):
        assert rep["shm"]["present"] and rep["shm"]["size_bytes"] > 0
    import resource

    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    assert rep["memlock"]["soft_bytes"] == (None if soft == resource.RLIM_INFINITY else soft)
    if os.path.isdir("/sys/devices/system/node/node0"):
        assert rep["numa"]["nodes"] >= 1
    import fastloader

    info = fastloader.build_info()
    assert rep["jpeg"]["libjpeg_turbo"] == info["libjpeg_turbo"]
    assert rep["cuda"]["devices"] == info["cuda"]["devices"]
    assert rep["python"]["version"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}.")
    assert isinstance(rep["python"]["free_threaded_build"], bool)
    assert rep["local_world_size"] is None
    r = rep["recommended"]
    assert r["num_workers"] == max(1, rep["usable_cpus"] - 1)
    assert r["pin_memory"] == bool(info["cuda"]["devices"])
    assert r["prefetch_factor"] == 2
    # every finding is a [level, name, value, advice] with real advice
    names = {f[1] for f in rep["findings"]}
    assert {"usable CPUs", "memory limit", "/dev/shm", "CUDA", "libjpeg-turbo", "Python"} <= names
    assert all(f[0] in ("ok", "note", "warn") and len(f[3]) > 20 for f in rep["findings"])


def test_doctor_text_has_advice_and_recommendation(capsys, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "usable CPUs:" in out and "/dev/shm" in out and "libjpeg-turbo" in out
    usable = doctor.check_cpus()["usable_cpus"]
    assert f"num_workers={max(1, (usable - 1) // 2)}" in out
    assert "LOCAL_WORLD_SIZE=2" in out


def test_recommend_divides_cpus_among_ranks():
    assert doctor.recommend(1, 0)["num_workers"] == 1
    assert doctor.recommend(2, 0)["num_workers"] == 1
    assert doctor.recommend(17, 0)["num_workers"] == 16
    assert doctor.recommend(17, 8, 8) == {"num_workers": 2, "pin_memory": True, "prefetch_factor": 2,
                                          "per_ranks": 8}
    assert doctor.recommend(4, 0, 8)["num_workers"] == 1  # never 0


def test_parse_cpulist():
    assert doctor.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert doctor.parse_cpulist("") == []


def test_cgroup_v2_quota_and_memory_limit_from_a_fake_hierarchy(tmp_path):
    """The tightest limit along the chain from this cgroup up to the mount point wins."""
    mnt = tmp_path / "cg2"
    job = mnt / "user.slice" / "job"
    job.mkdir(parents=True)
    (mnt / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (mnt / "user.slice" / "cpu.max").write_text("max 100000\n")
    (job / "cpu.max").write_text("150000 100000\n")
    (mnt / "user.slice" / "memory.max").write_text("1073741824\n")
    (job / "memory.max").write_text("max\n")
    cgroup = "0::/user.slice/job\n"
    mountinfo = f"30 25 0:26 / {mnt} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    cpu_dirs = doctor.cgroup_dirs("cpu", cgroup, mountinfo)
    assert cpu_dirs[0] == (2, str(job)) and cpu_dirs[-1] == (2, str(mnt))
    q, src = doctor.cpu_quota(cpu_dirs)
    assert q == 1.5 and "cpu.max" in src
    lim, src = doctor.memory_limit(doctor.cgroup_dirs("memory", cgroup, mountinfo))
    assert lim == 1 << 30 and "user.slice" in src
    # no quota anywhere
    (job / "cpu.max").write_text("max 100000\n")
    assert doctor.cpu_quota(cpu_dirs) == (None, None)


def test_cgroup_v1_quota_from_a_fake_hierarchy(tmp_path):
    cpu = tmp_path / "cpu"
    (cpu / "docker" / "abc").mkdir(parents=True)
    (cpu / "docker" / "abc" / "cpu.cfs_quota_us").write_text("50000\n")
    (cpu / "docker" / "abc" / "cpu.cfs_period_us").write_text("100000\n")
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    mem = tmp_path / "memory"
    mem.mkdir()
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "unlimited"
    cgroup = "4:memory:/\n3:cpu,cpuacct:/docker/abc\n"
    mountinfo = (f"32 31 0:29 / {cpu} rw - cgroup cgroup rw,cpu,cpuacct\n"
                 f"35 31 0:32 / {mem} rw - cgroup cgroup rw,memory\n")
    assert doctor.cpu_quota(doctor.cgroup_dirs("cpu", cgroup, mountinfo))[0] == 0.5
    assert doctor.memory_limit(doctor.cgroup_dirs("memory", cgroup, mountinfo)) == (None, None)


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset not installed")
def test_doctor_under_taskset_sees_one_cpu():
    cpu = min(os.sched_getaffinity(0))
    r = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-m", "fastloader", "doctor", "--json"],
                       capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["usable_cpus"] == 1
    assert rep["cpus"]["affinity"] == [cpu]
    assert rep["recommended"]["num_workers"] == 1


# ----------------------------------------------------------------------------
# make-sample + bench


@pytest.fixture(scope="module")
def tiny_sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli") / "sample30"
    rc = cli.main(["make-sample", str(root), "--n", "30", "--seed", "3", "--classes", "3", "--quiet"])
    assert rc == 0
    return root


def test_make_sample_writes_jpegs(tiny_sample, capsys):
    files = sorted(p for p in tiny_sample.rglob("*.JPEG"))
    assert len(files) == 30
    assert len({p.parent.name for p in files}) == 3
    for p in files[:5]:
        assert p.read_bytes()[:3] == b"\xff\xd8\xff"
    from fastloader.tools.sample import read_stats

    st = read_stats(tiny_sample)
    assert st["n"] == 30 and st["seed"] == 3


def test_make_sample_prints_stats_and_refuses_foreign_folder(tmp_path, capsys):
    rc = cli.main(["make-sample", str(tmp_path / "s"), "--n", "5", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "wrote 5 JPEGs" in out and "mean size" in out and "KiB" in out and "progressive" in out
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "keep.txt").write_text("x")
    assert cli.main(["make-sample", str(tmp_path / "foreign"), "--n", "5", "--quiet"]) == 2
    assert (tmp_path / "foreign" / "keep.txt").exists()


def test_bench_quick_both_loaders(tiny_sample, tmp_path, capsys):
    pytest.importorskip("torchvision")
    from PIL import Image

    png = tmp_path / "bench.png"
    js = tmp_path / "bench.json"
    rc = cli.main(["bench", str(tiny_sample), "--quick", "--workers", "0,1", "--max-batches", "2",
                   "--batch-size", "8", "--compare", "torch", "--plot", str(png), "--json", str(js)])
    cap = capsys.readouterr()
    assert rc == 0, cap.out + cap.err
    out = cap.out
    assert "torch.set_num_threads(1)" in out
    for w in (0, 1):
        for loader in ("fastloader", "torch"):
            assert re.search(rf"^\|\s+{w} \| {loader}\s+\|\s+[\d.]+ s \|", out, re.M), out
    assert "consumer wait" in out and "images/s" in out and "peak RSS" in out
    # progress line per configuration on stderr
    assert len(re.findall(r"^\[\d/4\] ", cap.err, re.M)) == 4
    # a real PNG
    assert png.stat().st_size > 0
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100
        im.verify()
    # the raw numbers are those of real runs
    res = json.loads(js.read_text())
    assert len(res["results"]) == 4
    for r in res["results"]:
        assert "error" not in r, r
        assert r["batches"] == 2 and r["samples"] == 16
        assert r["shape"] == "8x3x224x224" and r["dtype"] == "float32"
        assert r["torch_threads"] == 1
        assert 0 < r["ttfb_s"] <= r["total_s"]
        assert r["rate"] > 0 and 0 <= r["wait_pct"] <= 100.5
        assert r["peak_mib"] >= r["rss_peak_mib"] > 0


def test_bench_step_lowers_consumer_wait(tiny_sample, tmp_path, capsys):
    """A model step much longer than loading a batch leaves the loop waiting a small fraction of the time."""
    js = tmp_path / "b.json"
    rc = cli.main(["bench", str(tiny_sample), "--workers", "1", "--max-batches", "3", "--batch-size", "4",
                   "--compare", "none", "--step-ms", "300", "--plot", "", "--json", str(js)])
    cap = capsys.readouterr()
    assert rc == 0, cap.out + cap.err
    (r,) = json.loads(js.read_text())["results"]
    assert r["loader"] == "fastloader" and r["batches"] == 3
    assert r["batch_ms"] >= 290  # the step is in the batch time
    assert r["wait_pct"] < 50
    assert "| torch" not in cap.out


def test_sample_sources_override(tmp_path, monkeypatch):
    """FASTLOADER_SAMPLE_SOURCES (used on the offline GPU box) replaces
    scikit-image's folder; a missing folder is a clear error."""
    from fastloader.tools import sample
    src = tmp_path / "sources"
    src.mkdir()
    real = sample._skimage_data_dir()
    shutil.copy(os.path.join(real, "astronaut.png"), src)
    shutil.copy(os.path.join(real, "camera.png"), src)
    monkeypatch.setenv("FASTLOADER_SAMPLE_SOURCES", str(src))
    color, gray = sample._source_list()
    # (matplotlib's sample photograph joins when matplotlib is installed)
    assert [os.path.basename(p) for p, _ in color if p.startswith(str(src))] == ["astronaut.png"]
    assert [os.path.basename(p) for p, _ in gray] == ["camera.png"]
    monkeypatch.setenv("FASTLOADER_SAMPLE_SOURCES", str(tmp_path / "nope"))
    with pytest.raises(RuntimeError, match="FASTLOADER_SAMPLE_SOURCES=.*is not a folder"):
        sample._source_list()

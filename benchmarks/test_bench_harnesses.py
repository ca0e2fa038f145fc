"""The C harnesses of bench_render.py and bench_augment_ops.py compile against
today's csrc/ and run; bench_sampler.py (a standalone script no suite test
runs) runs and finds the same batches from both loaders.  They link csrc/image/ units directly, not the
extension, so a function that moves between units breaks them while every
loader test passes (bench_render.py stopped linking when the policy path moved
into render.c, and nothing noticed).  A few calls each; the figures mean
nothing here.
"""
import os
import re
import subprocess
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))


def _run(script, *args):
    r = subprocess.run([sys.executable, os.path.join(BENCH_DIR, script), *args], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{script} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def test_bench_render_harness_runs():
    out = _run("bench_render.py", "--n", "3", "--no-py")
    rows = re.findall(r"^(val_u8|val_f32|train_u8|train_f32)\s+([0-9.]+) us/image\s+checksum ([0-9a-f]{16})$",
                      out, re.M)
    assert [r[0] for r in rows] == ["val_u8", "val_f32", "train_u8", "train_f32"], out
    assert all(float(r[1]) > 0 for r in rows)


def test_bench_augment_ops_harness_runs():
    out = _run("bench_augment_ops.py", "--n", "2", "--repeats", "1", "--only", "Rotate")
    rows = re.findall(r"^\| (Rotate(?:/bilinear|/bicubic)?)\s+\|\s+([0-9.]+) \|", out, re.M)
    assert [r[0] for r in rows] == ["Rotate", "Rotate/bilinear", "Rotate/bicubic"], out
    assert all(float(r[1]) > 0 for r in rows)


def test_bench_sampler_runs_and_both_loaders_agree():
    out = _run("bench_sampler.py", "--rounds", "1", "--n", "3000", "--batch-size", "64")
    rows = re.findall(r"^\| (shuffle=True[^|]*|sampler=DistributedSampler[^|]*|accelerate[^|]*)\|.*\|\s*(yes|NO)\s*\|$",
                      out, re.M)
    assert len(rows) == 6 and all(r[1] == "yes" for r in rows), out
    assert "PROBLEMS" not in out, out


def test_child_reports_what_its_cgroup_holds_by_kind(tmp_path):
    """A measured process that holds 48 MiB of its own memory: where the
    harness can give it a memory cgroup, the peak covers it and the charge at
    the end names it as anon (not page cache), so a report can tell a loader's
    memory from page cache that other processes' history charged here."""
    from fastloader.tools import harness

    child = tmp_path / "holder.py"
    child.write_text("def child(cfg):\n"
                     "    global held\n"
                     "    held = bytearray(cfg['mib'] << 20)\n"
                     "    held[::4096] = b'x' * len(held[::4096])\n"
                     "    return {'held': len(held)}\n")
    res = harness.run_child(str(child), "child", {"mib": 48}, mem_interval=0)
    assert "error" not in res, res
    assert res["held"] == 48 << 20
    if "cgroup_peak_mib" not in res:
        import pytest

        pytest.skip("no memory cgroup can be made here (not root, or no cgroup file system)")
    end = res["cgroup_end_mib"]
    assert set(end) >= {"anon", "page_cache"}, end
    assert 48 <= end["anon"] <= res["cgroup_peak_mib"], res
    assert end["anon"] < 48 + 64, res  # a bare interpreter, not a second copy


def test_bench_trainer_runs_both_trainers_and_fastloader_stays_native(tmp_path):
    """bench_trainer.py: transformers' Trainer as it is and with fastloader
    (one assignment, ImageFolder + DictCollate) both train; the fastloader
    Trainer's loader is on the native path."""
    import pytest

    pytest.importorskip("transformers")
    from fastloader.tools.sample import make_sample

    make_sample(str(tmp_path / "s"), n=64, classes=4, progress=False, processes=1)
    out = _run("bench_trainer.py", "--sample-dir", str(tmp_path / "s"), "--rounds", "1", "--epochs", "1")
    row = re.search(r"^\| 2 .*\|\s*([0-9.]+)x \|\s*(\S+) \|$", out, re.M)
    assert row and row.group(2) == "native" and float(row.group(1)) > 0, out
    assert "ERROR" not in out, out

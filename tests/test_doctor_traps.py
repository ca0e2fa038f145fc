"""doctor's traps, against faked environments: thread oversubscription (the
thread variables, torch's pool, the usable CPUs), the predicted memory of the
user's settings against a faked cgroup limit, and a cold page cache."""
from __future__ import annotations

import json
import time

import pytest

from fastloader import __main__ as cli
from fastloader.tools import doctor

pytestmark = pytest.mark.fastloader_only


def _finding(rep_or_list, name):
    items = rep_or_list["findings"] if isinstance(rep_or_list, dict) else rep_or_list
    hits = [f for f in items if f[1] == name]
    assert len(hits) == 1, [f[1] for f in items]
    return hits[0]


def _threads(usable, workers, env, torch_threads):
    return doctor.trap_findings({"threads": doctor.check_threads(usable, workers, env=env,
                                                                 torch_threads=torch_threads)})


# ----------------------------------------------------------------------------
# threads


def test_torch_pool_larger_than_the_usable_cpus_is_a_warning_with_the_fix():
    """A container with a 2-CPU quota on a 64-CPU host: torch sizes its pool
    from the 64, the loader adds its worker."""
    lvl, name, val, adv = _finding(_threads(2, 1, {}, 64), "thread oversubscription")
    assert lvl == "warn"
    assert "torch intra-op 64" in val and "2 usable CPUs" in val
    assert "intra-op pool has 64 threads for 2 usable CPUs" in adv
    assert "export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1" in adv
    assert "torch.set_num_threads(1)" in adv


def test_thread_variable_above_the_usable_cpus_is_a_warning():
    lvl, _, val, adv = _finding(_threads(8, 3, {"OPENBLAS_NUM_THREADS": "32", "OMP_NUM_THREADS": "4"}, 4),
                                "thread oversubscription")
    assert lvl == "warn"
    assert "OPENBLAS_NUM_THREADS=32" in val and "OMP_NUM_THREADS=4" in val
    assert "OPENBLAS_NUM_THREADS=32 is more than the 8 usable CPUs" in adv
    assert "OMP_NUM_THREADS=5" in adv  # 8 usable - 3 workers


def test_pool_plus_workers_over_the_cpus_is_a_note_and_a_fitting_setup_is_ok():
    lvl, _, _, adv = _finding(_threads(4, 3, {}, 4), "thread oversubscription")
    assert lvl == "note" and "4 intra-op threads plus 3 loader worker thread(s)" in adv
    assert "OMP_NUM_THREADS=1" in adv
    lvl, _, _, _ = _finding(_threads(8, 3, {"OMP_NUM_THREADS": "5"}, 5), "thread oversubscription")
    assert lvl == "ok"
    # an unparsable variable is shown, not trusted
    th = doctor.check_threads(8, 3, env={"MKL_NUM_THREADS": "many"}, torch_threads=2)
    assert th["env_threads"]["MKL_NUM_THREADS"] is None and th["env"]["MKL_NUM_THREADS"] == "many"


def test_collect_reads_the_environment_and_a_faked_cgroup(monkeypatch):
    """OMP_NUM_THREADS from the environment, a 1-CPU cgroup quota and a 1 GiB
    cgroup memory limit faked through the cgroup readers doctor uses."""
    monkeypatch.setenv("OMP_NUM_THREADS", "16")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(doctor, "cpu_quota", lambda dirs=None: (1.0, "cgroup v2 /fake/cpu.max = 100000 100000"))
    monkeypatch.setattr(doctor, "memory_limit", lambda dirs=None: (1 << 30, "cgroup v2 /fake/memory.max"))
    monkeypatch.setattr(doctor, "_torch_threads", lambda: 16)
    rep = doctor.collect({"batch_size": 256, "num_workers": 8})
    assert rep["usable_cpus"] == 1 and rep["memory"]["limit_bytes"] == 1 << 30
    lvl, _, val, adv = _finding(rep, "thread oversubscription")
    assert lvl == "warn" and "OMP_NUM_THREADS=16" in val and "OMP_NUM_THREADS=1 " in adv
    sm = rep["settings_memory"]
    # 256 x 3x224x224 float32 = 147 MiB per batch, 2 x 8 + 2 = 18 batches in flight
    assert sm["predicted_mib"] == pytest.approx(sm["base_mib"] + 18 * 256 * 3 * 224 * 224 * 4 / 2**20)
    lvl, _, val, adv = _finding(rep, "predicted peak memory")
    assert lvl == "warn" and "batch_size=256, num_workers=8, prefetch_factor=2" in val and "(limit 1.0 GiB)" in val
    assert "18 batches in flight" in adv and "lower prefetch_factor or num_workers" in adv
    text = doctor.render(rep)
    assert "[warn] predicted peak memory" in text and "[warn] thread oversubscription" in text


def test_predicted_memory_of_worker_processes_and_a_roomy_limit():
    s = dict(doctor.DEFAULT_SETTINGS, num_workers=4, worker_mode="process", worker_mib=300.0)
    sm = doctor.check_settings_memory(s, 64 << 30, base_mib=500.0)
    assert sm["predicted_mib"] == pytest.approx(500 + 64 * 3 * 224 * 224 * 4 * 10 / 2**20 + 4 * 300)
    lvl, _, val, adv = _finding(doctor.trap_findings({"settings_memory": sm}), "predicted peak memory")
    assert lvl == "ok" and "worker processes" in val and "+ 4 worker processes" in adv


# ----------------------------------------------------------------------------
# page cache


def test_page_cache_verdict():
    assert doctor.page_cache_verdict(0.50, 0.05, 1 << 20) == "cold"
    assert doctor.page_cache_verdict(0.012, 0.004, 1 << 20) == "warm"  # 3x, but 8 ms does not matter
    assert doctor.page_cache_verdict(0.10, 0.09, 1 << 20) == "warm"
    assert doctor.page_cache_verdict(0.0, 0.0, 0) == "warm"


def test_cold_read_is_detected_and_explained(tmp_path):
    """The first read of each file waits 2 ms (storage), later reads do not
    (the page cache): a read function standing in for the disk."""
    for i in range(20):
        (tmp_path / f"c{i % 2}").mkdir(exist_ok=True)
        (tmp_path / f"c{i % 2}" / f"{i}.jpg").write_bytes(b"x" * 1000)
    seen = []

    def read(p):
        if p not in seen:
            seen.append(p)
            time.sleep(0.002)
        with open(p, "rb") as f:
            f.read()

    pc = doctor.check_page_cache(str(tmp_path), n=16, read=read)
    assert pc["files"] == 16 and pc["bytes"] == 16000 and len(seen) == 16
    assert pc["dataset_files"] == 20 and pc["dataset_bytes"] == 20000
    assert pc["verdict"] == "cold" and pc["first_s"] > 2 * pc["second_s"]
    lvl, name, val, adv = _finding(doctor.trap_findings({"page_cache": pc}), "cold page cache")
    assert lvl == "warn" and "16 files" in val and "first epoch will be slower" in adv


def test_doctor_command_with_settings_and_data(tmp_path, capsys, monkeypatch):
    """Files just written are in the page cache: both reads at memory speed."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for i in range(8):
        (tmp_path / f"{i}.bin").write_bytes(bytes(4096))
    assert cli.main(["doctor", "--json", "--batch-size", "128", "--num-workers", "3", "--sample-bytes", "1MiB",
                     "--data", str(tmp_path)]) == 0
    rep = json.loads(capsys.readouterr().out)
    sm = rep["settings_memory"]
    assert sm["settings"]["batch_size"] == 128 and sm["settings"]["sample_bytes"] == 1 << 20
    assert sm["predicted_mib"] == pytest.approx(sm["base_mib"] + 128 * (2 * 3 + 2))
    assert rep["page_cache"]["files"] == 8 and rep["threads"]["loader_workers"] == 3
    names = {f[1] for f in rep["findings"]}
    assert {"thread oversubscription", "predicted peak memory"} <= names
    assert names & {"page cache", "cold page cache"}

"""HTTP vs local shards in one process: images/s and the loader process's CPU per image,
epoch by epoch (benchmarks/RESULTS.md section 12).

    python benchmarks/bench_http_cpu.py SHARD_DIR    (a folder written by `python -m fastloader pack shards`)
"""
import sys, os, time, glob, resource, importlib.util, tempfile
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, REPO)
import torch; torch.set_num_threads(1)
import fastloader
from fastloader import transforms as FT
spec = importlib.util.spec_from_file_location("ns", os.path.join(REPO, "tests", "nginx_server.py")); ns = importlib.util.module_from_spec(spec); spec.loader.exec_module(ns)
shard_dir = sys.argv[1]
local = sorted(glob.glob(shard_dir + "/*.tar"))
srv = ns.NginxServer(shard_dir, tempfile.mkdtemp(prefix="fl-nginx-")); srv.start()
remote = [srv.url(os.path.basename(u)) for u in local]
tf = FT.Compose([FT.RandomResizedCrop(224), FT.RandomHorizontalFlip(), FT.ToTensor(), FT.Normalize([0.5]*3,[0.25]*3)])
def run(urls, label):
    dl = fastloader.DataLoader(fastloader.WebDataset(urls, transform=tf, shuffle=1000, epoch_length=2000), batch_size=64, num_workers=2)
    for ep in range(4):
        r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter(); n = 0
        for x, y in dl: n += len(x)
        dt = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        print(label, ep, f"{n/dt:.0f}/s cpu {cpu*1000/n:.3f} ms/img (sys {(r1.ru_stime-r0.ru_stime)*1000/n:.3f})", dl.stats()["stream"]["network_wait_s"])
try:
    run(local, "local"); run(remote, "http"); run(local, "local")
finally:
    srv.stop()

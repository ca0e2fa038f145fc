"""The import swap (bench_swap.py's child): each dataset -- torchvision's
ImageFolder with the reference training preset (classic v1, ta_wide v1/v2),
bench_python's pure-Python and numpy datasets, a dict-of-tensors NLP dataset,
an IterableDataset sharding itself by get_worker_info() -- with the same
object and arguments under torch's DataLoader and under fastloader's
(``from fastloader import DataLoader``, its default settings), batch 64,
torch.set_num_threads(1).  Every run's batch structure (keys, shapes, dtypes)
and sample count are checked; the standalone script reports PSS memory and
each loader's best num_workers (``python benchmarks/bench_swap.py``).
"""
import pytest

import _suite as S
import bench_swap as BS


@pytest.mark.parametrize("loader", S.loaders("torch", "fastloader"))
@pytest.mark.parametrize("dataset", list(BS.DATASETS))
def test_swap(bench, suite, request, dataset, workers, loader):
    """The import swap, same Dataset object and arguments, samples/s"""
    kind = BS.DATASETS[dataset][1]
    root, count = None, None
    if kind.startswith("folder:"):
        smp = request.getfixturevalue("sample")
        root, count = smp.root, smp.count
    mb = bench.max_batches(None)
    samples = mb * BS.BATCH_SIZE if mb else BS.DATASETS[dataset][2]
    if count is not None:
        samples = min(samples, count)
    cfg = dict(dataset=dataset, kind=kind, workers=workers, samples=samples, batch_size=BS.BATCH_SIZE, root=root,
               torch_threads=1)

    def config(ld):
        return S.Child(S.script("bench_swap.py"), "child", dict(cfg, impl=ld, fl_kwargs={}))

    want = BS.expected_structure(dataset)

    def check(r):
        if r.get("structure") != want:
            return f"batch structure {r.get('structure')!r}, expected {want!r}"
        return None

    first = want.split("[", 1)[1].split("]", 1)[0]  # the first tensor's shape
    bench.run(config, unit="samples/s",
              expect=dict(shape=first, samples=samples, check=check,
                          dtype="int64" if kind == "nlp" else "float32"))

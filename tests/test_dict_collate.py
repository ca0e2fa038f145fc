"""fastloader.DictCollate: the default collation with its fields named, for
models called with keyword arguments (transformers' Trainer).  A native
dataset stays on its batch path; transformers' RemoveColumnsCollator around
it is looked through only where it cannot change anything."""
import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")

import fastloader  # noqa: E402
from fastloader import DictCollate, PerformanceWarning  # noqa: E402
from fastloader import transforms as FT  # noqa: E402
from fastloader.collate import default_fields  # noqa: E402
from fastloader.tools.sample import make_sample  # noqa: E402

VAL = FT.Compose([FT.Resize(40), FT.CenterCrop(32), FT.ToTensor(), FT.Normalize([0.5] * 3, [0.25] * 3)])


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("dictcollate") / "data"
    make_sample(str(root), n=40, classes=4, progress=False, processes=1)
    return str(root)


class Pairs(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.full((3,), float(i)), i


def test_it_is_the_default_collation_named():
    c = DictCollate("x", "y")
    samples = [Pairs()[i] for i in range(4)]
    got = c(samples)
    want = torch.utils.data.default_collate(samples)
    assert list(got) == ["x", "y"] and torch.equal(got["x"], want[0]) and torch.equal(got["y"], want[1])
    assert pickle.loads(pickle.dumps(c)) == c and repr(c) == "DictCollate('x', 'y')"


def test_bad_names_are_refused():
    with pytest.raises(ValueError, match="needs the name"):
        DictCollate()
    with pytest.raises(TypeError, match="strings"):
        DictCollate("x", 1)
    with pytest.raises(ValueError, match="repeat"):
        DictCollate("x", "x")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_python_dataset_gets_named_batches(num_workers):
    loader = fastloader.DataLoader(Pairs(), batch_size=4, collate_fn=DictCollate("x", "y"), num_workers=num_workers)
    batches = list(loader)
    assert [b["y"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(torch.equal(b["x"][:, 0], b["y"].float()) for b in batches)


def test_the_wrong_number_of_names_is_an_error_that_says_so():
    loader = fastloader.DataLoader(Pairs(), batch_size=4, collate_fn=DictCollate("x", "y", "z"))
    with pytest.raises(ValueError, match=r"names 3 field\(s\), and the batch has 2"):
        next(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_native_dataset_stays_native(images, num_workers):
    """ImageFolder with DictCollate: the native batch path (no warning, the
    stats say so), the same pixels and labels as with the default
    collation."""
    ds = fastloader.ImageFolder(images, transform=VAL)
    ref = list(fastloader.DataLoader(ds, batch_size=8, num_workers=num_workers))
    loader = fastloader.DataLoader(ds, batch_size=8, num_workers=num_workers,
                                   collate_fn=DictCollate("pixel_values", "labels"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        got = list(loader)
    assert loader.stats()["path"] == "native"
    assert len(got) == len(ref) == 5
    for b, (x, y) in zip(got, ref):
        assert list(b) == ["pixel_values", "labels"]
        assert torch.equal(b["pixel_values"], x) and torch.equal(b["labels"], y)


def test_transformers_remove_columns_is_looked_through_only_over_tuple_samples(images):
    """The Trainer wraps every collator in RemoveColumnsCollator: over a
    native dataset (tuple samples, which it passes as they are) the native
    path stays; over a Python dataset it runs as the user's collate_fn."""
    trainer_utils = pytest.importorskip("transformers.trainer_utils")
    wrapped = trainer_utils.RemoveColumnsCollator(DictCollate("pixel_values", "labels"), ["pixel_values", "labels"])
    assert default_fields(wrapped, True) == (True, ("pixel_values", "labels"))
    assert default_fields(wrapped, False) == (False, None)
    assert default_fields(trainer_utils.RemoveColumnsCollator(lambda b: b, ["x"]), True) == (False, None)
    ds = fastloader.ImageFolder(images, transform=VAL)
    loader = fastloader.DataLoader(ds, batch_size=8, collate_fn=wrapped, num_workers=2)
    got = list(loader)
    assert loader.stats()["path"] == "native" and got[0]["pixel_values"].shape == (8, 3, 32, 32)
    py = fastloader.DataLoader(Pairs(), batch_size=4, collate_fn=trainer_utils.RemoveColumnsCollator(
        DictCollate("x", "y"), ["x", "y"]))
    assert [b["y"].tolist() for b in py][0] == [0, 1, 2, 3]


class DictFolder(fastloader.ImageFolder):
    """A user's ImageFolder whose own __getitem__ returns dicts."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return {"pixel_values": x, "labels": y, "index": i}


class TaggedFolder(fastloader.ImageFolder):
    """A subclass that brings no sample code of its own."""

    tag = "mine"


def test_a_subclass_with_its_own_getitem_is_called_as_torch_calls_it(images):
    """The native batch path would skip a subclass's own __getitem__: such
    a dataset runs as a Python dataset (its dict samples collated into a
    dict, as torch's loader gives), and RemoveColumnsCollator is not looked
    through for it.  A subclass without sample code stays native."""
    ds = DictFolder(images, transform=VAL)
    want = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    loader = fastloader.DataLoader(ds, batch_size=4)
    got = next(iter(loader))
    assert loader.stats()["path"] != "native"
    assert list(got) == ["pixel_values", "labels", "index"] and got["index"].tolist() == [0, 1, 2, 3]
    assert torch.equal(got["pixel_values"], want["pixel_values"])
    with pytest.raises(ValueError, match="is a dict"):
        next(iter(fastloader.DataLoader(ds, batch_size=4, collate_fn=DictCollate("pixel_values", "labels"))))
    plain = fastloader.DataLoader(TaggedFolder(images, transform=VAL), batch_size=4,
                                  collate_fn=DictCollate("pixel_values", "labels"))
    next(iter(plain))
    assert plain.stats()["path"] == "native"


class Masked(DictCollate):
    """A user's DictCollate subclass (its own __call__ would run in worker processes)."""


def test_a_subclass_of_dict_collate_pickles_as_itself():
    assert type(pickle.loads(pickle.dumps(Masked("x", "y")))) is Masked


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_native_epoch_with_named_batches_resumes_exactly(images, num_workers):
    """Random crops (keyed by seed, epoch and index) under DictCollate: a
    state taken after two batches, loaded into a loader built afresh, gives
    the rest of the epoch bit for bit."""
    train = FT.Compose([FT.RandomResizedCrop(32), FT.RandomHorizontalFlip(), FT.ToTensor()])

    def make():
        return fastloader.DataLoader(fastloader.ImageFolder(images, transform=train), batch_size=8, shuffle=True,
                                     num_workers=num_workers, seed=4, generator=torch.Generator().manual_seed(1),
                                     collate_fn=DictCollate("pixel_values", "labels"))

    ref = list(make())
    loader = make()
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    del it
    again = make()
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == len(ref) - 2
    for a, b in zip(rest, ref[2:]):
        assert torch.equal(a["pixel_values"], b["pixel_values"]) and torch.equal(a["labels"], b["labels"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_array_dataset_keeps_its_batch_gather_under_the_trainers_wrapper(tmp_path, num_workers):
    """ArrayDataset's samples are tuples too: DictCollate, bare or inside
    transformers' RemoveColumnsCollator, keeps its one-call gather of each
    batch (stats path "batch") and names the batch."""
    import numpy as np

    np.save(tmp_path / "x.npy", np.arange(40 * 3, dtype=np.float32).reshape(40, 3))
    np.save(tmp_path / "y.npy", np.arange(40, dtype=np.int64))
    ds = fastloader.ArrayDataset(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    collates = [DictCollate("x", "labels")]
    trainer_utils = pytest.importorskip("transformers.trainer_utils")
    collates.append(trainer_utils.RemoveColumnsCollator(DictCollate("x", "labels"), ["x", "labels"]))
    for collate_fn in collates:
        loader = fastloader.DataLoader(ds, batch_size=8, num_workers=num_workers, collate_fn=collate_fn)
        got = list(loader)
        assert loader.stats()["path"] == "batch"
        assert [b["labels"].tolist() for b in got][:2] == [list(range(8)), list(range(8, 16))]
        assert torch.equal(got[0]["x"], torch.arange(24, dtype=torch.float32).reshape(8, 3))

"""fastloader command line: python -m fastloader <command> (or: fastloader <command>).

Commands:
  make-sample DIR   write an ImageNet-like folder of real JPEG photographs
  bench [DIR]       fastloader vs torch DataLoader for num_workers 0,1,2,4: time, images/s,
                    time to first batch, peak memory, consumer wait %; writes a PNG plot
  doctor            what limits data loading on this machine, and recommended settings
  tune              search batch_size, num_workers, prefetch_factor, persistent_workers (and pin_memory
                    on a GPU) for your dataset and step; table, heatmap PNG, JSON, recommendation
  doctor DATASET_SCRIPT | --dataset MOD:ATTR
                    measure a dataset and say which path it should take: native dataset,
                    native call in __getitem__, or process workers
  pack FORMAT SRC OUT
                    convert an ImageFolder: `pack shards SRC_DIR OUT_DIR --shard-size 256MB`
                    writes tar shards in the WebDataset layout (fastloader/tools/pack.py)
  version           fastloader.build_info() as JSON
"""
from __future__ import annotations

import argparse
import json
import sys


def _cmd_make_sample(a) -> int:
    from .sample import make_sample

    try:
        st = make_sample(a.dir, a.n, seed=a.seed, classes=a.classes, processes=a.processes,
                         progress=not a.quiet)
    except (FileExistsError, RuntimeError, ValueError) as e:
        print(f"fastloader make-sample: {e}", file=sys.stderr)
        return 2
    if a.json:
        st = dict(st)
        st.pop("class_names", None)
        print(json.dumps(st, indent=1))
        return 0
    print(f"wrote {st['n']} JPEGs in {st['classes']} classes to {st['root']}")
    print(f"  mean size      {st['mean_width']:.0f} x {st['mean_height']:.0f} px "
          f"(width {st['min_width']}-{st['max_width']}, height {st['min_height']}-{st['max_height']})")
    print(f"  mean file size {st['mean_bytes'] / 1024:.1f} KiB (total {st['total_bytes'] / 2**20:.1f} MiB)")
    print(f"  progressive    {st['progressive']}")
    print(f"  grayscale      {st['grayscale']}")
    print(f"  seed           {st['seed']}")
    print(f"  time           {st['seconds']:.1f} s ({st['processes']} processes)")
    return 0


def _cmd_version(a) -> int:
    import fastloader

    print(json.dumps(fastloader.build_info(), indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import cli_bench, cli_tune, doctor, pack

    p = argparse.ArgumentParser(prog="fastloader", description=__doc__.split("\n\n")[0],
                                epilog="Run 'fastloader <command> --help' for a command's options.")
    sub = p.add_subparsers(dest="command", metavar="command")

    s = sub.add_parser("make-sample", help="write an ImageNet-like folder of real JPEG photographs",
                       description="Write N ImageNet-like JPEGs (crops of scikit-image's photographs) into "
                                   "DIR/<class>/; deterministic for a given --seed.")
    s.add_argument("dir", metavar="DIR", help="output folder (must be missing, empty or an earlier sample folder)")
    s.add_argument("--n", "-n", type=int, default=5000, help="number of images (default %(default)s)")
    s.add_argument("--seed", type=int, default=0, help="default %(default)s")
    s.add_argument("--classes", type=int, default=10, help="number of class folders (default %(default)s)")
    s.add_argument("--processes", type=int, default=None, help="generator processes (default: CPUs, at most 8)")
    s.add_argument("--json", action="store_true", help="print the statistics as JSON")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress line on stderr")
    s.set_defaults(func=_cmd_make_sample)

    b = sub.add_parser("bench", help="fastloader vs torch DataLoader for several num_workers, with a plot",
                       description=cli_bench.DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_bench.add_arguments(b)
    b.set_defaults(func=cli_bench.run)

    d = sub.add_parser("doctor", help="what limits data loading on this machine; recommended settings",
                       description=doctor.__doc__.split("\n\n")[0])
    doctor.add_arguments(d)
    d.set_defaults(func=doctor.run)

    t = sub.add_parser("tune", help="search DataLoader settings for your dataset and step, with a recommendation",
                       description=cli_tune.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_tune.add_arguments(t)
    t.set_defaults(func=cli_tune.run)

    k = sub.add_parser("pack", help=f"convert an ImageFolder into another layout ({', '.join(pack.FORMATS)})",
                       description=pack.DESCRIPTION)
    pack.add_arguments(k)
    k.set_defaults(func=pack.run)

    v = sub.add_parser("version", help="print fastloader.build_info() as JSON")
    v.set_defaults(func=_cmd_version)
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if not getattr(a, "func", None):
        p.print_help()
        return 2
    try:
        return int(a.func(a) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

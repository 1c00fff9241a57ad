"""`specdrive scenes generate|show`: thin wiring onto scenes.dataset and scenes.show."""
from __future__ import annotations

from scenes.config import DRIVE_SECONDS, FAMILIES, SPLITS, ConfigError
from tools.argtypes import integer


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("scenes", help="synthetic driving world: generate datasets or drives, draw them")
    sub = p.add_subparsers(dest="scenes_command", metavar="ACTION")
    sub.required = True
    g = sub.add_parser("generate", help="write train/val/test/heldout/unseen shards of snapshots (--n) or drives")
    g.add_argument("--out", required=True, help="dataset directory")
    what = g.add_mutually_exclusive_group(required=True)
    what.add_argument("--n", type=integer, help="number of snapshots (one cycle of a drive each) over all splits")
    what.add_argument("--drives", type=integer, help="number of drives (10 Hz cycles over --seconds)")
    g.add_argument("--seconds", type=float, default=DRIVE_SECONDS, help="length of each drive (default 8)")
    g.add_argument("--split", choices=SPLITS, help="with --drives: put every drive in this split; with --n: "
                   "write only this split's share of the N scenes, the same scenes a whole run writes there")
    g.add_argument("--seed", type=integer, default=0)
    g.add_argument("--families", default=",".join(FAMILIES),
                   help=f"comma-separated subset of: {','.join(FAMILIES)} (default: all)")
    g.add_argument("--workers", type=integer, default=1, help="processes (the bytes do not depend on it)")
    g.add_argument("--shard-size", type=integer, default=256, help="snapshots per shard")
    g.add_argument("--no-render", action="store_true", help="snapshots only: skip the camera images")
    g.set_defaults(run=_generate)
    s = sub.add_parser("show", help="draw one scene to a PNG, or a drive (--drive) to an animated GIF")
    s.add_argument("dataset", help="dataset or drives directory")
    s.add_argument("--index", type=integer, default=0, help="snapshot index")
    s.add_argument("--drive", type=integer, help="drive index: writes an animated GIF of the drive")
    s.add_argument("--every", type=integer, default=1, help="with --drive: one GIF frame every N cycles")
    s.add_argument("--split", help="split (default: train for snapshots, test for drives)", choices=SPLITS)
    s.add_argument("--out", required=True, help="PNG (scene) or GIF (drive) file to write")
    s.set_defaults(run=_show)


def _generate(args) -> int:
    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    if args.drives is not None:
        from scenes.dataset import DriveConfig, generate_drives

        cfg = DriveConfig(args.out, args.drives, args.seconds, args.seed, args.split, families, args.workers)
        manifest = generate_drives(cfg)
        counts = ", ".join(f"{k} {n}" for k, n in manifest.counts.items())
        print(f"wrote {cfg.drives} drives of {cfg.seconds:g} s to {cfg.out}: {counts}")
        return 0
    from scenes.dataset import GenerateConfig, generate

    cfg = GenerateConfig(args.out, args.n, args.seed, families, args.workers, args.shard_size, not args.no_render,
                         args.split)
    manifest = generate(cfg)
    counts = ", ".join(f"{k} {n}" for k, n in manifest.counts.items())
    print(f"wrote {sum(manifest.counts.values())} scenes to {cfg.out}: {counts}")
    return 0


def _show(args) -> int:
    if args.drive is not None:
        return _show_drive(args)
    from scenes.dataset import load
    from scenes.show import draw

    split = args.split or "train"
    data = load(args.dataset, split)
    if len(data) == 0:
        raise ConfigError(f"split {split!r} of {args.dataset!r} has no scenes")
    if not 0 <= args.index < len(data):
        raise ConfigError(f"--index {args.index} is out of range for split {split!r} of {args.dataset!r}; "
                          f"allowed 0..{len(data) - 1}")
    scene = data[args.index]
    if scene.images is None:
        raise ConfigError(f"{args.dataset!r} was generated with --no-render; it has no images to draw")
    draw(scene, args.out)
    print(f"wrote {args.out}")
    return 0


def _show_drive(args) -> int:
    from scenes.dataset import load_drives
    from scenes.show import draw_drive

    if args.every < 1:
        raise ConfigError(f"--every {args.every} must be at least 1")
    split = args.split or "test"
    drives = load_drives(args.dataset, split)
    if not 0 <= args.drive < len(drives):
        raise ConfigError(f"--drive {args.drive} is out of range for split {split!r} of {args.dataset!r}; "
                          f"allowed 0..{len(drives) - 1}" if len(drives) else f"split {split!r} has no drives")
    n = draw_drive(drives[args.drive], args.out, args.every)
    print(f"wrote {args.out} ({n} frames)")
    return 0
